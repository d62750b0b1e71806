"""Benchmark: planning time of both planners on synthetic graphs, and plans of real models.

Synthetic graphs come from tests/graph/synthetic.py: `model_like` stacks conv /
residual / pooling / layer-norm / linear blocks the way vision and token models do; `random_dag`
wires registry ops at random with skip connections (a stress test). Times are wall-clock seconds
of the planner alone (problem construction included), best of --repeats. Prints markdown tables.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

from machine import machine


def time_planner(make, planner: str, repeats: int):
    from texelflow.runtime.graph.greedy import plan_greedy
    from texelflow.runtime.graph.optimal import plan_optimal
    from texelflow.runtime.graph.problem import Problem

    best, result = None, None
    for _ in range(repeats):
        graph = make()
        start = time.perf_counter()
        problem = Problem.build(graph)
        assignment = plan_optimal(problem) if planner == "optimal" else plan_greedy(problem)
        elapsed = time.perf_counter() - start
        best = elapsed if best is None else min(best, elapsed)
        result = (assignment.cost(problem), assignment.optimal, assignment.lower_bound)
    return best, result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="sizes up to 1k only")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for tests.*
    from tests.graph import synthetic

    sizes = (100, 1000) if args.quick else (100, 1000, 10000, 50000)
    print(f"Machine: {machine()}\n")
    print("| graph | nodes | greedy s | optimal s | greedy transitions (bytes) | optimal transitions (bytes) | certified | lower bound |")
    print("|---|---|---|---|---|---|---|---|")
    for kind in ("model_like", "random_dag"):
        gen = getattr(synthetic, kind)
        for n in sizes:
            g_time, (g_cost, _, _) = time_planner(lambda: gen(n), "greedy", args.repeats)
            o_time, (o_cost, certified, bound) = time_planner(lambda: gen(n), "optimal", args.repeats)
            print(f"| {kind} | {n} | {g_time:.3f} | {o_time:.3f} | {g_cost[0]} ({g_cost[1]}) | "
                  f"{o_cost[0]} ({o_cost[1]}) | {certified} | {bound} |", flush=True)

    import texelflow
    from texelflow import models
    from tests.acceptance.test_layout_cases import CASES

    print("\n| model | planner | transitions | bytes | certified optimal | lower bound | prepacked constants | fallbacks | planning ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    named = [(name, lambda f=f: f()) for name, f in (("tiny_resnet", models.tiny_resnet), ("tiny_mixer", models.tiny_mixer))]
    named += [(f"case {k}", lambda k=k: CASES[k][:2]) for k in sorted(CASES)]
    for name, make in named:
        model, inputs = make()
        for planner in ("greedy", "optimal"):
            p = texelflow.plan(model, inputs, planner=planner)
            print(f"| {name} | {planner} | {p.num_transitions} | {p.transition_bytes} | {p.optimal} | "
                  f"{p.lower_bound} | {len(p.prepacks)} | {len(p.fallbacks)} | {p.seconds * 1000:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
