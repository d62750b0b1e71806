"""Matmul-family kernel speed on the Vulkan device: GFLOP/s and the fraction of the FMA ceiling.

Each case dispatches the kernel the runtime would run (the generated variant, with the launch
grid and shape classes the runtime gives it) on resident tensors beside a baseline, in ONE
process and alternated round by round with the trivial FMA kernel of bench/ceilings.py, so all
three see the same load; GPU timestamps, min and median over the rounds. The fraction of peak is
the kernel's median GFLOP/s over the FMA kernel's median in the same rounds (issue 13's target:
mm 1024^3 and ViT-S/16's linears at >= 40%). The machine may be shared: the CPU columns also give
the fraction from the process's CPU time per call (lavapipe's threads are the process's), which
other jobs on the cores do not inflate as they do wall time. Baselines: `linear` (the general kernel every
linear ran before linear_packed; its template is unchanged) and, for mm / bmm, the same variant
compiled from the GLSL that git revision --baseline generated (default HEAD). FLOPs = 2 M N K.
Usage: python bench/matmul.py [--reps N] [--only TEXT] [--baseline REV]
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ceilings import fma_probe  # noqa: E402
from machine import machine  # noqa: E402

import texelflow.generated as generated  # noqa: E402
import texelflow.shaders as shaders  # noqa: E402
from texelflow.runtime.graph.prepack_matmul import linear_weight_kn  # noqa: E402
from texelflow.runtime.vulkan.device import Device  # noqa: E402
from texelflow.runtime.vulkan.pipeline import find_variant  # noqa: E402
from texelflow.runtime.vulkan.program import Dispatch, Program  # noqa: E402
from texelflow.runtime.vulkan.tensor import VkTensor  # noqa: E402
from texelflow.shaders import spirv_cache  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
VIT_LINEARS = [(197, 384, 1152), (197, 384, 384), (197, 384, 1536), (197, 1536, 384)]  # M, K, N



NO_ACTIVATION = {"activation": 0, "act_min": 0.0, "act_max": 0.0}  # linear_packed with no fused activation

def baseline_spirv(variant, rev: str) -> bytes | None:
    """SPIR-V of the variant's GLSL as generated at git revision `rev` (None: `rev` had none)."""
    shown = subprocess.run(["git", "show", f"{rev}:generated/glsl/{variant.source}"], cwd=ROOT,
                           capture_output=True, text=True)
    if shown.returncode:
        return None
    glsl = Path(generated.__file__).parent / "glsl"
    return spirv_cache.spirv(shown.stdout, [glsl / "include", Path(shaders.__file__).parent / "include"],
                             variant.target_env, variant.name + "_baseline")


