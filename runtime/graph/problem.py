"""The layout-planning problem shared by both planners, and the assignment they return.

Slots are (node, name) for each tensor argument and output of a Vulkan node; each has a pristine
OpRepSets entry. Constants are prepacked into whatever their consumers need, so they never take a
run-time transition and are not planned. Every other value consumed or produced on the device
gets one representation; a consumer slot that wants another pays one transition per
(value, representation), shared by all consumers wanting it.
"""

from __future__ import annotations

import contextlib
import gc
from dataclasses import dataclass, field
from typing import Sequence

from texelflow.generated.layouts import DTYPES, TEXTURE_LIMITS

from .costs import pair_slots
from .ir import Node, PlanGraph, Role, Value
from .lowering import node_repsets, tensor_shapes
from .op_repsets import OpRepSets
from .repr import TensorRepr, TensorRepSet


@dataclass
class Problem:
    graph: PlanGraph
    limits: tuple[int, int, int]
    repsets: dict[Node, OpRepSets]  # pristine, per device node
    planned: list[Value]  # values that get a representation (non-constant, touching the device)
    # The cost model (runtime/graph/costs.py) whose predicted time the optimal planner minimises;
    # None: transitions alone (count, then bytes)
    costs: object = None

    @classmethod
    def build(cls, graph: PlanGraph, limits: Sequence[int] = TEXTURE_LIMITS, costs=None) -> "Problem":
        limits = tuple(limits)
        with gc_paused():
            built: dict = {}
            repsets = {n: _cached_repsets(n, limits, built) for n in graph.device_nodes()}
            narrow_free_permutes(graph, repsets)
            planned: list[Value] = []
            seen: set[int] = set()
            for n in repsets:
                for v in [v for _, v in n.tensor_args()] + [v for _, v in n.outputs]:
                    if v.role is not Role.CONST and id(v) not in seen:
                        seen.add(id(v))
                        planned.append(v)
        return cls(graph, limits, repsets, planned, costs)

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


def narrow_free_permutes(graph: PlanGraph, repsets: dict[Node, OpRepSets]) -> list[Node]:
    """Narrow a permute to a free (self, out) pair (redundant.permute_is_free: two buffers holding
    the same memory) where a neighbour forces that pair's representation on one side (its input's
    producer slot, or every device reader of its output, accepts only it) and the neighbours of the
    other side accept the pair's other representation. The forced side then costs no transition,
    the other at most one, and the permute's own copy goes: never more copies than before,
    counting transitions and permute dispatches together (the permutes around channels-last
    kernels, runtime/graph/permutes/dim_order.py, become free on channels-packed buffers). The
    planners minimise transitions over the narrowed sets, so `plan.optimal` certifies that.
    Nodes are visited in order, so a chain of permutes narrows one after the other. Returns the
    narrowed permutes."""
    from .redundant import free_permute_pairs

    narrowed = []
    for node in graph.nodes:
        sets = repsets.get(node)
        if sets is None or node.transition or node.op.name != "permute_copy":
            continue
        src, out = node.arg("self"), node.outputs[0][1]
        pairs = free_permute_pairs(node, sets.sets["self"], sets.sets["out"])
        if not pairs:
            continue
        producer = [(src.producer, n) for n, v in src.producer.outputs if v is src] if src.producer in repsets else []
        readers = [(n, name) for n in dict.fromkeys(out.users) if n in repsets
                   for name, v in n.tensor_args() if v is out]
        forced_in = _forced(src, producer, repsets)
        forced_out = _forced(out, readers, repsets) if len(readers) == len(set(out.users)) else None
        # the other side's neighbours must accept the pair too, so narrowing alone adds no transition
        keep = [(a, b) for a, b in pairs
                if (forced_in is None or a == forced_in) and (forced_out is None or b == forced_out)
                and all(a in repsets[n].sets[name] for n, name in producer)
                and all(b in repsets[n].sets[name] for n, name in readers)]
        if keep and (forced_in is not None or forced_out is not None):
            a, b = min(keep, key=lambda p: (p[0].preference_key(), p[1].preference_key()))
            if sets.constrain("self", TensorRepSet.of(a)) and sets.constrain("out", TensorRepSet.of(b)):
                narrowed.append(node)
    return narrowed


def _forced(v: Value, slots, repsets) -> TensorRepr | None:
    """The one representation every slot in `slots` accepts when that is all they accept."""
    if v.role is Role.CONST or not slots:
        return None
    only = {frozenset(repsets[n].sets[name]) for n, name in slots}
    if len(only) == 1:
        (reprs,) = only
        if len(reprs) == 1:
            return next(iter(reprs))
    return None


@contextlib.contextmanager
def gc_paused():
    """Pause CPython's cyclic garbage collector while planning.

    Planning allocates a few small containers per slot and leaves no cyclic garbage, but each
    full collection those allocations trigger rescans every live object, the whole graph included:
    on 10k-node graphs that was a third of the planning time. Collection resumes afterwards (and
    stays off if the caller had turned it off)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _cached_repsets(node: Node, limits: tuple[int, int, int], built: dict) -> OpRepSets:
    """node_repsets(node, limits), built once per signature: nodes of the same op with the same
    tensor shapes and dtype get the same repsets (a pure function of those), and large graphs
    repeat a few signatures thousands of times. Each node still gets its own OpRepSets (sets
    copied), so nothing is shared between nodes. The op is keyed by identity: `built` lives for
    one Problem.build, while every node keeps its op alive."""
    shapes = tensor_shapes(node)
    key = (
        id(node.op),
        node.outputs[0][1].dtype if node.outputs else None,
        tuple((name, tuple(map(tuple, s)) if isinstance(s, list) else tuple(s)) for name, s in shapes.items()),
    )
    sets = built.get(key)
    if sets is None:
        sets = built[key] = node_repsets(node, limits)
    return OpRepSets(sets.op, dict(sets.sets), sets.sync)


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
                if v.role is Role.CONST:
                    continue
                want = self.slots[(node, name)]
                if self.values[v] != want:
                    result.setdefault((v, want), []).append((node, name))
        return result

    def cost(self, problem: Problem) -> tuple[int, int]:
        """(number of transitions, bytes they copy)."""
        t = self.transitions(problem)
        return len(t), sum(v.nbytes for v, _ in t)

    def predicted_seconds(self, problem: Problem, costs=None) -> float:
        """The plan's predicted time under a cost model (`costs`, else the problem's): every
        device node's slots at their representations, a permute's general path where its pair
        of representations misses the fast one (costs.pair_seconds), plus every transition: what
        the optimal planner minimises when the problem has costs. Constants' slots count at the
        representation they are prepacked in; host values cost nothing to upload."""
        model = costs if costs is not None else problem.costs
        if model is None:
            raise ValueError("predicted_seconds needs a cost model (the problem has none)")
        total = 0.0
        for node in problem.repsets:
            if node.transition:
                continue
            for name, v in list(node.tensor_args()) + list(node.outputs):
                total += model.slot_seconds(node, name, v, self.slots[(node, name)])
            pair = pair_slots(node)
            if pair is not None:
                total += model.pair_seconds(node, self.slots[(node, pair[0])], self.slots[(node, pair[1])])
        for v, want in self.transitions(problem):
            total += model.transition_seconds(v, want)
        return total
