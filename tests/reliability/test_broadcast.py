"""Issue 9, item 2: broadcasting at every rank 0-6 gives torch's result.

WHCN sizes fold every dim but the last 3 into N, so at rank 5 and 6 a broadcast over one of the
folded leading dims cannot be computed on the folded N: the `binary` class declares the
`broadcast_foldable` check, which sends such a node to the CPU with its reason. The minimal
reproducer of the report, then a property test over random broadcast pairs of ranks 0-6.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import texelflow

OPS = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
       "maximum": torch.maximum, "minimum": torch.minimum}


class _Binary(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, a, b):
        return self.fn(a, b)


def _run(device, fn, a, b):
    prog = texelflow.compile(_Binary(fn), (a, b), planner="greedy", device=device)
    try:
        return prog, prog(a, b)
    finally:
        prog.close()


@pytest.mark.parametrize("shapes", [
    ((2, 3, 4, 5, 6), (1, 3, 4, 5, 6)),
    ((1, 3, 4, 5, 6), (2, 3, 4, 5, 6)),
    ((2, 3, 1, 2, 3, 4), (2, 1, 1, 2, 3, 4)),
    ((3, 4, 5, 6), (2, 3, 4, 5, 6)),
])
def test_leading_dim_broadcast_matches_torch(device, shapes):
    """A broadcast inside the leading dims WHCN folds into N: the operand's leading dims are
    expanded first (own_decompositions' _lead_broadcast), then the add runs on the device."""
    a, b = torch.randn(shapes[0]), torch.randn(shapes[1])
    prog, got = _run(device, torch.add, a, b)
    torch.testing.assert_close(got, a + b)
    assert prog.plan.fallbacks == []
    assert prog.plan.dispatches["expand"] == 1 and prog.plan.dispatches["add"] == 1


def test_foldable_broadcast_stays_on_device(device):
    a, b = torch.randn(2, 3, 4, 5, 6), torch.randn(4, 1, 6)
    prog, got = _run(device, torch.add, a, b)
    torch.testing.assert_close(got, a + b)
    assert prog.plan.fallbacks == []


@st.composite
def broadcast_pair(draw):
    rank_out = draw(st.sampled_from([0, 1, 2, 3, 4, 5, 5, 6, 6]))  # folding starts at rank 5
    out = draw(st.lists(st.integers(1, 3), min_size=rank_out, max_size=rank_out))
    shapes = []
    for _ in range(2):
        rank = draw(st.one_of(st.just(len(out)), st.integers(0, len(out))))
        tail = out[len(out) - rank:]
        shapes.append(tuple(d if draw(st.booleans()) else 1 for d in tail))
    return shapes


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shapes=broadcast_pair(), op=st.sampled_from(sorted(OPS)), dtype=st.sampled_from([torch.float32, torch.int32]))
@example(shapes=[(3, 2, 2, 1, 3), (1, 2, 2, 1, 3)], op="add", dtype=torch.float32)
@example(shapes=[(2, 1, 3, 1, 1, 2), (1, 3, 3, 1, 1, 2)], op="mul", dtype=torch.int32)
def test_every_broadcast_pattern_matches_torch(device, shapes, op, dtype):
    if dtype == torch.int32 and op == "div":
        dtype = torch.float32  # true division of ints gives floats: a CPU fallback, not a broadcast case
    gen = torch.Generator().manual_seed(0)
    a = torch.randint(-5, 6, shapes[0], generator=gen).to(dtype)
    b = torch.randint(1, 6, shapes[1], generator=gen).to(dtype)
    _, got = _run(device, OPS[op], a, b)
    want = OPS[op](a, b)
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got, want)
