"""Long sums on the device are as close to the exact answer as torch's.

The kernels used to add a line's elements one after another in float32: a mean of 4096 values near
100 came out 20-25x further from float64 than torch's (whose CPU sums are pairwise, and whose
cumsum accumulates in float64), far enough to fail torch.testing's float32 tolerance. Every sum now
carries the rounding its additions drop (math.glslh tf_sum_add, Knuth's TwoSum) and adds it back
once. Each case runs in the planner's representations and in buffers, and its error against
float64 must be at most twice torch's own, plus half a float32 rounding of the result's size.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import texelflow

from .models import Call

BUFFERS = (1, 1, 1)
EPS32 = 2.0 ** -24


def _x(*shape, offset=0.0, scale=1.0, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale + offset


# name: (function, input shape, input scale); each runs centred and at a mean of 100
CASES = {
    "sum_rows": (lambda x: x.sum(-1), (6, 4096), 1.0),
    "mean_rows_keepdim": (lambda x: x.mean(-1, keepdim=True), (5, 3001), 1.0),
    "mean_map": (lambda x: x.mean((2, 3)), (2, 12, 40, 40), 1.0),
    "mean_channels": (lambda x: x.mean(1), (2, 1030, 3, 5), 1.0),
    "sum_all": (lambda x: x.sum(), (7, 1001), 1.0),
    "var_rows": (lambda x: x.var(-1), (6, 3000), 1.0),
    "std_map": (lambda x: x.std((1, 2)), (3, 50, 70), 1.0),
    "norm2_rows": (lambda x: torch.linalg.vector_norm(x, dim=-1), (6, 5000), 1.0),
    "norm1_rows": (lambda x: torch.linalg.vector_norm(x, ord=1, dim=-1), (6, 5000), 1.0),
    "logsumexp_rows": (lambda x: torch.logsumexp(x, -1), (6, 4096), 3.0),
    "layer_norm": (lambda x: F.layer_norm(x, (x.shape[-1],)), (20, 3072), 1.0),
    "layer_norm_ragged": (lambda x: F.layer_norm(x, (x.shape[-1],)), (20, 3071), 1.0),
    "softmax_rows": (lambda x: torch.softmax(x, -1), (6, 4096), 3.0),
    "softmax_channels": (lambda x: torch.softmax(x, 1), (2, 2000, 3, 5), 3.0),
    "log_softmax_rows": (lambda x: torch.log_softmax(x, -1), (6, 4097), 3.0),
    "cumsum_rows": (lambda x: x.cumsum(-1), (4, 3000), 1.0),
    "cumsum_channels": (lambda x: x.cumsum(1), (2, 2000, 5), 1.0),
}


def _relative_error(got, exact):
    return float((got.double() - exact).abs().max()) / float(exact.abs().max())


@pytest.mark.parametrize("limits", [None, BUFFERS], ids=["planned", "buffers"])
@pytest.mark.parametrize("offset", [0.0, 100.0], ids=["centred", "mean-100"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_sums_are_as_close_to_float64_as_torchs(device, name, offset, limits):
    fn, shape, scale = CASES[name]
    x = _x(*shape, offset=offset, scale=scale)
    with texelflow.compile(Call(fn), (x,), device=device, texture_limits=limits) as prog:
        assert prog.plan.fallbacks == []
        got = prog(x)
    exact = fn(x.double())
    ours, torchs = _relative_error(got, exact), _relative_error(fn(x), exact)
    assert ours <= 2 * torchs + EPS32 / 2, (ours, torchs)


def test_a_line_past_the_loop_limit_sums_as_closely(device):
    # 70,001 elements: split into blocks whose sums are summed again (tests/reliability/test_loop_limit.py)
    x = _x(3, 70_001, offset=100.0)
    fn = lambda t: t.mean(-1)  # noqa: E731
    with texelflow.compile(Call(fn), (x,), device=device) as prog:
        got = prog(x)
    exact = fn(x.double())
    ours, torchs = _relative_error(got, exact), _relative_error(fn(x), exact)
    assert ours <= 2 * torchs + EPS32 / 2, (ours, torchs)


@pytest.mark.parametrize("limits", [None, BUFFERS], ids=["planned", "buffers"])
def test_compensation_keeps_infinities_nans_and_overflow_as_torch(device, limits):
    # the compensation of a sum that met +-inf or NaN is NaN: the total must be the plain sum then
    x = _x(5, 2048)
    x[0, 7] = float("inf")
    x[1, 100] = float("-inf")
    x[2, 5] = float("nan")
    x[3, 9], x[3, 2000] = float("inf"), float("-inf")
    x[4] = 3e38  # overflows to +inf part way
    for fn in (lambda t: t.sum(-1), lambda t: t.mean(-1), lambda t: t.cumsum(-1),
               lambda t: torch.softmax(t, -1), lambda t: F.layer_norm(t, (t.shape[-1],))):
        with texelflow.compile(Call(fn), (x,), device=device, texture_limits=limits) as prog:
            got = prog(x)
        want = fn(x)
        torch.testing.assert_close(got, want, equal_nan=True, rtol=1e-5, atol=1e-5)


def test_integer_sums_stay_exact(device):
    x = torch.randint(-1000, 1000, (4, 3001), dtype=torch.int32, generator=torch.Generator().manual_seed(1))
    for fn in (lambda t: t.sum(-1, dtype=torch.int32), lambda t: t.cumsum(-1, dtype=torch.int32)):
        with texelflow.compile(Call(fn), (x,), device=device) as prog:
            assert prog.plan.fallbacks == []
            got = prog(x)
        assert torch.equal(got, fn(x))
