"""Benchmark: the model zoo end to end, and how fast texelflow lowers a model.

Per zoo model (texelflow/models.py): graph size, dispatches, transitions of both planners,
prepacked constants, fallbacks, the error against eager PyTorch, planning and compile seconds,
latency per call beside eager PyTorch's in the same process, and the three ops that take most
device time with their GFLOP/s (FLOPs from node shapes, times from CompiledProgram.profile()).
Beside texelflow, the Vulkan peers on the same device in the same run (bench/peers.py: ncnn's
Vulkan path through pnnx, IREE's through ONNX and `iree-compile` for Vulkan SPIR-V), each with its
output's error against eager PyTorch (on ResNet-18, MobileNetV3-small and ViT-S/16, at the zoo's
default size), and eager PyTorch on the CPU, with the ratios; a peer that
is not installed, fails to convert or runs past `--peer-timeout` gets one line saying why.
Then the lowering speed: ViT-S/16 planned and compiled from an ExportedProgram, and a 1,500-op
chain of unary ops planned. Compile times are with a warm SPIR-V cache (`make gen` fills it).
Prints markdown tables for bench/RESULTS.md.
Usage: python bench/models.py --models resnet18,mobilenet_v3_small,vit_s16 --reps 3 --no-lowering
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import defaultdict

from machine import machine
from peers import PEERS, run_peer

QUICK_SIZES = {"vit_s16": 64, "resnet18": 64, "mobilenet_v3_small": 96, "convnext_atto": 64}
PEER_MODELS = ("resnet18", "mobilenet_v3_small", "vit_s16")  # the models the peers are run on (issue 13)
CHAIN_OPS = 1500


# ---- FLOPs from node shapes ----------------------------------------------------------------------
def _shape(node, name):
    """The shape of argument `name`; for a weight prepacked into another shape (a derived constant:
    Winograd, GEMM tiles), the shape of the model's own tensor it was derived from."""
    v = node.arg(name)
    derive = getattr(v, "derive", None)
    sources = [getattr(src, "shape", None) for src in getattr(derive, "sources", None) or ()]
    if sources and sources[0] is not None:
        return sources[0]
    return getattr(v, "shape", None)


def node_flops(node) -> int | None:
    """Multiply-adds x 2 of a conv / linear / matmul / bmm / attention node; None for other ops."""
    t, out = node.target, node.outputs[0][1]
    if "convolution" in t or "conv2d" in t:
        w = _shape(node, "weight")
        return 2 * out.numel * math.prod(w[1:]) if w else None
    if "linear" in t:  # the reduction is the input's last dim (a prepacked weight is padded; an
        x = _shape(node, "input")  # im2col GEMM's weight derives from a 4-D conv weight)
        return 2 * out.numel * x[-1] if x else None
    if "addmm" in t:
        return 2 * out.numel * _shape(node, "mat1")[-1]
    if any(k in t for k in ("aten.mm.", "aten.bmm.", "aten.matmul.", "texelflow.mm_wg.")):
        return 2 * out.numel * _shape(node, "self")[-1]
    if "scaled_dot_product" in t:
        q, k, v = _shape(node, "query"), _shape(node, "key"), _shape(node, "value")
        return 2 * math.prod(q[:-2]) * q[-2] * k[-2] * (q[-1] + v[-1])
    return None


def hottest_ops(prog, inputs, count: int = 3):
    """[(op, dispatches, seconds, flops or None)] of the `count` ops with most device time (one
    more call, with timestamps)."""
    from texelflow.demo import dispatch_times, op_name, time_by_op

    times = dispatch_times(prog, inputs)
    flops: dict[str, int] = defaultdict(int)
    for node in {node for _, node, _ in times if node is not None}:  # a node's FLOPs once, however many dispatches
        flops[op_name(node, "")] += node_flops(node) or 0
    return [(op, n, us / 1e6, flops.get(op) or None) for op, n, us in time_by_op(times)[:count]]


