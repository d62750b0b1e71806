"""Run the planning passes on the IR and present the result: the `Plan` users look at."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

from texelflow.generated.layouts import TEXTURE_LIMITS

from .greedy import plan_greedy
from .ir import Node, PlanGraph, Role
from .optimal import SOLVER_TIME_LIMIT_S, plan_optimal
from .problem import Assignment, Problem
from .redundant import fold_free_permutes, fold_identity_ops
from .transitions import insert_transitions
from .verify import verify

PLANNERS = ("optimal", "greedy")
PERMUTE_OPS = ("permute_copy",)
PERMUTE_TARGETS = ("aten.permute.default", "aten.permute_copy.default")

# One colour per representation in to_dot(); transitions are drawn as red diamonds.
COLOURS = {
    "TEXTURE_3D/WIDTH_PACKED": "#8ecae6",
    "TEXTURE_3D/HEIGHT_PACKED": "#90be6d",
    "TEXTURE_3D/CHANNELS_PACKED": "#f9c74f",
    "BUFFER/WIDTH_PACKED": "#219ebc",
    "BUFFER/HEIGHT_PACKED": "#43aa8b",
    "BUFFER/CHANNELS_PACKED": "#f8961e",
}


@dataclass
class Plan:
    graph: PlanGraph
    assignment: Assignment
    planner: str
    transitions: list[Node]
    folded: list[Node]
    seconds: float
    texture_limits: tuple[int, int, int]
    prepacks: list[tuple[str, str]] = field(default_factory=list)  # (constant, representation) at load
    exported: object = None  # the ExportedProgram the plan came from, when it came from one
    # Seconds per stage: export, decomposition, lowering, fusion, planning (texelflow.plan); compile
    # adds prepacking and pipelines. A plan built from an IR graph has planning only.
    timings: dict[str, float] = field(default_factory=dict)
    # The cost model the plan minimised predicted time under (runtime/graph/costs.py); None when
    # planned by transitions alone
    costs: object = None
    # What precision="fp16" did (runtime/graph/precision.py PrecisionReport): float16 nodes, casts,
    # or why float32 variants are used; None for a plan that was not asked for a precision
    precision: object = None

    # ---- the numbers of DESIGN §10 -------------------------------------------------------------
    @property
    def num_transitions(self) -> int:
        return len(self.transitions)

    @property
    def transition_bytes(self) -> int:
        return sum(n.outputs[0][1].nbytes for n in self.transitions)

    @property
    def optimal(self) -> bool:
        return self.assignment.optimal

    @property
    def lower_bound(self) -> int:
        return self.assignment.lower_bound

    @property
    def reprs(self) -> dict[str, str]:
        return {v.name: str(r) for v, r in self.assignment.values.items()}

    @property
    def fallbacks(self) -> list[tuple[str, str]]:
        return [(n.name, n.fallback) for n in self.graph.nodes if n.fallback is not None or n.op is None]

    @property
    def num_permutes(self) -> int:
        """Permutes that move data: free ones (folded into views of their input) left out."""
        return sum(1 for n in self._permute_nodes() if not n.folded)

    @property
    def num_permute_nodes(self) -> int:
        """Permute nodes left in the graph, free ones included: what the permute passes leave."""
        return len(self._permute_nodes())

    def _permute_nodes(self) -> list[Node]:
        return [n for n in self.graph.nodes if (n.op and n.op.name in PERMUTE_OPS) or n.target in PERMUTE_TARGETS]

    @property
    def dispatches(self) -> Counter:
        return Counter(n.op.name for n in self.graph.device_nodes() if not n.folded)

    # ---- predicted time (runtime/graph/costs.py) ----------------------------------------------------
    def predicted(self, costs=None) -> dict[str, float]:
        """Predicted seconds per device node (transitions included, folded nodes 0) under `costs`,
        else the plan's own cost model, else the built-in estimate."""
        from .costs import CostModel

        model = costs or self.costs or CostModel.estimate()
        slots = self.assignment.slots
        out = {}
        for n in self.graph.device_nodes():
            names = [name for name, _ in n.tensor_args()] + [name for name, _ in n.outputs]
            out[n.name] = model.node_seconds(n, {name: slots[(n, name)] for name in names if (n, name) in slots})
        return out

    @property
    def predicted_seconds(self) -> float | None:
        """The plan's total predicted device time under its cost model; None without one."""
        return sum(self.predicted().values()) if self.costs is not None else None

    # ---- presentation ----------------------------------------------------------------------------
    def rows(self) -> list[tuple[str, str, str, str, str]]:
        """(node, op, where, representation, note) per node, in execution order."""
        rows = []
        for n in self.graph.nodes:
            out = n.outputs[0][1] if n.outputs else None
            rep = self.reprs.get(out.name, "-") if out is not None else "-"
            if n.transition:
                src = self.assignment.values[n.arg("self")]
                rows.append((n.name, "to_layout", "vulkan", rep, f"transition from {src}"))
            elif n.fallback is not None or n.op is None:
                rows.append((n.name, n.target, "cpu", "-", f"fallback: {n.fallback}"))
            else:
                note = "folded (no data moves)" if n.folded else "; ".join(n.fused)
                if out is not None and out.dtype == "float16":  # precision="fp16" stores it narrow
                    note = "; ".join(x for x in (note, "float16") if x)
                rows.append((n.name, n.op.name, "vulkan", rep, note))
        return rows

    def summary(self) -> str:
        head = (f"planner={self.planner}  transitions={self.num_transitions} ({self.transition_bytes} B)  "
                f"optimal={self.optimal}  lower_bound={self.lower_bound}  prepacked constants={len(self.prepacks)}  "
                f"fallbacks={len(self.fallbacks)}  planning {self.seconds * 1000:.1f} ms")
        if self.precision is not None and self.precision.requested != "fp32":
            head += f"\n{self.precision.summary()}"
        if self.graph.bfloat16 is not None:
            head += f"\n{self.graph.bfloat16.summary()}"
        if self.graph.input_bounds:  # lowering's _with_input_bounds: int64 inputs assumed narrower
            head += "\ninput bounds (checked at each call, so that int64 arithmetic runs in int32): " + ", ".join(
                f"{name} in [{low}, {high}]" for name, (low, high) in sorted(self.graph.input_bounds.items()))
        rows = [("node", "op", "where", "representation", "note")] + self.rows()
        if self.costs is not None:  # a predicted-time column, from the cost model the plan minimised
            predicted = self.predicted()
            head += f"\ncosts={self.costs.source}  predicted {sum(predicted.values()) * 1000:.3f} ms"
            if self.costs.device:
                head += f" on {self.costs.device}"
            head += "".join(f"\n{note}" for note in self.assignment.notes)
            rows = [rows[0][:4] + ("predicted us",) + rows[0][4:]] + [
                r[:4] + (f"{predicted[r[0]] * 1e6:.1f}" if r[0] in predicted else "-",) + r[4:] for r in rows[1:]]
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = [head, ""]
        for i, r in enumerate(rows):
            lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
            if i == 0:
                lines.append("  ".join("-" * w for w in widths))
        return "\n".join(lines)

    def timing_summary(self) -> str:
        """One line: the seconds of each stage that ran, in pipeline order, and their total."""
        order = ("export", "decomposition", "lowering", "fusion", "planning", "prepacking", "pipelines")
        stages = [k for k in order if k in self.timings] + sorted(set(self.timings) - set(order))
        parts = [f"{k} {self.timings[k] * 1000:.1f} ms" for k in stages]
        return f"timings: {', '.join(parts)}; total {sum(self.timings.values()) * 1000:.1f} ms"

    def to_dot(self) -> str:
        """Graphviz source: nodes coloured by output representation, transitions as red diamonds."""
        lines = ["digraph plan {", "  rankdir=TB;", '  node [shape=box, style=filled, fontname="Helvetica"];']

        def q(s: str) -> str:
            return '"' + s.replace('"', '\\"') + '"'

        for v in self.graph.inputs:
            rep = self.reprs.get(v.name, "")
            lines.append(f"  {q(v.name)} [shape=ellipse, fillcolor={q(COLOURS.get(rep, '#eeeeee'))}, "
                         f"label={q(v.name + chr(10) + rep)}];")
        by_name = {x.name: x for x in self.graph.nodes}
        for n, op, where, rep, note in self.rows():
            node = by_name[n]
            if node.transition:
                attrs = f"shape=diamond, fillcolor=\"#e63946\", fontcolor=white, label={q('to_layout' + chr(10) + rep)}"
            elif where == "cpu":
                attrs = f"fillcolor=\"#dddddd\", style=\"filled,dashed\", label={q(n + chr(10) + 'CPU: ' + op)}"
            else:
                style = "filled,dotted" if node.folded else "filled"
                title = n if n.rstrip("_0123456789") == op else f"{n}{chr(10)}{op}"
                attrs = f"fillcolor={q(COLOURS.get(rep, '#ffffff'))}, style={q(style)}, label={q(title + chr(10) + rep)}"
            lines.append(f"  {q(n)} [{attrs}];")
            for _, v in node.tensor_args():
                if v.role is Role.CONST:
                    continue
                src = v.producer.name if v.producer is not None else v.name
                lines.append(f"  {q(src)} -> {q(n)};")
        for v in self.graph.outputs:
            src = v.producer.name if v.producer is not None else v.name
            lines.append(f"  {q(src)} -> {q('output')};")
        lines.append('  "output" [shape=ellipse, fillcolor=white];')
        lines.append("}")
        return "\n".join(lines) + "\n"


