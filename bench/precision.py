"""Benchmark: precision="fp16" against float32 on the device, zoo models at the test sizes.

Three programs per model, called alternately in one process (median wall time of `--reps` calls
each, and the GPU time of the last call, summed from GPU timestamps): float32; compile's fp16
(regions whose casts cost more than float16 saves stay float32); and fp16 with every
float16-capable node narrowed. Also the float16 nodes and casts of each (docs/precision.md).
Prints one markdown table for bench/RESULTS.md.
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

SIZES = {"vit_tiny": 32, "resnet18": 64, "mobilenet_v3_small": 96, "convnext_atto": 64, "unet_decoder": 64}


def programs(ep, device) -> dict:
    every = texelflow.plan(ep, device=device)
    apply_precision(every, "fp16", device.enabled_features, prune=False)
    return {"fp32": texelflow.compile(ep, device=device),
            "fp16": texelflow.compile(ep, device=device, precision="fp16"),
            "fp16, every node": CompiledProgram(every, every.exported, device)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(SIZES))
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    device = default_device()
    print(f"device: {device.limits.name}\n")
    print("| model | program | median ms | GPU ms | float16 nodes | casts |")
    print("|---|---|---|---|---|---|")
    for name in args.models.split(","):
        model, inputs = ZOO[name](image_size=SIZES[name])
        progs = programs(export_program(model, inputs), device)
        times = {k: [] for k in progs}
        for p in progs.values():
            p(*inputs)  # warm
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
            print(f"| {name}@{SIZES[name]} | {k} | {statistics.median(times[k]) * 1e3:.1f} | {gpu:.1f} | {half} | {casts} |",
                  flush=True)
        for p in progs.values():
            p.close()


if __name__ == "__main__":
    main()
