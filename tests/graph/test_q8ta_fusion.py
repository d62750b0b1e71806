"""The quantized lowering and the q8ta fusion (runtime/graph/quantized.py), at plan level: graphs
quantized by texelflow's PT2E quantizer and by torchao's X86InductorQuantizer (uint8
activations), and PT2E-shaped graphs written by hand (explicit quantized_decomposed calls) where
a test needs parameters of its own choosing. No device is needed."""

from __future__ import annotations

from typing import NamedTuple

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchao.quantization.pt2e  # noqa: F401  registers torch.ops.quantized_decomposed

import texelflow
from texelflow.runtime.errors import QuantizationError, UnsupportedModelError
from texelflow.runtime.graph.prepack_matmul import SubgroupFacts
from texelflow.runtime.graph.quantized import INT8_CONV_ENV, int8_conv_form

qd = torch.ops.quantized_decomposed


# ---- PT2E-shaped graphs written by hand ------------------------------------------------------------
class QP(NamedTuple):
    """Per-tensor int8 activation parameters."""

    scale: float
    zero_point: int


def q(x, p: QP):
    return qd.quantize_per_tensor.default(x, p.scale, p.zero_point, -128, 127, torch.int8)


def dq(x, p: QP):
    return qd.dequantize_per_tensor.default(x, p.scale, p.zero_point, -128, 127, torch.int8)


def qdq(x, p: QP):
    return dq(q(x, p), p)


