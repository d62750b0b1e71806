"""The fusion pass (runtime/graph/fusion.py) on real models: conv + batch norm folding into derived
constants, conv + activation into one conv2d_act dispatch, the cases that must not fuse, and the
user's model left as it was. Plans need no device; numerics run on the session's Vulkan device."""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import texelflow
from texelflow.runtime.graph.ir import Role
from texelflow.runtime.graph.fusion import PREPACKS, fusion_op_name

# the device tests below name the specialised conv kernels: keep them on a GPU too
pytestmark = pytest.mark.usefixtures("register_tiles")

ACTIVATIONS = {
    "relu": nn.ReLU(),
    "relu6": nn.ReLU6(),
    "hardtanh": nn.Hardtanh(-0.5, 2.0),
    "hardswish": nn.Hardswish(),
    "silu": nn.SiLU(),
    "gelu": nn.GELU(),
    "gelu_tanh": nn.GELU(approximate="tanh"),
    "hardsigmoid": nn.Hardsigmoid(),
}


class ConvBn(nn.Module):
    def __init__(self, cin=3, cout=5, groups=1, bias=True, act=None):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1, groups=groups, bias=bias)
        self.bn = nn.BatchNorm2d(cout)
        self.act = act if act is not None else nn.Identity()
        with torch.no_grad():  # statistics far from the (0, 1) defaults, so folding shows
            g = torch.Generator().manual_seed(cout)
            self.bn.running_mean.copy_(torch.randn(cout, generator=g))
            self.bn.running_var.copy_(torch.rand(cout, generator=g) * 2 + 0.2)
            self.bn.weight.copy_(torch.randn(cout, generator=g))
            self.bn.bias.copy_(torch.randn(cout, generator=g))

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class ConvBnTwoUsers(ConvBn):
    """The conv output is also returned: folding would change it, so nothing is folded."""

    def forward(self, x):
        y = self.conv(x)
        return self.bn(y), y


class ConvAct(nn.Module):
    def __init__(self, act, cin=5, cout=7, groups=1):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, stride=2, padding=1, groups=groups)
        self.act = act

    def forward(self, x):
        return self.act(self.conv(x))


def _generic(node) -> str:
    """These tests are about what fuses; test_conv_kernels.py is about which kernel is chosen."""
    return fusion_op_name(node)


def _ops(plan) -> list[str]:
    return [_generic(n) for n in plan.graph.device_nodes() if not n.transition]


def _fusions(node) -> list[str]:
    """What was fused into a node (its notes, less the kernel choice of step 6)."""
    return [note for note in node.fused if " kernel (from " not in note]


def _dispatches(plan) -> Counter:
    """plan.dispatches by fusion op (_generic)."""
    return Counter(_generic(n) for n in plan.graph.device_nodes() if not n.folded)


def _folded_recipe(v) -> str:
    """The recipe of a derived weight before a kernel's prepack (runtime/graph/prepack_conv.py)."""
    prepacks = {recipe for recipe, _ in PREPACKS.values()}
    while v.derive is not None and v.derive.recipe in prepacks:
        v = v.derive.sources[0]
    return v.derive.recipe if v.derive is not None else None


def _run(device, model, x):
    with texelflow.compile(model, (x,), device=device) as prog:
        return prog(x), prog


def _close(got, want, rtol=1e-4):
    scale = want.abs().max().clamp_min(1e-6)
    assert ((got - want).abs().max() / scale) <= rtol, f"max relative error {((got - want).abs().max() / scale):.2e}"


