"""Issue 10: reductions, softmax, adaptive pooling and group norm through torch.export.

The kernel test (tests/kernels/test_registry_ops.py) runs each op alone in every representation;
here whole exported models run: the training-IR targets torch.export emits (mean.dim, softmax.int,
group_norm, ...) and their decomposed forms (_softmax, native_group_norm, ...), both on Vulkan with
no fallback, and the arguments the kernels cannot take, each sent to the CPU with its reason.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import texelflow

from .models import Call


class Reductions(torch.nn.Module):
    """Every reduction form: all dims (no dim argument, None, []), several dims, keepdim."""

    def forward(self, x):
        return (x.mean(), x.sum(), x.amax(), x.amin(),
                x.mean((-1, -2), keepdim=True), x.sum(dim=[0, 2]), x.amax(dim=1), x.amin(dim=(1, 3), keepdim=True),
                torch.mean(x, dim=None, keepdim=True), torch.amax(x, dim=[]))


class Head(torch.nn.Module):
    """Group norm, squeeze-excite style global pooling, adaptive pooling and classifier softmaxes."""

    def __init__(self, affine=True):
        super().__init__()
        self.gn = torch.nn.GroupNorm(3, 6, affine=affine)
        self.gn_one = torch.nn.GroupNorm(1, 6)
        self.gn_each = torch.nn.GroupNorm(6, 6)
        self.pool = torch.nn.AdaptiveAvgPool2d(1)
        self.pool_general = torch.nn.AdaptiveAvgPool2d((3, 2))

    def forward(self, x):
        a = self.gn(x)
        squeeze = self.pool(a)
        logits = self.pool_general(self.gn_one(x) + self.gn_each(x)).flatten(1)
        return squeeze, F.softmax(logits, dim=-1), F.log_softmax(logits, dim=-1), F.softmax(x, dim=1)


def _check(device, model, x, decompose):
    ep = torch.export.export(model, (x,))
    if decompose:
        ep = ep.run_decompositions()
    with texelflow.compile(ep, (x,), planner="greedy", device=device) as prog:
        got = prog(x)
        fallbacks = prog.plan.fallbacks
    want = model(x)
    assert fallbacks == []
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    return ep


@pytest.mark.parametrize("decompose", [False, True], ids=["training-ir", "decomposed"])
def test_reductions_on_vulkan_match_torch(device, decompose):
    _check(device, Reductions(), torch.randn(2, 3, 5, 7), decompose)


@pytest.mark.parametrize("decompose", [False, True], ids=["training-ir", "decomposed"])
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "no-weights"])
def test_norm_pool_softmax_on_vulkan_match_torch(device, decompose, affine):
    torch.manual_seed(0)
    model = Head(affine).eval()
    if affine:
        with torch.no_grad():
            model.gn.weight.uniform_(0.5, 2.0)
            model.gn.bias.uniform_(-1.0, 1.0)
    ep = _check(device, model, torch.randn(2, 6, 7, 5) + 1.0, decompose)
    targets = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    if decompose:
        expected = {"aten.native_group_norm.default", "aten._softmax.default", "aten._log_softmax.default",
                    "aten._adaptive_avg_pool2d.default"}
    else:
        expected = {"aten.group_norm.default", "aten.softmax.int", "aten.log_softmax.int",
                    "aten.adaptive_avg_pool2d.default"}
    assert expected <= targets


def test_global_average_pool_of_a_classifier_head(device):
    """The MobileNetV3 / ResNet head: [1, 576, 7, 7] averaged to [1, 576, 1, 1]."""
    model = torch.nn.AdaptiveAvgPool2d(1)
    _check(device, model, torch.randn(1, 576, 7, 7), decompose=False)


@pytest.mark.parametrize("fn,shape,reason", [
    (lambda x: torch.mean(x, dim=1, dtype=torch.float64), (2, 3, 5), "dtype float64"),
    (lambda x: torch.sum(x, dim=(0, 1), dtype=torch.float64), (2, 3, 5), "dtype float64"),
    (lambda x: torch.sum(x, dim=(0, 1, 3), dtype=torch.float64), (2, 3, 2, 4, 5), "dtype float64"),
], ids=["mean-dtype", "sum-dtype", "sum-dtype-rank5"])
def test_unsupported_arguments_fall_back_with_reason(device, fn, shape, reason):
    x = torch.randn(*shape)
    model = Call(fn)
    with texelflow.compile(model, (x,), planner="greedy", device=device) as prog:
        got = prog(x)
        reasons = [r for _, r in prog.plan.fallbacks]
    assert any(reason in r for r in reasons), reasons
    torch.testing.assert_close(got, fn(x))


RANK5_REDUCTIONS = {
    "mean_thw": lambda x: x.mean((2, 3, 4)),  # a video model's global pooling of [B, C, T, H, W]
    "sum_last_keepdim": lambda x: x.sum(-1, keepdim=True),
    "amax_dim1": lambda x: x.amax(1),
    "amin_interleaved": lambda x: x.amin((0, 2, 4)),  # 5 runs: the reduced dims permuted last
    "var_mean_interleaved": lambda x: torch.var_mean(x, (0, 2, 4), keepdim=True),
    "std": lambda x: x.std((1, 2)),
    "mean_all": lambda x: x.mean(),
    "vector_norm": lambda x: x.norm(dim=1),
    "logsumexp": lambda x: x.logsumexp(2),
    "prod": lambda x: (x * 0.1 + 1).prod(3),
    "max_argmax": lambda x: (x.max(dim=0)[0], x.argmax(-2)),
    "size1_dims": lambda x: x[:, :1].sum((1, 3)),
    "rank6": lambda x: x.reshape(2, 3, 2, 2, 5, 6).mean((3, 4)),
    "cumsum": lambda x: x.cumsum(1),
    "logcumsumexp": lambda x: x.logcumsumexp(0),
    "softmax_dim0": lambda x: F.softmax(x, dim=0),
    "log_softmax_dim1": lambda x: F.log_softmax(x, dim=1),
}


@pytest.mark.parametrize("name", sorted(RANK5_REDUCTIONS))
def test_rank5_reductions_and_scans_merge_dims_on_the_device(device, name):
    """Reductions, running ops and softmaxes of rank 5+ tensors, which the kernels take only up
    to rank 4: lowering merges neighbouring reduced (or kept) dims by reshapes (lowering's
    _merged_dims), so every node runs on the device, NaN and Inf as torch spreads them."""
    fn = RANK5_REDUCTIONS[name]
    x = torch.randn(2, 3, 4, 5, 6)
    x[0, 1, 2, 3, 4], x[1, 2, 3, 4, 5] = float("nan"), float("inf")
    with texelflow.compile(Call(fn), (x,), device=device) as prog:
        assert prog.plan.fallbacks == [], prog.plan.fallbacks
        got = prog(x)
    want = fn(x)
    got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5, equal_nan=True)


def test_softmax_rank5_along_an_unfolded_dim_stays_on_device(device):
    x = torch.randn(2, 3, 2, 4, 5)
    model = Call(lambda t: F.softmax(t, dim=2))
    with texelflow.compile(model, (x,), planner="greedy", device=device) as prog:
        got = prog(x)
        assert prog.plan.fallbacks == []
    torch.testing.assert_close(got, F.softmax(x, dim=2))


class ArgExtremes(torch.nn.Module):
    """argmax / argmin and max / min along a dim: int64 indices computed on the device in int32,
    held narrowed (returned as int64), NaN the extreme and the first tie winning, as torch."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(7, 3)  # indices feeding a device op, not only returned

    def forward(self, x, i):
        v, ix = x.max(-1)
        w, iw = torch.min(x, 1, keepdim=True)
        return (x.argmax(), x.argmax(-1), x.argmin(0, keepdim=True), v, ix, w, iw, i.argmax(1), i.argmin(),
                i.long(), self.table(x.argmax(-1)))


