"""scaled_dot_product_attention beyond the generic sample test: chosen mask values (fully masked
rows), causal masks with L != S, NaN and Inf inputs, fallbacks with their reasons, what the kernel
refuses run as torch's decomposition, a timm-style attention block compiled whole, with its
attention as one node, and the form a GPU takes (attention as GEMMs).

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
from texelflow.runtime.graph.prepack_matmul import ATTENTION_ENV, GEMM_ENV, SubgroupFacts, attention_form

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


@pytest.mark.parametrize("S", [3, 5])
def test_inf_in_the_last_value_row_of_an_odd_key_count(device, S):
    """The tiled path takes keys 2 at a time: with S odd its last block repeats the last key, whose
    weight is 0 there; an Inf in that value row must not make 0 * Inf = NaN of every row (it did)."""
    inputs = qkv(np.random.default_rng(S), 1, 2, 6, S, 8)
    inputs["value"][0, 0, S - 1, 2] = INF
    inputs["value"][0, 1, S - 1, 5] = -INF
    assert_all_variants_match(device, inputs, f"Inf in value row {S - 1} of {S}")


class Sdpa(torch.nn.Module):
    def __init__(self, **kwargs):
        super().__init__()
        self.kwargs = kwargs

    def forward(self, q, k, v, *mask):
        return F.scaled_dot_product_attention(q, k, v, *mask, **self.kwargs)


def test_dropout_falls_back_with_a_reason():
    q = torch.randn(1, 2, 3, 4)
    plan = texelflow.plan(Sdpa(dropout_p=0.25), (q, q, q))
    reasons = [why for name, why in plan.fallbacks if "scaled_dot_product_attention" in name]
    assert len(reasons) == 1 and "dropout_p=0.25 is not implemented" in reasons[0] and "\n" not in reasons[0], \
        plan.fallbacks


@pytest.mark.parametrize("kwargs,shapes,bool_mask", [
    ({"enable_gqa": True}, ((1, 4, 3, 4), (1, 2, 3, 4)), False),
    ({}, ((1, 2, 3, 4), (1, 2, 3, 4)), True),
])
def test_what_the_kernel_refuses_runs_as_its_decomposition(device, kwargs, shapes, bool_mask):
    """enable_gqa and a bool mask, which the fused kernel does not take (contract checks), run on
    the device as torch's decomposition (bmm, softmax, where ...), fully masked rows 0 as in torch."""
    torch.manual_seed(3)
    q, k = torch.randn(shapes[0]), torch.randn(shapes[1])
    inputs = (q, k, torch.randn(shapes[1]))
    if bool_mask:
        mask = torch.rand(3, 3) > 0.5
        mask[1, :] = False  # a fully masked row
        inputs += (mask,)
    model = Sdpa(**kwargs)
    with texelflow.compile(model, inputs, device=device) as prog:
        assert prog.plan.fallbacks == [] and "scaled_dot_product_attention" not in prog.plan.dispatches
        assert prog.plan.dispatches["bmm"] + prog.plan.dispatches["mm_wg"] == 2, prog.plan.dispatches
        got = prog(*inputs)
    torch.testing.assert_close(got, model(*inputs), rtol=1e-4, atol=1e-5)


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


