"""bfloat16 programs: the device holds bfloat16 as float32 and rounds where torch rounds.

runtime/graph/bfloat16.py rewrites a program with bfloat16 tensors before lowering: placeholders
and dtype arguments become float32, a round_bfloat16 node follows each op whose result torch
rounds, and the caller still passes and gets bfloat16. These tests check the rounding itself bit
for bit (ties, NaN, Inf, denormals, float32's largest), elementwise chains bit for bit against
torch's bfloat16 eager, whole models within a stated tolerance, the caller's contract (dtypes,
errors, the fast path), saved programs (float32 in and out, rounded where they enter), CPU
fallbacks inside a bfloat16 program, and the one case declined (a bfloat16 buffer written by
forward).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import texelflow
from texelflow import InputValueError
from texelflow.models import ZOO

BF16 = torch.bfloat16
# One bfloat16 ulp relative to the largest output, a few times over: the float32 kernels sum in
# another order than torch's bfloat16 ones (matmuls, attention), and a fused activation or batch
# norm keeps its input in float32 where torch rounds it (docs/runtime.md)
MODEL_TOLERANCE = 2e-2


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.float().numpy().view(np.uint32)


def _same_bits(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Bit-identical, except that any NaN equals any NaN."""
    g, w = got.float(), want.float()
    both_nan = torch.isnan(g) & torch.isnan(w)
    return bool(((_bits(g) == _bits(w)) | both_nan.numpy()).all())


def _patterns() -> torch.Tensor:
    """float32 values whose bfloat16 rounding is delicate, as bits."""
    bits = [
        0x3F808000, 0x3F818000,  # ties: to even downwards, to even upwards
        0x3F808001, 0x3F807FFF,  # just past and just below a tie
        0x3FFFFFFF, 0x3F7FFFFF,  # carries into the next exponent
        0x7F7FFFFF, 0xFF7FFFFF,  # float32's largest: past bfloat16's, +-Inf
        0x7F7F7FFF, 0x7F7F8000,  # bfloat16's largest kept; the tie above it carries to Inf
        0x7F800000, 0xFF800000,  # +-Inf
        0x7FC00000, 0xFFC00001, 0x7F800001, 0x7FBFFFFF,  # NaNs: quiet, negative, signalling payloads
        0x00000001, 0x00008000, 0x00018000, 0x807FFFFF,  # denormals, a denormal tie, the largest one
        0x00000000, 0x80000000, 0x3EAAAAAB, 0xC2F6E979,  # +-0, 1/3, -123.456
    ]
    return torch.from_numpy(np.array(bits, dtype=np.uint32).view(np.float32).reshape(4, 6).copy())


class Cast(nn.Module):
    def forward(self, x):
        return x.to(BF16)


@pytest.mark.parametrize("storage", ["texture", "buffer"])
def test_round_matches_torch_bit_for_bit(device, storage):
    x = _patterns()
    limits = (1, 1, 1) if storage == "buffer" else None  # no texture fits: every tensor a buffer
    with texelflow.compile(Cast(), (x,), device=device, texture_limits=limits) as prog:
        assert prog.plan.fallbacks == []
        assert any(n.op.name == "round_bfloat16" for n in prog.plan.graph.nodes)
        got = prog(x)
    want = x.to(BF16)
    assert got.dtype == BF16
    assert _same_bits(got, want), (_bits(got), _bits(want))
    # torch's NaN is its quiet NaN, as every NaN here becomes
    assert torch.isnan(got.float()).sum() == 4


class Chain(nn.Module):
    """Elementwise bfloat16 arithmetic, numbers beside tensors, factories, casts both ways."""

    def forward(self, x, y):
        a = x.to(BF16) * 3 + 1.1  # mul keeps 3 in float32; add rounds 1.1 to bfloat16 first
        b = (a * torch.tensor(0.3)).exp() - torch.tensor(0.7)  # 0-d tensors: kept by mul, rounded by sub
        c = torch.where(a > 0.3, b, a / 7) % 2.5  # the comparison and remainder see bfloat16(0.3), (2.5)
        d = torch.full((3,), 0.1, dtype=BF16) + torch.arange(3, dtype=BF16)
        return b.float() + y, c, d, F.gelu(c).half(), (c * 1000).int()