def _params(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("groups,bias,op", [(1, True, "conv2d"), (1, False, "conv2d"), (5, True, "conv2d_dw")])
def test_conv_bn_folds_into_one_conv(device, groups, bias, op):
    model = ConvBn(cin=5 if groups == 5 else 3, cout=5, groups=groups, bias=bias).eval()
    x = torch.randn(2, model.conv.in_channels, 7, 6)
    before = _params(model)
    plan = texelflow.plan(model, (x,))
    assert _ops(plan) == [op], plan.summary()
    conv = plan.graph.device_nodes()[0]
    assert all(n.op is None or n.op.name != "batch_norm" for n in plan.graph.nodes)
    weight, b = conv.arg("weight"), conv.arg("bias")
    assert weight.role is Role.CONST and _folded_recipe(weight) == "bn_folded_conv_weight"
    assert b is not None and _folded_recipe(b) == "bn_folded_conv_bias"
    assert "batch_norm" in plan.summary() and "folded" in plan.summary()
    got, prog = _run(device, model, x)
    assert _dispatches(prog.plan) == {op: 1}
    _close(got, model(x))
    for k, v in model.state_dict().items():  # the user's model is untouched
        assert torch.equal(v, before[k]), k


def test_conv_bn_with_a_second_user_is_not_folded(device):
    model = ConvBnTwoUsers().eval()
    x = torch.randn(1, 3, 6, 5)
    plan = texelflow.plan(model, (x,))
    assert sorted(_ops(plan)) == ["conv2d", "scale_shift"], plan.summary()
    assert not any(_fusions(n) for n in plan.graph.nodes if n.op.name == "conv2d")
    (got_bn, got_conv), prog = _run(device, model, x)
    assert prog.plan.dispatches["scale_shift"] == 1
    want_bn, want_conv = model(x)
    _close(got_bn, want_bn)
    _close(got_conv, want_conv)


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
@pytest.mark.parametrize("op", ["conv2d_act", "conv2d_dw_act"])
def test_conv_activation_is_one_dispatch(device, name, op):
    groups = 5 if op == "conv2d_dw_act" else 1
    model = ConvAct(copy.deepcopy(ACTIVATIONS[name]), cout=7 if groups == 1 else 5, groups=groups).eval()
    x = torch.randn(2, 5, 9, 7) * 2
    got, prog = _run(device, model, x)
    assert _dispatches(prog.plan) == {op: 1}, prog.plan.summary()
    assert not prog.plan.fallbacks, prog.plan.fallbacks
    (node,) = prog.plan.graph.device_nodes()
    assert node.fused and _generic(node) == op
    _close(got, model(x))


def test_depthwise_conv_gets_its_own_kernel(device):
    model = nn.Sequential(nn.Conv2d(6, 6, 5, stride=2, padding=2, groups=6), nn.Conv2d(6, 6, 3, groups=3)).eval()
    x = torch.randn(1, 6, 11, 13)
    got, prog = _run(device, model, x)
    assert _dispatches(prog.plan) == {"conv2d_dw": 1, "conv2d": 1}, prog.plan.summary()
    _close(got, model(x))


def test_conv_bn_act_folds_and_fuses(device):
    model = ConvBn(cin=4, cout=7, act=nn.ReLU6()).eval()
    x = torch.randn(1, 4, 8, 8)
    got, prog = _run(device, model, x)
    assert _dispatches(prog.plan) == {"conv2d_act": 1}, prog.plan.summary()
    (node,) = prog.plan.graph.device_nodes()
    assert node.arg("weight").derive is not None and node.arg("activation") == "hardtanh"
    assert len(_fusions(node)) == 2
    _close(got, model(x))


@pytest.mark.parametrize("norm,shape", [(nn.BatchNorm1d(7), (3, 7, 5)), (nn.BatchNorm1d(5), (4, 5)),
                                        (nn.BatchNorm2d(21), (2, 21, 5, 3)), (nn.BatchNorm2d(8, affine=False), (1, 8, 3, 7))],
                         ids=["1d", "1d_rows", "2d_21_channels", "2d_no_affine"])
def test_batch_norm_alone_runs_as_one_multiply_add(device, norm, shape):
    """An inference batch norm no conv absorbs (after a concat, a relu) is scale_shift: its scale
    and shift computed at load, one multiply-add per element; NaN and Inf pass as torch's do."""
    model = nn.Sequential(nn.ReLU(), norm).eval()
    with torch.no_grad():
        norm.running_mean.uniform_(-1, 1)
        norm.running_var.uniform_(0.5, 2)
        if norm.affine:
            norm.weight.uniform_(-2, 2)
            norm.bias.uniform_(-1, 1)
    x = torch.randn(shape)
    x.view(-1)[1], x.view(-1)[-2] = float("nan"), float("inf")
    got, prog = _run(device, model, x)
    assert prog.plan.dispatches["scale_shift"] == 1 and "batch_norm" not in prog.plan.dispatches, prog.plan.summary()
    torch.testing.assert_close(got, model(x), rtol=1e-5, atol=1e-5, equal_nan=True)


def test_batch_norm_3d_keeps_its_kernel(device):
    """[N, C, D, H, W]: a per-channel scale would broadcast inside the dims WHCN folds into N, so
    the batch_norm kernel (which indexes the channel itself) stays."""
    model = nn.Sequential(nn.ReLU(), nn.BatchNorm3d(3)).eval()
    with torch.no_grad():
        model[1].running_var.uniform_(0.5, 2)
    x = torch.randn(2, 3, 2, 3, 5)
    got, prog = _run(device, model, x)
    assert prog.plan.dispatches["batch_norm"] == 1, prog.plan.summary()
    _close(got, model(x), 1e-5)


def test_decomposed_batch_norm_becomes_the_kernel(device):
    """An ExportedProgram after run_decompositions has _native_batch_norm_legit_no_training."""
    model = nn.Sequential(nn.ReLU(), nn.BatchNorm2d(5)).eval()
    x = torch.randn(2, 5, 3, 4)
    ep = torch.export.export(model, (x,)).run_decompositions()
    got, prog = _run(device, ep, x)
    assert prog.plan.dispatches["scale_shift"] == 1, prog.plan.summary()
    _close(got, model(x), 1e-5)


def test_decomposed_conv_bn_act_folds_and_fuses(device):
    """run_decompositions turns conv2d into aten.convolution: it still folds and fuses."""
    model = ConvBn(cin=3, cout=6, act=nn.ReLU6()).eval()  # (hardswish would decompose)
    x = torch.randn(2, 3, 7, 5)
    ep = torch.export.export(model, (x,)).run_decompositions()
    got, prog = _run(device, ep, x)
    assert _dispatches(prog.plan) == {"conv2d_act": 1}, prog.plan.summary()
    _close(got, model(x))


@pytest.mark.parametrize("kernel,phased", [(3, False), (4, True)])
def test_decomposed_transposed_convolution_becomes_the_kernel(device, kernel, phased):
    """run_decompositions turns conv_transpose2d into aten.convolution(transposed=True): it runs
    as conv_transpose2d (stride, padding, output_padding, groups, dilation kept), or, with a
    kernel a multiple of its stride, as the conv2d of its phases (runtime/graph/conv_transpose.py)."""
    model = nn.Sequential(nn.ConvTranspose2d(4, 6, kernel, stride=2, padding=1, output_padding=1, groups=2,
                                             dilation=1), nn.ReLU()).eval()
    x = torch.randn(1, 4, 5, 5)
    got, prog = _run(device, torch.export.export(model, (x,)).run_decompositions(), x)
    ops = prog.plan.dispatches
    assert prog.plan.fallbacks == [], prog.plan.summary()
    assert (ops.get("conv_transpose2d", 0), ops.get("phase_shuffle", 0)) == ((0, 1) if phased else (1, 0)), ops
    _close(got, model(x))


class TrainingBatchNorm(nn.Module):
    """Batch statistics (training=True), with or without running statistics to update."""

    def __init__(self, running: bool):
        super().__init__()
        self.register_buffer("mean", torch.zeros(3) if running else None)
        self.register_buffer("var", torch.ones(3) if running else None)

    def forward(self, x):
        return torch.nn.functional.batch_norm(x, self.mean, self.var, training=True)


class Float64BatchNormCumsum(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(4)

    def forward(self, x):
        return torch.cumsum(self.bn(x), 1)  # a CPU reader of the batch norm's output 0


def test_decomposed_batch_norm_on_the_cpu_feeds_a_cpu_node(device):
    """float64 keeps the (rewritten) batch norm on the CPU: its output still reaches cumsum."""
    model = Float64BatchNormCumsum().double().eval()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-1, 1)
    x = torch.randn(3, 4, 5, dtype=torch.float64)
    ep = torch.export.export(model, (x,)).run_decompositions()
    got, prog = _run(device, ep, x)
    assert "float64" in dict(prog.plan.fallbacks)["_native_batch_norm_legit_no_training"]
    assert torch.equal(got, model(x))


@pytest.mark.parametrize("running", [True, False])
def test_training_batch_norm_falls_back_with_a_reason(running):
    plan = texelflow.plan(TrainingBatchNorm(running), (torch.randn(2, 3, 4, 4),))
    (reason,) = [why for name, why in plan.fallbacks if name == "batch_norm"]
    assert "training=True" in reason and "\n" not in reason
    assert "batch_norm" not in plan.dispatches


class Residual(nn.Module):
    """A residual block's tail: the add of two branches, then the activation."""

    def __init__(self, act, twice=False):
        super().__init__()
        self.conv = nn.Conv2d(6, 6, 3, padding=1)
        self.act, self.twice = act, twice

    def forward(self, x):
        s = self.conv(x) + x
        y = self.act(s)
        return (y, s) if self.twice else y


@pytest.mark.parametrize("name", ["relu", "relu6", "hardtanh"])
def test_add_activation_is_one_dispatch(device, name):
    model = Residual(copy.deepcopy(ACTIVATIONS[name])).eval()
    x = torch.randn(1, 6, 7, 5) * 2
    got, prog = _run(device, model, x)
    assert _dispatches(prog.plan) == {"conv2d": 1, "add_act": 1}, prog.plan.summary()
    (add,) = [n for n in prog.plan.graph.device_nodes() if _generic(n) == "add_act"]
    assert any("fused" in f for f in add.fused), add.fused
    _close(got, model(x))


def test_add_whose_sum_is_also_read_keeps_its_activation(device):
    """The sum is an output too: it must exist, so the add and the relu stay two nodes."""
    model = Residual(nn.ReLU(), twice=True).eval()
    x = torch.randn(1, 6, 7, 5)
    (got_y, got_s), prog = _run(device, model, x)
    assert _dispatches(prog.plan) == {"conv2d": 1, "add": 1, "relu": 1}, prog.plan.summary()
    want_y, want_s = model(x)
    _close(got_y, want_y), _close(got_s, want_s)


def test_activations_add_act_cannot_take_stay_apart(device):
    model = Residual(nn.SiLU()).eval()
    x = torch.randn(1, 6, 7, 5)
    got, prog = _run(device, model, x)
    assert _dispatches(prog.plan) == {"conv2d": 1, "add": 1, "silu": 1}, prog.plan.summary()
    _close(got, model(x))


@pytest.mark.parametrize("rows,act,op", [(10, "gelu", "linear_packed"), (10, "gelu_tanh", "linear_packed"),
                                         (10, "hardsigmoid", "linear_packed"), (1, "hardswish", "linear_packed_gemv"),
                                         (1, "relu", "linear_packed_gemv"), (1, "hardsigmoid", "linear_packed_gemv")])
def test_linear_activation_is_applied_at_the_store(device, rows, act, op):
    """A transformer MLP's linear + gelu (a classifier head's linear + hardswish): the packed
    linear applies the activation as it stores, one dispatch."""
    model = nn.Sequential(nn.Linear(12, 24), copy.deepcopy(ACTIVATIONS[act]), nn.Linear(24, 5)).eval()
    x = torch.randn(rows, 12) * 2
    got, prog = _run(device, model, x)
    assert _dispatches(prog.plan) == {op: 2}, prog.plan.summary()
    first, second = [n for n in prog.plan.graph.device_nodes() if not n.transition]
    assert (first.value("activation"), second.value("activation")) == (act, "none")
    assert any("fused" in f for f in first.fused), first.fused
    _close(got, model(x))


def test_linear_whose_output_is_also_read_keeps_its_activation(device):
    class Both(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(12, 8)

        def forward(self, x):
            y = self.fc(x)
            return nn.functional.gelu(y), y

    model = Both().eval()
    x = torch.randn(6, 12)
    (got_a, got_y), prog = _run(device, model, x)
    assert _dispatches(prog.plan) == {"linear_packed": 1, "gelu": 1}, prog.plan.summary()
    want_a, want_y = model(x)
    _close(got_a, want_a), _close(got_y, want_y)


class ExpandsIntoOps(nn.Module):
    """Expands that a broadcasting op does itself (dropped), beside ones it does not (kept)."""

    def forward(self, x, m):
        normed = torch.nn.functional.normalize(x, dim=1)  # x / norm.clamp_min(eps).expand_as(x)
        masked = x * m.expand_as(x)
        chosen = torch.where(m.bool().expand(-1, -1, x.shape[2], -1), x, 0.0)
        wide = m.expand(-1, 4, -1, -1)  # a graph output: kept
        bigger = m.expand(2, 4, x.shape[2], x.shape[3]) + x.new_ones(2, 4, 1, 1)  # neither input has the sum's shape: kept
        return normed, masked, chosen, wide, bigger.relu().sum(1)


def test_expands_that_a_broadcasting_op_does_itself_are_dropped(device):
    x = torch.randn(2, 4, 5, 7)
    m = (torch.rand(2, 1, 1, 7) > 0.3).float()
    model = ExpandsIntoOps()
    plan = texelflow.plan(model, (x, m))
    assert plan.fallbacks == []
    notes = [f for node in plan.graph.nodes for f in node.fused if "broadcast by the op itself" in f]
    assert len(notes) == 3, notes
    assert plan.dispatches["expand"] == 2, plan.dispatches
    with texelflow.compile(model, (x, m), device=device) as prog:
        got = prog(x, m)
    for g, w in zip(got, model(x, m)):
        torch.testing.assert_close(g, w)


def test_an_expand_inside_whcns_folded_batch_stays(device):
    # rank 6: the op may not broadcast inside N (broadcast_foldable), so the expand it needs stays
    x = torch.randn(2, 3, 2, 3, 4, 5)
    m = torch.randn(1, 3, 1, 3, 4, 5)

    class M(nn.Module):
        def forward(self, x, m):
            return x * m.expand(2, 3, 2, 3, 4, 5)

    plan = texelflow.plan(M(), (x, m))
    assert plan.fallbacks == []
    assert plan.dispatches["expand"] >= 1, plan.dispatches
    with texelflow.compile(M(), (x, m), device=device) as prog:
        torch.testing.assert_close(prog(x, m), M()(x, m))


def _recipes(v) -> list[str]:
    """The recipes a derived constant comes from, outermost (a kernel's prepack) first."""
    chain = []
    while v is not None and v.derive is not None:
        chain.append(v.derive.recipe)
        v = v.derive.sources[0]
    return chain


class ScaledLinears(nn.Module):
    """Constant scales after linears: a layer scale [N] after an inference dropout (ConvNeXt), a
    number on either side (a query's 1 / sqrt(d)), a buffer [1, 1, N]; and scales that must stay
    muls: a run-time tensor, a [N, 1] constant (it scales rows), and a linear read elsewhere too."""

    def __init__(self, k: int, n: int):
        super().__init__()
        self.a, self.b, self.c, self.d = (nn.Linear(k, n), nn.Linear(k, n, bias=False), nn.Linear(k, n),
                                          nn.Linear(k, n))
        self.gamma = nn.Parameter(torch.randn(n))
        self.register_buffer("g3", torch.randn(1, 1, n))
        self.register_buffer("rows", torch.randn(3, 1))
        self.drop = nn.Dropout(0.25)

    def forward(self, x):
        kept = self.d(x)
        folded = self.drop(self.a(x)) * self.gamma + self.b(x) * 0.125 + 2.0 * self.c(x) + self.g3 * self.a(x)
        return folded + kept * x[..., : kept.shape[-1]] + self.b(x) * self.rows + kept * self.gamma


@pytest.mark.parametrize("k,n", [(8, 6), (13, 5), (16, 1)])
def test_a_constant_scale_after_a_linear_folds_into_its_weight(device, k, n):
    x = torch.randn(2, 3, k)
    x[0, 1, 0], x[1, 2, k - 1] = float("nan"), float("inf")
    model = ScaledLinears(k, n).eval()
    got, prog = _run(device, model, x)
    folded = [node for node in prog.plan.graph.device_nodes() if any("folded mul by" in f for f in node.fused)]
    assert len(folded) == 4, prog.plan.summary()
    assert all("column_scaled_weight" in _recipes(node.arg("weight")) for node in folded)
    assert sorted(r for node in folded for r in _recipes(node.arg("bias"))) == ["column_scaled_bias"] * 3
    assert prog.plan.dispatches["mul"] == 3, prog.plan.summary()  # the run-time, row and shared scales
    torch.testing.assert_close(got, model(x), rtol=1e-5, atol=1e-5, equal_nan=True)


class SqueezeExcite(nn.Module):
    """MobileNetV3's inverted residual tail: a squeeze-excite gate (pool, 1x1 conv, relu, 1x1 conv,
    hardsigmoid) multiplies the activations, then the projecting pointwise conv; with `shared`
    the gated tensor is also an output, with `constant` the gate is a parameter [1, C, 1, 1]."""

    def __init__(self, c: int, shared: bool = False, constant: bool = False):
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(c, 8, 1), nn.Conv2d(8, c, 1)
        self.project = nn.Conv2d(c, 6, 1)
        self.gate = nn.Parameter(torch.rand(1, c, 1, 1)) if constant else None
        self.shared = shared

    def forward(self, x):
        s = self.gate if self.gate is not None else F.hardsigmoid(self.fc2(F.relu(self.fc1(x.mean((2, 3), keepdim=True)))))
        y = x * s
        return (self.project(y), y) if self.shared else self.project(y)


@pytest.mark.parametrize("c,shape,constant", [(12, (2, 12, 7, 5), False), (9, (1, 9, 3, 1), False),
                                              (260, (1, 260, 5, 7), False), (7, (2, 7, 5, 5), True)],
                         ids=["batch2", "c9_w1", "deep", "constant_gate"])
def test_a_squeeze_excite_gate_joins_the_pointwise_conv(device, c, shape, constant):
    torch.manual_seed(c)
    model = SqueezeExcite(c, constant=constant).eval()
    x = torch.randn(shape)
    x.view(-1)[1], x.view(-1)[-2] = float("nan"), float("inf")
    got, prog = _run(device, model, x)
    assert prog.plan.dispatches["conv2d_pw_scaled"] == 1 and "mul" not in prog.plan.dispatches, prog.plan.summary()
    torch.testing.assert_close(got, model(x), rtol=1e-4, atol=1e-4, equal_nan=True)


def test_a_gated_tensor_read_elsewhere_keeps_its_mul(device):
    model = SqueezeExcite(12, shared=True).eval()
    x = torch.randn(1, 12, 5, 7)
    (got, got_y), prog = _run(device, model, x)
    assert prog.plan.dispatches["mul"] == 1 and "conv2d_pw_scaled" not in prog.plan.dispatches, prog.plan.summary()
    want, want_y = model(x)
    _close(got, want), _close(got_y, want_y)
