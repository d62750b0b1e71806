"""`texelflow demo`: one model end to end, the way a user meets texelflow.

Export once; plan with both planners side by side; compile for the Vulkan device (a progress bar
when texelflow.compile reports progress, else a spinner); run; check against eager PyTorch; time
both in the same process; show the slowest dispatches and the device time per op.
bench/models.py reuses the measuring helpers (`compare`, `time_calls`, `dispatch_times`,
`time_by_op`) so the demo and the benchmark report the same numbers.
"""

from __future__ import annotations

import importlib
import inspect
import statistics
import sys
import time
import warnings
from dataclasses import dataclass

DEFAULT_MODEL = "vit_s16"
TOLERANCE = 1e-3  # max |texelflow - eager| <= TOLERANCE * max |eager|
TIMING_BUDGET_S = 20.0  # wall time per side for the warm runs (at least MIN_RUNS each)
MIN_RUNS, MAX_RUNS = 2, 20


@dataclass
class Check:
    """How far texelflow's output is from eager PyTorch's."""

    max_abs: float
    max_ref: float

    @property
    def relative(self) -> float:
        return self.max_abs / self.max_ref if self.max_ref > 0 else self.max_abs

    @property
    def ok(self) -> bool:
        return self.max_abs <= TOLERANCE * max(self.max_ref, 1e-30) or self.max_abs == 0.0


def compare(got, want) -> Check:
    """Worst absolute error over every output tensor, and the largest |eager| value it is judged
    against. NaN or Inf where eager has a finite value counts as an infinite error."""
    import torch

    gots, wants = torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want)
    if len(gots) != len(wants):
        return Check(float("inf"), 0.0)
    max_abs, max_ref = 0.0, 0.0
    for g, w in zip(gots, wants):
        if not isinstance(w, torch.Tensor):
            continue
        g, w = g.detach().double(), w.detach().double()
        if g.shape != w.shape:
            return Check(float("inf"), 0.0)
        same = (g == w) | (g.isnan() & w.isnan())  # equal infinities and NaN where eager has NaN
        diff = torch.where(same, torch.zeros_like(g), (g - w).abs().nan_to_num(nan=float("inf")))
        max_abs = max(max_abs, diff.max().item() if diff.numel() else 0.0)
        finite = w[w.isfinite()]
        max_ref = max(max_ref, finite.abs().max().item() if finite.numel() else 0.0)
    return Check(max_abs, max_ref)


def time_calls(fn, args, budget_s: float = TIMING_BUDGET_S, min_runs: int = MIN_RUNS,
               max_runs: int = MAX_RUNS) -> tuple[float, int]:
    """(median seconds per warm call, runs): one warm call sizes the run count to fit
    `budget_s`, within [min_runs, max_runs]."""
    start = time.perf_counter()
    fn(*args)
    probe = time.perf_counter() - start
    runs = max(min_runs, min(max_runs, int(budget_s / max(probe, 1e-6))))
    times = [probe]
    for _ in range(runs - 1):
        start = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - start)
    return statistics.median(times), runs


def eager(model, inputs):
    """The model's output in PyTorch, without autograd, and the seconds it took."""
    import torch

    with torch.no_grad():
        start = time.perf_counter()
        out = model(*inputs)
        return out, time.perf_counter() - start


