"""Fused attention (scaled_dot_product_attention) speed on the Vulkan device: the current kernel
against the one a git revision generated, in one process, alternating, GPU timestamps.

Shapes: ViT-S/16's attention [1, 6, 197, 64], a causal decoder [1, 8, 128, 64] and an awkward one
(L 37, S 53, head dim 20, value dim 13, an additive mask). Each row gives the median of `--reps`
timed runs per round over `--rounds` alternating rounds (the machine may be shared: alternating lets
both kernels see the same load), FLOPs counted as 2 * L * S * (E + Ev) per head (halved for causal),
and the max error against torch's CPU result. The revision's kernel gets its own grid (units) from
that revision's ops.yaml contract: one invocation per row before the tiled kernel.
Usage: python bench/attention.py [--baseline REV] [--reps N] [--rounds N] [--storage buffer,texture3d]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import texelflow.generated as generated
import texelflow.shaders as shaders
from texelflow.runtime.vulkan.device import Device
from texelflow.runtime.vulkan.pipeline import find_variant
from texelflow.runtime.vulkan.program import Dispatch, Program
from texelflow.runtime.vulkan.tensor import VkTensor
from texelflow.shaders import spirv_cache

ROOT = Path(__file__).resolve().parents[1]
OP = "scaled_dot_product_attention"
CASES = [  # name, query, key, value shapes, mask shape or None, is_causal
    ("ViT-S/16 1x6x197x64", (1, 6, 197, 64), (1, 6, 197, 64), (1, 6, 197, 64), None, False),
    ("decoder causal 1x8x128x64", (1, 8, 128, 64), (1, 8, 128, 64), (1, 8, 128, 64), None, True),
    ("awkward 2x3x37x20 S53 Ev13 mask", (2, 3, 37, 20), (2, 3, 53, 20), (2, 3, 53, 13), (37, 53), False),
]


def revision_source(variant, rev: str) -> str | None:
    shown = subprocess.run(["git", "show", f"{rev}:generated/glsl/{variant.source}"], cwd=ROOT,
                           capture_output=True, text=True)
    return None if shown.returncode else shown.stdout


def compile_glsl(source: str, variant, label: str) -> bytes:
    glsl = Path(generated.__file__).parent / "glsl"
    return spirv_cache.spirv(source, [glsl / "include", Path(shaders.__file__).parent / "include"],
                             variant.target_env, label)


def units_for(source: str, out_shape) -> int:
    """Invocations the kernel in `source` expects: per tile (64 columns x 4 rows) for the tiled
    kernel, else one per row (the grid the contract of that revision declared)."""
    rows = int(np.prod(out_shape[:-1]))
    if "struct Tile" in source:
        return -(-out_shape[-1] // 64) * -(-out_shape[-2] // 4) * (rows // out_shape[-2])
    return rows


def median_us(device, dispatch: Dispatch, reps: int) -> float:
    prog = Program(device, [dispatch])
    try:
        prog()
        times = []
        for _ in range(reps):
            prog()
            times.append(prog.profile()[0][1])
        return statistics.median(times)
    finally:
        prog.close()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--baseline", default="HEAD", help="git revision whose generated kernel to compare with")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--storage", default="buffer,texture3d")
    args = parser.parse_args()
    device = Device()
    rng = np.random.default_rng(0)
    print(f"device: {device.limits.name}; median of {args.reps} runs x {args.rounds} alternating rounds")
    print(f"| case | storage | new ms | new GFLOP/s | {args.baseline} ms | {args.baseline} GFLOP/s | speed-up | max err |")
    print("|---|---|---|---|---|---|---|---|")
    for name, qs, ks, vs, mask_shape, causal in CASES:
        q, k, v = (rng.standard_normal(s, dtype=np.float32) for s in (qs, ks, vs))
        mask = rng.uniform(-1, 1, size=mask_shape).astype(np.float32) if mask_shape else None
        tq, tk, tv = map(torch.from_numpy, (q, k, v))
        want = F.scaled_dot_product_attention(tq, tk, tv, None if mask is None else torch.from_numpy(mask),
                                              is_causal=causal).numpy()
        heads = int(np.prod(qs[:-2]))
        flops = 2 * heads * qs[-2] * ks[-2] * (qs[-1] + vs[-1]) / (2 if causal else 1)
        scalars = {"has_attn_mask": int(mask is not None), "is_causal": int(causal), "scale": qs[-1] ** -0.5}
        for storage in args.storage.split(","):
            variant = find_variant(OP, dtype="float32", storage=storage)
            fixed = {b.tensor: b.storage for b in variant.bindings}
            arrays = {"query": q, "key": k, "value": v, "attn_mask": np.zeros(1, np.float32) if mask is None else mask}
            ts = {"out": VkTensor(device, want.shape, "float32", storage, "WIDTH_PACKED", label="out")}
            for n, a in arrays.items():
                ts[n] = VkTensor(device, a.shape, "float32", fixed[n], "WIDTH_PACKED", label=n)
                ts[n].upload(a)
            try:
                new_src = (Path(generated.__file__).parent / "glsl" / variant.source).read_text()
                kernels = {"new": (None, units_for(new_src, want.shape))}
                old_src = revision_source(variant, args.baseline)
                if old_src is not None and old_src != new_src:
                    kernels["old"] = (compile_glsl(old_src, variant, variant.name + "_baseline"),
                                      units_for(old_src, want.shape))
                times, errs = {n: [] for n in kernels}, {}
                for _ in range(args.rounds):
                    for n, (spirv, units) in kernels.items():
                        times[n].append(median_us(device, Dispatch(variant, ts, scalars, units=units, spirv=spirv),
                                                  args.reps))
                        errs[n] = float(np.nanmax(np.abs(ts["out"].download() - want)))
                new = statistics.median(times["new"])
                old = statistics.median(times["old"]) if "old" in times else None
                old_cols = (f"{old / 1e3:.2f} | {flops / old / 1e3:.2f} | {old / new:.2f}x" if old else "- | - | -")
                print(f"| {name} | {storage} | {new / 1e3:.2f} | {flops / new / 1e3:.2f} | {old_cols} | "
                      f"{errs['new']:.1e} |", flush=True)
            finally:
                for t in ts.values():
                    t.close()
    device.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
