"""scaled_dot_product_attention beyond the generic sample test: chosen mask values (fully masked
rows), causal masks with L != S, NaN and Inf inputs, fallbacks with their reasons, and a timm-style
attention block compiled whole, with its attention as one node.

Kernel cases run through nodecheck (the runtime's own lowering, one Program per variant and
representations) on every variant of the op, against torch's CPU result for the same inputs.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import texelflow
from texelflow.generated.ops import OPS
from texelflow.generated.variants import VARIANTS

from .nodecheck import check_variant, explicit_case, repr_combos

OP = OPS["scaled_dot_product_attention"]
NAN, INF = float("nan"), float("inf")


def qkv(rng, b, h, L, S, e, ev=None):
    shapes = {"query": (b, h, L, e), "key": (b, h, S, e), "value": (b, h, S, ev or e)}
    return {n: rng.uniform(-3, 3, size=s).astype(np.float32) for n, s in shapes.items()}


def assert_all_variants_match(device, inputs: dict, label: str, **scalars) -> None:
    """Every variant, in every representation assignment, gives torch's output for `inputs`: a
    float16 variant on the inputs rounded to float16, against torch's float32 answer on those
    rounded to float16 (nodecheck: within max(2e-3 relative, 1e-4); the kernel rounds once)."""
    sample = {name: a.shape for name, a in inputs.items()}
    sample.update(scalars)
    cases = {dtype: explicit_case(OP, sample, {n: a.astype(dtype) for n, a in inputs.items()}, f"{label} ({dtype})")
             for dtype in ("float32", "float16")}
    assert {VARIANTS[v].dtype for v in OP.variants} == set(cases)
    failures = []
    for vname in OP.variants:
        for combo in repr_combos(OP, VARIANTS[vname]):
            failures += [msg for _, msg in check_variant(device, vname, combo, [cases[VARIANTS[vname].dtype]])]
    assert not failures, "\n\n".join(failures)


@pytest.mark.parametrize("e", [6, 8])
def test_mask_with_fully_masked_rows(device, e):
    """An additive mask of -inf on whole rows gives 0 there (torch's safe softmax); -inf on some
    keys drops them; finite values shift the scores. Head dim 6 takes the row path, 8 the tiled one."""
    rng = np.random.default_rng(1)
    inputs = qkv(rng, 2, 3, 5, 7, e)
    mask = rng.uniform(-2, 2, size=(5, 7)).astype(np.float32)
    mask[1, :] = -INF
    mask[3, ::2] = -INF
    mask[:, 6] = -INF
    inputs["attn_mask"] = mask
    assert_all_variants_match(device, inputs, "mask [L, S] with fully masked rows")


def test_mask_broadcast_over_heads_with_masked_rows(device):
    rng = np.random.default_rng(2)
    inputs = qkv(rng, 2, 3, 4, 5, 7, ev=3)
    mask = np.zeros((2, 1, 4, 5), np.float32)
    mask[0, 0, 2, :] = -INF
    mask[1, 0, :, 1:4] = -INF
    inputs["attn_mask"] = mask
    assert_all_variants_match(device, inputs, "mask [B, 1, L, S]", scale=0.7)


@pytest.mark.parametrize("L,S", [(7, 3), (3, 7), (1, 5), (5, 1), (6, 6)])
def test_causal_is_top_left_aligned(device, L, S):
    """is_causal masks key s for query l when s > l, also when L != S (torch's tril of ones(L, S))."""
    inputs = qkv(np.random.default_rng(L * 10 + S), 2, 2, L, S, 5)
    assert_all_variants_match(device, inputs, f"causal L={L} S={S}", is_causal=True)


def test_long_rows_and_large_head_dim(device):
    """L and S of ViT's 197 tokens; a head dim past 256 takes two passes over the keys."""
    rng = np.random.default_rng(3)
    assert_all_variants_match(device, qkv(rng, 1, 2, 197, 197, 64), "197 tokens, d 64")
    assert_all_variants_match(device, qkv(rng, 1, 1, 5, 9, 300, ev=301), "d 300, dv 301")


@pytest.mark.parametrize("L,S", [(1, 1), (3, 7), (5, 13), (7, 3), (13, 5), (197, 197)])
@pytest.mark.parametrize("e,ev", [(64, 64), (4, 68), (3, 5), (1, 1), (5, 13)])
def test_tiled_and_row_paths_on_awkward_sizes(device, L, S, e, ev):
    """Head dims that are multiples of 4 up to 64 (value dims too) take the tiled path (4 rows per
    invocation, a last tile of 1 to 3 rows; Ev 68: two column tiles); E or Ev 1, 3, 5, 13 the row
    path (the tile's rows one by one)."""
    inputs = qkv(np.random.default_rng(L * 1000 + S * 10 + e), 1, 2, L, S, e, ev)
    assert_all_variants_match(device, inputs, f"L={L} S={S} E={e} Ev={ev}")


@pytest.mark.parametrize("heads,L,causal", [(63, 4, False), (64, 4, False), (16, 13, True), (15, 13, True)])
def test_many_heads_masks_and_causal_tiles(device, heads, L, causal):
    """Many heads of whole 4-row tiles, or with a last tile of 1 row (L 13, causal); not causal
    with a float mask per head (a -inf column); value dim 12, head dim 8; both dtypes."""
    rng = np.random.default_rng(heads * 100 + L)
    inputs = qkv(rng, 1, heads, L, 9, 8, ev=12)
    if not causal:  # torch takes no mask with is_causal
        mask = rng.uniform(-2, 2, size=(1, heads, L, 9)).astype(np.float32)
        mask[..., 4] = -INF
        inputs["attn_mask"] = mask
    assert_all_variants_match(device, inputs, f"{heads} heads L={L}", is_causal=causal, scale=0.4)


@pytest.mark.parametrize("L,S", [(1, 5), (5, 1), (7, 13), (13, 7), (197, 197)])
def test_causal_tiles_stop_at_their_last_row(device, L, S):
    """is_causal on the tiled path: a tile visits keys up to its last row only (top-left aligned)."""
    inputs = qkv(np.random.default_rng(L * 7 + S), 2, 1, L, S, 64, 8)
    assert_all_variants_match(device, inputs, f"causal tiled L={L} S={S}", is_causal=True)


def test_nan_and_inf_propagate_like_torch(device):
    """A NaN (or an Inf making a score +inf) in a query row makes that row NaN, a NaN key row every
    row that sees it, and a NaN or Inf in `value` its column. (torch's CPU kernels give 0 instead
    of NaN for a NaN query row of short sequences, depending on the shape; L = 40 is past that.)"""
    rng = np.random.default_rng(4)
    inputs = qkv(rng, 1, 3, 40, 40, 8)
    inputs["query"][0, 0, 0, 3] = NAN
    inputs["query"][0, 0, 5, :] = INF  # scores +-inf: NaN where one is +inf
    inputs["key"][0, 1, 7, 2] = NAN
    inputs["value"][0, 2, 11, 1] = INF
    inputs["value"][0, 2, 12, 4] = NAN
    want = F.scaled_dot_product_attention(*(torch.from_numpy(inputs[n]) for n in ("query", "key", "value")))
    assert want[0, 0, 0].isnan().all() and want[0, 1].isnan().all() and want[0, 2, :, 4].isnan().all()
    assert_all_variants_match(device, inputs, "NaN / Inf inputs")


class Sdpa(torch.nn.Module):
    def __init__(self, **kwargs):
        super().__init__()
        self.kwargs = kwargs

    def forward(self, q, k, v, *mask):
        return F.scaled_dot_product_attention(q, k, v, *mask, **self.kwargs)


@pytest.mark.parametrize("kwargs,shapes,mask_dtype,reason", [
    ({"dropout_p": 0.25}, ((1, 2, 3, 4), (1, 2, 3, 4)), None, "dropout_p=0.25 is not implemented"),
    ({"enable_gqa": True}, ((1, 4, 3, 4), (1, 2, 3, 4)), None, "enable_gqa=True is not implemented"),
    ({}, ((1, 2, 3, 4), (1, 2, 3, 4)), torch.bool, "dtype bool of"),
])
def test_unsupported_arguments_fall_back_with_a_reason(kwargs, shapes, mask_dtype, reason):
    q, k = torch.randn(shapes[0]), torch.randn(shapes[1])
    inputs = (q, k, torch.randn(shapes[1]))
    if mask_dtype is not None:
        inputs += (torch.rand(3, 3) > 0.5,)
    plan = texelflow.plan(Sdpa(**kwargs), inputs)
    reasons = [why for name, why in plan.fallbacks if "scaled_dot_product_attention" in name]
    assert len(reasons) == 1 and reason in reasons[0] and "\n" not in reasons[0], plan.fallbacks


class TimmAttention(torch.nn.Module):
    """timm's ViT attention: qkv projection, (3, B, heads, N, d) permute, unbind, sdpa, projection."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, dim * 3)
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x):
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        x = F.scaled_dot_product_attention(q, k, v)
        return self.proj(x.transpose(1, 2).reshape(b, n, c))


def test_timm_attention_block_is_one_sdpa_node(device):
    torch.manual_seed(0)
    model = TimmAttention(dim=20, heads=2).eval()
    x = torch.randn(2, 7, 20)
    with torch.no_grad(), texelflow.compile(model, (x,), device=device) as prog:
        assert prog.plan.fallbacks == []
        assert prog.plan.dispatches["scaled_dot_product_attention"] == 1
        got, want = prog(x), model(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_fp16_precision_keeps_attention_in_float16(device):
    """precision="fp16": sdpa has float16 variants, so the precision pass never keeps it float32
    for want of one (it may still keep a region float32 where casts cost more, pruned_ops); the
    block's answer is torch's within float16 rounding of the inputs and the stored values."""
    torch.manual_seed(1)
    model = TimmAttention(dim=24, heads=3).eval()
    x = torch.randn(2, 13, 24)
    with torch.no_grad(), texelflow.compile(model, (x,), device=device, precision="fp16") as prog:
        report = prog.plan.precision
        assert report.used == "fp16" and "scaled_dot_product_attention" not in report.single_ops, report.summary()
        assert "scaled_dot_product_attention" in report.half_nodes + list(report.pruned_ops), report.summary()
        got, want = prog(x), model(x)
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
