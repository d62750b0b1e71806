"""Bool tensors through compiled programs: comparisons give them, where and logical_not take them,
as inputs, outputs and across CPU fallbacks, with the values torch gives (issue 10).
"""
from __future__ import annotations

import torch

import texelflow

from .models import Call

NAN, INF = float("nan"), float("inf")


def _run(device, fn, *inputs, fallbacks=0):
    """Compile `fn`, check the number of CPU fallbacks, and return (texelflow's, torch's) results."""
    want = fn(*inputs)
    with torch.no_grad():
        prog = texelflow.compile(Call(fn), inputs, device=device)
    try:
        assert len(prog.plan.fallbacks) == fallbacks, prog.plan.fallbacks
        got = prog(*inputs)
    finally:
        prog.close()
    return got, want


def _same(got, want):
    got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
    for g, w in zip(got, want):
        assert g.dtype == w.dtype, (g.dtype, w.dtype)
        torch.testing.assert_close(g, w, equal_nan=True, rtol=0, atol=0)


def test_comparisons_give_torch_bools(device):
    x = torch.tensor([[NAN, INF, -INF, 0.0, -0.0, 1.5], [2.0, -1.0, 0.5, NAN, 3.0, -0.0]])
    y = torch.tensor([[NAN, INF, 0.0, -0.0, 0.0, 1.5]])

    def fn(a, b):
        return a == b, a != b, a < b, a <= b, a > b, a >= b, a == 0.0, a != 1.5, a > -1

    _same(*_run(device, fn, x, y))


def test_where_selects_with_a_computed_and_a_given_condition(device):
    x = torch.randn(2, 3, 5, 7)
    y = torch.randn(3, 1, 7)
    mask = torch.rand(5, 7) > 0.5

    def fn(a, b, m):
        picked = torch.where(a > b, a, b * 2)
        return torch.where(m, picked, a), torch.logical_not(m), torch.logical_not(a > 0)

    _same(*_run(device, fn, x, y, mask))


def test_where_with_a_scalar_side(device):
    """torch.where(c, x, 0.0) and torch.where(c, 1.5, x) export as where.ScalarOther / ScalarSelf."""
    x = torch.tensor([[NAN, INF, -INF, 0.0, -0.0, 1.5], [2.0, -1.0, 0.5, NAN, 3.0, -0.0]])

    def fn(a):
        return torch.where(a > 0, a, 0.0), torch.where(a < 1, -1.5, a)

    _same(*_run(device, fn, x))


def test_int32_comparisons_and_where(device):
    x = torch.randint(-3, 4, (3, 5), dtype=torch.int32)
    y = torch.randint(-3, 4, (5,), dtype=torch.int32)

    def fn(a, b):
        return torch.where(a >= b, a, b), a == 2, a < 0.5

    _same(*_run(device, fn, x, y))


def test_bool_from_a_cpu_fallback_feeds_the_device(device):
    """isclose has no Vulkan op: its bool result comes from the CPU into the device's `|` and where."""
    x = torch.tensor([[NAN, INF, -INF, 0.0, -0.0, 1.5], [2.0, -1.0, 0.5, NAN, 3.0, -0.0]])
    y = torch.randn(2, 6)

    def fn(a, b):
        either = torch.isclose(a, a.abs()) | (b > 0)
        return torch.where(either, a, b), either

    _same(*_run(device, fn, x, y, fallbacks=1))


def test_bool_logic(device):
    m = torch.rand(3, 5) > 0.5
    x = torch.tensor([[NAN, INF, -INF, 0.0, -0.0], [2.0, -1.0, 0.0, NAN, 3.0], [0.0, 1.0, -0.0, 0.5, 0.0]])

    def fn(c, a):
        return (c & (a > 0), c | (a < 0), c ^ (a == 0), torch.logical_and(a, a - 1), torch.logical_or(c, a > 1),
                torch.logical_xor(a, 0.5 - a))

    _same(*_run(device, fn, m, x))


def test_logic_of_mixed_dtypes_runs_on_the_device(device):
    """logical_and(float, bool): torch's decomposition casts the float to bool, which runs as a
    compare with zero (own_decompositions' to_copy; NaN is true, as in torch)."""
    m = torch.rand(3, 5) > 0.5
    x = torch.randn(3, 5)
    x[0, :3] = torch.tensor([float("nan"), 0.0, -0.0])
    got, want = _run(device, torch.logical_and, x, m, fallbacks=0)
    _same(got, want)


def test_mixed_dtype_comparison_promotes_on_the_device(device):
    """float < int32 and int32 < bool: the narrower side cast to torch's promoted dtype first
    (own_decompositions' `_promoted`; a bool to int32 as a where between 1 and 0), so both
    compares run on the device, with torch's answer."""
    x = torch.randn(3, 4)
    y = torch.randint(-2, 3, (3, 4), dtype=torch.int32)
    m = x > 0.5
    for a, b in ((x, y), (y, m)):
        with torch.no_grad():
            prog = texelflow.compile(Call(lambda p, q: p < q), (a, b), device=device)
        try:
            assert prog.plan.fallbacks == [], prog.plan.fallbacks
            _same(prog(a, b), a < b)
        finally:
            prog.close()


def test_where_of_two_dtypes_and_heaviside_promote_on_the_device(device):
    """torch.where between a float and an int, and between an int and a bool, casts the narrower
    side to the promoted dtype first (own_decompositions' `promoted_where`); heaviside decomposes
    into such a where. Every node runs on the device, with torch's answer and dtype."""
    x = torch.tensor([[NAN, INF, -INF, 0.0, -0.0, 1.5], [2.0, -1.0, 0.5, NAN, 3.0, -0.0]])
    ids = torch.tensor([[3, -2, 7, 0, 1, -5], [2, 2, -1, 4, 0, 9]], dtype=torch.int32)
    m = x > 0
    got, want = _run(device, lambda a, i: torch.where(a > 0, a, i), x, ids)
    _same(got, want)
    got, want = _run(device, lambda i, b: torch.where(i > 1, i, b), ids, m)
    _same(got, want)
    got, want = _run(device, lambda a: torch.heaviside(a, torch.tensor(0.5)), x)
    _same(got, want)


def test_any_all_and_bitwise_not_run_on_the_device(device):
    """`any` (every overload) and `all` (torch decomposes it through any) as a max of truth values,
    NaN true as in torch; `~` of bools and of int32 at its extremes; no CPU node."""
    x = torch.tensor([[[NAN, 0.0, 0.0], [0.0, -0.0, 0.0]], [[1.5, -INF, 2.0], [0.0, 3.0, 0.0]],
                      [[0.0, 0.0, 0.0], [-0.0, 0.0, 0.0]]])
    m = torch.tensor([[True, True, True, False, True], [False] * 5, [True] * 5])
    i = torch.tensor([[-2**31, 2**31 - 1, 0, -1, 7]], dtype=torch.int32)

    def fn(a, b, c):
        return (a.any(), a.any(-1), a.any(1, keepdim=True), a.any(dim=(0, 2)), a.all(), a.all(0),
                (a > 0).all(dim=-1, keepdim=True), b.any(-1), b.all(-1), b.any(dim=()), ~b, ~c, c.bitwise_not())

    _same(*_run(device, fn, x, m, i))
