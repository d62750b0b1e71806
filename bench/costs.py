"""Cost-table planning benchmark: zoo models planned by transitions alone vs by predicted time.

For each model, two programs are compiled in one process, `costs="none"` (transitions alone) and
`costs="table"` (the device's cost table, `texelflow tune`), and called alternately; the table
reports the median wall time per call and the median and least GPU time (sum of the dispatches'
timestamps; on a CPU device shared with other work the least is the steadier figure),
the plans' transitions, and the plan's predicted time beside the measured GPU time (both plans
predicted by the same table), plus the nodes whose prediction is furthest off.
Usage: python bench/costs.py [--quick] [--reps N] [--models a,b] [--size N]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from machine import cpu_model

import texelflow
from texelflow.models import ZOO
from texelflow.runtime.graph.importer import export_program
from texelflow.runtime.vulkan.device import default_device

MODELS = ("resnet18", "mobilenet_v3_small", "vit_s16", "convnext_atto")
QUICK_SIZES = {"resnet18": 64, "mobilenet_v3_small": 96, "vit_s16": 64, "convnext_atto": 64}


def gpu_seconds(prog) -> float:
    return sum(row.measured_us for row in prog.profile()) * 1e-6


def bench_model(name: str, size: int | None, reps: int, device) -> dict:
    model, inputs = ZOO[name]() if size is None else ZOO[name](image_size=size)
    ep = export_program(model, inputs)
    progs = {c: texelflow.compile(ep, device=device, costs=c, profile=True) for c in ("none", "table")}
    try:
        table = progs["table"].plan.costs
        if table is None or table.source != "table":
            raise SystemExit(f"no cost table for {device.limits.name}: run `texelflow tune` first")
        with torch.no_grad():
            want = model(*inputs)
        wall = {c: [] for c in progs}
        gpu = {c: [] for c in progs}
        errors = {}
        for c, prog in progs.items():  # warm up, and check both against eager (reported, not asserted)
            got = prog(*inputs)
            errors[c] = float((got - want).abs().max() / want.abs().max())
        for _ in range(reps):
            for c, prog in progs.items():  # alternate, so drifting machine load hits both alike
                t0 = time.perf_counter()
                prog(*inputs)
                wall[c].append(time.perf_counter() - t0)
                gpu[c].append(gpu_seconds(prog))
        row = {"model": name, "size": size or "full"}
        for c, prog in progs.items():
            plan = prog.plan
            row[c] = {"wall": statistics.median(wall[c]), "gpu": statistics.median(gpu[c]), "gpu_min": min(gpu[c]),
                      "transitions": plan.num_transitions, "optimal": plan.optimal,
                      "predicted": sum(plan.predicted(table).values()), "error": errors[c]}
        rows = progs["table"].profile()
        off = sorted((r for r in rows if r.predicted_us is not None and r.measured_us > 0),
                     key=lambda r: -abs(r.predicted_us - r.measured_us))[:3]
        row["worst"] = [(r.label, r.op, r.predicted_us, r.measured_us) for r in off]
        return row
    finally:
        for prog in progs.values():
            prog.close()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="reduced input sizes, 3 repetitions")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--models", default=",".join(MODELS))
    args = ap.parse_args(argv)
    reps = args.reps or (3 if args.quick else 5)
    device = default_device()
    print(f"device: {device.limits.name}; machine: {cpu_model()}; {reps} alternating calls per program, medians\n")
    print("| model | input | plan | transitions | predicted ms | GPU ms median | GPU ms min | wall ms median | "
          "GPU vs none (median, min) | max err / max |out| |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    worst = []
    for name in args.models.split(","):
        size = QUICK_SIZES.get(name) if args.quick else None
        r = bench_model(name, size, reps, device)
        for c in ("none", "table"):
            x = r[c]
            print(f"| {name} | {r['size']} | costs={c} | {x['transitions']} | {x['predicted'] * 1e3:.1f} | "
                  f"{x['gpu'] * 1e3:.1f} | {x['gpu_min'] * 1e3:.1f} | {x['wall'] * 1e3:.1f} | "
                  f"{x['gpu'] / r['none']['gpu']:.2f}x, {x['gpu_min'] / r['none']['gpu_min']:.2f}x | {x['error']:.1e} |",
                  flush=True)
        worst += [(name,) + w for w in r["worst"]]
    print("\nNodes furthest from their prediction (costs=table plan):\n")
    print("| model | node | op | predicted us | measured us |")
    print("|---|---|---|---|---|")
    for name, label, op, p, m in worst:
        print(f"| {name} | {label} | {op} | {p:.0f} | {m:.0f} |")


if __name__ == "__main__":
    main()
