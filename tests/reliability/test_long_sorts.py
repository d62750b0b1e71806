"""sort, argsort and topk of long lines on the device: a bitonic network of bitonic_step nodes
(own_decompositions._bitonic_sort), where ranking every pair (the short lines' sort) would be
too many comparisons: a detection head's topk over 8,400 anchors, top-p over a vocabulary.

torch's own order among equal values is unspecified (its CPU sort is not stable); texelflow's
is always the stable one, so the inputs here have distinct values but for the NaNs and Infs, and
the reference is torch's stable sort.
"""
from __future__ import annotations

import pytest
import torch

import texelflow

from .models import Call


def _line(*shape, seed=0):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    flat = x.view(-1)
    flat[3], flat[11], flat[-2] = float("nan"), float("inf"), float("-inf")
    return x


CASES = {
    "sort_ascending": (lambda x: torch.sort(x, dim=-1, stable=True), (2, 5000)),
    "sort_descending": (lambda x: torch.sort(x, dim=-1, descending=True, stable=True), (2, 5000)),
    "argsort_dim0": (lambda x: torch.argsort(x, dim=0, stable=True), (1500, 3)),
    "sort_middle_dim_power_of_two": (lambda x: torch.sort(x, dim=1, stable=True)[0], (2, 2048, 3)),
    "topk_anchors": (lambda x: torch.topk(x, 100, dim=-1), (1, 8400)),
    "topk_smallest": (lambda x: torch.topk(x, 40, dim=-1, largest=False), (3, 3000)),
    "top_p_vocab": (lambda x: torch.sort(x, descending=True)[0].softmax(-1).cumsum(-1), (1, 32000)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_long_lines_sort_on_the_device(device, name):
    fn, shape = CASES[name]
    x = _line(*shape)
    if name == "top_p_vocab":
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    with texelflow.compile(Call(fn), (x,), device=device) as prog:
        assert prog.plan.fallbacks == [], prog.plan.fallbacks
        assert prog.plan.dispatches.get("bitonic_step", 0) > 0
        got = prog(x)
    want = fn(x)
    got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
    for g, w in zip(got, want):
        if name == "top_p_vocab":
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
        else:
            assert g.dtype == w.dtype
            torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)


def test_which_lines_sort_how():
    """Float32 lines of up to SORT_LINE_MAX (256) sort in one sort_lines dispatch, longer ones by
    the bitonic network; int32 lines below BITONIC_MIN_LENGTH (and few pairs) by ranks."""
    def dispatches(x):
        plan = texelflow.plan(Call(lambda t: torch.sort(t, dim=-1)[0]), (x,))
        assert plan.fallbacks == []
        return plan.dispatches

    short, longer = dispatches(torch.randn(3, 256)), dispatches(torch.randn(3, 257))
    assert short["sort_lines"] == 1 and "bitonic_step" not in short
    assert "sort_lines" not in longer and longer["bitonic_step"] > 0
    ints = dispatches(torch.randint(0, 9, (3, 300), dtype=torch.int32))
    assert "sort_lines" not in ints and "bitonic_step" not in ints
