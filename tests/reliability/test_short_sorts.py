"""sort, argsort, topk, kthvalue and median of float32 lines of up to 256 on the device: one
sort_lines dispatch (an insertion sort per line in one invocation), where ranking every pair
took n^2 comparisons through a dozen dispatches (100 ms for lines of 40 on lavapipe, 2-5 ms now).

The order is torch's stable one: NaN the largest, equal values (NaNs, +-0.0 and repeats) in
their order in the line, so every result is compared with torch's stable sort bit for bit,
indices included (torch leaves topk's and kthvalue's index among ties unspecified: the stable
sort's is the one texelflow gives).
"""
from __future__ import annotations

import pytest
import torch

import texelflow

from .models import Call


def _values(*shape, seed=0):
    """Random values with repeats, NaN, +-inf and signed zeros in every line."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-4, 5, shape, generator=g).float() * 0.5  # repeats
    x += torch.where(torch.rand(shape, generator=g) < 0.5, torch.randn(shape, generator=g), 0.0)
    flat = x.view(-1)
    for k, v in enumerate([float("nan"), float("inf"), float("-inf"), -0.0, 0.0, float("nan")]):
        flat[(7 * k + 3) % flat.numel()] = v
    return x


def _stable_sort(x, dim, descending=False):
    return torch.sort(x, dim=dim, descending=descending, stable=True)


CASES = {
    "sort_rows": (lambda x: _stable_sort(x, -1), (4, 7)),
    "sort_descending_channels": (lambda x: _stable_sort(x, 1, True), (2, 5, 3, 4)),
    "argsort_dim0": (lambda x: torch.argsort(x, dim=0, stable=True), (3, 5)),
    "sort_256": (lambda x: _stable_sort(x, -1), (3, 256)),
    "sort_one_long_line": (lambda x: _stable_sort(x, 0, True), (200,)),
    "topk_largest": (lambda x: tuple(t[..., :3] for t in _stable_sort(x, -1, True)), (6, 8)),
    "kth_middle": (lambda x: tuple(t.select(1, 2) for t in _stable_sort(x, 1)), (3, 7, 5)),
}
OURS = {
    "topk_largest": lambda x: torch.topk(x, 3, dim=-1),
    "kth_middle": lambda x: torch.kthvalue(x, 3, dim=1),
}


@pytest.mark.parametrize("limits", [None, (1, 1, 1)], ids=["planned", "buffers"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_short_lines_sort_in_one_dispatch_as_torchs_stable_sort(device, name, limits):
    want_fn, shape = CASES[name]
    fn = OURS.get(name, want_fn)
    x = _values(*shape)
    with texelflow.compile(Call(fn), (x,), device=device, texture_limits=limits) as prog:
        assert prog.plan.fallbacks == [], prog.plan.fallbacks
        assert prog.plan.dispatches["sort_lines"] == 1, prog.plan.dispatches
        got = prog(x)
    want = want_fn(x)
    got, want = (tuple(got), tuple(want)) if isinstance(want, tuple) else ((got,), (want,))
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)
        if g.is_floating_point():
            assert torch.equal(torch.signbit(g), torch.signbit(w))


def test_median_of_short_lines_keeps_torchs_nan_rule(device):
    """median along a dim: the lower median of the stable sort, NaN (at the first NaN) where a
    line holds one, as torch."""
    x = _values(5, 9, seed=2)
    x[1] = torch.arange(9.0)  # a line without NaN
    fn = lambda t: torch.median(t, dim=1)  # noqa: E731
    with texelflow.compile(Call(fn), (x,), device=device) as prog:
        assert prog.plan.fallbacks == [] and prog.plan.dispatches["sort_lines"] == 1
        got = prog(x)
    want = fn(x)
    torch.testing.assert_close(got.values, want.values, rtol=0, atol=0, equal_nan=True)
    clean = ~x.isnan().any(1)  # torch's index among equal medians is unspecified: the value at it must match
    picked = x.gather(1, got.indices.unsqueeze(1)).squeeze(1)
    torch.testing.assert_close(picked[clean], want.values[clean], rtol=0, atol=0)
    assert torch.equal(got.indices[~clean], want.indices[~clean])