def test_elementwise_chains_match_torch_bit_for_bit(device):
    torch.manual_seed(0)
    x, y = torch.randn(5, 7) * 3, torch.randn(5, 7)
    with texelflow.compile(Chain(), (x, y), device=device) as prog:
        assert prog.plan.fallbacks == []
        got = prog(x, y)
    want = Chain()(x, y)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert _same_bits(g, w) if g.is_floating_point() else torch.equal(g, w)


class Block(nn.Module):
    """A LLaMA-style block: RMSNorm through float32 and back, rotary-free causal attention, SiLU MLP."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.w = nn.Parameter(torch.randn(d))
        self.qkv, self.o = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.norm, self.up, self.down = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.heads = heads

    def rms(self, x):
        h = x.float()
        return self.w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in self.qkv(self.rms(x)).split(d, -1))
        x = x + self.o(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d))
        return x + self.down(F.silu(self.up(self.norm(x))))


class Net(nn.Module):
    """Conv, batch norm, ReLU and hardswish (fused with their producers), a pool, a head, argmax."""

    def __init__(self):
        super().__init__()
        self.c1, self.bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.c2, self.fc = nn.Conv2d(8, 8, 3, stride=2, groups=8), nn.Linear(8, 5)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)

    def forward(self, x):
        y = F.hardswish(self.c2(F.relu(self.bn(self.c1(x)))))
        y = self.fc(F.adaptive_avg_pool2d(y, 1).flatten(1))
        return y.softmax(-1), y.argmax(-1)


def _relative(got, want) -> float:
    return ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()


@pytest.mark.parametrize("make,shape", [(Block, (2, 7, 32)), (Net, (1, 3, 9, 11))], ids=["block", "net"])
def test_bfloat16_models_run_on_the_device(device, make, shape):
    torch.manual_seed(0)
    model = make().to(BF16).eval()
    x = torch.randn(shape, dtype=BF16)
    with texelflow.compile(model, (x,), device=device) as prog:
        assert prog.plan.fallbacks == []
        assert "bfloat16 held as float32" in prog.plan.summary()
        for seed in range(2):
            x = torch.randn(shape, dtype=BF16, generator=torch.Generator().manual_seed(seed))
            got, want = prog(x), model(x)
            got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
            for g, w in zip(got, want):
                assert g.dtype == w.dtype and g.shape == w.shape
                if g.is_floating_point():
                    assert _relative(g, w) <= MODEL_TOLERANCE
                else:
                    assert torch.equal(g, w)


def test_fused_activations_and_batch_norms_keep_fusing(device):
    """conv -> batch norm -> ReLU in bfloat16 is one kernel, as in float32: the roundings between
    them are dropped (the plan says so)."""
    model = Net().to(BF16).eval()
    plan = texelflow.plan(model, (torch.randn(1, 3, 9, 11, dtype=BF16),), device=device)
    ops = [n.op.name for n in plan.graph.nodes]
    assert "batch_norm" not in ops and "relu" not in ops and "hardswish" not in ops, ops
    assert "bfloat16 rounding" in plan.summary()


def _roundings(prog) -> int:
    return sum(1 for n in prog.plan.graph.nodes if n.op is not None and n.op.name == "round_bfloat16")


@pytest.mark.parametrize("make,shape", [(Block, (2, 7, 32)), (Net, (1, 3, 9, 11))], ids=["block", "net"])
def test_roundings_move_into_stores_bit_for_bit(device, monkeypatch, make, shape):
    """fold_roundings moves every rounding but the input's into a producer's store (through
    permutes, views and dropout), and the program gives the same bits as with round_bfloat16 nodes."""
    from texelflow.runtime.graph import bfloat16

    torch.manual_seed(1)
    model = make().to(BF16).eval()
    x = torch.randn(shape, dtype=BF16)
    with texelflow.compile(model, (x,), device=device) as folded:
        got = folded(x)
        assert _roundings(folded) == 1  # the input's, where a float32 caller (a saved program) enters
        report = folded.plan.graph.bfloat16
        assert report.at_store + report.in_fusion == report.rounds - 1
        assert "at its store" in folded.plan.summary()
    monkeypatch.setattr(bfloat16, "fold_roundings", lambda graph: 0)
    with texelflow.compile(model, (x,), device=device) as separate:
        want = separate(x)
        assert _roundings(separate) > 3
    got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
    for g, w in zip(got, want):
        assert _same_bits(g, w) if g.is_floating_point() else torch.equal(g, w)


def test_caller_passes_and_gets_bfloat16(device):
    model = Block().to(BF16).eval()
    x = torch.randn(1, 3, 32, dtype=BF16)
    with texelflow.compile(model, (x,), device=device) as prog:
        with pytest.raises(InputValueError, match="expected dtype bfloat16, got float32"):
            prog(x.float())
        assert prog._fast is not None  # the planned fast call takes bfloat16 in and out (call_fast.py)
        first = prog(x)
        assert first.dtype == BF16
        assert torch.equal(prog(x), first)  # and again: the same answer each call
        general = prog._general_call((x,))
        assert general.dtype == BF16 and torch.equal(general, first)


def test_cpu_fallback_inside_a_bfloat16_program(device):
    """A node with no Vulkan kernel runs on the CPU in float32; its result is rounded on the device."""

    class Gamma(nn.Module):
        def forward(self, x):
            return torch.special.i1e(x.abs() + 0.5) * 2

    x = torch.rand(4, 5, dtype=BF16) * 4
    with texelflow.compile(Gamma(), (x,), device=device) as prog:
        assert [f[0] for f in prog.plan.fallbacks] == ["special_i1e"], prog.plan.fallbacks
        got = prog(x)
    want = Gamma()(x)
    assert got.dtype == BF16
    # torch rounds |x| + 0.5 and i1e's result once each, as the program does
    assert _same_bits(got, want)


def test_saved_bfloat16_program_takes_float32(device, tmp_path):
    """numpy has no bfloat16: a saved bfloat16 program takes and returns float32, rounding its
    inputs to bfloat16 where they enter, so it gives the compiled program's answer for any float32."""
    model = Block().to(BF16).eval()
    x = torch.randn(2, 5, 32)
    with texelflow.compile(model, (x.to(BF16),), device=device) as prog:
        path = prog.save(tmp_path / "block.tflow")
        want = prog(x.to(BF16))
    loaded = texelflow.load(path, device=device)
    assert [s["dtype"] for s in loaded.input_specs] == ["float32"]
    assert [s["dtype"] for s in loaded.output_specs] == ["float32"]
    got = loaded(x.numpy())  # not bfloat16 values: rounded inside
    assert got.dtype == np.float32
    assert np.array_equal(got, want.float().numpy())


