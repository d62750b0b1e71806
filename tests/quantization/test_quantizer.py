"""texelflow.Quantizer and texelflow.quantize on real torch.export graphs and torchao's PT2E flow:
the converted graphs have the canonical dq -> op -> q shape the q8ta fusion reads, the quantized
model stays close to the float one, and the user's model is never changed."""

from __future__ import annotations

import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import texelflow
import texelflow.quantizer  # noqa: F401  loads torchao, which registers torch.ops.quantized_decomposed
from texelflow import models
from texelflow.runtime.errors import InputTypeError, InputValueError, UnsupportedModelError

aten = torch.ops.aten
qd = torch.ops.quantized_decomposed
Q, DQ, DQC = qd.quantize_per_tensor.default, qd.dequantize_per_tensor.default, qd.dequantize_per_channel.default
RELUS = (aten.relu.default, aten.relu_.default)
# the largest output error of the quantized model on an input it was calibrated with, as a fraction
# of the float output's range: the models here measure 0.5% to 1.7% (8-bit steps through up to 20
# layers), so 3% flags a wrong observer or a badly quantized weight without failing on rounding
MAX_ERROR = 0.03


# ---- graph helpers ----------------------------------------------------------------------------------
def calls(gm, *targets):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target in targets]


def qparams(node):
    """(scale, zero_point) of a quantize / dequantize_per_tensor node."""
    assert node.target in (Q, DQ), f"{node.name} is {node.target}, not a per-tensor quantize or dequantize"
    return node.args[1], node.args[2]


def only_user(node):
    assert len(node.users) == 1, f"{node.name} has users {list(node.users)}"
    return next(iter(node.users))


def quantized_output(node):
    """The quantize every user of `node` is (PT2E gives an observed output one quantize)."""
    users = list(node.users)
    assert users and all(u.target is Q for u in users), f"{node.name} is not quantized: users {users}"
    return users[0]


def assert_int8_weight(gm, weight_dq, out_channels: int):
    """`dequantize_per_channel(int8 constant, scales, zero_points, 0, -127, 127, torch.int8)`."""
    assert weight_dq.target is DQC, f"weight is {weight_dq.target}"
    constant, scales, zero_points = (attr(gm, a.target) for a in weight_dq.args[:3])
    assert all(a.op == "get_attr" for a in weight_dq.args[:3])
    assert tuple(weight_dq.args[3:]) == (0, -127, 127, torch.int8)
    assert constant.dtype == torch.int8 and constant.shape[0] == out_channels
    assert int(constant.min()) >= -127 and int(constant.max()) <= 127
    assert scales.shape == (out_channels,) and bool((scales > 0).all())
    assert bool((zero_points == 0).all())  # symmetric


def assert_weighted_op(gm, node, weight_index: int = 1):
    """A conv / linear reading a dequantized activation and a per-channel int8 weight."""
    assert node.args[0].target is DQ, f"{node.name}'s input is {node.args[0].target}"
    out_channels = node.meta["val"].shape[1 if node.target is aten.conv2d.default else -1]
    assert_int8_weight(gm, node.args[weight_index], out_channels)


def assert_op_then_quantize(gm, node):
    """`node` -> quantize, or `node` -> relu -> quantize with nothing between them."""
    user = list(node.users)[0]
    if user.target in RELUS:
        assert only_user(node) is user
        return quantized_output(user)
    return quantized_output(node)


def assert_shares_qparams(node):
    """A value-moving op whose output is quantized like its input."""
    assert qparams(node.args[0]) == qparams(quantized_output(node)), node.name


def relative_error(model, qmodel, inputs) -> float:
    with torch.no_grad():
        want, got = model(*inputs), qmodel(*inputs)
    return float((got - want).abs().max() / (want.max() - want.min()))


def calibration_like(inputs, count: int = 2, seed: int = 1):
    """`inputs` and `count` more random inputs of their shapes: the error measured on `inputs` is
    then the quantization's own, not a range the calibration never saw."""
    generator = torch.Generator().manual_seed(seed)
    return [tuple(inputs)] + [tuple(torch.randn(x.shape, generator=generator) for x in inputs) for _ in range(count)]