def test_arg_extremes_run_on_the_device_with_int64_indices(device):
    x = torch.randn(3, 5, 7)
    x[0, 1, 2] = x[0, 3, 4] = float("nan")
    x[1, 2, :3] = 5.0
    x[2] = -1.0
    i = torch.randint(-5, 5, (4, 6), dtype=torch.int32)
    model = ArgExtremes()
    want = model(x, i)
    prog = texelflow.compile(model, (x, i), device=device)
    try:
        assert prog.plan.fallbacks == []
        got = prog(x, i)
    finally:
        prog.close()
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, (g, w)
        torch.testing.assert_close(g, w, equal_nan=True, rtol=0, atol=0)


def test_int64_arithmetic_on_indices_runs_on_the_cpu_with_torchs_values(device):
    """An int64 value computed from narrowed indices (`argmax + 1`) is computed on the CPU, on int64."""
    x = torch.randn(2, 9)
    fn = Call(lambda t: t.argmax(-1) * 3_000_000_000)
    prog = texelflow.compile(fn, (x,), device=device)
    try:
        assert [name for name, _ in prog.plan.fallbacks] == ["mul"]
        torch.testing.assert_close(prog(x), x.argmax(-1) * 3_000_000_000, rtol=0, atol=0)
    finally:
        prog.close()
