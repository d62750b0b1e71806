"""Coverage benchmark: which patterns of third-party model code run whole on the device.

Each case is a few lines as transformers, timm, open_clip or a detection head writes them. For
each, the plan's CPU nodes (count and the first reason) and the compiled program's largest
error against eager torch, relative to the largest reference value. Nothing is timed: a pattern
either runs on the device or its plan says why not.

    python bench/coverage.py                 # every case, a markdown table
    python bench/coverage.py --only topk     # the cases whose name contains this
"""

from __future__ import annotations

import argparse
import math
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

import texelflow


class Call(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def _clip_pool(x, ids):
    return x[torch.arange(x.shape[0]), ids.argmax(dim=-1)]


def _roberta_positions(ids):
    mask = ids.ne(1).int()
    return (torch.cumsum(mask, dim=1).type_as(mask) * mask).long() + 1


def _last_token(h, ids):
    last = (torch.eq(ids, 0).int().argmax(-1) - 1) % ids.shape[-1]
    return h[torch.arange(h.shape[0]), last]


def _length_mask(x, lengths):
    keep = torch.arange(x.shape[1])[None, :] < lengths[:, None]
    return x.masked_fill(~keep[:, :, None], 0.0).sum(1)


def _causal_update(x, attention_mask):
    t = attention_mask.shape[1]
    low = torch.finfo(torch.float32).min
    causal = torch.triu(torch.full((t, t), low), diagonal=1)
    causal = causal * (torch.arange(t) > torch.arange(t).reshape(-1, 1))
    causal = causal[None, None].expand(x.shape[0], 1, -1, -1).clone()
    padding = (causal[:, :, :, :t] + attention_mask[:, None, None, :]) == 0
    causal[:, :, :, :t] = causal[:, :, :, :t].masked_fill(padding, low)
    return torch.softmax(x + causal, -1)


def _router(x):
    weights, chosen = x.topk(2, dim=-1)
    return weights.softmax(-1) * (chosen == 1).sum(-1, keepdim=True)


def _assignments(x, src):
    y = x.clone()
    y[:, 1:3] = src
    y[y > 2] = 0.0
    return y.index_add(0, torch.tensor([3, 0]), x[:2])


def _bloom_alibi(x, attention_mask):
    positions = ((attention_mask.cumsum(dim=-1) - 1) * attention_mask)[:, None, :]
    return x + torch.tensor([0.5, 0.25])[..., None] * positions


def _half_rms_norm(h):
    f = h.to(torch.float32)
    return (f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.float16) * h


def _tril_mask(x):
    mask = torch.ones(x.shape[-1], x.shape[-1], dtype=torch.bool).tril()
    return x.masked_fill(mask == 0, float("-inf")).softmax(-1)


def _t5_buckets(q):
    t = q.shape[1]
    rel = torch.arange(t, dtype=torch.long)[None, :] - torch.arange(t, dtype=torch.long)[:, None]
    ret = (rel > 0).to(torch.long) * 4
    n = torch.abs(rel)
    large = 2 + (torch.log(n.float() / 2) / math.log(12 / 2) * 2).to(torch.long)
    buckets = ret + torch.where(n < 2, n, torch.min(large, torch.full_like(large, 3)))
    bias = F.embedding(buckets, torch.linspace(-1, 1, 16).reshape(8, 2)).permute(2, 0, 1)
    return q @ q.transpose(1, 2) + bias


def _complex_rope(x):
    freqs = torch.outer(torch.arange(x.shape[1]).float(), 1.0 / 10000 ** (torch.arange(0, 8, 2).float() / 8))
    z = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2)) * torch.polar(torch.ones_like(freqs), freqs)[None, :, None]
    return torch.view_as_real(z).flatten(3)


def _bf16(x):
    return (x.to(torch.bfloat16) * 2).float()


class HalfRmsNormBf16(nn.Module):
    """A bfloat16 model as transformers' LLaMA code writes it: RMSNorm through float32 and back,
    a linear, softmax in float32 cast back, a finfo(bfloat16).min causal mask."""

    def __init__(self, d=16):
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, d))
        self.proj = nn.Linear(d, d, bias=False)

    def forward(self, h):
        dtype = h.dtype
        x = h.to(torch.float32)
        x = self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dtype)
        w = self.proj(x) @ x.transpose(-1, -2)
        t = w.shape[-1]
        w = w + torch.full((t, t), torch.finfo(dtype).min, dtype=dtype).triu(1)
        return torch.softmax(w, dim=-1, dtype=torch.float32).to(dtype) @ x