def compile_with_progress(ep, console):
    """texelflow.compile(ep) with a progress bar per stage when compile reports progress
    (progress(stage, done, total)), else with a spinner."""
    import texelflow

    if "progress" not in inspect.signature(texelflow.compile).parameters:
        with console.status("compiling for the Vulkan device ..."):
            return texelflow.compile(ep)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    columns = (SpinnerColumn(), TextColumn("{task.description:<24}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, console=console) as bar:
        tasks: dict[str, int] = {}

        def progress(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(stage, total=total)
            bar.update(tasks[stage], completed=done, total=total)

        return texelflow.compile(ep, progress=progress)


# ---- tables ------------------------------------------------------------------------------------
def planner_table(plans: dict):
    from rich.table import Table

    table = Table(title="layout planners", title_justify="left", min_width=60)
    for col in ("planner", "transitions", "bytes", "certified optimal", "lower bound", "planning ms",
                "dispatches", "prepacked constants", "fallbacks"):
        table.add_column(col, justify="left" if col == "planner" else "right")
    for name, p in plans.items():
        table.add_row(name, str(p.num_transitions), f"{p.transition_bytes:,}", "yes" if p.optimal else "no",
                      str(p.lower_bound), f"{p.seconds * 1000:.1f}", str(sum(p.dispatches.values())),
                      str(len(p.prepacks)), str(len(p.fallbacks)))
    return table


def fallback_table(plan, examples: int = 3):
    from rich.table import Table

    by_reason: dict[str, list[str]] = {}
    for node, reason in plan.fallbacks:
        by_reason.setdefault(reason, []).append(node)
    table = Table(title="run on the CPU (fallbacks)", title_justify="left", min_width=60)
    table.add_column("nodes", justify="right")
    table.add_column("reason")
    table.add_column("e.g.")
    for reason, nodes in sorted(by_reason.items(), key=lambda kv: -len(kv[1])):
        table.add_row(str(len(nodes)), reason, ", ".join(nodes[:examples]) + (" ..." if len(nodes) > examples else ""))
    return table


def dispatch_times(prog, inputs) -> list[tuple[str, object, float]]:
    """(label, IR node or None, microseconds) per dispatch of one call with `inputs`, timestamps
    switched on for that call only; [] on a device without timestamps on its compute queue."""
    from texelflow.runtime.errors import TexelflowError

    was, prog.profiling = prog.profiling, True
    try:
        prog(*inputs)
        rows = prog.profile()
    except TexelflowError:
        return []
    finally:
        prog.profiling = was
    nodes = {n.name: n for n in prog.plan.graph.nodes}
    return [(label, nodes.get(label.split("[")[0]), us) for label, us in rows]  # NAME[i]: i-th of a node


def op_name(node, label: str) -> str:
    return node.op.name if node is not None and node.op is not None else label


def time_by_op(times) -> list[tuple[str, int, float]]:
    """(op, dispatches, microseconds) per op, most device time first."""
    total: dict[str, float] = {}
    count: dict[str, int] = {}
    for label, node, us in times:
        op = op_name(node, label)
        total[op] = total.get(op, 0.0) + us
        count[op] = count.get(op, 0) + 1
    return sorted(((op, count[op], us) for op, us in total.items()), key=lambda r: -r[2])


def slowest_tables(times, count: int = 5):
    """The slowest dispatches, and device time per op."""
    from rich.table import Table

    total = sum(us for _, _, us in times) or 1.0
    slow = Table(title=f"slowest dispatches (of {len(times)}, {total / 1000:.1f} ms on the device)",
                 title_justify="left", min_width=60)
    for col in ("dispatch", "op", "us", "share"):
        slow.add_column(col, justify="left" if col in ("dispatch", "op") else "right")
    for label, node, us in sorted(times, key=lambda r: -r[2])[:count]:
        slow.add_row(label, op_name(node, label), f"{us:,.0f}", f"{100 * us / total:.1f}%")
    by_op = Table(title="device time by op", title_justify="left", min_width=60)
    for col in ("op", "dispatches", "us", "share"):
        by_op.add_column(col, justify="left" if col == "op" else "right")
    for op, n, us in time_by_op(times)[:count]:
        by_op.add_row(op, str(n), f"{us:,.0f}", f"{100 * us / total:.1f}%")
    return slow, by_op


def latency_table(tf_s: float, tf_runs: int, eager_s: float, eager_runs: int, submits: int):
    from rich.table import Table

    table = Table(title="latency per call (median of warm runs, this process)", title_justify="left", min_width=60)
    for col in ("runtime", "ms per call", "runs", "note"):
        table.add_column(col, justify="left" if col in ("runtime", "note") else "right")
    table.add_row("texelflow (Vulkan)", f"{tf_s * 1000:.2f}", str(tf_runs), f"{submits} queue submit(s) per call")
    import torch

    table.add_row(f"eager PyTorch (CPU, {torch.get_num_threads()} threads)", f"{eager_s * 1000:.2f}", str(eager_runs),
                  f"texelflow / eager = {tf_s / eager_s:.2f}x" if eager_s > 0 else "")
    return table


# ---- the demo ----------------------------------------------------------------------------------
def make_console():
    from rich.console import Console

    return Console(highlight=False, width=None if sys.stdout.isatty() else 132)


def run(model, inputs, title: str, console=None) -> int:
    """The demo on `model` with `inputs`; 0 when texelflow's output matches eager PyTorch."""
    from texelflow.runtime.errors import TexelflowError

    console = console or make_console()
    with warnings.catch_warnings():
        quiet_third_party_warnings()
        try:
            return _run(model, inputs, title, console)
        except TexelflowError as exc:  # no device, a model torch.export cannot take, ...: one line
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            print(f"texelflow demo: {first}", file=sys.stderr)
            return 1


def quiet_third_party_warnings() -> None:
    """Silence warnings that torch raises about its own internals (the user cannot act on them)."""
    warnings.filterwarnings("ignore", message=r".*LeafSpec.*", category=FutureWarning)
    warnings.filterwarnings("ignore", module=r"torch\._(export|dynamo|functorch|subclasses)")
    warnings.filterwarnings("ignore", module=r"torchao(\.|$)")


def _run(model, inputs, title, console) -> int:
    import texelflow
    from texelflow.runtime.graph.importer import export_program
    from texelflow.runtime.vulkan.device import default_device

    shapes = ", ".join("x".join(map(str, x.shape)) for x in inputs if hasattr(x, "shape"))
    console.rule(f"texelflow demo: {title}")
    with console.status("exporting with torch.export ..."):
        start = time.perf_counter()
        ep = export_program(model, inputs)
        export_s = time.perf_counter() - start
        importlib.import_module("scipy.optimize")  # the optimal planner's solver, loaded before it is timed
    nodes = sum(1 for n in ep.graph.nodes if n.op == "call_function")
    console.print(f"model: {title}  input {shapes}  {nodes} ATen nodes  exported in {export_s:.1f} s", soft_wrap=True)

    plans = {}
    for planner in ("greedy", "optimal"):
        with console.status(f"planning ({planner}) ..."):
            plans[planner] = texelflow.plan(ep, planner=planner)
    console.print(planner_table(plans))
    best = plans["optimal"]
    if best.fallbacks:
        console.print(fallback_table(best))

    device = default_device()
    console.print(f"device: {device.limits.name} ({device.limits.device_type})", soft_wrap=True)
    t = time.perf_counter()
    prog = compile_with_progress(ep, console)
    compile_s = time.perf_counter() - t
    with prog:
        t = time.perf_counter()
        with console.status("first call on the device ..."):
            got = prog(*inputs)
        first_s = time.perf_counter() - t
        want, _ = eager(model, inputs)
        check = compare(got, want)
        console.print(f"compiled in {compile_s:.1f} s; first call {first_s * 1000:.0f} ms; "
                      f"{len(prog.segments)} segment(s)", soft_wrap=True)
        console.print(f"max |texelflow - eager| = {check.max_abs:.2e}  (max |eager| = {check.max_ref:.3g}, "
                      f"relative {check.relative:.2e}, tolerance {TOLERANCE:g})", soft_wrap=True)

        with console.status("timing warm calls ..."):
            tf_s, tf_runs = time_calls(prog, inputs)
            eager_s, eager_runs = time_calls(lambda *a: eager(model, a), inputs, budget_s=2.0, min_runs=10,
                                             max_runs=50)
        console.print(latency_table(tf_s, tf_runs, eager_s, eager_runs, prog.num_submits_per_call))
        console.print(f"{tf_s * 1000:.2f} ms per call; {prog.num_submits_per_call} queue submit(s) per call",
                      soft_wrap=True)
        times = dispatch_times(prog, inputs)
        if times:
            for table in slowest_tables(times):
                console.print(table)
    console.print("demo: OK" if check.ok else "demo: MISMATCH", soft_wrap=True)
    return 0 if check.ok else 1

