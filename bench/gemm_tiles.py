"""Benchmark: zoo models under each GEMM tiling, conv form and attention form, calls alternated.

The planner picks register tiles (`linear_packed`, `mm_tiled`) or workgroup tiles (`linear_wg`,
`mm_wg`) per GEMM node: by the device's cost table when `texelflow tune` measured one, else by
the device type (runtime/graph/prepack_matmul.py). This script says what that choice is worth on
the device at hand, with the other two forms that follow the tiling on a GPU. Each model is
compiled four times, each checked against eager PyTorch: register tiles (a CPU device's forms:
Winograd and pointwise conv kernels, fused attention); workgroup tiles with those kept
(TEXELFLOW_CONV=specialised, TEXELFLOW_ATTENTION=fused); then every groups=1 conv an im2col
GEMM (TEXELFLOW_CONV=auto); then attention as bmm + softmax + bmm too (TEXELFLOW_ATTENTION=auto),
each with split K off; then GEMMs of few blocks split along K (TEXELFLOW_SPLITK=auto: a GPU's
default). `--configs` keeps some of them. The programs are called in turn, `--reps` rounds. Per model and program it
prints the median GPU time of a call (GPU timestamps), the part of it spent in GEMM dispatches
and their number, and the median wall time of a call without timestamps.
Usage: python bench/gemm_tiles.py [--models resnet18,vit_s16] [--size 224] [--reps 10]
       [--configs "+ attention as GEMMs,+ split K"]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import texelflow
from texelflow.models import ZOO
from texelflow.runtime.graph.fusion import CONV_ENV
from texelflow.runtime.graph.prepack_matmul import ATTENTION_ENV, GEMM_ENV, SPLITK_ENV
from texelflow.runtime.vulkan.device import Device

from machine import machine

CONFIGS = {  # each step from a CPU device's forms to a GPU's, one change at a time
    "register": {GEMM_ENV: "register", CONV_ENV: "auto", ATTENTION_ENV: "auto", SPLITK_ENV: "off"},
    "workgroup": {GEMM_ENV: "workgroup", CONV_ENV: "specialised", ATTENTION_ENV: "fused", SPLITK_ENV: "off"},
    "+ im2col convs": {GEMM_ENV: "workgroup", CONV_ENV: "auto", ATTENTION_ENV: "fused", SPLITK_ENV: "off"},
    "+ attention as GEMMs": {GEMM_ENV: "workgroup", CONV_ENV: "auto", ATTENTION_ENV: "auto", SPLITK_ENV: "off"},
    "+ split K": {GEMM_ENV: "workgroup", CONV_ENV: "auto", ATTENTION_ENV: "auto", SPLITK_ENV: "auto"},
}
GEMM_VARIANT_PREFIXES = ("linear_packed", "linear_wg", "linear_gemv", "linear_splitk", "mm_tiled", "mm_wg")


def _compile(model, inputs, device, env: dict[str, str]):
    """`model` compiled under the environment `env` (its GEMM tiling, conv and attention forms), GPU
    timestamps on."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return texelflow.compile(model, inputs, device=device, profile=True)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _gemm_labels(prog) -> set[str]:
    """Labels of the program's dispatches that run a GEMM variant."""
    return {label for label, variant in prog.dispatch_variants if variant.startswith(GEMM_VARIANT_PREFIXES)}


def _timed_call(prog, inputs, gemm: set[str]) -> tuple[float, float, float]:
    """(GPU ms, GEMM GPU ms) of one profiled call, then the wall ms of one call without timestamps."""
    prog.profiling = True
    prog(*inputs)
    rows = prog.profile()
    gpu = sum(r.measured_us for r in rows) / 1e3
    gemm_ms = sum(r.measured_us for r in rows if r.label in gemm) / 1e3
    prog.profiling = False
    start = time.perf_counter()
    prog(*inputs)
    return gpu, gemm_ms, (time.perf_counter() - start) * 1e3


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet18,mobilenet_v3_small,vit_s16,convnext_atto")
    ap.add_argument("--size", type=int, default=None, help="input image size (default: each model's own)")
    ap.add_argument("--reps", type=int, default=10, help="timed rounds; each calls every program once")
    ap.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated, from: " + ", ".join(CONFIGS))
    args = ap.parse_args(argv)
    names = args.configs.split(",")
    unknown = [c for c in names if c not in CONFIGS]
    if unknown:
        ap.error(f"--configs: unknown {', '.join(map(repr, unknown))}; expected some of {', '.join(CONFIGS)}")
    with Device() as device:
        lim = device.limits
        print(f"# Whole models: a CPU device's kernel forms against a GPU's, one change at a time\n\n- device: {lim.name} "
              f"({lim.device_type}, subgroup {lim.subgroup_size}); machine: {machine()}\n"
              f"- median of {args.reps} alternated rounds; GPU ms from timestamps, wall ms from calls "
              "without them\n")
        print("| model | " + " | ".join(f"{c}: GPU ms (GEMMs) | wall ms" for c in names)
              + f" | GPU time / {names[0]}'s | max rel. error |")
        print("|---|" + "---:|---:|" * len(names) + "---|---|")
        for name in args.models.split(","):
            kwargs = {"image_size": args.size} if args.size else {}
            model, inputs = ZOO[name](**kwargs)
            with torch.no_grad():
                want = model(*inputs)
            progs, errors, gemm = {}, {}, {}
            for c in names:
                prog = progs[c] = _compile(model, inputs, device, CONFIGS[c])
                got = prog(*inputs)
                errors[c] = float((got - want).abs().max() / want.abs().max())
                gemm[c] = _gemm_labels(prog)
            samples = {c: [] for c in names}
            for _ in range(args.reps):
                for c in names:
                    samples[c].append(_timed_call(progs[c], inputs, gemm[c]))
            med = {c: [statistics.median(s[i] for s in samples[c]) for i in range(3)] for c in names}
            cells = " | ".join(f"{med[c][0]:.2f} ({med[c][1]:.2f}, {len(gemm[c])}) | {med[c][2]:.2f}" for c in names)
            ratios = " / ".join(f"{med[c][0] / med[names[0]][0]:.2f}x" for c in names[1:])
            errs = " / ".join(f"{errors[c]:.1e}" for c in names)
            print(f"| {name} | {cells} | {ratios} | {errs} |", flush=True)
            for prog in progs.values():
                prog.close()


if __name__ == "__main__":
    main()