def _longformer_chunks(h):
    b, t, d = h.shape
    h = h.view(b, t // 4, 4, d)
    size, stride = list(h.size()), list(h.stride())
    size[1], stride[1] = size[1] * 2 - 1, stride[1] // 2
    return h.as_strided(size=size, stride=stride)


def _top_p(logits):
    """transformers' top-p (nucleus) filter: sort, cumsum of softmax, shift the mask, scatter back."""
    ordered, order = torch.sort(logits, descending=True)
    drop = torch.cumsum(F.softmax(ordered, -1), -1) > 0.9
    drop[..., 1:] = drop[..., :-1].clone()
    drop[..., 0] = False
    return logits.masked_fill(drop.scatter(1, order, drop), -float("inf"))


IDS = torch.tensor([[0, 5, 7, 9, 2, 1, 1], [0, 3, 4, 5, 6, 8, 2]])
PADDED = torch.tensor([[5, 3, 2, 7, 0, 0, 0], [1, 2, 3, 4, 5, 6, 7]])
MASK = (PADDED != 0).long()
G = torch.Generator().manual_seed(0)


def _randn(*shape):
    return torch.randn(*shape, generator=G)


CASES = {
    # name: (callable or module, inputs, what it stands for)
    "clip_pool": (_clip_pool, (_randn(2, 7, 8), IDS), "open_clip's text pooling, x[arange(B), ids.argmax(-1)]"),
    "roberta_positions": (_roberta_positions, (IDS,), "RoBERTa / XLM-R position ids from the padding mask"),
    "last_token": (_last_token, (_randn(2, 7, 4), PADDED), "transformers' sequence-classification pooling"),
    "length_mask": (_length_mask, (_randn(3, 6, 4), torch.tensor([6, 2, 4])), "arange(T) < lengths[:, None]"),
    "causal_update": (_causal_update, (_randn(2, 1, 7, 7), MASK), "transformers' causal mask, updated in place"),
    "router_top2": (_router, (_randn(2, 5, 8),), "a mixture-of-experts router: topk, float x bool"),
    "gather": (lambda x, i: torch.gather(x, 1, i), (_randn(3, 5, 4), torch.randint(0, 5, (3, 2, 4), generator=G)),
               "torch.gather"),
    "take_along_dim": (lambda x, i: torch.take_along_dim(x, i, dim=-1), (_randn(3, 5), torch.tensor([[4], [-1], [0]])),
                       "torch.take_along_dim"),
    "one_hot": (lambda i: F.one_hot(i, 10).float(), (IDS,), "F.one_hot"),
    "f_unfold": (lambda x: F.unfold(x, 3, padding=1), (_randn(1, 3, 6, 7),), "F.unfold (im2col)"),
    "tensor_unfold": (lambda x: x.unfold(-1, 4, 2), (_randn(2, 3, 9),), "Tensor.unfold (framing)"),
    "circular_pad": (lambda x: F.pad(x, (1, 1, 2, 0), mode="circular"), (_randn(1, 3, 5, 6),), "F.pad circular"),
    "bicubic": (lambda x: F.interpolate(x, scale_factor=2, mode="bicubic"), (_randn(1, 3, 5, 6),), "bicubic upsampling"),
    "layer_norm_chw": (nn.LayerNorm([3, 5, 6]), (_randn(2, 3, 5, 6),), "nn.LayerNorm([C, H, W])"),
    "whole_max": (lambda x: x / x.max() - x.min(), (_randn(2, 3, 5),), "x.max(), x.min()"),
    "std_mean": (lambda x: torch.std_mean(x, dim=(2, 3))[0], (_randn(2, 3, 5, 6),), "torch.std_mean"),
    "assignments": (_assignments, (_randn(5, 7), _randn(5, 2)), "y[:, a:b] = src, y[mask] = v, index_add"),
    "grid_sample": (lambda x, g: F.grid_sample(x, g, align_corners=False), (_randn(1, 3, 5, 6), _randn(1, 4, 4, 2)),
                    "F.grid_sample (a spatial transformer's warp)"),
    "bloom_alibi": (_bloom_alibi, (_randn(2, 2, 7), MASK), "BLOOM's alibi: a cumsum of the int64 attention mask"),
    "scatter_add": (lambda x, i: torch.zeros(2, 6).scatter_add(1, i, x), (_randn(2, 5), IDS[:, :5] % 6),
                    "Tensor.scatter_add"),
    "sort": (lambda x: x.sort(-1)[0], (_randn(2, 9),), "torch.sort"),
    "sort_long": (lambda x: x.argsort(-1), (_randn(4, 2048),), "argsort of 2,048-element lines"),
    "floor_divide": (lambda ids: (ids % 7 - 3) // 2 + torch.div(ids, 3, rounding_mode="trunc"), (IDS,),
                     "`//` and torch.div(rounding_mode=...) of int64 ids"),
    "int_magnitudes": (lambda ids: (ids % 9 - 4).abs().clamp(1, 3) * -(ids % 5), (IDS,), "abs, clamp, neg of ints"),
    "float_to_int": (lambda x: (x * 10).int() // 3, (_randn(3, 5),), "x.int(): a float rounded toward zero"),
    "tril_mask": (_tril_mask, (_randn(2, 5, 5),), "ones(T, T).bool().tril() == 0 as a -inf mask"),
    "count_nonzero": (lambda x: torch.count_nonzero(x > 0, -1), (_randn(3, 5),), "count_nonzero of a mask"),
    "median": (lambda x: x.median(-1)[0] + x.kthvalue(2, -1)[0], (_randn(3, 7),), "torch.median, torch.kthvalue"),
    "conv3d": (nn.Conv3d(3, 4, (3, 3, 3), padding=1), (_randn(1, 3, 4, 6, 7),), "nn.Conv3d (video models)"),
    "pool3d": (lambda x: F.max_pool3d(x, 2) + F.avg_pool3d(x, 2) + F.adaptive_avg_pool3d(x, 1),
               (_randn(1, 3, 4, 6, 6),), "max / avg / adaptive 3-D pools"),
    "embedding_bag": (nn.EmbeddingBag(10, 4, mode="mean"), (IDS[0], torch.tensor([0, 3, 3])),
                      "nn.EmbeddingBag with offsets (DLRM)"),
    "scatter_reduce": (lambda x, i: torch.zeros(2, 6).scatter_reduce(1, i, x, "amax", include_self=False),
                       (_randn(2, 5), IDS[:, :5] % 6), "Tensor.scatter_reduce (graph networks)"),
    "bucketize": (lambda x: torch.bucketize(x, torch.tensor([-1.0, 0.0, 1.0])), (_randn(3, 5),), "torch.bucketize"),
    "diagonal": (lambda x: torch.diagonal(x, 0, -2, -1).sum(-1) + torch.trace(x[0]), (_randn(2, 4, 4),),
                 "torch.diagonal, torch.trace"),
    "cdist": (lambda x, y: torch.cdist(x, y), (_randn(2, 5, 3), _randn(2, 4, 3)), "torch.cdist"),
    "fold": (lambda x: F.fold(x, (5, 6), 3, padding=1), (_randn(1, 27, 30),), "F.fold (col2im)"),
    "trig": (lambda x, y: torch.atan2(x, y) + torch.sinh(x) + torch.acosh(1 + y.abs()) + torch.asin(x.tanh()),
             (_randn(3, 5), _randn(3, 5)), "atan2, sinh, acosh, asin"),
    "bitwise": (lambda ids: ((ids >> 1) & 3) | (ids % 4) ^ 5, (IDS,), "bitwise ops and shifts of int64 ids"),
    "prod": (lambda x: x.prod(-1) + x.cumprod(1).sum(1), (_randn(3, 5),), "prod, cumprod"),
    "half_rms_norm": (_half_rms_norm, (_randn(3, 8).half(),), "a float16 model's RMSNorm: .float(), .half()"),
    "t5_buckets": (_t5_buckets, (_randn(1, 7, 5),), "T5's relative position buckets: arange, log, .long(), min"),
    "complex_rope": (_complex_rope, (_randn(2, 5, 3, 8),), "Meta LLaMA's rotary embedding: view_as_complex, polar"),
    "fnet_fft": (lambda x: torch.fft.fftn(x, dim=(1, 2)).real, (_randn(2, 6, 8),), "FNet's token mixing: fftn(x).real"),
    "gfnet_rfft2": (lambda x: torch.fft.irfft2(torch.fft.rfft2(x, dim=(1, 2), norm="ortho") * 0.5, s=(5, 6),
                                               dim=(1, 2), norm="ortho"), (_randn(2, 5, 6, 4),), "GFNet: rfft2, irfft2"),
    "lead_broadcast_5d": (lambda x, g: x * g.sigmoid() + g, (_randn(2, 3, 4, 5, 6), _randn(1, 3, 1, 1, 6)),
                          "a rank-5 input broadcast inside the dims WHCN folds into N"),
    "erfc_round": (lambda x: torch.erfc(x) + torch.round(x, decimals=2), (_randn(3, 5),), "erfc, round(decimals=)"),
    "fmod_remainder": (lambda x, y: torch.fmod(x * 50, y) + (x * 50) % 0.7 + torch.remainder(x, y),
                       (_randn(3, 5), _randn(3, 5)), "float fmod and remainder (%), exact"),
    "hypot_copysign": (lambda x, y: torch.hypot(x, y) + torch.copysign(x, y) + torch.signbit(y).float(),
                       (_randn(3, 5), _randn(3, 5)), "hypot, copysign, signbit"),
    "logaddexp": (lambda x, y: torch.logaddexp(x, y) + torch.logaddexp2(x, y) + torch.fmax(x, y),
                  (_randn(3, 5), _randn(3, 5)), "logaddexp, logaddexp2, fmax"),
    "aminmax_bilinear": (lambda x, y: nn.functional.bilinear(x, y, torch.ones(2, 5, 5) * 0.1).sum(-1) + torch.aminmax(x, dim=-1)[1],
                         (_randn(3, 5), _randn(3, 5)), "F.bilinear (nn.Bilinear), torch.aminmax"),
    "int_to_bool": (lambda x, m: torch.where(m.bool(), x, -x), (_randn(2, 7), PADDED), "an int64 mask's .bool()"),
    "lgamma": (lambda x: torch.lgamma(x.abs() + 0.5) + torch.digamma(x.abs() + 0.5), (_randn(3, 5),), "lgamma, digamma"),
    "logcumsumexp": (lambda x: torch.logcumsumexp(x, -1) + torch.cummax(x, -1)[0], (_randn(3, 5),),
                     "logcumsumexp, cummax"),
    "antialias": (lambda x: F.interpolate(x, size=(4, 4), mode="bilinear", antialias=True), (_randn(1, 3, 9, 9),),
                  "antialiased downsampling"),
    "adaptive_max": (lambda x: F.adaptive_max_pool2d(x, (2, 3)).sum(-1) + F.adaptive_max_pool1d(x.flatten(2), 1),
                     (_randn(1, 3, 7, 9),), "adaptive max pooling of unequal windows, 1-D and 2-D"),
    "heaviside_exp2": (lambda x: torch.heaviside(x, torch.tensor(0.5)) + torch.exp2(x), (_randn(3, 5),),
                       "heaviside (a where of two dtypes), exp2"),
    "as_strided": (_longformer_chunks, (_randn(2, 12, 3),), "Longformer's overlapping chunks: as_strided"),
    "top_p": (_top_p, (_randn(2, 10),), "top-p filtering: a shifted bool mask, scatter"),
    "stft_log_mel": (lambda x: torch.log(torch.stft(x, 32, 8, window=torch.hann_window(32), return_complex=True).abs() ** 2
                                         + 1e-6), (_randn(2, 100),), "a log spectrogram: torch.stft in forward"),
    "video_pool": (lambda x: x.mean((2, 3, 4)) + x.amax((0, 2, 4)).sum(), (_randn(2, 3, 4, 5, 6),),
                   "a video model's pooling of [B, C, T, H, W]: rank-5 reductions"),
    "bfloat16": (_bf16, (_randn(3, 5),), "a bfloat16 cast"),
    "bfloat16_model": (HalfRmsNormBf16().to(torch.bfloat16), (_randn(2, 6, 16).to(torch.bfloat16),),
                       "a bfloat16 model: RMSNorm via float32, softmax(dtype=float32), finfo.min mask"),
}


def run_case(name: str) -> tuple[int, str, float | None]:
    """(CPU nodes, the first one's reason, relative max error) of one case."""
    fn, inputs, _ = CASES[name]
    model = fn if isinstance(fn, nn.Module) else Call(fn)
    model.eval()
    with torch.no_grad():
        want = model(*inputs)
        with texelflow.compile(model, inputs) as prog:
            got = prog(*inputs)
            fallbacks = prog.plan.fallbacks
    got = got if isinstance(got, (tuple, list)) else (got,)
    want = want if isinstance(want, (tuple, list)) else (want,)
    err = 0.0
    for g, w in zip(got, want):
        g, w = g.double(), w.double()
        scale = w[torch.isfinite(w)].abs().max().item() if torch.isfinite(w).any() else 1.0
        err = max(err, ((g - w).abs().nan_to_num(0.0).max().item()) / max(scale, 1e-12))
    why = fallbacks[0][1] if fallbacks else ""
    return len(fallbacks), why, err


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run only the cases whose name contains this")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    print("| case | pattern | CPU nodes | max error (relative) | first CPU node's reason |")
    print("|---|---|---:|---:|---|")
    for name, (_, _, what) in CASES.items():
        if args.only not in name:
            continue
        try:
            count, why, err = run_case(name)
            shown = why if len(why) <= 110 else why[:107] + "..."
            print(f"| {name} | {what} | {count} | {err:.1e} | {shown.replace('|', '/')} |", flush=True)
        except Exception as exc:  # a case that fails to compile: reported, the rest still run
            print(f"| {name} | {what} | error | - | {type(exc).__name__}: {str(exc).splitlines()[0][:100]} |",
                  flush=True)


if __name__ == "__main__":
    main()
