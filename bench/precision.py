"""Benchmark: precision="fp16" against float32 on the device, zoo models at the test sizes.

Three programs per model, called alternately in one process (median wall time of `--reps` calls
each, and the GPU time of the last call, summed from GPU timestamps): float32; compile's fp16
(regions whose casts cost more than float16 saves stay float32); and fp16 with every
float16-capable node narrowed. Also the float16 nodes and casts of each (docs/precision.md).
Each fp16 row gives its ratio to float32 (median / median and best / best of the alternated calls)
and max|fp16 - fp32| / max|fp32| on the benchmark input. Prints one markdown table for
bench/RESULTS.md.
Usage: python bench/precision.py --models vit_tiny,resnet18 --reps 10
"""

from __future__ import annotations

import argparse
import statistics
import time

import texelflow
from texelflow.models import ZOO
from texelflow.runtime.graph.importer import export_program
from texelflow.runtime.graph.precision import apply_precision
from texelflow.runtime.program import CompiledProgram
from texelflow.runtime.vulkan.device import default_device

SIZES = {"vit_s16": 224, "vit_tiny": 32, "resnet18": 64, "mobilenet_v3_small": 96, "convnext_atto": 64,
         "unet_decoder": 64}


def programs(ep, device) -> dict:
    every = texelflow.plan(ep, device=device)
    apply_precision(every, "fp16", device.enabled_features, prune=False)
    return {"fp32": texelflow.compile(ep, device=device, profile=True),
            "fp16": texelflow.compile(ep, device=device, precision="fp16", profile=True),
            "fp16, every node": CompiledProgram(every, every.exported, device, profile=True)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(SIZES))
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    device = default_device()
    print(f"device: {device.limits.name}\n")
    print("| model | program | median ms | best ms | vs fp32 median / best | GPU ms | float16 nodes | casts | rel err |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        model, inputs = ZOO[name](image_size=SIZES[name])
        progs = programs(export_program(model, inputs), device)
        times = {k: [] for k in progs}
        outs = {k: p(*inputs) for k, p in progs.items()}  # (also the warm-up call)
        for _ in range(args.reps):
            for k, p in progs.items():
                start = time.perf_counter()
                p(*inputs)
                times[k].append(time.perf_counter() - start)
        for k, p in progs.items():
            gpu = sum(row[1] for row in p.profile()) / 1e3
            report = p.plan.precision
            half = len(report.half_nodes) if report else 0
            casts = report.num_casts if report else 0
            med, best = statistics.median(times[k]), min(times[k])
            ratio = f"{med / statistics.median(times['fp32']):.2f} / {best / min(times['fp32']):.2f}"
            err = ((outs[k] - outs["fp32"]).abs().max() / outs["fp32"].abs().max()).item()
            print(f"| {name}@{SIZES[name]} | {k} | {med * 1e3:.1f} | {best * 1e3:.1f} | {ratio} | {gpu:.1f} | {half} "
                  f"| {casts} | {err:.1e} |", flush=True)
        for p in progs.values():
            p.close()


if __name__ == "__main__":
    main()
