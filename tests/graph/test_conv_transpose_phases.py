"""Transposed convs as a stride-1 conv2d of their output phases and phase_shuffle
(runtime/graph/conv_transpose.py): numerics against torch on awkward sizes with NaN and Inf in the
input, the plans they take, and the forms that keep the transposed conv's own kernel."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import texelflow
from texelflow.runtime.graph.conv_transpose import plan_dim


def _with_specials(x: torch.Tensor) -> torch.Tensor:
    x = x.clone()
    flat = x.view(-1)
    flat[1], flat[flat.numel() // 2], flat[-2] = float("nan"), float("inf"), float("-inf")
    return x


def _dispatches(prog) -> Counter:
    return Counter(n.op.name for n in prog.plan.graph.device_nodes() if not n.transition and not n.folded)


def _run(device, model, x):
    with texelflow.compile(model.eval(), (x,), device=device) as prog:
        got = prog(x)
        plan = _dispatches(prog)
        assert prog.plan.fallbacks == [], prog.plan.fallbacks
    with torch.no_grad():
        want = model(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * float(want[want.isfinite()].abs().max()),
                               equal_nan=True)
    return plan


# (input shape, ConvTranspose2d arguments): every window slot a real tap of every phase
PHASED_2D = {
    "unet_k2s2_5_channels": ((2, 3, 3, 5), dict(in_channels=3, out_channels=5, kernel_size=2, stride=2)),
    "unet_k2s2_whole_texels": ((1, 6, 5, 7), dict(in_channels=6, out_channels=8, kernel_size=2, stride=2)),
    "k3s3_no_bias": ((1, 5, 1, 3), dict(in_channels=5, out_channels=7, kernel_size=3, stride=3, bias=False)),
    "dcgan_k4s2p1": ((1, 7, 5, 3), dict(in_channels=7, out_channels=4, kernel_size=4, stride=2, padding=1)),
    "k4s2p1_output_padding": ((2, 4, 3, 3), dict(in_channels=4, out_channels=3, kernel_size=4, stride=2,
                                                 padding=1, output_padding=1)),
    "k4s2p3": ((1, 3, 5, 5), dict(in_channels=3, out_channels=4, kernel_size=4, stride=2, padding=3)),
    "mixed_strides": ((1, 5, 3, 7), dict(in_channels=5, out_channels=6, kernel_size=(3, 2), stride=(1, 2),
                                         padding=(1, 0))),
    "grouped_k2s2": ((1, 6, 3, 5), dict(in_channels=6, out_channels=8, kernel_size=2, stride=2, groups=2)),
    "grouped_k4s2_odd": ((1, 9, 3, 3), dict(in_channels=9, out_channels=3, kernel_size=4, stride=2,
                                            padding=1, groups=3)),
    "stride1_dilated_output_padding": ((1, 4, 5, 7), dict(in_channels=4, out_channels=5, kernel_size=2,
                                                          dilation=3, padding=1, output_padding=2)),
}


@pytest.mark.parametrize("name", sorted(PHASED_2D))
def test_transposed_conv_runs_as_phases(device, name):
    shape, kwargs = PHASED_2D[name]
    torch.manual_seed(len(name))
    model = nn.ConvTranspose2d(**kwargs)
    plan = _run(device, model, _with_specials(torch.randn(shape)))
    assert "conv_transpose2d" not in plan, plan
    stride = kwargs.get("stride", 1)
    assert plan["phase_shuffle"] == (0 if stride == 1 and not kwargs.get("output_padding") else 1), plan


def test_unet_up_convolution_is_a_pointwise_gemm(device):
    """k = s = 2, groups 1: one window slot, so the phases' conv is conv2d_pw (a GEMM), and the
    shuffle of whole texels (out channels a multiple of 4)."""
    model = nn.ConvTranspose2d(16, 8, 2, 2)
    plan = _run(device, model, _with_specials(torch.randn(1, 16, 7, 5)))
    assert plan == {"conv2d_pw": 1, "phase_shuffle": 1}, plan


@pytest.mark.parametrize("kwargs", [dict(kernel_size=4, stride=2, padding=1), dict(kernel_size=2, stride=2),
                                    dict(kernel_size=3, padding=2, dilation=2, output_padding=1)])
def test_transposed_conv1d_runs_as_phases(device, kwargs):
    model = nn.ConvTranspose1d(7, 6, **kwargs)
    plan = _run(device, model, _with_specials(torch.randn(2, 7, 9)))
    assert "conv_transpose1d" not in plan and "conv_transpose2d" not in plan, plan


UNEVEN = {  # phases that meet different numbers of taps
    "cyclegan_k3s2p1op1": ((2, 5, 5, 5), dict(in_channels=5, out_channels=7, kernel_size=3, stride=2, padding=1,
                                               output_padding=1)),
    "k3s2_no_bias_wide": ((1, 9, 3, 13), dict(in_channels=9, out_channels=17, kernel_size=3, stride=2, bias=False)),
    "k5s3_mixed": ((1, 3, 4, 5), dict(in_channels=3, out_channels=4, kernel_size=(5, 3), stride=(3, 2),
                                      padding=(2, 1), output_padding=(1, 0))),
    "dilated_k3s2": ((1, 4, 5, 5), dict(in_channels=4, out_channels=2, kernel_size=3, stride=2, padding=2,
                                        dilation=2)),
}


@pytest.mark.parametrize("name", sorted(UNEVEN))
def test_phases_of_different_tap_counts_take_the_tiles(device, name):
    """k 3 s 2: phases of 2 and 1 taps, where one window would multiply a zero tap by Inf; they
    take conv_transpose2d_tiles, which walks each phase's own taps."""
    shape, kwargs = UNEVEN[name]
    torch.manual_seed(len(name))
    plan = _run(device, nn.ConvTranspose2d(**kwargs), _with_specials(torch.randn(shape)))
    assert plan == {"conv_transpose2d_tiles": 1}, plan