def test_timm_attention_block_is_one_sdpa_node(device, register_tiles):
    torch.manual_seed(0)
    model = TimmAttention(dim=20, heads=2).eval()
    x = torch.randn(2, 7, 20)
    with torch.no_grad(), texelflow.compile(model, (x,), device=device) as prog:
        assert prog.plan.fallbacks == []
        assert prog.plan.dispatches["scaled_dot_product_attention"] == 1
        got, want = prog(x), model(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_fp16_precision_keeps_attention_in_float16(device, register_tiles):
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


# ---- attention as GEMMs: what a GPU takes (prepack_matmul.attention_form) -------------------------------
def test_gpus_take_attention_as_gemms(monkeypatch):
    """Where GEMMs take workgroup tiles attention is torch's decomposition (its bmm on mm_wg);
    elsewhere the fused kernel; TEXELFLOW_ATTENTION forces either, and a bad value is an error."""
    monkeypatch.delenv(GEMM_ENV, raising=False)
    monkeypatch.delenv(ATTENTION_ENV, raising=False)
    gpu, cpu = SubgroupFacts(32, True, "discrete"), SubgroupFacts(8, True, "cpu")
    assert attention_form(gpu) == ("gemm", "GEMMs take workgroup tiles (a discrete GPU)")
    assert attention_form(cpu)[0] == "fused" and attention_form(None)[0] == "fused"
    monkeypatch.setenv(ATTENTION_ENV, "fused")
    assert attention_form(gpu) == ("fused", "TEXELFLOW_ATTENTION=fused")
    monkeypatch.setenv(ATTENTION_ENV, "gemm")
    q = torch.randn(1, 2, 5, 8)
    plan = texelflow.plan(Sdpa(), (q, q, q))
    assert "scaled_dot_product_attention" not in plan.dispatches and plan.dispatches["bmm"] == 2, plan.dispatches
    notes = [note for n in plan.graph.device_nodes() for note in n.fused if "decomposed" in note]
    assert notes == ["first piece of aten.scaled_dot_product_attention.default scaled_dot_product_attention, "
                     "decomposed: attention as bmm + softmax + bmm: TEXELFLOW_ATTENTION=gemm"], notes
    monkeypatch.setenv(ATTENTION_ENV, "flash")
    with pytest.raises(ValueError, match="TEXELFLOW_ATTENTION='flash': expected one of auto, fused, gemm"):
        texelflow.plan(Sdpa(), (q, q, q))


@pytest.mark.parametrize("kwargs,shapes,mask", [
    ({}, ((1, 6, 17, 64), (1, 6, 17, 64), (1, 6, 17, 64)), None),  # a ViT head, short
    ({"scale": 0.3}, ((2, 5, 7), (2, 3, 7), (2, 3, 9)), None),  # rank 3, Ev != E
    ({}, ((1, 1, 3, 260), (1, 1, 5, 260), (1, 1, 5, 261)), None),  # head dim past 64
    ({}, ((2, 3, 5, 4), (2, 3, 6, 4), (2, 3, 6, 4)), (2, 3, 5, 6)),  # a mask with fully masked rows
    ({}, ((2, 2, 5, 3), (2, 2, 7, 3), (2, 2, 7, 5)), (2, 1, 1, 7)),  # a broadcast mask
    ({"is_causal": True}, ((2, 1, 6, 8), (2, 1, 3, 8), (2, 1, 3, 8)), None),  # causal, L != S
    ({}, ((1, 2, 3, 4), (2, 2, 5, 4), (2, 2, 5, 4)), None),  # query broadcast over the batch
])
def test_attention_as_gemms_against_torch(device, monkeypatch, kwargs, shapes, mask):
    """The GPU's form, run here on this device: every case torch's answer, NaN and Inf included
    (a NaN key element, an Inf value element)."""
    monkeypatch.setenv(ATTENTION_ENV, "gemm")
    torch.manual_seed(len(shapes[0]) * 10 + shapes[0][-1])
    q, k, v = (torch.randn(s) for s in shapes)
    k.view(-1)[1] = NAN  # key row 0: NaN in every row that sees it (a NaN query row of a short
    v.view(-1)[-2] = INF  # sequence is 0 in torch's CPU kernel, NaN in its math: not tested here)
    inputs = (q, k, v)
    if mask is not None:
        m = torch.randn(mask)
        if mask[-2] > 1:
            m[..., 1, :] = -INF  # a fully masked row: 0
        m[..., 2] = -INF
        inputs += (m,)
    model = Sdpa(**kwargs)
    with texelflow.compile(model, inputs, device=device) as prog:
        assert prog.plan.fallbacks == []
        # every case decomposes: a causal one's mask (ones() and tril(), numbers alone) is folded
        assert "scaled_dot_product_attention" not in prog.plan.dispatches, prog.plan.dispatches
        got = prog(*inputs)
    # against torch's math kernel: its CPU flash kernel drops a NaN key row from short causal rows
    mask = inputs[3] if len(inputs) > 3 else None
    want = torch.ops.aten._scaled_dot_product_attention_math(q, k, v, mask, is_causal=kwargs.get("is_causal", False),
                                                             scale=kwargs.get("scale"))[0]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, equal_nan=True)
    if not kwargs.get("is_causal"):
        torch.testing.assert_close(got, model(*inputs), rtol=1e-4, atol=1e-5, equal_nan=True)