def attr(gm, target: str):
    """A GraphModule's constant by its get_attr target ("fc1.bias")."""
    value = gm
    for name in target.split("."):
        value = getattr(value, name)
    return value


def state(model):
    return ([m.training for m in model.modules()], [id(t) for t in [*model.parameters(), *model.buffers()]],
            {k: v.clone() for k, v in model.state_dict().items()})


def assert_unchanged(model, before):
    flags, ids, values = before
    after_flags, after_ids, _ = state(model)
    assert after_flags == flags and after_ids == ids
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, values[name], rtol=0, atol=0)


# ---- hand models ------------------------------------------------------------------------------------
class ConvReluAddRelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        y = F.relu(self.conv1(x))
        return F.relu(self.conv2(y) + y)


class LinearReluLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 8)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class ConvPixelShuffle(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 16, 1)

    def forward(self, x):
        return F.pixel_shuffle(self.conv(x), 2)


class LinearViewLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(12, 24), nn.Linear(8, 5)

    def forward(self, x):  # x [2, 12] -> [2, 24] -> [6, 8] -> [6, 5]
        return self.fc2(self.fc1(x).view(6, 8))


class Matmuls(nn.Module):
    """Linear layers written as addmm / matmul / mm against a transposed weight, and a relu6."""

    def __init__(self):
        super().__init__()
        self.w1, self.b1 = nn.Parameter(torch.randn(12, 6) / 3), nn.Parameter(torch.randn(12))
        self.w2 = nn.Parameter(torch.randn(10, 12) / 4)
        self.w3 = nn.Parameter(torch.randn(4, 10) / 4)

    def forward(self, x):
        y = torch.relu(torch.addmm(self.b1, x, self.w1.t()))
        y = F.hardtanh(y @ self.w2.t(), 0.0, 6.0)
        return torch.mm(y, self.w3.transpose(0, 1))


class ConvBn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 6, 3, bias=False), nn.BatchNorm2d(6)

    def forward(self, x):
        return torch.sigmoid(F.relu(self.bn(self.conv(x))))


def quantized(model, inputs, **options):
    torch.manual_seed(0)
    return texelflow.quantize(model, calibration_like(inputs), texelflow.Quantizer(**options))


def test_conv_relu_add_relu_fuses_the_relus_and_quantizes_the_add():
    torch.manual_seed(0)
    model, inputs = ConvReluAddRelu().eval(), (torch.randn(1, 3, 8, 8),)
    qmodel = quantized(model, inputs)
    conv1, conv2 = calls(qmodel, aten.conv2d.default)
    for conv in (conv1, conv2):
        assert_weighted_op(qmodel, conv)
    assert only_user(conv1).target in RELUS  # no quantize between the conv and its relu
    assert quantized_output(only_user(conv1))
    (add,) = calls(qmodel, aten.add.Tensor)
    assert [a.target for a in add.args[:2]] == [DQ, DQ]
    assert conv2 in [a.args[0].args[0] for a in add.args[:2]]  # conv2 -> q -> dq -> add
    assert_op_then_quantize(qmodel, add)
    assert only_user(add).target in RELUS
    assert relative_error(model, qmodel, inputs) < MAX_ERROR


def test_linear_relu_linear_chains_through_one_quantize():
    torch.manual_seed(0)
    model, inputs = LinearReluLinear().eval(), (torch.randn(4, 16),)
    qmodel = quantized(model, inputs)
    fc1, fc2 = calls(qmodel, aten.linear.default)
    assert_weighted_op(qmodel, fc1)
    assert_weighted_op(qmodel, fc2)
    relu = only_user(fc1)
    assert relu.target in RELUS
    q = quantized_output(relu)
    assert fc2.args[0].args[0] is q and qparams(fc2.args[0]) == qparams(q)  # fc2 reads relu's quantization
    assert fc1.args[2].op == "get_attr" and attr(qmodel, fc1.args[2].target).dtype == torch.float32  # bias float
    assert_op_then_quantize(qmodel, fc2)
    assert relative_error(model, qmodel, inputs) < MAX_ERROR