def test_bfloat16_buffer_written_by_forward_is_declined(device):
    """forward writing a bfloat16 buffer keeps torch's bfloat16 nodes (the call writes the model's own
    tensor back), which then run on the CPU, as before: right answers, the plan says why."""

    class Counter(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("total", torch.zeros(3, dtype=BF16))

        def forward(self, x):
            self.total.add_(x)
            return self.total * 2

    model = Counter()
    x = torch.full((3,), 0.3, dtype=BF16)
    with texelflow.compile(model, (x,), device=device) as prog:
        assert "bfloat16 held as float32" not in prog.plan.summary()
        assert prog.plan.fallbacks
        got = prog(x)
    assert got.dtype == BF16 and torch.equal(got, (x * 2))


@pytest.mark.slow
@pytest.mark.parametrize("name,size", [("vit_tiny", 32), ("resnet18", 64), ("mobilenet_v3_small", 96),
                                       ("convnext_atto", 64), ("unet_decoder", 64)])
def test_zoo_models_in_bfloat16(device, name, size):
    """Every zoo model in bfloat16: no CPU node, the same top-1 as torch's bfloat16 eager (per pixel,
    99%, for the decoder) and within MODEL_TOLERANCE of it."""
    model, inputs = ZOO[name](image_size=size)
    model = model.to(BF16).eval()
    inputs = tuple(t.to(BF16) for t in inputs)
    with texelflow.compile(model, inputs, device=device) as prog:
        assert prog.plan.fallbacks == []
        got, want = prog(*inputs), model(*inputs)
    assert got.dtype == BF16 and got.shape == want.shape
    assert _relative(got, want) <= MODEL_TOLERANCE
    agree = (got.argmax(1) == want.argmax(1)).float().mean().item()
    assert agree >= (1.0 if got.dim() == 2 else 0.99)


def test_round_reference_is_torchs():
    from texelflow.runtime.graph.bfloat16 import round_bfloat16_reference

    x = _patterns()
    assert _same_bits(round_bfloat16_reference(x), x.to(BF16))
    assert math.isinf(round_bfloat16_reference(torch.tensor(3.4028235e38)).item())
