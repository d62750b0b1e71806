"""GroupNorm (and InstanceNorm, which is one group per channel) on the device as row statistics,
their combination per group, and one scale and shift per (sample, channel)
(own_decompositions.group_norm_by_rows). The group_norm kernel recomputed a group's
statistics for every row it wrote: 10-20 ms for a [1, 512, 8, 8] map on lavapipe, where the
pieces take about 1 ms. Its sums were plain running sums, 10-15x further from the exact answer
than torch's for a map whose mean is large against its spread; the pieces subtract each group's
first element first, so every sum stays near zero, and combine rows by the law of total
variance: closer to float64 than torch where the mean is large. Every case runs in the planner's representations and in buffers, with no CPU node."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import texelflow

from .models import Call

BUFFERS = (1, 1, 1)


def _x(*shape, offset=0.0, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) + offset


def _affine(norm: torch.nn.Module, seed=3) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        if getattr(norm, "weight", None) is not None:
            norm.weight.copy_(torch.rand(norm.weight.shape, generator=g) + 0.5)
            norm.bias.copy_(torch.randn(norm.bias.shape, generator=g))
    return norm.eval()


CASES = {
    "conv_map": (lambda: _affine(torch.nn.GroupNorm(3, 6)), (2, 6, 5, 7)),
    "one_channel_a_group": (lambda: _affine(torch.nn.GroupNorm(5, 5)), (1, 5, 3, 7)),
    "one_group": (lambda: torch.nn.GroupNorm(1, 6, affine=False).eval(), (2, 6, 1, 3)),
    "sequence": (lambda: _affine(torch.nn.GroupNorm(3, 9)), (2, 9, 4)),
    "channels_only": (lambda: _affine(torch.nn.GroupNorm(2, 8)), (3, 8)),
    "video": (lambda: _affine(torch.nn.GroupNorm(3, 6)), (2, 6, 3, 4, 5)),
    "unet_stage": (lambda: _affine(torch.nn.GroupNorm(32, 128)), (1, 128, 16, 16)),
    "wide_rows": (lambda: _affine(torch.nn.GroupNorm(4, 8)), (2, 8, 10, 350)),
    "instance_norm": (lambda: _affine(torch.nn.InstanceNorm2d(7, affine=True)), (2, 7, 5, 3)),
}


def _error(got, exact):
    return float((got.double() - exact).abs().max())


@pytest.mark.parametrize("limits", [None, BUFFERS], ids=["planned", "buffers"])
@pytest.mark.parametrize("offset", [0.0, 100.0], ids=["centred", "mean-100"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_group_norm_matches_torch_as_closely_as_torch_matches_float64(device, name, offset, limits):
    make, shape = CASES[name]
    model = make()
    x = _x(*shape, offset=offset)
    with texelflow.compile(model, (x,), device=device, texture_limits=limits) as prog:
        assert prog.plan.fallbacks == []
        assert not {"group_norm", "native_group_norm"} & set(prog.plan.dispatches)
        got = prog(x)
    with torch.no_grad():
        want = model(x)
        exact = model.double()(x.double())
    # torch's own float32 error sets the scale; a mean of 100 costs torch ~1e-5 and the pieces
    # nothing (their sums are of the input less its group pilots)
    ours, torchs = _error(got, exact), _error(want, exact)
    assert ours <= 3 * torchs + 2e-6, (ours, torchs)
    if offset:
        assert ours <= max(torchs, 4e-6), (ours, torchs)


def test_the_plan_says_why_group_norm_is_decomposed(device):
    model, x = _affine(torch.nn.GroupNorm(2, 4)), _x(1, 4, 3, 5)
    plan = texelflow.plan(model, (x,))
    notes = [note for node in plan.graph.nodes for note in node.fused]
    assert any("aten.group_norm.default" in n and "recomputes its group's statistics" in n for n in notes), notes


def test_a_non_finite_value_spoils_its_group_only_as_in_torch(device):
    model = _affine(torch.nn.GroupNorm(2, 4))
    x = _x(2, 4, 3, 5)
    x[0, 0, 1, 2] = float("nan")
    x[1, 3, 0, 0] = float("inf")
    with texelflow.compile(model, (x,), device=device) as prog:
        got = prog(x)
    with torch.no_grad():
        want = model(x)
    torch.testing.assert_close(got, want, equal_nan=True, rtol=1e-5, atol=1e-5)
    assert got[0, 2:].isfinite().all() and got[1, :2].isfinite().all()


def test_native_group_norm_returns_torch_mean_and_rstd(device):
    """A program torch decomposed already holds native_group_norm, with its [N, G] statistics."""
    w, b = torch.rand(6) + 0.5, torch.randn(6)
    fn = Call(lambda t: torch.ops.aten.native_group_norm(t, w, b, 2, 6, 35, 3, 1e-5))
    x = _x(2, 6, 5, 7, offset=10.0)
    ep = torch.export.export(fn, (x,)).run_decompositions()
    with texelflow.compile(ep, (x,), device=device) as prog:
        assert prog.plan.fallbacks == []
        got = prog(x)
    want = fn(x)
    for g, t in zip(got, want):
        torch.testing.assert_close(g, t, rtol=2e-5, atol=2e-5)


def test_group_norm_in_half_precision_programs(device):
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), _affine(torch.nn.GroupNorm(4, 8)), torch.nn.SiLU())
    model = model.eval()
    x = _x(1, 3, 12, 12)
    with texelflow.compile(model, (x,), device=device, precision="fp16") as prog:
        assert prog.plan.fallbacks == []
        got = prog(x)
    with torch.no_grad():
        want = model(x)
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    assert F.cosine_similarity(got.flatten(), want.flatten(), dim=0) > 0.999