def test_pixel_shuffle_keeps_its_inputs_quantization():
    torch.manual_seed(0)
    model, inputs = ConvPixelShuffle().eval(), (torch.randn(1, 4, 5, 6),)
    qmodel = quantized(model, inputs)
    (conv,) = calls(qmodel, aten.conv2d.default)
    assert_weighted_op(qmodel, conv)
    (shuffle,) = calls(qmodel, aten.pixel_shuffle.default)
    assert shuffle.args[0].target is DQ and shuffle.args[0].args[0] is quantized_output(conv)
    assert_shares_qparams(shuffle)
    assert relative_error(model, qmodel, inputs) < MAX_ERROR


def test_a_view_between_linears_keeps_the_quantization():
    torch.manual_seed(0)
    model, inputs = LinearViewLinear().eval(), (torch.randn(2, 12),)
    qmodel = quantized(model, inputs)
    fc1, fc2 = calls(qmodel, aten.linear.default)
    (view,) = calls(qmodel, aten.view.default)
    assert view.args[0].args[0] is quantized_output(fc1)
    assert_shares_qparams(view)
    assert fc2.args[0].args[0] is quantized_output(view)
    assert_weighted_op(qmodel, fc2)
    assert relative_error(model, qmodel, inputs) < MAX_ERROR


class ConvPermuteNorm(nn.Module):
    """ConvNeXt's pattern: the conv's output permuted into a layer norm (a float op)."""

    def __init__(self):
        super().__init__()
        self.conv, self.norm = nn.Conv2d(3, 8, 3), nn.LayerNorm(8)

    def forward(self, x):
        return self.norm(self.conv(x).permute(0, 2, 3, 1))


def test_a_move_that_only_float_ops_read_stays_float():
    torch.manual_seed(0)
    model, inputs = ConvPermuteNorm().eval(), (torch.randn(1, 3, 6, 6),)
    qmodel = quantized(model, inputs)
    (conv,) = calls(qmodel, aten.conv2d.default)
    (permute,) = calls(qmodel, aten.permute.default)
    assert permute.args[0].target is DQ and permute.args[0].args[0] is quantized_output(conv)
    assert [u.target for u in permute.users] == [aten.layer_norm.default]  # no quantize, dequantize pair
    assert relative_error(model, qmodel, inputs) < MAX_ERROR


def test_addmm_matmul_mm_quantize_the_weight_before_its_transpose():
    torch.manual_seed(0)
    model, inputs = Matmuls().eval(), (torch.randn(3, 6),)
    qmodel = quantized(model, inputs)
    ops = calls(qmodel, aten.addmm.default, aten.matmul.default, aten.mm.default)
    assert [n.target for n in ops] == [aten.addmm.default, aten.matmul.default, aten.mm.default]
    for op, weight_index, out_channels in zip(ops, (2, 1, 1), (12, 10, 4)):
        transposed = op.args[weight_index]
        assert transposed.target in (aten.t.default, aten.transpose.int)
        assert_int8_weight(qmodel, transposed.args[0], out_channels)  # dq_per_channel([N, K] int8) -> t
        assert op.args[weight_index - 1].target is DQ
    addmm, matmul, mm = ops
    assert addmm.args[0].op == "get_attr"  # the bias stays a float constant
    assert only_user(addmm).target in RELUS and quantized_output(only_user(addmm))
    relu6 = only_user(matmul)  # hardtanh(0, 6) fuses like relu
    assert relu6.target is aten.hardtanh.default and quantized_output(relu6)
    assert_op_then_quantize(qmodel, mm)
    assert relative_error(model, qmodel, inputs) < MAX_ERROR


class ConvThen(nn.Module):
    def __init__(self, activation):
        super().__init__()
        self.conv, self.activation = nn.Conv2d(3, 8, 3), activation

    def forward(self, x):
        return self.activation(self.conv(x))