def test_uneven_transposed_conv1d_takes_the_tiles(device):
    plan = _run(device, nn.ConvTranspose1d(6, 5, 3, stride=2, padding=1), _with_specials(torch.randn(2, 6, 7)))
    assert plan == {"conv_transpose2d_tiles": 1}, plan


def test_grouped_uneven_transposed_conv_keeps_its_own_kernel(device):
    model = nn.ConvTranspose2d(4, 6, 3, 2, 1, output_padding=1, groups=2)
    assert _run(device, model, _with_specials(torch.randn(1, 4, 5, 5))) == {"conv_transpose2d": 1}


@pytest.mark.parametrize("length,kernel,stride,padding,dilation,out_pad",
                         [(L, k, s, p, d, o) for L in (1, 3, 5) for k in (1, 2, 3, 4, 6) for s in (1, 2, 3)
                          for p in (0, 1, 3) for d in (1, 2) for o in (0, 1) if o < max(s, d)])
def test_phase_windows_reproduce_the_transposed_conv(length, kernel, stride, padding, dilation, out_pad):
    """plan_dim's windows, taps and crop, applied in torch (float64), give conv_transpose1d's
    answer for every combination, zero taps included (the planner refuses those only for Inf)."""
    out_length = (length - 1) * stride - 2 * padding + dilation * (kernel - 1) + out_pad + 1
    if out_length <= 0:
        return
    g = torch.Generator().manual_seed(length * 1000 + kernel * 100 + stride * 10 + padding)
    x = torch.randn(1, 1, length, generator=g, dtype=torch.float64)
    w = torch.randn(1, 1, kernel, generator=g, dtype=torch.float64)
    plan = plan_dim(length, out_length, kernel, stride, padding, dilation)
    phase_w = torch.zeros(stride, 1, plan.window, dtype=torch.float64)
    for r, row in enumerate(plan.taps):
        for j, t in enumerate(row):
            if t >= 0:
                phase_w[r, 0, j] = w[0, 0, t]
    t = F.conv1d(x, phase_w, None, 1, plan.padding, plan.dilation)
    assert t.shape[-1] == plan.rows
    full = t.reshape(stride, plan.rows).t().reshape(1, 1, -1)
    got = full[..., plan.crop_lo:plan.rows * stride - plan.crop_hi]
    want = F.conv_transpose1d(x, w, None, stride, padding, out_pad, 1, dilation)
    torch.testing.assert_close(got, want)


TRANSPOSED_3D = {  # a 3-D U-Net's up-sampling, then the other forms the decomposition takes
    "unet3d_k2s2": dict(in_channels=8, out_channels=4, kernel_size=2, stride=2),
    "k3s2_output_padding": dict(in_channels=6, out_channels=5, kernel_size=3, stride=2, padding=1, output_padding=1),
    "temporal_stride1": dict(in_channels=4, out_channels=3, kernel_size=(3, 2, 2), stride=(1, 2, 2),
                             padding=(1, 0, 0)),
    "temporal_dilated": dict(in_channels=4, out_channels=6, kernel_size=(2, 3, 3), stride=(3, 1, 1),
                             padding=(1, 1, 1), dilation=(2, 1, 1), output_padding=(1, 0, 0)),
    "grouped_no_bias": dict(in_channels=4, out_channels=4, kernel_size=2, stride=2, groups=2, bias=False),
}


@pytest.mark.parametrize("name", sorted(TRANSPOSED_3D))
def test_transposed_conv3d_runs_on_the_device(device, name):
    """own_decompositions.conv_transpose3d: a transposed 2-D conv per kernel frame slice over the
    frames folded into the batch, their results interleaved or spread and summed along T."""
    kwargs = TRANSPOSED_3D[name]
    torch.manual_seed(len(name))
    model = nn.ConvTranspose3d(**kwargs)
    plan = _run(device, model, _with_specials(torch.randn(2, kwargs["in_channels"], 3, 5, 4)))
    assert "conv_transpose2d" not in plan, plan  # every frame slice took a phase conv or the tiles
