"""Benchmark: precision="fp16" and bfloat16 models against float32 on the device, zoo models at the test sizes.

Four programs per model (three with `--bfloat16 0`), called alternately in one process (median
wall time of `--reps` calls each, and the GPU time of the last call, summed from GPU
timestamps): float32; compile's fp16 (regions whose casts cost more than float16 saves stay
float32); fp16 with every float16-capable node narrowed; and the model itself in bfloat16 (`--bfloat16 1`, the default: its
float32 program rounding where torch rounds, docs/runtime.md; its "casts" column counts the
round_bfloat16 nodes left). Also the float16 nodes and casts of each (docs/precision.md).
Each fp16 row gives its ratio to float32 (median / median and best / best of the alternated calls)
and max|fp16 - fp32| / max|fp32| on the benchmark input. Prints one markdown table for
bench/RESULTS.md.
Usage: python bench/precision.py --models vit_tiny,resnet18 --reps 10
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

import texelflow
from texelflow.models import ZOO
from texelflow.runtime.graph.importer import export_program
from texelflow.runtime.graph.precision import apply_precision
from texelflow.runtime.program import CompiledProgram
from texelflow.runtime.vulkan.device import default_device

SIZES = {"vit_s16": 224, "vit_tiny": 32, "resnet18": 64, "mobilenet_v3_small": 96, "convnext_atto": 64,
         "unet_decoder": 64}


def programs(ep, device, model=None, inputs=()) -> dict:
    every = texelflow.plan(ep, device=device)
    apply_precision(every, "fp16", device.enabled_features, prune=False)
    progs = {"fp32": texelflow.compile(ep, device=device, profile=True),
             "fp16": texelflow.compile(ep, device=device, precision="fp16", profile=True),
             "fp16, every node": CompiledProgram(every, every.exported, device, profile=True)}
    if model is not None:  # the model itself in bfloat16 (runtime/graph/bfloat16.py)
        half = copy.deepcopy(model).to(torch.bfloat16)
        progs["bfloat16 model"] = texelflow.compile(half, tuple(x.to(torch.bfloat16) for x in inputs), device=device,
                                                    profile=True)
    return progs


def _args(key: str, inputs: tuple) -> tuple:
    return tuple(x.to(torch.bfloat16) for x in inputs) if key == "bfloat16 model" else inputs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(SIZES))
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--bfloat16", type=int, default=1, help="also the model in bfloat16 (1) or not (0)")
    args = ap.parse_args()
    device = default_device()
    print(f"device: {device.limits.name}\n")
    print("| model | program | median ms | best ms | vs fp32 median / best | GPU ms | float16 nodes | casts | rel err |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        model, inputs = ZOO[name](image_size=SIZES[name])
        progs = programs(export_program(model, inputs), device, model if args.bfloat16 else None, inputs)
        times = {k: [] for k in progs}
        outs = {k: p(*_args(k, inputs)).float() for k, p in progs.items()}  # (also the warm-up call)
        for _ in range(args.reps):
            for k, p in progs.items():
                x = _args(k, inputs)
                start = time.perf_counter()
                p(*x)
                times[k].append(time.perf_counter() - start)
        for k, p in progs.items():
            gpu = sum(row[1] for row in p.profile()) / 1e3
            report = p.plan.precision
            half = len(report.half_nodes) if report else 0
            casts = report.num_casts if report else 0
            if k == "bfloat16 model":  # its round_bfloat16 nodes left (the rest round at their producers' stores)
                half, casts = "-", sum(1 for n in p.plan.graph.nodes if n.op is not None and n.op.name == "round_bfloat16")
            med, best = statistics.median(times[k]), min(times[k])
            ratio = f"{med / statistics.median(times['fp32']):.2f} / {best / min(times['fp32']):.2f}"
            err = ((outs[k] - outs["fp32"]).abs().max() / outs["fp32"].abs().max()).item()
            print(f"| {name}@{SIZES[name]} | {k} | {med * 1e3:.1f} | {best * 1e3:.1f} | {ratio} | {gpu:.1f} | {half} "
                  f"| {casts} | {err:.1e} |", flush=True)
        for p in progs.values():
            p.close()


if __name__ == "__main__":
    main()
