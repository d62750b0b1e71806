"""Depthwise convs between a permute to NCHW and one back take both in
(runtime/graph/permutes/kernel_orders.py): conv2d_dwK_s1_nhwc reads and writes the [N, H, W, C]
tensors themselves; what else reads a permute keeps it."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.nn as nn

import texelflow


class ChannelsLastBlock(nn.Module):
    """ConvNeXt's block as timm writes it with conv_mlp off, on an [N, H, W, C] stream: permute to
    NCHW, depthwise conv, permute back, layer norm, MLP, residual."""

    def __init__(self, c: int, k: int, act: bool = False):
        super().__init__()
        self.dw = nn.Conv2d(c, c, k, padding=k // 2, groups=c)
        self.act = nn.GELU() if act else nn.Identity()
        self.norm = nn.LayerNorm(c)
        self.fc = nn.Linear(c, c)

    def forward(self, x):
        y = self.act(self.dw(x.permute(0, 3, 1, 2))).permute(0, 2, 3, 1)
        return x + self.fc(self.norm(y))


def _kernels(plan) -> Counter:
    return Counter(n.op.name for n in plan.graph.device_nodes() if not n.folded)


@pytest.mark.parametrize("k", [3, 5, 7])
@pytest.mark.parametrize("shape,act", [((2, 5, 7, 6), False), ((1, 1, 3, 13), True), ((1, 9, 4, 8), True)],
                         ids=["batch2_c6", "h1_c13_gelu", "c8_gelu"])
def test_depthwise_conv_between_permutes_runs_channels_last(device, k, shape, act):
    torch.manual_seed(k)
    model = nn.Sequential(ChannelsLastBlock(shape[-1], k, act), ChannelsLastBlock(shape[-1], k)).eval()
    x = torch.randn(shape)
    x[0, 0, 0, 0], x[-1, -1, -1, -1] = float("nan"), float("inf")
    with texelflow.compile(model, (x,), device=device) as prog:
        got = prog(x)
        kernels = _kernels(prog.plan)
    assert kernels[f"conv2d_dw{k}_s1_nhwc"] == 2 and "permute_copy" not in kernels, kernels
    with torch.no_grad():
        want = model(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, equal_nan=True)


class SharedPermute(nn.Module):
    """The NCHW view is read by the conv and by a pool; the conv's result by the permute back and,
    in the second conv, by a sum as well."""

    def __init__(self, c: int):
        super().__init__()
        self.a = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.b = nn.Conv2d(c, c, 3, padding=1, groups=c)

    def forward(self, x):
        nchw = x.permute(0, 3, 1, 2)
        y = self.a(nchw).permute(0, 2, 3, 1)
        z = self.b(nchw)
        return y + nchw.mean((2, 3))[:, None, None, :], z.permute(0, 2, 3, 1) * 2, z.sum()


def test_permutes_read_elsewhere_stay(device):
    torch.manual_seed(0)
    model = SharedPermute(6).eval()
    x = torch.randn(1, 5, 7, 6)
    with texelflow.compile(model, (x,), device=device) as prog:
        got = prog(x)
        kernels = _kernels(prog.plan)
        nodes = {n.name: n for n in prog.plan.graph.nodes}
    assert kernels["conv2d_dw7_s1_nhwc"] == 1 and kernels["conv2d_dw3_s1"] == 1, kernels
    assert any("taken in" in note for note in nodes["conv2d"].fused), nodes["conv2d"].fused
    with torch.no_grad():
        want = model(x)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


def test_convnext_runs_its_depthwise_convs_channels_last():
    """The zoo's ConvNeXt-atto: 11 of its 12 depthwise convs take their permutes in (the last
    stage's first one sits where the placement keeps its residual stream in NCHW)."""
    from texelflow.models import ZOO

    model, inputs = ZOO["convnext_atto"]()
    kernels = _kernels(texelflow.plan(model.eval(), inputs))
    assert kernels["conv2d_dw7_s1_nhwc"] == 11 and kernels["conv2d_dw7_s1"] == 1, kernels
    assert kernels["permute_copy"] == 8, kernels