class Int8Weights(nn.Module):
    """Weights frozen as convert_pt2e leaves them: int8 buffers with per-channel float32 scales
    and int64 zero points (0 when symmetric), dequantized where they are used."""

    def add(self, name: str, shape, symmetric: bool = True, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        w = torch.randn(*shape, generator=g) * 0.3
        scales = w.abs().amax(dim=tuple(range(1, w.dim()))) / 127
        zero_points = torch.zeros(shape[0], dtype=torch.int64)
        if not symmetric:
            zero_points = torch.randint(-8, 8, (shape[0],), generator=g)
        per_channel = (-1,) + (1,) * (w.dim() - 1)
        w8 = torch.clamp(torch.round(w / scales.view(per_channel)) + zero_points.view(per_channel), -127, 127)
        self.register_buffer(f"{name}_int8", w8.to(torch.int8))
        self.register_buffer(f"{name}_scales", scales)
        self.register_buffer(f"{name}_zero_points", zero_points)
        self.register_buffer(f"{name}_bias", torch.randn(shape[0], generator=g) * 0.1)

    def weight(self, name: str):
        return qd.dequantize_per_channel.default(getattr(self, f"{name}_int8"), getattr(self, f"{name}_scales"),
                                                 getattr(self, f"{name}_zero_points"), 0, -127, 127, torch.int8)

    def bias(self, name: str):
        return getattr(self, f"{name}_bias")


P1, P2, P3, P4, P5 = QP(0.02, 3), QP(0.015, -5), QP(0.03, -20), QP(0.012, -128), QP(0.04, 7)


class AddRelu(Int8Weights):
    """Q1: quantize x and y -> q8ta_add -> q8ta_relu -> dequantize."""

    def forward(self, x, y):
        a = q(dq(q(x, P1), P1) + dq(q(y, P2), P2), P3)
        return dq(q(torch.relu(dq(a, P3)), P4), P4)


class ShuffleAdd(Int8Weights):
    """Q3: quantize(x [1, 8, 8, 8]) -> q8ta_pixel_shuffle; quantize(y [1, 2, 16, 16]); q8ta_add."""

    def forward(self, x, y):
        ps = q(F.pixel_shuffle(qdq(x, P1), 2), P1)
        return dq(q(dq(ps, P1) + qdq(y, P2), P3), P3)


class ConvBlock(Int8Weights):
    """Q4: quantize -> q8ta_conv2d 3x3 -> q8ta_relu -> q8ta_conv2d -> q8ta_add(conv2, conv1) -> dequantize."""

    def __init__(self, channels: int = 8):
        super().__init__()
        self.add("c1", (channels, channels, 3, 3), seed=1)
        self.add("c2", (channels, channels, 3, 3), seed=2)

    def forward(self, x):
        c1 = q(F.conv2d(qdq(x, P1), self.weight("c1"), self.bias("c1"), padding=1), P2)
        r = q(torch.relu(dq(c1, P2)), P3)
        c2 = q(F.conv2d(dq(r, P3), self.weight("c2"), self.bias("c2"), padding=1), P4)
        return dq(q(dq(c2, P4) + dq(c1, P2), P5), P5)


class ClampedActivations(Int8Weights):
    """conv -> hardtanh(-0.3, 0.5) and linear -> relu6, each quantized with a range wider than its
    activation's, so the fused op's narrowed [quant_min, quant_max] is what clamps."""

    def __init__(self):
        super().__init__()
        self.add("c", (8, 8, 3, 3), seed=3)
        self.add("l", (12, 8), seed=4)

    def forward(self, x):
        c = q(F.hardtanh(F.conv2d(qdq(x, P1), self.weight("c"), self.bias("c"), padding=1), -0.3, 0.5), P1)
        y = dq(c, P1).permute(0, 2, 3, 1)
        return dq(q(F.relu6(F.linear(qdq(y, P1), self.weight("l"), self.bias("l")) * 1), QP(0.05, -3)), QP(0.05, -3))


class ChainedLinears(Int8Weights):
    """Two quantized linears; the second's dequantize has parameters of its own (P3, not the P2
    its input was quantized with), which is what it computes with."""

    def __init__(self, symmetric: bool = True):
        super().__init__()
        self.add("l1", (32, 16), symmetric=symmetric, seed=3)
        self.add("l2", (8, 32), symmetric=symmetric, seed=4)

    def forward(self, x):
        h = q(F.linear(qdq(x, P1), self.weight("l1"), self.bias("l1")), P2)
        return dq(q(F.linear(dq(h, P3), self.weight("l2"), self.bias("l2")), P4), P4)


class ViewBetweenLinears(Int8Weights):
    """linear -> quantize -> dequantize -> view -> (quantize -> dequantize, when `requantize`) -> linear."""

    def __init__(self, requantize: bool = True):
        super().__init__()
        self.requantize = requantize
        self.add("l1", (16, 16), seed=5)
        self.add("l2", (8, 16), seed=6)

    def forward(self, x):
        h = dq(q(F.linear(qdq(x, P1), self.weight("l1"), self.bias("l1")), P2), P2).view(1, 8, 16)
        h = qdq(h, P2) if self.requantize else h
        return dq(q(F.linear(h, self.weight("l2"), self.bias("l2")), P4), P4)


class FloatAddmm(Int8Weights):
    """addmm(bias, dq(x), dq_per_channel(w).t()) with a float output: nothing to fuse."""

    def __init__(self):
        super().__init__()
        self.add("w", (24, 16), seed=10)

    def forward(self, x):
        return torch.addmm(self.bias("w"), qdq(x, P1), self.weight("w").t())


class Uint8Weight(nn.Module):
    """A linear whose weight is uint8 per channel (zero points near 128) and whose bias is int32,
    dequantized per channel with scales input_scale * weight_scales, as some quantizers leave them."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(11)
        self.register_buffer("w", torch.randint(0, 256, (8, 16), generator=g, dtype=torch.uint8))
        self.register_buffer("scales", torch.rand(8, generator=g) * 0.01 + 0.001)
        self.register_buffer("zero_points", torch.randint(120, 136, (8,), generator=g))
        self.register_buffer("bias_int32", torch.randint(-5000, 5000, (8,), generator=g, dtype=torch.int32))
        self.register_buffer("bias_scales", self.scales * P1.scale)
        self.register_buffer("bias_zero_points", torch.zeros(8, dtype=torch.int64))

    def forward(self, x):
        w = qd.dequantize_per_channel.default(self.w, self.scales, self.zero_points, 0, 0, 255, torch.uint8)
        b = qd.dequantize_per_channel.default(self.bias_int32, self.bias_scales, self.bias_zero_points, 0,
                                              -(2**31), 2**31 - 1, torch.int32)
        return dq(q(F.linear(qdq(x, P1), w, b), P2), P2)


class QDQ(nn.Module):
    """quantize -> dequantize with the given parameters."""

    def __init__(self, scale=0.05, zero_point=0, quant_min=-128, quant_max=127, dtype=torch.int8):
        super().__init__()
        self.params = (scale, zero_point, quant_min, quant_max, dtype)

    def forward(self, x):
        return qd.dequantize_per_tensor.default(qd.quantize_per_tensor.default(x, *self.params), *self.params)


class PerChannel(nn.Module):
    """linear with a weight dequantized per channel from the given scales / zero points."""

    def __init__(self, scales, zero_points, quant_min=-127, quant_max=127, dtype=torch.int8):
        super().__init__()
        self.register_buffer("w", torch.ones(len(scales), 16, dtype=dtype))
        self.register_buffer("scales", torch.tensor(scales, dtype=torch.float32))
        self.register_buffer("zero_points", torch.tensor(zero_points, dtype=torch.int64))
        self.range = (quant_min, quant_max, dtype)

    def forward(self, x):
        w = qd.dequantize_per_channel.default(self.w, self.scales, self.zero_points, 0, *self.range)
        return F.linear(qdq(x, P1), w)


# ---- quantizers ------------------------------------------------------------------------------------
def tf_quantize(model, *inputs):
    """The model quantized by texelflow's quantizer (min / max observers: fast, deterministic)."""
    return texelflow.quantize(model.eval(), [inputs], quantizer=texelflow.Quantizer(observer="minmax"))


def x86_quantize(model, *inputs):
    """The model quantized by torchao's X86InductorQuantizer: uint8 activations, int8 weights."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as x86

    quantizer = x86.X86InductorQuantizer()
    quantizer.set_global(x86.get_default_x86_inductor_quantization_config())
    prepared = prepare_pt2e(torch.export.export(model.eval(), inputs).module(), quantizer)
    with torch.no_grad():
        prepared(*inputs)
    return convert_pt2e(prepared)


def fused(plan, op_name: str):
    """The plan's nodes of op `op_name`."""
    return [n for n in plan.graph.nodes if n.op is not None and n.op.name == op_name]


def r(*shape, seed: int = 0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


class ConvRelu(nn.Module):
    def __init__(self, cin=4, cout=8, groups=1):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1, groups=groups)

    def forward(self, x):
        return torch.relu(self.conv(x))


class Linear(nn.Module):
    def __init__(self, k=16, n=8, relu=False):
        super().__init__()
        self.lin, self.relu = nn.Linear(k, n), relu

    def forward(self, x):
        y = self.lin(x)
        return torch.relu(y) if self.relu else y


class MatMuls(nn.Module):
    """addmm(bias, x, w.t()) and mm(x, w2.t()): weight and input at the ops' own positions."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(r(24, 16, seed=7) * 0.3)
        self.b = nn.Parameter(r(24, seed=8) * 0.1)
        self.w2 = nn.Parameter(r(8, 24, seed=9) * 0.3)

    def forward(self, x):
        return torch.mm(torch.addmm(self.b, x, self.w.t()), self.w2.t())


class AddShuffle(nn.Module):
    def forward(self, x, y):
        return F.pixel_shuffle(torch.relu(x + y), 2)


# ---- each pattern fuses ----------------------------------------------------------------------------
def test_conv2d_relu_fuses_into_im2col_when_groups_1_and_cin_multiple_of_4():
    x = r(1, 4, 8, 8)
    plan = texelflow.plan(tf_quantize(ConvRelu(4, 8), x), (x,))
    assert plan.fallbacks == []
    assert plan.dispatches == {"quantize_per_tensor": 1, "q8ta_conv2d_im2col": 1, "dequantize_per_tensor": 1}
    (conv,) = fused(plan, "q8ta_conv2d_im2col")
    assert conv.arg("activation") == "relu" and conv.arg("groups") == 1
    assert conv.arg("weight").dtype == "int8" and conv.arg("weight").shape == (8, 4, 3, 3)
    assert conv.arg("weight_zero_points") is None  # symmetric weights
    assert conv.arg("weight_scales").shape == (8,) and conv.arg("bias").shape == (8,)
    assert any("relu" in f for f in conv.fused) and any("quantize" in f for f in conv.fused)


CPU_NO_DOT = SubgroupFacts(8, True, "cpu", 1024, int8_dot=False)
GPU_DOT = SubgroupFacts(32, True, "discrete", 1024, int8_dot=True)


@pytest.mark.parametrize("facts, env, form", [
    (None, None, "q8ta"), (CPU_NO_DOT, None, "float"), (GPU_DOT, None, "q8ta"),
    (SubgroupFacts(8, True, "cpu", 1024, int8_dot=True), None, "q8ta"),
    (SubgroupFacts(32, True, "integrated", 1024, int8_dot=False), None, "q8ta"),
    (CPU_NO_DOT, "q8ta", "q8ta"), (GPU_DOT, "float", "float"), (CPU_NO_DOT, "AUTO", "float")])
def test_the_quantized_conv_form_follows_the_device_and_the_environment(facts, env, form, monkeypatch):
    if env is None:
        monkeypatch.delenv(INT8_CONV_ENV, raising=False)
    else:
        monkeypatch.setenv(INT8_CONV_ENV, env)
    got, why = int8_conv_form(facts)
    assert got == form
    assert (why is None) == (form == "q8ta" and env in (None, "AUTO"))


def test_an_unknown_quantized_conv_form_is_an_error_naming_the_variable(monkeypatch):
    monkeypatch.setenv(INT8_CONV_ENV, "int4")
    with pytest.raises(ValueError, match="TEXELFLOW_INT8_CONV='int4': expected one of auto, q8ta, float"):
        int8_conv_form(None)


def test_a_conv_kept_in_float_keeps_its_int8_neighbours_and_says_why(monkeypatch):
    """The float form leaves dq -> conv -> relu -> q as it is: the conv runs on its float kernels
    with its weight dequantized at load, between the input's dequantize and the output's quantize."""
    monkeypatch.setenv(INT8_CONV_ENV, "float")
    x = r(1, 4, 8, 8)
    plan = texelflow.plan(tf_quantize(ConvRelu(4, 8), x), (x,))
    assert plan.fallbacks == []
    assert not any(op.startswith("q8ta_conv2d") for op in plan.dispatches), plan.dispatches
    # the input's q -> dq and the output's: a quantize_dequantize pass each (no int8 tensor left),
    # the output's folded into the conv's store (test_round_trips_fold_into_conv_stores)
    assert plan.dispatches["quantize_dequantize"] == 1 and plan.dispatches["quantize_per_tensor"] == 0
    (conv,) = [n for n in plan.graph.nodes if any("kept in float" in f for f in n.fused)]
    assert f"{INT8_CONV_ENV}=float" in "; ".join(conv.fused) and conv.arg("rt_scale") > 0
    assert conv.arg("weight").dtype == "float32"


def test_a_quantize_read_only_by_a_dequantize_becomes_one_float_pass(monkeypatch):
    """Convs kept in float leave q -> dq between them: each pair becomes quantize_dequantize in the
    float tensor's own representation (no int8 tensor, one dispatch instead of two), and a
    quantize whose int8 tensor a q8ta op also reads stays for it."""
    monkeypatch.setenv(INT8_CONV_ENV, "float")
    x = r(1, 4, 8, 8)
    plan = texelflow.plan(tf_quantize(TwoConvs(), x), (x,))
    assert plan.fallbacks == [] and plan.num_transitions == 0
    # (the convs' own round trips are folded into their stores: test_round_trips_fold_into_conv_stores)
    assert plan.dispatches == {"quantize_dequantize": 1, "conv2d_wino": 1, "conv2d_pw_act": 1}, plan.dispatches
    trips = fused(plan, "quantize_dequantize")
    assert all(n.arg("self").dtype == "float32" and n.outputs[0][1].dtype == "float32" for n in trips)
    assert all("read by nothing else" in n.fused[0] for n in trips)
    x8 = r(1, 8, 8, 8)
    plan = texelflow.plan(ConvBlock(), (x8,))  # c1's int8 output: read by q8ta_add and by c2's dequantize
    assert plan.dispatches["quantize_dequantize"] == 1 and plan.dispatches["q8ta_add"] == 1, plan.dispatches


class MobileBlock(nn.Module):
    """MobileNetV3's inverted residual without squeeze-excite: pointwise expand + hardswish,
    depthwise 5x5 stride 2 + hardswish, pointwise project (no activation), then a depthwise 3x3."""

    def __init__(self):
        super().__init__()
        self.expand = nn.Conv2d(8, 20, 1)
        self.dw = nn.Conv2d(20, 20, 5, stride=2, padding=2, groups=20)
        self.project = nn.Conv2d(20, 12, 1)
        self.dw2 = nn.Conv2d(12, 12, 3, padding=1, groups=12)

    def forward(self, x):
        y = F.hardswish(self.dw(F.hardswish(self.expand(x))))
        return torch.relu(self.dw2(self.project(y)))


def test_round_trips_fold_into_conv_stores(monkeypatch, device):
    """Convs kept in float between int8 neighbours: the quantize_dequantize after each pointwise and
    depthwise conv becomes part of that conv's store (rt_scale, ...), one pass fewer each, and the
    program still gives the quantized graph's answer exactly."""
    monkeypatch.setenv(INT8_CONV_ENV, "float")
    x = r(1, 8, 11, 13)
    quantized = tf_quantize(MobileBlock(), x)
    with texelflow.compile(quantized, (x,), device=device) as prog:
        plan = prog.plan
        assert plan.fallbacks == []
        hosts = [n for n in plan.graph.nodes if n.op is not None and n.arg("rt_scale")]
        assert sorted(n.op.name for n in hosts) == ["conv2d_dw3_s1", "conv2d_dw5_s2", "conv2d_pw_act",
                                                    "conv2d_pw_act"], plan.dispatches
        assert all(any("rounded as it stores" in f for f in n.fused) for n in hosts)
        assert plan.dispatches["quantize_dequantize"] == 1  # the input's: no conv makes it
        got = prog(x)
    with torch.no_grad():
        assert torch.equal(got, quantized(x))


def test_a_round_trip_with_other_parameters_stays():
    """q(P1) -> dq(P2) with another scale is a requantization, not a round trip: it stays."""
    class Requantized(nn.Module):
        def forward(self, x):
            return torch.relu(dq(q(x, P1), P2))

    x = r(1, 3, 4, 4)
    plan = texelflow.plan(Requantized(), (x,))
    assert plan.dispatches["quantize_per_tensor"] == 1 and plan.dispatches["dequantize_per_tensor"] == 1
    assert "quantize_dequantize" not in plan.dispatches
    plan = texelflow.plan(QDQ(0.05, 3), (x,))  # the same parameters: a round trip
    assert dict(plan.dispatches) == {"quantize_dequantize": 1}, plan.dispatches


@pytest.mark.parametrize("cin, groups", [(3, 1), (6, 1), (8, 2), (8, 8)])
def test_conv2d_takes_the_general_kernel_when_im2col_does_not_apply(cin, groups):
    x = r(1, cin, 8, 8)
    plan = texelflow.plan(tf_quantize(ConvRelu(cin, 8, groups), x), (x,))
    assert plan.fallbacks == []
    assert plan.dispatches["q8ta_conv2d"] == 1 and plan.dispatches["q8ta_conv2d_im2col"] == 0
    (conv,) = fused(plan, "q8ta_conv2d")
    assert conv.arg("groups") == groups


@pytest.mark.parametrize("shape, op", [((1, 16), "q8ta_linear_gemv"), ((1, 1, 16), "q8ta_linear_gemv"),
                                       ((4, 16), "q8ta_linear"), ((2, 3, 16), "q8ta_linear")])
def test_linear_takes_gemv_for_one_row_and_the_tiled_kernel_otherwise(shape, op):
    x = r(*shape)
    plan = texelflow.plan(tf_quantize(Linear(16, 8, relu=True), x), (x,))
    assert plan.fallbacks == []
    assert plan.dispatches == {"quantize_per_tensor": 1, op: 1, "dequantize_per_tensor": 1}
    (lin,) = fused(plan, op)
    assert lin.arg("activation") == "relu" and lin.arg("weight").shape == (8, 16)


def test_addmm_and_mm_take_weight_input_and_bias_from_their_positions():
    x = r(4, 16)
    model = MatMuls()
    plan = texelflow.plan(tf_quantize(model, x), (x,))
    assert plan.fallbacks == []
    assert plan.dispatches == {"quantize_per_tensor": 1, "q8ta_linear": 2, "dequantize_per_tensor": 1}
    first, second = fused(plan, "q8ta_linear")
    # addmm(bias, x, w.t()): the [24, 16] weight itself (its transpose absorbed), addmm's bias
    assert first.arg("weight").shape == (24, 16) and first.arg("bias").shape == (24,)
    assert first.arg("input").producer.op.name == "quantize_per_tensor"
    assert "weight transpose 't/permute'" in first.fused
    # mm(h, w2.t()): the [8, 24] weight, no bias, the first linear's int8 output as input
    assert second.arg("weight").shape == (8, 24) and second.arg("bias") is None
    assert second.arg("input") is first.outputs[0][1]
    assert "t/permute" not in {n.name for n in plan.graph.nodes}


def test_chained_linears_read_input_parameters_from_their_own_dequantize():
    x = r(4, 16)
    plan = texelflow.plan(ChainedLinears(), (x,))
    assert plan.fallbacks == []
    first, second = fused(plan, "q8ta_linear")
    assert (first.arg("input_scale"), first.arg("input_zero_point")) == P1
    assert (first.arg("out_scale"), first.arg("out_zero_point")) == P2
    assert second.arg("input") is first.outputs[0][1]
    assert (second.arg("input_scale"), second.arg("input_zero_point")) == P3  # its dequantize's, not P2
    assert (second.arg("out_scale"), second.arg("out_zero_point")) == P4


def test_asymmetric_weights_keep_their_zero_points_as_int32():
    plan = texelflow.plan(ChainedLinears(symmetric=False), (r(4, 16),))
    first, _ = fused(plan, "q8ta_linear")
    zp = first.arg("weight_zero_points")
    assert zp is not None and zp.dtype == "int32" and zp.shape == (32,)


def test_add_relu_relu_and_pixel_shuffle_fuse():
    x, y = r(1, 8, 8, 8, seed=1), r(1, 8, 8, 8, seed=2)
    plan = texelflow.plan(tf_quantize(AddShuffle(), x, y), (x, y))
    assert plan.fallbacks == []
    assert plan.dispatches == {"quantize_per_tensor": 2, "q8ta_add": 1, "q8ta_pixel_shuffle": 1,
                               "dequantize_per_tensor": 1}
    (add,) = fused(plan, "q8ta_add")
    assert add.arg("activation") == "relu" and add.arg("alpha") == 1.0
    plan = texelflow.plan(AddRelu(), (x, y))
    assert plan.dispatches == {"quantize_per_tensor": 2, "q8ta_add": 1, "q8ta_relu": 1, "dequantize_per_tensor": 1}
    (add,), (relu,) = fused(plan, "q8ta_add"), fused(plan, "q8ta_relu")
    assert (add.arg("self_scale"), add.arg("other_scale"), add.arg("out_scale")) == (P1.scale, P2.scale, P3.scale)
    assert (relu.arg("self_scale"), relu.arg("out_scale"), relu.arg("out_zero_point")) == (P3.scale, P4.scale, -128)


class AddHardswish(nn.Module):
    """A foreign quantizer's add -> hardswish -> quantize: q8ta_add applies relu only."""

    def forward(self, x, y):
        return dq(q(F.hardswish(qdq(x, P1) + qdq(y, P2)), P3), P3)


def test_an_add_does_not_absorb_a_hardswish(device):
    x, y = r(1, 8, 4, 4, seed=1), r(1, 8, 4, 4, seed=2)
    model = AddHardswish()
    plan = texelflow.plan(model, (x, y))
    assert plan.fallbacks == [] and "q8ta_add" not in plan.dispatches and plan.dispatches["hardswish"] == 1
    with texelflow.compile(model, (x, y), device=device) as prog:
        got = prog(x, y)
    torch.testing.assert_close(got, model(x, y), rtol=0, atol=P3.scale * 1.01)


class BroadcastAdd(nn.Module):
    def forward(self, x, y):
        return torch.relu(x + y)


def test_add_with_a_broadcast_operand_fuses():
    x, y = r(1, 8, 4, 4, seed=1), r(1, 8, 1, 1, seed=2)
    plan = texelflow.plan(tf_quantize(BroadcastAdd(), x, y), (x, y))
    assert plan.fallbacks == []
    assert plan.dispatches == {"quantize_per_tensor": 2, "q8ta_add": 1, "dequantize_per_tensor": 1}
    (add,) = fused(plan, "q8ta_add")
    assert add.arg("other").shape == (1, 8, 1, 1) and add.arg("activation") == "relu"


def test_a_dequantize_with_a_float_reader_becomes_a_round_trip_beside_the_q8ta_op():
    class TwoReaders(Int8Weights):
        def __init__(self):
            super().__init__()
            self.add("l1", (16, 16))

        def forward(self, x):
            h = qdq(x, P1)
            return dq(q(F.linear(h, self.weight("l1")), P2), P2), torch.sigmoid(h)

    plan = texelflow.plan(TwoReaders(), (r(4, 16),))
    assert plan.fallbacks == []
    assert plan.dispatches == {"quantize_per_tensor": 1, "q8ta_linear": 1, "dequantize_per_tensor": 1,
                               "quantize_dequantize": 1, "sigmoid": 1}
    (lin,), (trip,), (quant,) = fused(plan, "q8ta_linear"), fused(plan, "quantize_dequantize"), fused(plan, "quantize_per_tensor")
    assert lin.arg("input") is quant.outputs[0][1]  # the quantize stays for the q8ta linear
    assert trip.arg("self") is quant.arg("input") and [u.op.name for u in trip.outputs[0][1].users] == ["sigmoid"]


class ThreeFloatReaders(nn.Module):
    """One quantized tensor, each of its three float readers through a dequantize of its own (as
    convert_pt2e leaves it), a reader between two of the dequantizes."""

    def forward(self, x):
        t = q(torch.tanh(x), P1)
        s = torch.sigmoid(dq(t, P1)) * 2
        a, b = dq(t, P1), dq(t, P1)
        return s, torch.exp(a) + torch.sin(b)


def test_round_trips_of_one_quantize_are_one_pass(device):
    """The readers of one quantize's dequantizes share one quantize_dequantize."""
    x = r(2, 3, 5, 7, seed=3)
    model = ThreeFloatReaders()
    plan = texelflow.plan(model, (x,))
    assert plan.fallbacks == [] and plan.dispatches["quantize_dequantize"] == 1
    assert "quantize_per_tensor" not in plan.dispatches and "dequantize_per_tensor" not in plan.dispatches
    (trip,) = fused(plan, "quantize_dequantize")
    assert sorted(u.op.name for u in trip.outputs[0][1].users) == ["exp", "sigmoid", "sin"]
    order = [n.op.name for n in plan.graph.nodes]
    assert order.index("quantize_dequantize") < min(order.index(k) for k in ("exp", "sigmoid", "sin"))
    with texelflow.compile(model, (x,), device=device) as prog:
        got = prog(x)
    for g, w in zip(got, model(x)):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


# ---- identity ops keep int8 flowing -------------------------------------------------------------
@pytest.mark.parametrize("requantize", [True, False])
def test_a_view_between_two_q8ta_linears_folds(requantize):
    plan = texelflow.plan(ViewBetweenLinears(requantize), (r(8, 16),))
    assert plan.fallbacks == []
    assert plan.num_transitions == 0
    assert plan.dispatches == {"quantize_per_tensor": 1, "q8ta_linear": 2, "dequantize_per_tensor": 1}
    (view,) = [n for n in plan.graph.nodes if n.op.name == "view_copy"]
    assert view.folded and view.outputs[0][1].dtype == "int8"
    first, second = fused(plan, "q8ta_linear")
    assert view.arg("self") is first.outputs[0][1] and second.arg("input") is view.outputs[0][1]


def test_quantizer_graph_reaches_the_int8_view():
    class LinearViewLinear(nn.Module):
        def __init__(self):
            super().__init__()
            self.l1, self.l2 = nn.Linear(16, 16), nn.Linear(16, 8)

        def forward(self, x):
            return self.l2(self.l1(x).view(1, 8, 16))

    x = r(8, 16)
    plan = texelflow.plan(tf_quantize(LinearViewLinear(), x), (x,))
    assert plan.fallbacks == [] and plan.num_transitions == 0
    assert plan.dispatches == {"quantize_per_tensor": 1, "q8ta_linear": 2, "dequantize_per_tensor": 1}


def test_clones_around_a_fused_pixel_shuffle_fold():
    """The decoder shape of the issue: no identity clone is dispatched around the pixel shuffle."""
    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.c2 = nn.Conv2d(8, 32, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)

        def forward(self, x):
            y = F.pixel_shuffle(torch.relu(self.c1(x)).clone(), 2).clone()
            return self.c2(y)

    x = r(1, 8, 8, 8)
    plan = texelflow.plan(tf_quantize(Decoder(), x), (x,))
    assert plan.fallbacks == [] and plan.num_transitions == 0
    assert plan.dispatches == {"quantize_per_tensor": 1, "q8ta_conv2d_im2col": 2, "q8ta_pixel_shuffle": 1,
                               "dequantize_per_tensor": 1}
    clones = [n for n in plan.graph.nodes if n.op.name == "clone"]  # (the permute passes may drop them)
    assert all(n.folded and n.outputs[0][1].dtype == "int8" for n in clones)


def test_different_parameters_around_a_view_keep_the_requantization():
    class Requantized(nn.Module):
        def forward(self, x):
            return dq(q(dq(q(x, P1), P1).view(4, 16), P2), P2)

    plan = texelflow.plan(Requantized(), (r(2, 32),))  # both quantizations stay, each one float pass
    assert dict(plan.dispatches) == {"quantize_dequantize": 2}, plan.dispatches
    assert [(n.arg("scale"), n.arg("zero_point")) for n in fused(plan, "quantize_dequantize")] == [P1, P2]


# ---- graphs from another quantizer: uint8 activations ------------------------------------------------
class TwoConvs(nn.Module):
    """conv + relu -> conv: X86InductorQuantizer quantizes the first conv's output (uint8) for the second."""

    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(4, 8, 3, padding=1), nn.Conv2d(8, 8, 1)

    def forward(self, x):
        return self.conv2(torch.relu(self.conv1(x)))


def test_x86_uint8_graph_is_shifted_to_int8_and_fused():
    x = r(1, 4, 8, 8)
    qmodel = x86_quantize(TwoConvs(), x)
    zero_points = [n.args[2] for n in qmodel.graph.nodes if n.target == qd.quantize_per_tensor.default]
    plan = texelflow.plan(qmodel, (x,))
    assert plan.fallbacks == []
    (quant,) = fused(plan, "quantize_per_tensor")
    assert quant.outputs[0][1].dtype == "int8" and str(quant.arg("dtype")) == "torch.int8"
    assert quant.arg("zero_point") == zero_points[0] - 128
    assert (quant.arg("quant_min"), quant.arg("quant_max")) == (-128, 127)
    (conv,) = fused(plan, "q8ta_conv2d_im2col")
    assert conv.arg("activation") == "relu"
    assert (conv.arg("input_zero_point"), conv.arg("out_zero_point")) == (zero_points[0] - 128, zero_points[1] - 128)
    assert (conv.arg("quant_min"), conv.arg("quant_max")) == (-128, 127)


def test_x86_float_ops_with_quantized_weights_run_on_the_device():
    """X86InductorQuantizer leaves linear's output float: the linear runs on Vulkan with the
    weight dequantized into a derived float constant when the program prepacks."""
    x = r(4, 16)
    plan = texelflow.plan(x86_quantize(Linear(16, 8), x), (x,))
    assert plan.fallbacks == []
    (lin,) = fused(plan, "linear_packed")  # a constant weight: prepacked for the tiled kernel
    w = lin.arg("weight").derive.sources[0]
    assert w.dtype == "float32" and w.derive.recipe == "dequantized_per_channel"


def test_an_unfused_addmm_reads_its_transposed_quantized_weight_as_a_constant():
    """The float addmm (x @ W + b, W the transposed dequantized weight, a constant) then takes the
    packed linear, W prepacked as it stands."""
    plan = texelflow.plan(FloatAddmm(), (r(4, 16),))
    assert plan.fallbacks == []
    assert plan.dispatches == {"quantize_dequantize": 1, "linear_packed": 1}
    (linear,) = fused(plan, "linear_packed")
    packed = linear.arg("weight")
    assert packed.derive.recipe == "matmul_weight_kn"
    w = packed.derive.sources[0]
    assert w.shape == (16, 24) and w.derive.recipe == "transposed"
    assert w.derive.sources[0].derive.recipe == "dequantized_per_channel"


def test_uint8_quantize_read_by_the_graph_output_is_not_shifted():
    class QuantizedOut(nn.Module):
        def forward(self, x):
            return qd.quantize_per_tensor.default(x, 0.1, 128, 0, 255, torch.uint8)

    plan = texelflow.plan(QuantizedOut(), (r(4, 16),))
    (node,) = plan.graph.nodes
    assert node.outputs[0][1].dtype == "uint8" and node.fallback is not None  # the user gets uint8 back


# ---- lowering: overloads, run-time parameters, weights -------------------------------------------
def test_tensor_overloads_with_constant_parameters_become_the_registry_ops():
    class TensorParams(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("scale", torch.tensor(0.05))
            self.register_buffer("zero_point", torch.tensor(3))

        def forward(self, x):
            y = qd.quantize_per_tensor.tensor(x, self.scale, self.zero_point, -128, 127, torch.int8)
            return qd.dequantize_per_tensor.tensor(y, self.scale, self.zero_point, -128, 127, torch.int8)

    plan = texelflow.plan(TensorParams(), (r(4, 16),))
    assert plan.fallbacks == []
    assert plan.dispatches == {"quantize_dequantize": 1}  # the pair, as one round trip
    quant = fused(plan, "quantize_dequantize")[0]
    assert (quant.arg("scale"), quant.arg("zero_point")) == (pytest.approx(0.05), 3)


def test_parameters_computed_at_run_time_run_on_the_cpu_with_a_reason():
    """Dynamic quantization's round trip runs on the device (tests/quantization/
    test_dynamic_quantization.py), but not an int8 tensor or parameters read elsewhere."""
    class Dynamic(nn.Module):
        def forward(self, x):
            scale, zero_point = qd.choose_qparams.tensor(x, -128, 127, 1e-5, torch.int8)
            y = qd.quantize_per_tensor.tensor(x, scale, zero_point, -128, 127, torch.int8)
            return qd.dequantize_per_tensor.tensor(y, scale, zero_point, -128, 127, torch.int8), y

    plan = texelflow.plan(Dynamic(), (r(4, 16),))
    reasons = dict(plan.fallbacks)
    assert "computed at run time" in reasons["quantize_per_tensor"]
    assert "computed at run time" in reasons["dequantize_per_tensor"]
    assert "dynamic_quantize_dequantize" not in plan.dispatches


def test_per_channel_dequantize_of_a_computed_tensor_runs_on_the_cpu_with_a_reason():
    class Computed(nn.Module):
        def forward(self, x):
            y = qd.quantize_per_channel.default(x, torch.full((4,), 0.1), torch.zeros(4, dtype=torch.int64), 0,
                                                -128, 127, torch.int8)
            return qd.dequantize_per_channel.default(y, torch.full((4,), 0.1), torch.zeros(4, dtype=torch.int64), 0,
                                                     -128, 127, torch.int8)

    reasons = dict(texelflow.plan(Computed(), (r(4, 16),)).fallbacks)
    assert "a tensor computed at run time" in reasons["quantize_per_channel"]
    assert "a tensor computed at run time" in reasons["dequantize_per_channel"]


def test_uint8_weights_are_shifted_and_an_int32_bias_dequantized():
    plan = texelflow.plan(Uint8Weight(), (r(4, 16),))
    assert plan.fallbacks == []
    (lin,) = fused(plan, "q8ta_linear")
    w, zp, bias = lin.arg("weight"), lin.arg("weight_zero_points"), lin.arg("bias")
    assert w.dtype == "int8" and w.derive.recipe == "shifted" and dict(w.derive.params) == {"by": -128}
    assert zp.dtype == "int32" and zp.derive.recipe == "shifted"
    assert bias.dtype == "float32" and bias.derive.recipe == "dequantized_per_channel"


class PerTensorWeight(nn.Module):
    """A linear whose int8 weight has one scale (float64 per-channel scales elsewhere: `Float64Scales`)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("w", torch.randint(-127, 128, (8, 16), dtype=torch.int8,
                                                generator=torch.Generator().manual_seed(12)))

    def forward(self, x):
        w = qd.dequantize_per_tensor.default(self.w, 0.01, 0, -127, 127, torch.int8)
        return dq(q(F.linear(qdq(x, P1), w), P2), P2)


class Float64Scales(ChainedLinears):
    """ChainedLinears with float64 weight scales."""

    def __init__(self):
        super().__init__(symmetric=False)
        for name in ("l1", "l2"):
            setattr(self, f"{name}_scales", getattr(self, f"{name}_scales").double())


def unfolded_quantize(model, *inputs):
    """texelflow's quantizer with convert_pt2e(fold_quantize=False): the weights stay float constants
    that a quantize_per_channel node quantizes, ahead of their dequantize."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    prepared = prepare_pt2e(torch.export.export(model.eval(), inputs).module(), texelflow.Quantizer(observer="minmax"))
    with torch.no_grad():
        prepared(*inputs)
    return convert_pt2e(prepared, fold_quantize=False)


def test_per_tensor_weights_get_scales_for_every_channel():
    plan = texelflow.plan(PerTensorWeight(), (r(4, 16),))
    (lin,) = fused(plan, "q8ta_linear")
    scales = lin.arg("weight_scales")
    assert scales.shape == (8,) and scales.derive.recipe == "filled" and lin.arg("weight_zero_points") is None


def test_float64_scales_and_int64_zero_points_become_float32_and_int32():
    plan = texelflow.plan(Float64Scales(), (r(4, 16),))
    assert plan.fallbacks == []
    for lin in fused(plan, "q8ta_linear"):
        scales, zp = lin.arg("weight_scales"), lin.arg("weight_zero_points")
        assert scales.dtype == "float32" and scales.derive.recipe == "reshaped"
        assert zp.dtype == "int32"  # (lowering holds the int64 buffer narrowed)


def test_weights_quantized_in_the_graph_are_quantized_when_the_program_prepacks():
    x = r(4, 16)
    qmodel = unfolded_quantize(Linear(16, 8), x)
    assert any(n.target == qd.quantize_per_channel.default for n in qmodel.graph.nodes)
    plan = texelflow.plan(qmodel, (x,))
    assert plan.fallbacks == []
    (lin,) = fused(plan, "q8ta_linear")
    assert lin.arg("weight").dtype == "int8" and lin.arg("weight").derive.recipe == "quantized_per_channel"


# ---- bad parameters: one clear line at plan time ------------------------------------------------------
@pytest.mark.parametrize("params, message", [
    (dict(scale=0.0), "quantize_per_tensor: scale 0.0 must be positive and finite"),
    (dict(scale=-0.5), "quantize_per_tensor: scale -0.5 must be positive and finite"),
    (dict(scale=float("inf")), "quantize_per_tensor: scale inf must be positive and finite"),
    (dict(zero_point=200),
     "quantize_per_tensor: zero_point 200 must be an integer in [quant_min, quant_max] = [-128, 127]"),
    (dict(dtype=torch.int16, quant_min=-32768, quant_max=32767), "quantize_per_tensor: dtype int16 is not supported"),
    (dict(dtype=torch.int32, quant_min=-(2**31), quant_max=2**31 - 1),
     "quantize_per_tensor: dtype int32 is not supported"),
    (dict(quant_min=-300),
     "quantize_per_tensor: quant_min / quant_max [-300, 127] must be an ordered range inside int8's"),
    (dict(dtype=torch.uint8, quant_min=0, quant_max=256, zero_point=0),
     "quantize_per_tensor: quant_min / quant_max [0, 256] must be an ordered range inside uint8's [0, 255]"),
    (dict(quant_min=10, quant_max=5, zero_point=7), "quantize_per_tensor: quant_min / quant_max [10, 5]"),
])
def test_bad_per_tensor_parameters_are_refused_at_plan_time(params, message):
    with pytest.raises(QuantizationError) as info:
        texelflow.plan(QDQ(**params), (r(4, 16),))
    assert str(info.value).startswith(message) and "\n" not in str(info.value)
    assert isinstance(info.value, UnsupportedModelError) and isinstance(info.value, ValueError)


@pytest.mark.parametrize("scales, zero_points, extra, message", [
    ([0.1, 0.0, 0.1], [0, 0, 0], {}, "dequantize_per_channel: scales[1] 0.0 must be positive and finite"),
    ([0.1, 0.1, float("nan")], [0, 0, 0], {}, "dequantize_per_channel: scales[2] nan must be positive and finite"),
    ([0.1, 0.1, 0.1], [0, 0, 200], {}, "dequantize_per_channel: zero_points[2] 200.0 must be an integer in"),
    ([0.1, 0.1, 0.1], [0, 0, 0], dict(dtype=torch.int16, quant_min=-32768, quant_max=32767),
     "dequantize_per_channel: dtype int16 is not supported"),
])
def test_bad_per_channel_parameters_are_refused_at_plan_time(scales, zero_points, extra, message):
    with pytest.raises(QuantizationError, match="^" + message.replace("[", r"\[").replace("]", r"\]")):
        texelflow.plan(PerChannel(scales, zero_points, **extra), (r(4, 16),))


def test_hardtanh_and_relu6_become_the_fused_ops_output_range():
    """quantize(hardtanh(y, lo, hi)) == clamp(quantize(y), quantize(lo), quantize(hi)): the fused
    op gets the narrower range and no activation of its own."""
    x = r(1, 8, 5, 6)
    plan = texelflow.plan(ClampedActivations(), (x,))
    assert plan.fallbacks == []
    (conv,) = fused(plan, "q8ta_conv2d_im2col")
    assert conv.arg("activation") == "none" and any("hardtanh" in f for f in conv.fused)
    # P1 = (0.02, 3): -0.3 -> round(-15) + 3 = -12, 0.5 -> 25 + 3 = 28
    assert (conv.arg("quant_min"), conv.arg("quant_max")) == (-12, 28)


def test_a_linear_summing_more_products_than_int32_holds_stays_float():
    """K = 33,026 int8 products of up to 255 * 255 could overflow q8ta_linear's int32 sums: the
    chain is left unfused (the float linear runs on its dequantized weight), never wrong."""
    x = r(2, 33026)
    plan = texelflow.plan(tf_quantize(Linear(33026, 2), x), (x,))
    assert plan.fallbacks == []
    assert "q8ta_linear" not in plan.dispatches and plan.dispatches["linear_packed"] == 1


class ConvPoolConv(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(4, 8, 3, padding=1), nn.Conv2d(8, 8, 1)

    def forward(self, x):
        return self.c2(F.max_pool2d(torch.relu(self.c1(x)), 3, stride=2, padding=1))


class PoolRequantized(nn.Module):
    """dq(P1) -> max_pool2d -> q(P2): another quantization after the pool, so it stays float."""

    def forward(self, x):
        return dq(q(F.max_pool2d(qdq(x, P1), 2), P2), P2)


def test_max_pool2d_between_one_quantization_runs_on_the_integers():
    x = r(1, 4, 9, 7)
    plan = texelflow.plan(tf_quantize(ConvPoolConv(), x), (x,))
    assert plan.fallbacks == []
    assert plan.dispatches["q8ta_max_pool2d"] == 1 and "max_pool2d" not in plan.dispatches
    (pool,) = fused(plan, "q8ta_max_pool2d")
    assert pool.arg("self").dtype == "int8" and pool.arg("padding") == [1, 1]
    assert plan.dispatches["quantize_per_tensor"] == 1 and plan.dispatches["dequantize_per_tensor"] == 1


def test_max_pool2d_with_another_quantization_after_stays_float():
    x = r(1, 4, 6, 6)
    plan = texelflow.plan(PoolRequantized(), (x,))
    assert plan.dispatches["max_pool2d"] == 1 and "q8ta_max_pool2d" not in plan.dispatches