def tile_units(m: int, n: int, batch: int = 1) -> int:
    """Invocations of a `per_tile: out, width: 16, height: 8` grid (linear_packed, mm_tiled)."""
    return -(-n // 16) * -(-m // 8) * batch


def cpu_seconds() -> float:
    """CPU time of this process so far (user + system): lavapipe's worker threads included."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class Case:
    """A kernel and its baseline on shared inputs; `run()` returns GPU microseconds of each."""

    def __init__(self, device, name: str, flops: int, want: np.ndarray):
        self.device, self.name, self.flops, self.want = device, name, flops, want
        self.tensors: list[VkTensor] = []
        self.programs: dict[str, Program] = {}
        self.outs: dict[str, VkTensor] = {}

    def tensor(self, shape, storage: str, data: np.ndarray | None = None) -> VkTensor:
        t = VkTensor(self.device, shape, "float32", storage, "WIDTH_PACKED")
        self.tensors.append(t)
        if data is not None:
            t.upload(np.ascontiguousarray(data, dtype=np.float32))
        return t

    def add(self, which: str, dispatch: Dispatch, out: VkTensor) -> None:
        self.programs[which] = Program(self.device, [dispatch])
        self.outs[which] = out

    def sample(self, which: str) -> tuple[float, float]:
        """(GPU microseconds, process CPU seconds) of one call."""
        prog = self.programs[which]
        c0 = cpu_seconds()
        prog()
        return prog.profile()[0][1], cpu_seconds() - c0

    def check(self) -> None:
        for which, out in self.outs.items():
            err = float(np.abs(out.download() - self.want).max() / max(np.abs(self.want).max(), 1e-30))
            assert err < 1e-5, f"{self.name} ({which}): relative error {err:.1e}"

    def close(self) -> None:
        for p in self.programs.values():
            p.close()
        for t in self.tensors:
            t.close()


def linear_case(device, m: int, k: int, n: int, storage: str, rng) -> Case:
    x = rng.standard_normal((m, k), dtype=np.float32)
    w = rng.standard_normal((n, k), dtype=np.float32) * 0.05
    b = rng.standard_normal(n, dtype=np.float32)
    case = Case(device, f"linear {m}x{k} -> {n} {storage}", 2 * m * n * k, x @ w.T + b)
    xi, bias = case.tensor((m, k), storage, x), case.tensor((n,), "buffer", b)
    packed = linear_weight_kn(torch.from_numpy(w).double()).float().numpy()
    out = case.tensor((m, n), storage)
    new = find_variant("linear_packed", dtype="float32", storage=storage, weight_storage="texture3d")
    case.add("new", Dispatch(new, {"out": out, "input": xi, "weight": case.tensor(packed.shape, "texture3d", packed),
                                   "bias": bias}, {"has_bias": 1, **NO_ACTIVATION}, units=tile_units(m, n),
                             spec={"k_ragged": int(k % 4 != 0), "n_ragged": int(n % 4 != 0)}), out)
    out = case.tensor((m, n), storage)
    old = find_variant("linear", dtype="float32", storage=storage)
    case.add("baseline", Dispatch(old, {"out": out, "input": xi, "weight": case.tensor((n, k), "buffer", w),
                                        "bias": bias}, {"has_bias": 1}), out)
    return case


def mm_case(device, op: str, batch: int, m: int, k: int, n: int, storage: str, rng, rev: str) -> Case | None:
    shape = (lambda *s: (batch, *s)) if op == "bmm" else (lambda *s: s)
    a = rng.standard_normal(shape(m, k), dtype=np.float32)
    b = rng.standard_normal(shape(k, n), dtype=np.float32)
    label = f"{op} {batch}x{m}x{k}x{n}" if op == "bmm" else f"{op} {m}x{k}x{n}"
    case = Case(device, f"{label} {storage}", 2 * batch * m * n * k, a @ b)
    ta, tb = case.tensor(a.shape, storage, a), case.tensor(b.shape, storage, b)
    variant = find_variant(op, dtype="float32", storage=storage)
    out = case.tensor(case.want.shape, storage)
    case.add("new", Dispatch(variant, {"out": out, "self": ta, "mat2": tb}, {}, units=tile_units(m, n, batch),
                             spec={"k_ragged": int(k % 4 != 0), "n_ragged": int(n % 4 != 0)}), out)
    spirv = baseline_spirv(variant, rev)
    if spirv is not None:
        out = case.tensor(case.want.shape, storage)
        case.add("baseline", Dispatch(variant, {"out": out, "self": ta, "mat2": tb}, {}, spirv=spirv), out)
    return case


def cases(device, rng, rev: str):
    for storage in ("buffer", "texture3d"):
        yield lambda s=storage: mm_case(device, "mm", 1, 1024, 1024, 1024, s, rng, rev)
        for m, k, n in VIT_LINEARS:
            yield lambda s=storage, m=m, k=k, n=n: linear_case(device, m, k, n, s, rng)
        yield lambda s=storage: mm_case(device, "bmm", 6, 197, 64, 197, s, rng, rev)
        yield lambda s=storage: linear_case(device, 1, 512, 1000, s, rng)  # ResNet-18's fc: one row


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5, help="rounds (kernel, baseline, FMA kernel alternated)")
    parser.add_argument("--only", default="", help="run the cases whose name contains this")
    parser.add_argument("--baseline", default="HEAD", help="git revision whose generated mm / bmm GLSL to compare with")
    args = parser.parse_args()
    device = Device()
    print(f"device: {device.limits.name}; machine: {machine()}; GPU timestamps, {args.reps} rounds alternated "
          "with the FMA kernel; GFLOP/s of the median (min in brackets)")
    print("| case | kernel ms | GFLOP/s | baseline GFLOP/s | speed-up | FMA peak GFLOP/s (same rounds) | fraction of peak "
          "| CPU: GFLOP/s per core x cores, kernel / FMA | CPU fraction |")
    print("|---|---|---|---|---|---|---|---|---|")
    fma = fma_probe(device, 1 << 16, 256)
    try:
        for make in cases(device, np.random.default_rng(0), args.baseline):
            case = make()
            if args.only not in case.name:
                case.close()
                continue
            try:
                times = {w: [] for w in case.programs}
                cpus = {w: [] for w in case.programs}
                peaks, fma_cpu = [], []
                for w in case.programs:
                    case.sample(w)  # warm-up
                for _ in range(args.reps):
                    for w in case.programs:
                        us, cpu = case.sample(w)
                        times[w].append(us)
                        cpus[w].append(cpu)
                    c0 = cpu_seconds()
                    peaks.append(fma.work / fma.sample() / 1e9)
                    fma_cpu.append(cpu_seconds() - c0)
                case.check()
                gf = {w: case.flops / statistics.median(t) / 1e3 for w, t in times.items()}
                best = {w: case.flops / min(t) / 1e3 for w, t in times.items()}
                peak = statistics.median(peaks)
                base = f"{gf['baseline']:.1f} ({best['baseline']:.1f})" if "baseline" in gf else "-"
                speedup = f"{gf['new'] / gf['baseline']:.2f}x" if "baseline" in gf else "-"
                cpu = "- | -"  # a GPU's work is not the process's CPU time
                if device.limits.device_type == "cpu":  # lavapipe: its threads run on every core
                    cpu_gf = os.cpu_count() * case.flops / statistics.median(cpus["new"]) / 1e9
                    cpu_peak = os.cpu_count() * fma.work / statistics.median(fma_cpu) / 1e9
                    cpu = f"{cpu_gf:.1f} / {cpu_peak:.1f} | {cpu_gf / cpu_peak:.0%}"
                print(f"| {case.name} | {statistics.median(times['new']) / 1e3:.2f} | {gf['new']:.1f} "
                      f"({best['new']:.1f}) | {base} | {speedup} | {peak:.1f} | {gf['new'] / peak:.0%} | {cpu} |",
                      flush=True)
            finally:
                case.close()
    finally:
        fma.close()
        device.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
