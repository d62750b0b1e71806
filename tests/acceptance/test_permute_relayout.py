"""permute_copy re-lays out for free (issue 10): its kernel reads `self` in any representation and
writes `out` per element in any other, so it has no sync group and the planner labels both sides
independently. An NCHW -> NHWC permute after a conv (channels-packed) hands a layer norm or a
linear a width-packed tensor with no to_layout in between, and NHWC -> NCHW hands it back."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import texelflow
from texelflow.demo import compare
from texelflow.models import ZOO

# the expected transitions assume the CPU forms of convs and GEMMs: keep them on a GPU too
pytestmark = pytest.mark.usefixtures("register_tiles")

CP = "TEXTURE_3D/CHANNELS_PACKED"
WP = "TEXTURE_3D/WIDTH_PACKED"


class ChannelsLastBlock(nn.Module):
    """ConvNeXt's block in miniature: depthwise conv on NCHW, then layer norm, linear, GELU and
    linear on channels-last tokens, back to NCHW, a residual and a 1x1 conv. Channels (6) are no
    multiple of 4, H and W (5, 7) odd, batch 2."""

    def __init__(self, dim: int = 6):
        super().__init__()
        self.conv_dw = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 3 * dim)
        self.fc2 = nn.Linear(3 * dim, dim)
        self.proj = nn.Conv2d(dim, 5, 1)

    def forward(self, x):
        y = self.conv_dw(x).permute(0, 2, 3, 1)
        y = self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(y))))
        return self.proj(y.permute(0, 3, 1, 2) + x)


def block():
    torch.manual_seed(0)
    return ChannelsLastBlock().eval(), (torch.randn(2, 6, 5, 7),)


def permutes(plan):
    """(input representation, output representation, dims) of every permute node that moves data."""
    nodes = [n for n in plan.graph.nodes if n.op is not None and n.op.name == "permute_copy" and not n.folded]
    return [(plan.reprs[n.arg("self").name], plan.reprs[n.name], list(n.arg("dims"))) for n in nodes]


def test_channels_last_block_needs_no_transition():
    for planner in ("greedy", "optimal"):
        plan = texelflow.plan(*block(), planner=planner)
        assert plan.fallbacks == []
        assert plan.num_transitions == 0, (planner, plan.summary())
        assert permutes(plan) == [(CP, WP, [0, 2, 3, 1]), (WP, CP, [0, 3, 1, 2])], planner
    assert plan.optimal and plan.lower_bound == 0


def test_channels_last_block_runs_on_the_device(device):
    model, inputs = block()
    with texelflow.compile(model, inputs, device=device) as prog:
        assert prog.plan.num_transitions == 0 and prog.plan.fallbacks == []
        got = prog(*inputs)
    with torch.no_grad():
        want = model(*inputs)
    check = compare(got, want)
    assert check.ok, f"max |texelflow - eager| = {check.max_abs:.3g} > 1e-3 x {check.max_ref:.3g}"


def test_convnext_pays_no_transition_around_its_permutes():
    """convnext_atto's 32 permutes (and the NHWC -> NCHW permutes of the im2col form of its three
    downsampling convs) all change layout themselves: 24 transitions before, 1 now
    (the head's global mean, channels-packed like the conv it reduces, feeding a layer norm).
    The model's own permutes, as it writes them (permutes="none": the permute passes, which take
    ConvNeXt to 28, are tests/graph/test_permute_placement.py's)."""
    model, inputs = ZOO["convnext_atto"]()
    greedy = texelflow.plan(model, inputs, planner="greedy", permutes="none")
    optimal = texelflow.plan(model, inputs, planner="optimal", permutes="none")
    assert optimal.optimal and optimal.num_transitions <= greedy.num_transitions
    assert optimal.num_transitions == 1
    (t,) = optimal.transitions
    assert t.arg("self").producer.target == "aten.mean.dim"
    moves = permutes(optimal)
    im2col = sum(n.op.name == "conv_im2col" for n in optimal.graph.device_nodes())
    assert im2col == 3 and len(moves) == 32 + im2col
    for src, dst, dims in moves:
        assert (src, dst) == ((CP, WP) if dims == [0, 2, 3, 1] else (WP, CP)), (src, dst, dims)
