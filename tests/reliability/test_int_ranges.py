"""int64 values computed in the graph run in int32 on the device where lowering bounds them.

torch makes integer sums and `.long()` arithmetic int64; the device has no int64. Lowering
bounds every integer value (runtime/graph/int_ranges.py): a bool is 0 .. 1, a constant its data's
extremes, an int64 input only int32's whole range. Where a sum, difference, product, running sum
or sum of such values provably fits int32, the device computes it in int32 and the host widens
it; elsewhere the node runs on the CPU and its reason gives the interval.
"""
from __future__ import annotations

import torch
import torch.nn as nn

import texelflow
from texelflow.runtime.graph.int_ranges import node_range

from .models import Call


class RobertaEmbeddings(nn.Module):
    """RoBERTa's (and XLM-R's) embeddings as transformers writes them: position ids counted from
    the non-padding tokens, `cumsum(ids.ne(pad).int()) * mask + pad`, in int64."""

    def __init__(self, vocab: int = 30, width: int = 16, pad: int = 1, positions: int = 12):
        super().__init__()
        self.pad = pad
        self.word_embeddings = nn.Embedding(vocab, width, padding_idx=pad)
        self.position_embeddings = nn.Embedding(positions, width, padding_idx=pad)
        self.norm = nn.LayerNorm(width)

    def forward(self, input_ids):
        mask = input_ids.ne(self.pad).int()
        incremental = (torch.cumsum(mask, dim=1).type_as(mask) + 0) * mask
        position_ids = incremental.long() + self.pad
        x = self.norm(self.word_embeddings(input_ids) + self.position_embeddings(position_ids))
        return x, position_ids


def test_roberta_position_ids_run_on_the_device(device):
    ids = torch.tensor([[0, 5, 7, 9, 2, 1, 1, 1], [0, 3, 4, 5, 6, 8, 9, 2], [0, 1, 4, 1, 6, 8, 2, 1]])
    model = RobertaEmbeddings().eval()
    with torch.no_grad():
        want = model(ids)
        prog = texelflow.compile(model, (ids,), device=device)
    try:
        assert prog.plan.fallbacks == [], prog.plan.fallbacks
        assert prog.plan.dispatches["cumsum"] == 1 and prog.plan.dispatches["embedding"] == 2
        got = prog(ids)
    finally:
        prog.close()
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-6)
    assert got[1].dtype == torch.int64 and torch.equal(got[1], want[1])


def test_counts_of_a_mask_run_on_the_device(device):
    """`(x > 0).sum(-1)`, a whole mask's count, a running count and `mask.long() * 3 - 1`:
    int64 in torch, bounded by the elements they sum, so int32 on the device."""

    def fn(x):
        m = x > 0
        return m.sum(-1), m.sum(), m.int().cumsum(0), m.long() * 3 - 1, (m.sum(1, keepdim=True) + 2) * m

    x = torch.randn(4, 5, 6, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = Call(fn)(x)
        prog = texelflow.compile(Call(fn), (x,), device=device)
    try:
        assert prog.plan.fallbacks == [], prog.plan.fallbacks
        got = prog(x)
    finally:
        prog.close()
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype == torch.int64 and torch.equal(g, w), (g, w)


def test_unbounded_int64_arithmetic_stays_on_the_cpu_with_its_interval(device):
    """An int64 input is known only to fit int32: its running sum and `ids + 1` may not, so they
    run on the CPU (on int64, torch's answer even past int32), the reason giving the interval."""
    ids = torch.tensor([[2**31 - 1, 5, 9], [3, -4, 2**31 - 2]])

    def fn(t):
        return t.cumsum(-1), t + 1

    with torch.no_grad():
        prog = texelflow.compile(Call(fn), (ids,), device=device)
    try:
        reasons = dict(prog.plan.fallbacks)
        assert set(reasons) == {"cumsum", "add"}, reasons
        assert all("past int32" in why and "\n" not in why for why in reasons.values()), reasons
        got = prog(ids)
    finally:
        prog.close()
    for g, w in zip(got, fn(ids), strict=True):
        assert g.dtype == torch.int64 and torch.equal(g, w)


def test_interval_rules():
    """The interval arithmetic itself, on lowered nodes of a tiny graph."""
    from texelflow.generated.ops import OPS
    from texelflow.runtime.graph.ir import Node, Role, Value

    def node(op, args):
        return Node("n", "t", OPS[op], args, [("out", Value("o", (2, 3), "int64", Role.NODE))])

    x = Value("x", (2, 3), "int32", Role.INPUT)
    cases = [
        ("add", [("self", x), ("other", x), ("alpha", 2)], {"self": (0, 1), "other": (-1, 4)}, (-2, 9)),
        ("sub", [("self", x), ("other", x)], {"self": (0, 1), "other": (-1, 4)}, (-4, 2)),
        ("mul", [("self", x), ("other", x)], {"self": (-2, 3), "other": (-5, 4)}, (-15, 12)),
        ("cumsum", [("self", x), ("dim", 1)], {"self": (0, 1)}, (0, 3)),
        ("cumsum", [("self", x), ("dim", 0)], {"self": (-3, 1)}, (-6, 2)),
        ("sum", [("self", x), ("dim", None)], {"self": (0, 1)}, (0, 6)),
        ("rsub_scalar", [("self", x), ("other", 10)], {"self": (0, 4)}, (6, 10)),
        ("mul_scalar", [("self", x), ("other", -3)], {"self": (0, 4)}, (-12, 0)),
        ("add_scalar", [("self", x), ("other", 0.5)], {"self": (0, 4)}, None),  # not an integer step
    ]
    for op, args, ranges, want in cases:
        assert node_range(None, node(op, args), ranges) == want, op
