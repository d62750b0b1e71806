"""Constant subgraphs that would run on the CPU are folded into constants at lowering
(runtime/graph/constant_folding.py); what must stay a node stays one."""

from __future__ import annotations

import torch
from torch import nn

import texelflow
from texelflow.runtime.graph.constant_folding import MAX_FOLDED_ELEMENTS, RECIPE
from texelflow.runtime.graph.ir import Role


def folded(plan) -> dict:
    """Folded constant name -> its data."""
    return {v.name: dict(v.derive.params)["data"] for v in plan.graph.constants
            if v.derive is not None and v.derive.recipe == RECIPE}


class BiasGather(nn.Module):
    """Swin's relative position bias: a table indexed by a constant int64 index."""

    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn(7, 2))
        self.register_buffer("index", torch.tensor([[0, 3, 6], [2, 5, 1]]))

    def forward(self, x):
        bias = self.table[self.index.view(-1)].view(2, 3, -1).permute(2, 0, 1).contiguous()
        return x + bias


def test_an_index_into_a_constant_table_is_folded_with_torchs_values():
    model = BiasGather().eval()
    x = torch.randn(2, 2, 3)
    plan = texelflow.plan(model, (x,))
    assert plan.fallbacks == []
    assert not any(n.target.startswith("aten.index") for n in plan.graph.nodes)
    # the gather, its view and the permute that reads it fold into one constant: the bias itself
    want = model.table.detach()[model.index.view(-1)].view(2, 3, -1).permute(2, 0, 1)
    assert [(tuple(t.shape), torch.equal(t, want)) for t in folded(plan).values()] == [((2, 2, 3), True)]


class Positions(nn.Module):
    def forward(self, x):
        pos = torch.arange(x.shape[-1], dtype=torch.long).unsqueeze(0)
        return x + pos.to(x.dtype) * torch.full([], 0.5)


def test_arange_and_full_become_constants_and_the_program_matches_eager(device):
    x = torch.randn(3, 5)
    model = Positions().eval()
    with texelflow.compile(model, (x,), device=device) as prog:
        assert prog.plan.fallbacks == []
        assert all(v.role is Role.CONST for v in prog.plan.graph.constants)
        assert torch.equal(prog(x), model(x))


class ZerosLikeMask(nn.Module):
    """nn.MultiheadAttention's mask conversion: the zeros' values depend on the mask's shape only."""

    def forward(self, x, mask):
        return x + torch.zeros_like(mask, dtype=x.dtype).masked_fill_(mask, float("-inf"))


def test_zeros_like_of_an_input_folds_its_shape_not_its_data(device):
    x, mask = torch.randn(2, 5), torch.tensor([[True, False, False, True, False]] * 2)
    with texelflow.compile(ZerosLikeMask(), (x, mask), device=device) as prog:
        assert prog.plan.fallbacks == []
        assert list(folded(prog.plan).values())[0].eq(0).all()
        other = ~mask
        assert torch.equal(prog(x, other), ZerosLikeMask()(x, other))


class RandomNoise(nn.Module):
    def forward(self, x):
        return x + torch.rand(x.shape)


def test_random_ops_are_never_folded():
    plan = texelflow.plan(RandomNoise(), (torch.randn(3, 4),))
    assert [name for name, _ in plan.fallbacks] == ["rand"]
    assert folded(plan) == {}


class HugeRange(nn.Module):
    def forward(self, x):
        return x + torch.arange(MAX_FOLDED_ELEMENTS + 1, dtype=torch.long).sum()


def test_a_result_over_the_size_limit_stays_a_node():
    plan = texelflow.plan(HugeRange(), (torch.randn(2),))
    assert "arange" in [name for name, _ in plan.fallbacks]
    assert folded(plan) == {}


class WindowMask(nn.Module):
    """Swin's shifted-window mask, [1, nW, 1, N, N], added to scores [B, nW, heads, N, N]."""

    def __init__(self):
        super().__init__()
        self.register_buffer("mask", torch.randn(4, 3, 3))

    def forward(self, attn):
        return (attn + self.mask.unsqueeze(1).unsqueeze(0)).softmax(-1)


def test_a_constant_broadcast_inside_whcn_n_is_widened(device):
    attn = torch.randn(2, 4, 2, 3, 3)
    model = WindowMask().eval()
    with texelflow.compile(model, (attn,), device=device) as prog:
        assert prog.plan.fallbacks == []
        wide = [t for name, t in folded(prog.plan).items() if name.endswith("_widened")]
        assert [tuple(t.shape) for t in wide] == [(2, 4, 1, 3, 3)]
        got = prog(attn)
    want = model(attn)
    assert (got - want).abs().max() <= 1e-6 * want.abs().max()


class CpuReader(nn.Module):
    """nextafter has no Vulkan op: its CPU node reads the folded constant directly."""

    def forward(self, x):
        return torch.nextafter(x, torch.arange(5).to(x.dtype))


def test_a_cpu_node_reads_a_folded_constant(device):
    x = torch.randn(2, 5)
    with texelflow.compile(CpuReader(), (x,), device=device) as prog:
        assert [name for name, _ in prog.plan.fallbacks] == ["nextafter"]
        assert [tuple(t.shape) for t in folded(prog.plan).values()] == [(5,)]
        assert torch.equal(prog(x), CpuReader()(x))