@pytest.mark.parametrize("activation, fused", [
    (torch.relu, aten.relu.default),
    (F.relu6, aten.relu6.default),
    (partial(F.relu, inplace=True), aten.relu_.default),
    (partial(F.hardtanh, min_val=0.0, max_val=6.0, inplace=True), aten.hardtanh_.default),
    (partial(F.hardtanh, min_val=0.0, max_val=6.0), aten.hardtanh.default),
    (partial(F.hardtanh, min_val=-1.0, max_val=1.0), aten.hardtanh.default),
    (F.hardswish, aten.hardswish.default),
    (partial(F.hardswish, inplace=True), aten.hardswish_.default),
    (F.gelu, aten.gelu.default),
], ids=["relu", "relu6", "relu_", "hardtanh_(0,6)", "hardtanh(0,6)", "hardtanh(-1,1)", "hardswish", "hardswish_",
        "gelu"])
def test_a_conv_and_its_activation_are_one_pattern(activation, fused):
    """No quantize between a conv and its relu / relu6 / hardtanh (any bounds) / hardswish / gelu:
    the fused q8ta op applies it (hardtanh as its output range, hardswish and gelu before its
    quantize)."""
    torch.manual_seed(0)
    model, inputs = ConvThen(activation).eval(), (torch.randn(1, 3, 6, 6),)
    qmodel = quantized(model, inputs)
    (conv,) = calls(qmodel, aten.conv2d.default)
    assert_weighted_op(qmodel, conv)
    assert only_user(conv).target is fused and quantized_output(only_user(conv))
    assert relative_error(model, qmodel, inputs) < MAX_ERROR