# ---- one model ---------------------------------------------------------------------------------
def bench_model(name, factory, size, reps=None):
    import texelflow
    from texelflow import demo
    from texelflow.runtime.graph.importer import export_program

    model, inputs = factory(size) if size else factory()
    ep = export_program(model, inputs)
    greedy = texelflow.plan(ep, planner="greedy")
    start = time.perf_counter()
    best = texelflow.plan(ep)
    plan_s = time.perf_counter() - start
    start = time.perf_counter()
    prog = texelflow.compile(ep)  # plans again, then prepacks and builds pipelines
    compile_s = time.perf_counter() - start
    with prog:
        got = prog(*inputs)
        want, _ = demo.eager(model, inputs)
        check = demo.compare(got, want)
        if reps:  # exactly `reps` warm calls each (after the first, untimed)
            prog(*inputs)
            tf_s, _ = demo.time_calls(prog, inputs, min_runs=reps, max_runs=reps)
            eager_s, _ = demo.time_calls(lambda *a: demo.eager(model, a), inputs, min_runs=max(reps, 5),
                                         max_runs=max(reps, 5))
        else:
            tf_s, _ = demo.time_calls(prog, inputs, budget_s=10.0)
            eager_s, _ = demo.time_calls(lambda *a: demo.eager(model, a), inputs, budget_s=2.0, min_runs=10,
                                         max_runs=50)
        hot = hottest_ops(prog, inputs)
    return {
        "model": name, "input": "x".join(map(str, inputs[0].shape)),
        "nodes": sum(1 for n in best.graph.nodes if not n.transition),
        "dispatches": sum(best.dispatches.values()),
        "greedy": greedy.num_transitions, "optimal": best.num_transitions,
        "certified": best.optimal, "prepacked": len(best.prepacks), "fallbacks": len(best.fallbacks),
        "error": check.relative, "ok": check.ok, "plan_s": plan_s, "compile_s": compile_s,
        "tf_ms": tf_s * 1000, "eager_ms": eager_s * 1000, "hot": hot,
    }


# ---- lowering speed ------------------------------------------------------------------------------
def unary_chain(n: int, shape=(1, 8, 16, 16)):
    """(model, inputs): `n` unary ops in a row, cycling through a few the registry implements."""
    import torch

    steps = (torch.relu, torch.tanh, torch.sigmoid, torch.neg)

    class Chain(torch.nn.Module):
        def forward(self, x):
            for i in range(n):
                x = steps[i % len(steps)](x)
            return x

    return Chain(), (torch.randn(*shape),)


def lowering_speed():
    """[(what, seconds)]: ViT-S/16 plan and compile from an ExportedProgram, a unary chain planned."""
    import torch

    import texelflow
    from texelflow.models import vit_s16

    rows = []
    model, inputs = vit_s16()
    start = time.perf_counter()
    ep = torch.export.export(model, inputs)
    rows.append(("ViT-S/16: torch.export.export (for reference)", time.perf_counter() - start))
    start = time.perf_counter()
    plan = texelflow.plan(ep)
    rows.append(("ViT-S/16: texelflow.plan(ExportedProgram)", time.perf_counter() - start))
    for stage, seconds in (getattr(plan, "timings", None) or {}).items():
        rows.append((f"  of which {stage}", seconds))
    texelflow.compile(ep).close()  # the SPIR-V cache and the device's pipelines are warm after this
    start = time.perf_counter()
    texelflow.compile(ep).close()
    rows.append(("ViT-S/16: texelflow.compile(ExportedProgram), warm cache", time.perf_counter() - start))
    chain, chain_inputs = unary_chain(CHAIN_OPS)
    chain_ep = torch.export.export(chain, chain_inputs)
    start = time.perf_counter()
    chain_plan = texelflow.plan(chain_ep)
    rows.append((f"{CHAIN_OPS}-op unary chain: texelflow.plan(ExportedProgram) "
                 f"({chain_plan.num_transitions} transitions, {len(chain_plan.fallbacks)} fallbacks)",
                 time.perf_counter() - start))
    return rows


# ---- tables --------------------------------------------------------------------------------------
def _ms(seconds) -> str:
    return f"{seconds * 1000:.1f}" if seconds is not None else "-"


def print_peers(rows, device: str) -> None:
    """texelflow beside the Vulkan peers on `device` and eager PyTorch on the CPU, same run."""
    names = [p for p in PEERS if any(p in r["peers"] for r in rows)]
    print(f"\nLatency beside the Vulkan peers on the same device ({device}) and eager PyTorch on the CPU, "
          "same run (ms per call, median of warm calls; error = max |out - eager| / max |eager|):\n")
    head = " | ".join(f"{p}-vk ms | {p} error" for p in names)
    print(f"| model | texelflow ms | texelflow error | {head} | eager CPU ms | texelflow speed-up vs fastest "
          "peer (peer ms / texelflow ms) | texelflow ms / eager ms |")
    print("|---|" + "---|" * (4 + 2 * len(names)) + "---|")
    notes = []
    for r in rows:
        cells, times = [], []
        for p in names:
            res = r["peers"].get(p)
            if res is None or res.seconds is None:
                cells += ["-", "-"]
                if res is not None:
                    notes.append(f"- {p} on {r['model']}: {res.why}")
            else:
                cells += [_ms(res.seconds), f"{res.error:.1e}"]
                times.append(res.seconds)
        tf_s = r["tf_ms"] / 1000
        vs_peer = f"{min(times) / tf_s:.2f}x" if times else "no peer ran"
        print(f"| {r['model']} | {r['tf_ms']:.1f} | {r['error']:.1e} | " + " | ".join(cells)
              + f" | {r['eager_ms']:.1f} | {vs_peer} | {r['tf_ms'] / r['eager_ms']:.1f}x |")
    for r in rows:
        for p in names:
            res = r["peers"].get(p)
            if res is not None and res.seconds is not None:
                notes.append(f"- {p} on {r['model']}: first call {_ms(res.first_s)} ms, conversion "
                             f"{res.convert_s:.1f} s (0 when cached)")
    if notes:
        print("\n" + "\n".join(notes))


