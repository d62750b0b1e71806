"""Matrix products written without nn.Linear take the tiled kernels (runtime/graph/prepack_matmul.py):
addmm with a constant [K, N] weight (GPT-2's Conv1D) becomes a packed linear whose weight is
prepacked as it stands, and torch.matmul of two operands with the same batch dims (attention
written by hand) becomes mm / bmm. Numerics against torch on awkward sizes, NaN and Inf included;
the forms that must not change stay as they were."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.nn as nn

import texelflow

# these tests name the register-tiled kernels: keep them on a GPU too
pytestmark = pytest.mark.usefixtures("register_tiles")


class Conv1D(nn.Module):
    """GPT-2's Conv1D: y = x @ W + b with W [K, N], written as addmm."""

    def __init__(self, k: int, n: int, alpha: float = 1.0, beta: float = 1.0, bias_rows: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(k * 100 + n)
        self.weight = nn.Parameter(torch.randn(k, n, generator=g) / k ** 0.5)
        self.bias = nn.Parameter(torch.randn(*((bias_rows,) if bias_rows else ()), n, generator=g))
        self.alpha, self.beta = alpha, beta

    def forward(self, x):
        shape = x.shape[:-1] + (self.weight.shape[1],)
        y = torch.addmm(self.bias, x.view(-1, x.shape[-1]), self.weight, beta=self.beta, alpha=self.alpha)
        return y.view(shape)


def _with_specials(x: torch.Tensor) -> torch.Tensor:
    x = x.clone()
    flat = x.view(-1)
    flat[1], flat[-2] = float("nan"), float("inf")
    if flat.numel() > 5:
        flat[4] = float("-inf")
    return x


def _dispatches(prog) -> Counter:
    return Counter(n.op.name for n in prog.plan.graph.device_nodes() if not n.transition and not n.folded)


def _matches(got, want):
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5, equal_nan=True)


@pytest.mark.parametrize("rows,k,n,op", [(6, 7, 13, "linear_packed"), (2 * 5, 5, 3, "linear_packed"),
                                         (1, 9, 20, "linear_packed_gemv"), (3, 64, 48, "linear_packed")])
def test_gpt2_conv1d_takes_the_packed_linear(device, rows, k, n, op):
    model = Conv1D(k, n).eval()
    x = _with_specials(torch.randn(rows, k) * 2)
    with texelflow.compile(model, (x,), device=device) as prog:
        got = prog(x)
        assert _dispatches(prog) == {op: 1}, prog.plan.summary()
        node = next(n for n in prog.plan.graph.device_nodes() if n.op.name == op)
        assert node.arg("weight").derive.recipe == "matmul_weight_kn"
        assert any("from addmm" in f for f in node.fused), node.fused
    _matches(got, model(x))


def test_gpt2_conv1d_on_tokens_of_a_batch(device):
    model = Conv1D(12, 36).eval()
    x = _with_specials(torch.randn(2, 5, 12))
    with texelflow.compile(model, (x,), device=device) as prog:
        got = prog(x)
        assert _dispatches(prog)["linear_packed"] == 1, prog.plan.summary()
    _matches(got, model(x))


@pytest.mark.parametrize("kwargs", [{"alpha": 2.0}, {"beta": 0.5}, {"bias_rows": 6}])
def test_addmm_that_is_not_x_w_plus_a_row_stays_addmm(device, kwargs):
    model = Conv1D(7, 5, **kwargs).eval()
    x = torch.randn(6, 7)
    with texelflow.compile(model, (x,), device=device) as prog:
        got = prog(x)
        assert _dispatches(prog) == {"addmm": 1}, prog.plan.summary()
    _matches(got, model(x))


class HandAttention(nn.Module):
    """softmax(q @ k^T * scale) @ v as BERT's and GPT-2's eager attention write it."""

    def forward(self, q, k, v):
        w = torch.matmul(q, k.transpose(-1, -2)) * q.shape[-1] ** -0.5
        return torch.matmul(w.softmax(-1), v)


@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (1, 6, 9, 16), (4, 5, 3), (5, 7)])
def test_hand_written_attention_takes_the_tiled_matmul(device, shape):
    g = torch.Generator().manual_seed(len(shape))
    q, k, v = (torch.randn(shape, generator=g) for _ in range(3))
    q = _with_specials(q)
    model = HandAttention().eval()
    with texelflow.compile(model, (q, k, v), device=device) as prog:
        got = prog(q, k, v)
        counts = _dispatches(prog)
        want_op = "mm" if len(shape) == 2 else "bmm"
        # q @ k^T reads k's rows as they are (bmm_nt): no transpose of k is dispatched
        assert counts[want_op] == 1 and counts["bmm_nt"] == 1 and counts["matmul"] == 0, prog.plan.summary()
        assert counts["permute_copy"] == 0, prog.plan.summary()
    _matches(got, model(q, k, v))


def test_transposed_operand_with_another_reader_keeps_its_permute(device):
    """k^T also returned: the permute stays for that reader, the product still reads k."""
    class Both(nn.Module):
        def forward(self, q, k):
            kt = k.transpose(-1, -2)
            return q @ kt, kt * 2

    q, k = _with_specials(torch.randn(2, 5, 6)), torch.randn(2, 7, 6)
    with texelflow.compile(Both().eval(), (q, k), device=device) as prog:
        got = prog(q, k)
        counts = _dispatches(prog)
        assert counts["bmm_nt"] == 1 and counts["permute_copy"] == 1, prog.plan.summary()
    for g, w in zip(got, Both()(q, k)):
        _matches(g, w)


def test_matmul_whose_batch_broadcasts_keeps_the_general_kernel(device):
    class Broadcast(nn.Module):
        def forward(self, a, b):
            return torch.matmul(a, b)

    a, b = _with_specials(torch.randn(2, 3, 5, 7)), torch.randn(3, 7, 4)
    with texelflow.compile(Broadcast().eval(), (a, b), device=device) as prog:
        got = prog(a, b)
        assert _dispatches(prog) == {"matmul": 1}, prog.plan.summary()
    _matches(got, torch.matmul(a, b))


class ByWeight(nn.Module):
    """x @ W by a constant W [K, N] written by hand: torch.matmul on tokens, torch.mm on rows, and
    the same W twice (one prepacked copy serves both)."""

    def __init__(self, k: int, n: int):
        super().__init__()
        self.w = nn.Parameter(torch.randn(k, n, generator=torch.Generator().manual_seed(k)) / k ** 0.5)

    def forward(self, tokens, rows):
        return torch.matmul(tokens, self.w), torch.mm(rows, self.w), torch.mm(rows * 2, self.w)


@pytest.mark.parametrize("k,n", [(7, 13), (16, 5)])
def test_products_by_a_constant_weight_take_the_packed_linear(device, k, n):
    model = ByWeight(k, n).eval()
    tokens, rows = _with_specials(torch.randn(2, 3, k)), _with_specials(torch.randn(5, k))
    with texelflow.compile(model, (tokens, rows), device=device) as prog:
        got = prog(tokens, rows)
        assert _dispatches(prog)["linear_packed"] == 3, prog.plan.summary()
        packed = {n.arg("weight").name for n in prog.plan.graph.device_nodes() if n.op.name == "linear_packed"}
        assert len(packed) == 1, packed  # one prepacked copy of W
    for g, w in zip(got, model(tokens, rows)):
        _matches(g, w)
