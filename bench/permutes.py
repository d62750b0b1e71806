"""Benchmark: permutes left by the local passes and by the global placement (runtime/graph/permutes).

Per case of the transposes-count suite (tests/graph/test_permute_placement.py) and per zoo model:
permute_copy nodes left in the planned graph and the bytes they move (the sum of the permuted
tensors' sizes; a free permute the planner folds moves none), with permutes="none" (the model's own), "local" and "global", and the seconds of
the permute stage (plan.timings["permutes"]); the conv models also with conv_dim_order="nhwc"
(explicit permutes around every dense conv). Then the global placement alone on a synthetic
10k-node graph (target: under 1 s). Prints markdown tables for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from machine import machine

MODES = ("none", "local", "global")
NHWC_MODELS = ("convnext_atto", "mobilenet_v3_small", "resnet18")  # also planned with conv_dim_order="nhwc"
ZOO_SIZES = {"convnext_atto": 64, "vit_tiny": 32, "mobilenet_v3_small": None, "resnet18": None, "vit_s16": None}
BLOCKS = 1250  # 8 nodes each: the 10k-node graph


def permutes_left(plan) -> tuple[int, int]:
    """(permute_copy nodes left, bytes the copying ones move): a free permute the planner folds
    stays in the count (the passes leave it) and moves no bytes."""
    nodes = [n for n in plan.graph.nodes if n.op is not None and n.op.name == "permute_copy"]
    return len(nodes), sum(n.outputs[0][1].nbytes for n in nodes if not n.folded)


def bench_model(model, inputs, conv_dim_order: str = "nchw") -> dict:
    import texelflow
    from texelflow.runtime.graph.importer import export_program

    ep = export_program(model, inputs)
    row = {}
    for mode in MODES:
        plan = texelflow.plan(ep, permutes=mode, conv_dim_order=conv_dim_order)
        row[mode] = permutes_left(plan) + (plan.timings.get("permutes", 0.0), len(plan.fallbacks))
    return row


def placement_speed(repeats: int):
    """(nodes, permutes before, permutes after, best seconds) of place_permutes on the 10k graph."""
    from tests.graph.test_permute_placement import chain_of_forks
    from texelflow.runtime.graph.permutes.placement import place_permutes

    best = None
    for _ in range(repeats):
        graph = chain_of_forks(BLOCKS)
        nodes, before = len(graph.nodes), sum(n.op.name == "permute_copy" for n in graph.nodes)
        start = time.perf_counter()
        place_permutes(graph)
        seconds = time.perf_counter() - start
        best = seconds if best is None else min(best, seconds)
    after = sum(n.op.name == "permute_copy" for n in graph.nodes)
    return nodes, before, after, best


def _cells(row) -> str:
    counts = " | ".join(str(row[m][0]) for m in MODES)
    nbytes = " | ".join(f"{row[m][1]:,}" for m in MODES)
    return f"{counts} | {nbytes}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default="convnext_atto,vit_tiny,mobilenet_v3_small,resnet18,vit_s16",
                        help="comma-separated zoo names")
    parser.add_argument("--repeats", type=int, default=3, help="runs of the 10k-node placement (best is shown)")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for tests.*
    import torch

    from texelflow.demo import quiet_third_party_warnings
    from texelflow.models import ZOO
    from tests.graph.test_permute_placement import CASES, _model

    quiet_third_party_warnings()
    print(f"Machine: {machine()}; torch {torch.__version__}\n")
    print("Transposes-count cases: permutes left (count, then bytes moved) per mode\n")
    print("| case | expected minimum | none | local | global | bytes none | bytes local | bytes global |")
    print("|---|---|---|---|---|---|---|---|")
    for name in CASES:
        model, inputs, expected = _model(name)
        print(f"| {name} | {expected} | {_cells(bench_model(model, inputs))} |", flush=True)
    print("\nZoo models (global placement ms: the whole permute stage, local passes included)\n")
    print("| model | input | conv dim order | none | local | global | bytes none | bytes local | bytes global | "
          "global ms | fallbacks |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        size = ZOO_SIZES.get(name)
        model, inputs = ZOO[name](image_size=size) if size else ZOO[name]()
        shape = "x".join(map(str, inputs[0].shape))
        for conv_dim_order in ("nchw", "nhwc") if name in NHWC_MODELS else ("nchw",):
            print(f"  {name} {conv_dim_order} ...", file=sys.stderr, flush=True)
            row = bench_model(model, inputs, conv_dim_order)
            print(f"| {name} | {shape} | {conv_dim_order} | {_cells(row)} | {row['global'][2] * 1000:.1f} | "
                  f"{row['global'][3]} |", flush=True)
    nodes, before, after, seconds = placement_speed(args.repeats)
    print("\nGlobal placement alone on a synthetic graph (tests/graph/test_permute_placement.py "
          "`chain_of_forks`, best of %d)\n" % args.repeats)
    print("| nodes | permutes before | permutes after | seconds | target |")
    print("|---|---|---|---|---|")
    print(f"| {nodes} | {before} | {after} | {seconds:.3f} | < 1 s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
