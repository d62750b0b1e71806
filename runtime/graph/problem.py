"""The layout-planning problem shared by both planners, and the assignment they return.

Slots are (node, name) for each tensor argument and output of a Vulkan node; each has a pristine
OpRepSets entry. Constants are prepacked into whatever their consumers need, so they never take a
run-time transition and are not planned. Every other value consumed or produced on the device
gets one representation; a consumer slot that wants another pays one transition per
(value, representation), shared by all consumers wanting it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from texelflow.generated.layouts import DTYPES, TEXTURE_LIMITS

from .ir import Node, PlanGraph, Value
from .lowering import node_repsets
from .op_repsets import OpRepSets
from .repr import TensorRepr, TensorRepSet


@dataclass
class Problem:
    graph: PlanGraph
    limits: tuple[int, int, int]
    repsets: dict[Node, OpRepSets]  # pristine, per device node
    planned: list[Value]  # values that get a representation (non-constant, touching the device)

    @classmethod
    def build(cls, graph: PlanGraph, limits: Sequence[int] = TEXTURE_LIMITS) -> "Problem":
        limits = tuple(limits)
        repsets = {n: node_repsets(n, limits) for n in graph.device_nodes()}
        planned: list[Value] = []
        seen: set[int] = set()
        for n in repsets:
            for v in [v for _, v in n.tensor_args()] + [v for _, v in n.outputs]:
                if v.kind != "const" and id(v) not in seen:
                    seen.add(id(v))
                    planned.append(v)
        return cls(graph, limits, repsets, planned)

    def free_domain(self, v: Value) -> TensorRepSet:
        """Representations a value not produced on the device may take (uploads land anywhere)."""
        allowed = TensorRepSet.named("ANY_STORAGE_INCL_PACKED_INT8")
        if v.dtype in DTYPES:
            allowed = allowed.filter_for_family(DTYPES[v.dtype].family)
        return allowed.filter_invalid_reprs(v.shape, self.limits)

    def consumer_slots(self, v: Value) -> list[tuple[Node, str]]:
        """(device node, slot name) pairs that read `v`, one per node and slot."""
        out = []
        for n in dict.fromkeys(v.users):
            if n in self.repsets:
                for name, x in n.tensor_args():
                    if x is v and (n, name) not in out:
                        out.append((n, name))
        return out


@dataclass
class Assignment:
    """A planner's answer: a representation per planned value and per device-node slot."""

    values: dict[Value, TensorRepr] = field(default_factory=dict)
    slots: dict[tuple[Node, str], TensorRepr] = field(default_factory=dict)
    optimal: bool = False
    lower_bound: int = 0
    planner: str = ""
    notes: list[str] = field(default_factory=list)

    def transitions(self, problem: Problem) -> dict[tuple[Value, TensorRepr], list[tuple[Node, str]]]:
        """(value, target representation) -> the consumer slots that need that copy."""
        result: dict[tuple[Value, TensorRepr], list[tuple[Node, str]]] = {}
        for node in problem.repsets:
            for name, v in node.tensor_args():
                if v.kind == "const":
                    continue
                want = self.slots[(node, name)]
                if self.values[v] != want:
                    result.setdefault((v, want), []).append((node, name))
        return result

    def cost(self, problem: Problem) -> tuple[int, int]:
        """(number of transitions, bytes they copy)."""
        t = self.transitions(problem)
        return len(t), sum(v.nbytes for v, _ in t)
