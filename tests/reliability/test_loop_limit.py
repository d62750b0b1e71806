"""Kernels that loop long in one invocation, against lavapipe's loop limit.

Mesa's llvmpipe (lavapipe) ends every loop of an invocation once their iterations together reach
65535 (gallivm's LP_MAX_TGSI_LOOP_ITERATIONS, shared by all loops of a shader, nested ones
included) and goes on with what it has: before this check, a softmax over a 32,000-word vocabulary
in a buffer, a mean over a 300 x 300 map or a GroupNorm over 64 x 64 x 10 channels came back
silently wrong. The `loop_trips` check (shaders/node_rules.py) refuses such a node, and its
decomposition (own_decompositions: reductions in blocks of SPLIT_BLOCK, softmax, norms and
moments from those, cumsum in blocks, matmul in K slices, transposed convs in input-channel
slices) keeps it on the device. Each case here
runs in the planner's representations and in buffers (the element-by-element paths), and must be
torch's answer with no CPU node; the sizes are past the limit, and just inside each bound.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import texelflow
from texelflow.shaders.node_rules import LOOP_TRIPS_LIMIT

from .models import Call

BUFFERS = (1, 1, 1)  # texture limits no tensor fits: every tensor in a buffer


def _x(*shape, seed=0):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    flat = x.view(-1)
    flat[7], flat[-3] = 4.0, -5.0
    return x


PAST_THE_LIMIT = {
    "softmax_vocab": (lambda x: x.softmax(-1), (_x(2, 32000),)),
    "log_softmax_vocab": (lambda x: x.log_softmax(-1), (_x(1, 50257),)),
    "softmax_dim0": (lambda x: x.softmax(0), (_x(20000, 3),)),
    "argmax_vocab": (lambda x: x.argmax(-1), (_x(3, 50257),)),
    "mean_hw_300": (lambda x: x.mean((2, 3)), (_x(1, 3, 300, 300),)),
    "global_avg_pool_300": (lambda x: F.adaptive_avg_pool2d(x, 1), (_x(1, 3, 300, 300),)),
    "sum_all": (lambda x: x.sum(), (_x(1000, 300),)),
    "amax_row": (lambda x: x.amax(-1, keepdim=True), (_x(2, 100000),)),
    # lines no block of 1,024-4,096 divides: the last block padded with the reduction's identity
    "mean_row_padded": (lambda x: x.mean(-1), (_x(2, 70001),)),
    "amax_row_padded": (lambda x: x.amax(-1), (_x(3, 65537) - 10.0,)),
    "amin_interleaved": (lambda x: x.amin((0, 2)), (_x(100, 3, 400),)),
    "var_row": (lambda x: x.var(-1), (_x(2, 70000),)),
    "std_mean": (lambda x: torch.std_mean(x, (1, 2)), (_x(2, 300, 300),)),
    "vector_norm": (lambda x: torch.linalg.vector_norm(x, dim=-1) + x.norm(p=1, dim=-1), (_x(2, 40000),)),
    "logsumexp": (lambda x: x.logsumexp(-1), (_x(2, 40000),)),
    "cumsum_row": (lambda x: x.cumsum(-1), (_x(2, 70001),)),
    "cumsum_dim0": (lambda x: x.cumsum(0), (_x(70001, 2),)),
    "layer_norm_row": (lambda x: F.layer_norm(x, (70000,)), (_x(1, 70000),)),
    "group_norm_sd_unet": (torch.nn.GroupNorm(4, 16), (_x(1, 16, 64, 64),)),
    "matmul_long_k": (lambda x, y: x @ y, (_x(2, 40000), _x(40000, 3, seed=1))),
    "mm_long_k": (lambda x, w: torch.nn.functional.linear(x, w), (_x(2, 50000), _x(3, 50000, seed=1))),
    "bmm_long_k": (torch.bmm, (_x(2, 3, 40000), _x(2, 40000, 2, seed=1))),
    "conv_transpose2d_wide": (torch.nn.ConvTranspose2d(2048, 4, 4, 2, 1, output_padding=1), (_x(1, 2048, 3, 3),)),
    "conv_transpose1d_vocoder": (torch.nn.ConvTranspose1d(4096, 4, 16, 8, 4), (_x(1, 4096, 10),)),
    # 3 x 3 stride 2: its own kernel computed 1,820 channels wrong whole in channels-packed textures
    "conv_transpose2d_uneven_taps": (torch.nn.ConvTranspose2d(2100, 4, 3, 2), (_x(1, 2100, 3, 3),)),
}


def _run(device, fn, inputs, limits, check_plan=lambda plan: None):
    """(got, want) as tuples: `fn` compiled (its plan with no CPU node, then `check_plan`d) and run
    on `inputs`, and torch's answer."""
    model = fn if isinstance(fn, torch.nn.Module) else Call(fn)
    with texelflow.compile(model, inputs, device=device, texture_limits=limits) as prog:
        assert prog.plan.fallbacks == [], prog.plan.fallbacks
        check_plan(prog.plan)
        got = prog(*inputs)
    with torch.no_grad():
        want = model(*inputs)
    return (got, want) if isinstance(want, tuple) else ((got,), (want,))