class LinearHardswishAddHardswish(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        y = F.hardswish(self.fc(x))
        return F.hardswish(y + x)


def test_hardswish_fuses_after_a_linear_but_not_after_an_add():
    """q8ta_linear applies hardswish; q8ta_add does not, so an add's hardswish stays a float op
    between the add's quantize and the next one."""
    torch.manual_seed(0)
    model, inputs = LinearHardswishAddHardswish().eval(), (torch.randn(4, 16),)
    qmodel = quantized(model, inputs)
    (fc,) = calls(qmodel, aten.linear.default)
    assert_weighted_op(qmodel, fc)
    assert only_user(fc).target is aten.hardswish.default and quantized_output(only_user(fc))
    (add,) = calls(qmodel, aten.add.Tensor)
    assert_op_then_quantize(qmodel, add)
    assert relative_error(model, qmodel, inputs) < MAX_ERROR


def test_gelus_tanh_form_is_not_fused():
    """The q8ta kernels apply gelu's exact (erf) form only: a conv's tanh-form gelu stays a float
    op after the conv's own quantize."""
    torch.manual_seed(0)
    model, inputs = ConvThen(partial(F.gelu, approximate="tanh")).eval(), (torch.randn(1, 3, 6, 6),)
    qmodel = quantized(model, inputs)
    (conv,) = calls(qmodel, aten.conv2d.default)
    assert_op_then_quantize(qmodel, conv)
    assert relative_error(model, qmodel, inputs) < MAX_ERROR


def test_batch_norm_folds_into_the_conv_and_unannotated_ops_stay_float():
    torch.manual_seed(0)
    model, inputs = models.randomize_norms(ConvBn()).eval(), (torch.randn(1, 3, 8, 8),)
    qmodel = quantized(model, inputs)
    assert not calls(qmodel, aten.batch_norm.default, aten._native_batch_norm_legit_no_training.default)
    (conv,) = calls(qmodel, aten.conv2d.default)
    assert_weighted_op(qmodel, conv)
    (sigmoid,) = calls(qmodel, aten.sigmoid.default)
    assert sigmoid.args[0].target is DQ  # relu's quantized output, read in float
    assert [u.op for u in sigmoid.users] == ["output"]  # sigmoid is not annotated: its output is float
    assert relative_error(model, qmodel, inputs) < MAX_ERROR


# ---- the zoo ----------------------------------------------------------------------------------------
ZOO = {
    "tiny_resnet": models.tiny_resnet,
    "resnet18": lambda: models.resnet18(image_size=32),
    "unet_decoder": lambda: models.unet_decoder(image_size=32),
}


@pytest.fixture(scope="module", params=sorted(ZOO))
def zoo_model(request):
    model, inputs = ZOO[request.param]()
    return request.param, model, inputs, texelflow.quantize(model, calibration_like(inputs))


def test_zoo_models_quantize_every_conv_and_linear(zoo_model):
    name, model, inputs, qmodel = zoo_model
    weighted = calls(qmodel, aten.conv2d.default, aten.linear.default)
    assert weighted and len(calls(qmodel, DQC)) == len(weighted)
    for node in weighted:
        assert_weighted_op(qmodel, node)
        assert_op_then_quantize(qmodel, node)
    for add in calls(qmodel, aten.add.Tensor, aten.add_.Tensor):
        assert [a.target for a in add.args[:2]] == [DQ, DQ]
        assert_op_then_quantize(qmodel, add)
    assert not calls(qmodel, aten.batch_norm.default)


def test_zoo_models_share_quantization_across_moves(zoo_model):
    name, model, inputs, qmodel = zoo_model
    moves = calls(qmodel, aten.max_pool2d.default, aten.pixel_shuffle.default, aten.upsample_bilinear2d.vec,
                  aten.flatten.using_ints, aten.reshape.default)
    assert moves
    for node in moves:
        assert_shares_qparams(node)
    for cat in calls(qmodel, aten.cat.default):  # every input and the output: one observer
        assert {qparams(t) for t in cat.args[0]} == {qparams(quantized_output(cat))}
    for pool in calls(qmodel, aten.avg_pool2d.default, aten.adaptive_avg_pool2d.default):
        assert pool.args[0].target is DQ and quantized_output(pool)  # averaging: its own observer


def test_zoo_models_stay_close_to_the_float_model(zoo_model):
    name, model, inputs, qmodel = zoo_model
    assert relative_error(model, qmodel, inputs) < MAX_ERROR, name


# ---- options ----------------------------------------------------------------------------------------
def test_per_tensor_weights_and_symmetric_activations():
    torch.manual_seed(0)
    model, inputs = ConvReluAddRelu().eval(), (torch.randn(1, 3, 8, 8),)
    qmodel = quantized(model, inputs, per_channel=False, symmetric_activations=True, observer="minmax")
    assert not calls(qmodel, DQC)
    for conv in calls(qmodel, aten.conv2d.default):
        weight = conv.args[1]
        assert weight.target is DQ and tuple(weight.args[2:]) == (0, -127, 127, torch.int8)
        assert attr(qmodel, weight.args[0].target).dtype == torch.int8
    activations = [n for n in calls(qmodel, Q, DQ) if n.args[0].op != "get_attr"]
    assert activations and all(n.args[2] == 0 and tuple(n.args[3:5]) == (-128, 127) for n in activations)
    assert relative_error(model, qmodel, inputs) < MAX_ERROR


def test_affine_activations_use_the_whole_int8_range():
    torch.manual_seed(0)
    model, inputs = LinearReluLinear().eval(), (torch.randn(4, 16),)
    qmodel = quantized(model, inputs)
    relu_q = quantized_output(calls(qmodel, aten.relu.default)[0])
    assert relu_q.args[2] == -128 and tuple(relu_q.args[3:]) == (-128, 127, torch.int8)  # [0, max] on [-128, 127]


def test_an_unknown_observer_is_refused():
    with pytest.raises(ValueError, match="observer must be one of histogram, minmax"):
        texelflow.Quantizer(observer="percentile")


# ---- quantize(): arguments, and the user's model -------------------------------------------------------
def test_the_users_model_is_never_changed():
    torch.manual_seed(0)
    model = models.randomize_norms(ConvBn()).train()  # train mode: exported in inference mode, through a copy
    inputs = (torch.randn(2, 3, 8, 8),)
    before = state(model)
    qmodel = texelflow.quantize(model, calibration_like(inputs))
    assert_unchanged(model, before)
    assert model.training
    model.eval()
    assert relative_error(model, qmodel, inputs) < MAX_ERROR  # batch norm with its running statistics


def test_calibration_inputs_take_one_call_or_many():
    torch.manual_seed(0)
    model, x = LinearReluLinear().eval(), torch.randn(4, 16)

    def scales(qmodel):
        return [qparams(n) for n in calls(qmodel, Q)]

    one = scales(texelflow.quantize(model, [(x,)]))
    assert scales(texelflow.quantize(model, (x,))) == one  # one tuple: one call
    assert scales(texelflow.quantize(model, x)) == one  # one tensor: one call
    assert scales(texelflow.quantize(model, [x])) == one  # a list of tensors: one call each
    assert scales(texelflow.quantize(model, [(x,), (x * 4,)])) != one  # a wider range seen


def test_an_exported_program_is_quantized_too():
    torch.manual_seed(0)
    model, inputs = models.randomize_norms(ConvBn()).eval(), (torch.randn(1, 3, 8, 8),)
    program = torch.export.export(model, inputs)
    before = {k: v.clone() for k, v in program.state_dict.items()}
    qmodel = texelflow.quantize(program, calibration_like(inputs))
    (conv,) = calls(qmodel, aten.conv2d.default)
    assert_weighted_op(qmodel, conv)
    for name, value in program.state_dict.items():  # batch norm folded into a new weight, not this one
        torch.testing.assert_close(value, before[name], rtol=0, atol=0)
    assert relative_error(model, qmodel, inputs) < MAX_ERROR


def test_a_quantized_model_is_not_quantized_again():
    torch.manual_seed(0)
    model, inputs = LinearReluLinear().eval(), (torch.randn(4, 16),)
    qmodel = texelflow.quantize(model, inputs)
    already = r"the model is quantized already \(node \w+: quantized_decomposed\."
    with pytest.raises(UnsupportedModelError, match=already):
        texelflow.quantize(qmodel, inputs)


@pytest.mark.parametrize("calibration, error, message", [
    ([], InputValueError, "calibration_inputs is empty"),
    ([(torch.randn(4, 16),), (3.0,)], InputTypeError, r"calibration_inputs\[1\]\[0\] is a float, not a tensor"),
    ([(torch.randn(4, 16),), ()], InputValueError, r"calibration_inputs\[1\] is empty"),
    ([{"x": torch.randn(4, 16)}], InputTypeError, r"calibration_inputs\[0\] must be a tuple of tensors, not a dict"),
    (None, InputTypeError, "calibration_inputs must be a sequence of input tuples, not a NoneType"),
    ("x", InputTypeError, "calibration_inputs must be a sequence of input tuples, not a str"),
])
def test_bad_calibration_inputs_are_refused_in_one_line(calibration, error, message):
    with pytest.raises(error, match=message) as info:
        texelflow.quantize(LinearReluLinear().eval(), calibration)
    assert "\n" not in str(info.value)


def test_a_model_that_is_not_a_module_is_refused():
    with pytest.raises(UnsupportedModelError, match="model must be an nn.Module or a torch.export ExportedProgram, "
                                                    "not a function"):
        texelflow.quantize(lambda x: x, [(torch.randn(2),)])


def test_a_model_export_cannot_take_is_refused_in_one_line():
    class Branchy(nn.Module):
        def forward(self, x):
            return x * 2 if float(x.sum()) > 0 else x  # data-dependent control flow

    with pytest.raises(UnsupportedModelError, match="quantize: torch.export could not export the model") as info:
        texelflow.quantize(Branchy(), [(torch.randn(3),)])
    assert "\n" not in str(info.value)


def test_a_quantizer_of_the_wrong_kind_is_refused():
    with pytest.raises(TypeError, match="quantizer must be a torchao PT2E Quantizer, not a str"):
        texelflow.quantize(LinearReluLinear().eval(), [(torch.randn(4, 16),)], quantizer="int8")


def test_import_texelflow_loads_torchao_only_when_quantizing():
    script = ("import sys, texelflow\n"
              "assert 'torchao' not in sys.modules, 'import texelflow loaded torchao'\n"
              "assert 'quantize' in texelflow.__all__ and texelflow.Quantizer.__module__ == 'texelflow.quantizer'\n"
              "assert 'torchao' in sys.modules\n")
    result = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).resolve().parents[2],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "Failed to load" not in result.stderr  # torchao's CUDA-library warnings are kept quiet
