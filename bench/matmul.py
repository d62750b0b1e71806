"""Matmul-family and attention kernel speed on the Vulkan device, in GFLOP/s.

Each row dispatches one registry variant on resident tensors and takes its GPU timestamp, the best
of N runs (the machine may be shared: the best run is the least disturbed). `--baseline REV` also
runs the same variant compiled from the GLSL that git revision REV generated (same bindings and
push constants), interleaved with the current one, so both see the same load; ViT-S/16's shapes:
a [197, 384] x [384, 1152] linear (the qkv projection), the same product as mm, q @ k^T as
bmm and sdpa on [1, 6, 197, 64], with torch's CPU time beside them.
Usage: python bench/matmul.py [--reps N] [--only TEXT] [--baseline REV]
"""
from __future__ import annotations

import argparse
import subprocess
import time
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


def baseline_spirv(variant, rev: str) -> bytes | None:
    """SPIR-V of the variant's GLSL as generated at git revision `rev` (None: `rev` had none)."""
    path = f"generated/glsl/{variant.source}"
    shown = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, capture_output=True, text=True)
    if shown.returncode:
        return None
    glsl = Path(generated.__file__).parent / "glsl"
    return spirv_cache.spirv(shown.stdout, [glsl / "include", Path(shaders.__file__).parent / "include"],
                             variant.target_env, variant.name + "_baseline")


def best_us(device, dispatch: Dispatch, reps: int) -> float:
    prog = Program(device, [dispatch])
    try:
        prog()
        best = float("inf")
        for _ in range(reps):
            prog()
            best = min(best, prog.profile()[0][1])
        return best
    finally:
        prog.close()


def cpu_us(fn, reps: int) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e6


def cases(rng):
    """(name, op, variant axes, {binding: array}, scalars, flops, torch fn)."""
    x = rng.standard_normal((197, 384), dtype=np.float32)
    w = rng.standard_normal((1152, 384), dtype=np.float32) * 0.05
    b = rng.standard_normal((1152,), dtype=np.float32)
    q, k, v = (rng.standard_normal((1, 6, 197, 64), dtype=np.float32) for _ in range(3))
    t = {n: torch.from_numpy(a) for n, a in dict(x=x, w=w, b=b, q=q, k=k, v=v).items()}
    lin = lambda: F.linear(t["x"], t["w"], t["b"])  # noqa: E731
    mm = lambda: t["x"] @ t["w"].T.contiguous()  # noqa: E731
    att = lambda: F.scaled_dot_product_attention(t["q"], t["k"], t["v"])  # noqa: E731
    qk = lambda: torch.bmm(t["q"][0], t["k"][0].transpose(1, 2))  # noqa: E731
    flops_mm, flops_att = 2 * 197 * 384 * 1152, 4 * 6 * 197 * 197 * 64
    out = []
    for storage in ("buffer", "texture3d"):
        out.append((f"linear 197x384x1152 {storage}", "linear", {"storage": storage},
                    {"input": x, "weight": w, "bias": b}, {"has_bias": 1}, flops_mm, lin))
        out.append((f"mm 197x384x1152 {storage}", "mm", {"storage": storage},
                    {"self": x, "mat2": np.ascontiguousarray(w.T)}, {}, flops_mm, mm))
        out.append((f"bmm 6x197x64x197 {storage}", "bmm", {"storage": storage},
                    {"self": q[0], "mat2": np.ascontiguousarray(k[0].transpose(0, 2, 1))}, {}, flops_att // 2, qk))
        out.append((f"sdpa 1x6x197x64 {storage}", "scaled_dot_product_attention", {"storage": storage},
                    {"query": q, "key": k, "value": v, "attn_mask": np.zeros(1, np.float32)},
                    {"has_attn_mask": 0, "is_causal": 0, "scale": 0.125}, flops_att, att))
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--only", default="", help="run the cases whose name contains this")
    parser.add_argument("--baseline", default=None, help="git revision whose generated GLSL to compare with")
    args = parser.parse_args()
    device = Device()
    print(f"device: {device.limits.name}; best of {args.reps} runs")
    print(f"| case | texelflow ms | GFLOP/s | baseline ({args.baseline}) GFLOP/s | torch CPU GFLOP/s |")
    print("|---|---|---|---|---|")
    for name, op, axes, arrays, scalars, flops, fn in cases(np.random.default_rng(0)):
        if args.only not in name:
            continue
        variant = find_variant(op, dtype="float32", **axes)
        storage = axes["storage"]
        fixed = {b.tensor: b.storage for b in variant.bindings}
        want = fn().numpy()
        ts = {"out": VkTensor(device, want.shape, "float32", storage, "WIDTH_PACKED", label="out")}
        for n, a in arrays.items():
            ts[n] = VkTensor(device, a.shape, "float32", fixed[n], "WIDTH_PACKED", label=n)
            ts[n].upload(a)
        try:
            rows = want.size // want.shape[-1] if op == "scaled_dot_product_attention" else None  # grid per_row
            us = best_us(device, Dispatch(variant, ts, scalars, units=rows), args.reps)
            err = np.abs(ts["out"].download() - want).max()
            assert err < 1e-3, f"{name}: max error {err}"
            base = "-"
            spirv = baseline_spirv(variant, args.baseline) if args.baseline else None
            if spirv is not None:
                base = f"{flops / best_us(device, Dispatch(variant, ts, scalars, units=rows, spirv=spirv), args.reps) / 1e3:.2f}"
            cpu = flops / cpu_us(fn, args.reps) / 1e3
            print(f"| {name} | {us / 1e3:.2f} | {flops / us / 1e3:.2f} | {base} | {cpu:.1f} |", flush=True)
        finally:
            for t in ts.values():
                t.close()
    device.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