def print_tables(rows, device: str) -> None:
    print(f"Vulkan device: {device}\n")
    print("| model | input | nodes | dispatches | transitions greedy | transitions optimal | certified | "
          "prepacked constants | fallbacks | max error (relative) | plan s | compile s | texelflow ms | "
          "eager ms | texelflow / eager |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        error = f"{r['error']:.1e}" + ("" if r["ok"] else " MISMATCH")
        print(f"| {r['model']} | {r['input']} | {r['nodes']} | {r['dispatches']} | {r['greedy']} | {r['optimal']} | "
              f"{r['certified']} | {r['prepacked']} | {r['fallbacks']} | {error} | {r['plan_s']:.2f} | "
              f"{r['compile_s']:.2f} | {r['tf_ms']:.1f} | {r['eager_ms']:.1f} | {r['tf_ms'] / r['eager_ms']:.1f}x |")
    if any(r.get("peers") for r in rows):
        print_peers(rows, device)
    print("\nThe three ops with most device time per model (GFLOP/s where the op has a FLOP count):\n")
    print("| model | op | dispatches | device ms | GFLOP | GFLOP/s |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        for op, n, seconds, flops in r["hot"]:
            gflop = f"{flops / 1e9:.3f}" if flops else "-"
            rate = f"{flops / 1e9 / seconds:.2f}" if flops and seconds > 0 else "-"
            print(f"| {r['model']} | {op} | {n} | {seconds * 1000:.1f} | {gflop} | {rate} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", help="comma-separated zoo names (default: all)")
    parser.add_argument("--quick", action="store_true", help="small inputs for the big models")
    parser.add_argument("--no-lowering", action="store_true", help="skip the lowering-speed table")
    parser.add_argument("--torch-threads", type=int, help="torch.set_num_threads for eager PyTorch (on a "
                        "loaded machine 1 thread gives steadier eager figures than torch's default)")
    parser.add_argument("--reps", type=int, help="timed warm calls per model and runtime (default: as many "
                        "as fit a time budget)")
    parser.add_argument("--peers", default=",".join(PEERS), help=f"Vulkan peers to run beside texelflow, "
                        f"comma-separated from {', '.join(PEERS)}, or 'none' (default: all)")
    parser.add_argument("--peer-timeout", type=float, default=240.0, help="seconds per peer and model, "
                        "conversion included (default 240); a peer past it is reported as timed out")
    args = parser.parse_args()
    from texelflow.demo import quiet_third_party_warnings
    from texelflow.models import ZOO
    from texelflow.runtime.vulkan.device import default_device

    quiet_third_party_warnings()
    names = args.models.split(",") if args.models else list(ZOO)
    unknown = [n for n in names if n not in ZOO]
    if unknown:
        print(f"bench/models.py: unknown model(s) {', '.join(unknown)}; choose from {', '.join(ZOO)}",
              file=sys.stderr)
        return 2
    import torch

    import texelflow
    from texelflow.models import tiny_resnet

    peers = [] if args.peers == "none" else [p for p in args.peers.split(",") if p]
    bad = [p for p in peers if p not in PEERS]
    if bad:
        print(f"bench/models.py: unknown peer(s) {', '.join(bad)}; choose from {', '.join(PEERS)} or none",
              file=sys.stderr)
        return 2
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    print(f"Machine: {machine()}; torch {torch.__version__} with {torch.get_num_threads()} threads")
    texelflow.compile(*tiny_resnet()).close()  # device, solver and imports warm before anything is timed
    rows = []
    for name in names:
        print(f"  {name} ...", file=sys.stderr, flush=True)
        row = bench_model(name, ZOO[name], QUICK_SIZES.get(name) if args.quick else None, args.reps)
        row["peers"] = {}
        for peer in peers if name in PEER_MODELS else ():
            if args.quick:
                row["peers"][peer] = None  # peers run the zoo's default sizes only
                continue
            print(f"  {name}: {peer} ...", file=sys.stderr, flush=True)
            row["peers"][peer] = run_peer(peer, name, args.reps or 3, args.peer_timeout)
        rows.append(row)
    print_tables(rows, default_device().limits.name)
    if not args.no_lowering:
        print("\nLowering speed (wall seconds, this process):\n")
        print("| what | seconds |")
        print("|---|---|")
        for what, seconds in lowering_speed():
            print(f"| {what} | {seconds:.2f} |")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
