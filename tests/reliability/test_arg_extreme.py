"""argmax / argmin (and the indices of max.dim / min.dim) in one arg_extreme dispatch: each
line walked once for its first extreme, NaN the extreme, as torch. Before, their decomposition
took six dispatches (the extreme, the hits, NaN, the positions, the least), 20x a copy in buffers.
torch's index among equal extremes is the first; so is this one, so results compare exactly."""
from __future__ import annotations

import pytest
import torch

import texelflow

from .models import Call


def _values(*shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-3, 4, shape, generator=g).to(dtype)  # ties
    if dtype.is_floating_point:
        flat = x.view(-1)
        flat[5 % flat.numel()] = float("nan")
        flat[11 % flat.numel()] = float("inf")
        flat[-1] = float("-inf")
    return x


CASES = {
    "argmax_channels": (lambda x: x.argmax(1), (2, 5, 3, 7), torch.float32),
    "argmin_rows_keepdim": (lambda x: x.argmin(-1, keepdim=True), (3, 5, 7), torch.float32),
    "argmax_flattened": (lambda x: x.argmax(), (3, 5, 7), torch.float32),
    "argmin_flattened_keepdim": (lambda x: x.argmin(keepdim=True), (4, 9), torch.float32),
    "argmax_int32": (lambda x: x.argmax(0), (7, 3, 5), torch.int32),
    "argmax_int64_ids": (lambda x: x.argmax(-1), (3, 9), torch.int64),
    "max_dim_indices": (lambda x: x.max(2).indices, (2, 3, 6, 5), torch.float32),
    "min_dim_values_and_indices": (lambda x: tuple(x.min(0, keepdim=True)), (5, 1, 6), torch.float32),
    "argmax_half": (lambda x: x.half().argmax(1), (3, 7), torch.float32),
}


@pytest.mark.parametrize("limits", [None, (1, 1, 1)], ids=["planned", "buffers"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_arg_extremes_in_one_dispatch_as_torch(device, name, limits):
    fn, shape, dtype = CASES[name]
    x = _values(*shape, dtype=dtype)
    with texelflow.compile(Call(fn), (x,), device=device, texture_limits=limits) as prog:
        assert prog.plan.fallbacks == [], prog.plan.fallbacks
        assert prog.plan.dispatches["arg_extreme"] == 1, prog.plan.dispatches
        got = prog(x)
    want = fn(x)
    got, want = (tuple(got), tuple(want)) if isinstance(want, tuple) else ((got,), (want,))
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)


def test_a_line_past_one_pass_splits_instead():
    """A vocabulary-long line takes the reductions, which split (tests/reliability/test_loop_limit.py)."""
    plan = texelflow.plan(Call(lambda x: x.argmax(-1)), (torch.randn(2, 50257),))
    assert plan.fallbacks == [] and "arg_extreme" not in plan.dispatches
