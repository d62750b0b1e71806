"""Fused attention (scaled_dot_product_attention) speed on the Vulkan device: the current kernel
against the one a git revision generated, in one process, alternating, GPU timestamps.

Shapes: ViT-S/16's attention [1, 6, 197, 64], a causal decoder [1, 8, 128, 64], an awkward one
(L 37, S 53, head dim 20, value dim 13, an additive mask), and the edges: [1, 1, 1, 1], a decode step
(L 1, S 1024), S 1, small heads (E 8, E 3). Each row gives the median of `--reps` timed runs per
round over `--rounds` alternating rounds (the machine may be shared: alternating lets every kernel
see the same load), the speed-up of the current kernel over each baseline revision as the ratio of
medians and of bests, FLOPs counted as 2 * L * S * (E + Ev) per head (halved for causal), and the
max error against torch's CPU result (float16: inputs rounded to float16). A revision's kernel gets
the grid (units) its own template contract declares (`grid:` of shaders/sdpa.glsl.j2 there).
c184c94 is the one-row-per-invocation kernel, 8d69e00 the first 4-row tiled one.
Usage: python bench/attention.py [--baseline REV[,REV...]] [--reps N] [--rounds N]
       [--storage buffer,texture3d] [--dtype float32|float16] [--only SUBSTRING]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
from pathlib import Path

import numpy as np
import torch
import yaml
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
    ("degenerate 1x1x1x1", (1, 1, 1, 1), (1, 1, 1, 1), (1, 1, 1, 1), None, False),
    ("decode L1 S1024 1x8x1x64", (1, 8, 1, 64), (1, 8, 1024, 64), (1, 8, 1024, 64), None, False),
    ("S1 1x4x64x64", (1, 4, 64, 64), (1, 4, 1, 64), (1, 4, 1, 64), None, False),
    ("small 1x2x5x8 S7", (1, 2, 5, 8), (1, 2, 7, 8), (1, 2, 7, 8), None, False),
    ("E3 Ev5 1x4x50x3 S50 causal", (1, 4, 50, 3), (1, 4, 50, 3), (1, 4, 50, 5), None, True),
]


def revision_source(variant, rev: str) -> str | None:
    shown = subprocess.run(["git", "show", f"{rev}:generated/glsl/{variant.source}"], cwd=ROOT,
                           capture_output=True, text=True)
    return None if shown.returncode else shown.stdout


def compile_glsl(source: str, variant, label: str) -> bytes:
    glsl = Path(generated.__file__).parent / "glsl"
    return spirv_cache.spirv(source, [glsl / "include", Path(shaders.__file__).parent / "include"],
                             variant.target_env, label)


def revision_grid(rev: str | None) -> dict:
    """The `grid:` of shaders/sdpa.glsl.j2's contract at `rev` (None: the working tree)."""
    if rev is None:
        text = (ROOT / "shaders" / "sdpa.glsl.j2").read_text()
    else:
        text = subprocess.run(["git", "show", f"{rev}:shaders/sdpa.glsl.j2"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout
    contract = yaml.safe_load(text.split("{#- contract", 1)[1].split("\n", 1)[1].split("-#}", 1)[0])
    return contract["grid"]


def units_for(grid: dict, out_shape) -> int:
    """Invocations a kernel of that grid launches for `out_shape`: one per row (per_row) or per
    width x height tile of each matrix (per_tile)."""
    rows = int(np.prod(out_shape[:-1]))
    if "per_tile" in grid:
        return -(-out_shape[-1] // grid["width"]) * -(-out_shape[-2] // grid["height"]) * (rows // out_shape[-2])
    assert "per_row" in grid, grid
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
    parser.add_argument("--baseline", default="HEAD", help="git revisions (comma-separated) whose generated kernel to compare with")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--storage", default="buffer,texture3d")
    parser.add_argument("--dtype", default="float32", choices=("float32", "float16"))
    parser.add_argument("--only", default="", help="run the cases whose name contains this")
    args = parser.parse_args()
    revs = [r for r in args.baseline.split(",") if r]
    device = Device()
    rng = np.random.default_rng(0)
    print(f"device: {device.limits.name}; {args.dtype}; median of {args.reps} runs x {args.rounds} alternating rounds")
    head = "".join(f" {r} ms | x {r} (median, best) |" for r in revs)
    print(f"| case | storage | new ms | new GFLOP/s |{head} max err |")
    print("|---|---|---|---|" + "---|---|" * len(revs) + "---|")
    np_dtype = np.dtype(args.dtype)
    for name, qs, ks, vs, mask_shape, causal in CASES:
        if args.only not in name:
            continue
        q, k, v = (rng.standard_normal(s, dtype=np.float32).astype(np_dtype) for s in (qs, ks, vs))
        mask = rng.uniform(-1, 1, size=mask_shape).astype(np_dtype) if mask_shape else None
        tq, tk, tv = (torch.from_numpy(a).float() for a in (q, k, v))
        want = F.scaled_dot_product_attention(tq, tk, tv, None if mask is None else torch.from_numpy(mask).float(),
                                              is_causal=causal).numpy()
        heads = int(np.prod(qs[:-2]))
        flops = 2 * heads * qs[-2] * ks[-2] * (qs[-1] + vs[-1]) / (2 if causal else 1)
        scalars = {"has_attn_mask": int(mask is not None), "is_causal": int(causal), "scale": qs[-1] ** -0.5}
        for storage in args.storage.split(","):
            variant = find_variant(OP, dtype=args.dtype, storage=storage)
            fixed = {b.tensor: b.storage for b in variant.bindings}
            arrays = {"query": q, "key": k, "value": v, "attn_mask": np.zeros(1, np_dtype) if mask is None else mask}
            ts = {"out": VkTensor(device, want.shape, args.dtype, storage, "WIDTH_PACKED", label="out")}
            for n, a in arrays.items():
                ts[n] = VkTensor(device, a.shape, args.dtype, fixed[n], "WIDTH_PACKED", label=n)
                ts[n].upload(a)
            try:
                new_src = (Path(generated.__file__).parent / "glsl" / variant.source).read_text()
                kernels = {"new": (None, units_for(revision_grid(None), want.shape))}
                for rev in revs:
                    old_src = revision_source(variant, rev)
                    if old_src is not None and old_src != new_src:
                        kernels[rev] = (compile_glsl(old_src, variant, f"{variant.name}_{rev}"),
                                        units_for(revision_grid(rev), want.shape))
                times, errs = {n: [] for n in kernels}, {}
                for _ in range(args.rounds):
                    for n, (spirv, units) in kernels.items():
                        times[n].append(median_us(device, Dispatch(variant, ts, scalars, units=units, spirv=spirv),
                                                  args.reps))
                        errs[n] = float(np.nanmax(np.abs(ts["out"].download().astype(np.float32) - want)))
                new, new_best = statistics.median(times["new"]), min(times["new"])
                cols = ""
                for rev in revs:
                    if rev not in times:
                        cols += " - | - |"
                        continue
                    old, old_best = statistics.median(times[rev]), min(times[rev])
                    cols += f" {old / 1e3:.2f} | {old / new:.2f}x, {old_best / new_best:.2f}x |"
                print(f"| {name} | {storage} | {new / 1e3:.3f} | {flops / new / 1e3:.2f} |{cols} {errs['new']:.1e} |",
                      flush=True)
            finally:
                for t in ts.values():
                    t.close()
    device.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