# The priced plan replaces the transitions-alone plan only when it is predicted this much faster
# (relative): predictions err by more than a few percent, and a plan that differs for less moved
# measured latency either way on the zoo (docs/planner.md, "Predicted time").
MIN_PREDICTED_GAIN = 0.05


def _clear_gain_only(problem: Problem, priced: Assignment, time_limit: float) -> Assignment:
    """The plan minimising predicted time when it beats the transitions-alone plan (priced alike)
    by MIN_PREDICTED_GAIN; else the transitions-alone plan, with a note saying why."""
    costs = problem.costs
    problem.costs = None
    try:
        alone = plan_optimal(problem, time_limit)
    finally:
        problem.costs = costs
    t_priced, t_alone = priced.predicted_seconds(problem), alone.predicted_seconds(problem)
    if t_priced <= t_alone * (1 - MIN_PREDICTED_GAIN):
        return priced
    gain = 1 - t_priced / t_alone if t_alone > 0 else 0.0
    alone.notes.append(f"kept the transitions-alone plan: the predicted-time plan gains {gain:.1%} "
                       f"(< {MIN_PREDICTED_GAIN:.0%})")
    return alone


def plan_graph(graph: PlanGraph, planner: str = "optimal", texture_limits: Sequence[int] = TEXTURE_LIMITS,
               time_limit: float = SOLVER_TIME_LIMIT_S, costs=None) -> Plan:
    """Plan representations, insert transitions, fold identity ops and verify, in place on `graph`.
    `costs`: a costs.CostModel whose predicted time the optimal planner minimises (transitions
    priced by it too); None: transitions alone, count then bytes. Greedy ignores it."""
    if planner not in PLANNERS:
        raise ValueError(f"unknown planner '{planner}'; choose one of {', '.join(PLANNERS)}")
    start = time.perf_counter()
    problem = Problem.build(graph, texture_limits, costs)
    assignment = plan_optimal(problem, time_limit) if planner == "optimal" else plan_greedy(problem)
    if costs is not None and planner == "optimal":
        assignment = _clear_gain_only(problem, assignment, time_limit)
    prepacks = sorted({
        (v.name, str(assignment.slots[(n, slot)]))
        for n in problem.repsets for slot, v in n.tensor_args() if v.role is Role.CONST
    })
    transitions = insert_transitions(problem, assignment)
    folded = fold_identity_ops(problem, assignment) + fold_free_permutes(problem, assignment)
    verify(problem, assignment)
    seconds = time.perf_counter() - start
    return Plan(graph, assignment, planner, transitions, folded, seconds, tuple(texture_limits), prepacks,
                timings={"planning": seconds}, costs=costs)