@pytest.mark.parametrize("limits", [None, BUFFERS], ids=["planned", "buffers"])
@pytest.mark.parametrize("name", sorted(PAST_THE_LIMIT))
def test_long_loops_split_and_stay_on_the_device(device, name, limits):
    fn, inputs = PAST_THE_LIMIT[name]
    got, want = _run(device, fn, inputs, limits)
    for g, w in zip(got, want):
        if w.dtype == torch.int64:
            assert torch.equal(g, w)
        else:
            torch.testing.assert_close(g, w, rtol=2e-5, atol=2e-5 * float(w.abs().max()))


JUST_INSIDE = {
    "sum_row": (lambda x: x.sum(-1), (_x(2, 7400),)),
    "mean_hw_texels": (lambda x: x.mean((2, 3)), (_x(1, 3, 73, 100),)),
    "var_c_w": (lambda x: x.var((1, 3)), (_x(2, 7, 3, 1050),)),
    "softmax_row": (lambda x: x.softmax(-1), (_x(3, 11900),)),
    "softmax_dim1": (lambda x: x.softmax(1), (_x(1, 4000, 7),)),
    "cumsum_row": (lambda x: x.cumsum(-1), (_x(2, 59000),)),
    "layer_norm_row": (lambda x: F.layer_norm(x, (59000,)), (_x(2, 59000),)),
    "avg_pool_window": (lambda x: F.avg_pool2d(x, (100, 280)), (_x(1, 3, 100, 280),)),
    "matmul_k": (lambda x, y: x @ y, (_x(2, 29000), _x(29000, 3, seed=1))),
    # grouped, with kernels not a multiple of the stride: they keep the transposed conv's own
    # kernel (runtime/graph/conv_transpose.py), whose loop this bounds (1,663 and 997 input
    # channels a group at most: node_rules.conv_transpose_trips)
    "conv_transpose2d": (torch.nn.ConvTranspose2d(3320, 4, 3, 2, groups=2), (_x(1, 3320, 3, 3),)),
    "conv_transpose1d": (torch.nn.ConvTranspose1d(1990, 4, 15, 8, 4, groups=2), (_x(1, 1990, 10),)),
}


@pytest.mark.parametrize("limits", [None, BUFFERS], ids=["planned", "buffers"])
@pytest.mark.parametrize("name", sorted(JUST_INSIDE))
def test_loops_just_inside_the_bound_run_whole(device, name, limits):
    """Sizes the check lets through run as one kernel, and correctly: the bounds hold."""
    fn, inputs = JUST_INSIDE[name]

    def one_kernel(plan):
        assert len([n for n in plan.graph.nodes if n.op is not None and n.op.name not in (
            "view_copy", "reshape", "alias_copy")]) == 1, [n.op.name for n in plan.graph.nodes if n.op]

    (got,), (want,) = _run(device, fn, inputs, limits, one_kernel)
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5 * float(want.abs().max()))


GROUPED_WEIGHT = torch.randn(8, 2048, 5, 5, generator=torch.Generator().manual_seed(2)) * 0.01


@pytest.mark.parametrize("fn,shape", [
    (lambda t: F.max_pool2d(t, 300), (1, 2, 300, 300)),
    (lambda t: F.conv2d(t, GROUPED_WEIGHT, padding=2, groups=4), (1, 8192, 5, 5)),  # 2,048 channels x 25 taps a group
], ids=["pool_window", "grouped_conv"])
def test_what_has_no_decomposition_runs_on_the_cpu_with_its_reason(device, fn, shape):
    x = _x(*shape)
    with texelflow.compile(Call(fn), (x,), device=device) as prog:
        [(_, reason)] = prog.plan.fallbacks
        got = prog(x)
    assert f"past the {LOOP_TRIPS_LIMIT} iterations a kernel may loop on lavapipe" in reason
    torch.testing.assert_close(got, fn(x), rtol=0, atol=0)
