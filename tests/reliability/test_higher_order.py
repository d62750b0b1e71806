"""Higher-order ops in forward: `with torch.no_grad():` and `torch.autocast` regions (submodule
calls in torch.export's graph, which the importer inlines with `run_decompositions`), and data-
dependent control flow (torch.cond), which is refused with a one-line error naming the node.
Before, any of them stopped lowering with a KeyError on the submodule's name.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

import texelflow
from texelflow import UnsupportedModelError


class NoGradInside(nn.Module):
    """A block whose forward computes a part under torch.no_grad() (EMA teachers, position tables)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        with torch.no_grad():
            y = self.proj(x).relu()
        return y * 2 + x


class AutocastInside(nn.Module):
    """A float32 model running its linear in bfloat16 under torch.autocast, softmax back in float32."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 16)

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = self.proj(x)
        return y.float().softmax(-1)


@pytest.mark.parametrize("make", [NoGradInside, AutocastInside], ids=["no_grad", "autocast"])
def test_wrapped_regions_run_on_the_device(device, make):
    torch.manual_seed(0)
    model = make().eval()
    x = torch.randn(3, 8)
    with texelflow.compile(model, (x,), device=device) as prog:
        assert prog.plan.fallbacks == []
        got, want = prog(x), model(x)
    assert got.dtype == want.dtype
    # autocast's linear is torch's bfloat16 one: the same bfloat16 roundings, another summation order
    torch.testing.assert_close(got, want, rtol=1e-2 if make is AutocastInside else 1e-5, atol=1e-6)


def test_control_flow_is_refused_naming_the_node():
    class Branch(nn.Module):
        def forward(self, x):
            return torch.cond(x.sum() > 0, lambda t: t.sin(), lambda t: t.cos(), (x,))

    with pytest.raises(UnsupportedModelError, match=r"^node 'cond' is cond \(data-dependent control flow"):
        texelflow.plan(Branch(), (torch.randn(2, 3),))
