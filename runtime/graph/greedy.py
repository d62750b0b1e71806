"""The reference planner (ExecuTorch Vulkan's tagging pass), kept as the baseline to beat.

Nodes in topological order. For each tensor argument that is still ambiguous, search the
consumers downstream breadth-first (a fresh budget of 64 per search, so at most 63 dequeues) and
intersect the first compatible requirement; only when downstream does not constrain, fall back to
the producer's representation. Outputs get the downstream search only. Sync groups narrow by
packed-dim compatibility, ties go by the declared preference order, and a representation once
written is never revised: conflicts become transitions at consumers.
"""

from __future__ import annotations

from collections import deque

from .ir import Node, Value
from .op_repsets import OpRepSets
from .problem import Assignment, Problem
from .repr import TensorRepSet

SEARCH_BUDGET = 64


def _propagates(sets: OpRepSets, slot: str) -> bool:
    """Whether a consumer carries an argument's representation on to its first output."""
    out0 = sets.op.outputs[0].name
    return any(slot in g and out0 in g for g in sets.sync)


def _first_positional_slot(node: Node, v: Value) -> str | None:
    """The first argument slot holding `v` directly; a value inside a list is invisible."""
    for name, x in node.args:
        if x is v:
            return name
    return None


def trace_downstream(problem: Problem, origin: Value, allowed: TensorRepSet) -> TensorRepSet:
    budget = SEARCH_BUDGET
    queue = deque([origin])
    while queue:
        if allowed.is_constrained():
            return allowed
        budget -= 1
        if budget <= 0:
            return allowed
        value = queue.popleft()
        for user in value.users:
            if allowed.is_constrained():
                return allowed
            sets = problem.repsets.get(user)
            slot = _first_positional_slot(user, value)
            if sets is None or slot is None or slot not in sets.sets:
                continue
            req = sets.sets[slot]
            if (req & allowed).is_empty():
                continue
            allowed = allowed & req
            if _propagates(sets, slot):
                queue.append(user.outputs[0][1])
    return allowed


def plan_greedy(problem: Problem) -> Assignment:
    result = Assignment(planner="greedy")
    for node in problem.graph.nodes:
        pristine = problem.repsets.get(node)
        if pristine is None:
            continue
        sets = OpRepSets(pristine.op, dict(pristine.sets), pristine.sync)
        arg_slots = [name for name, v in node.args if name in sets.sets]
        for slot in arg_slots:
            raw = node.arg(slot)
            first = raw[0] if isinstance(raw, list) else raw
            if sets.sets[slot].is_ambiguous():
                sets.constrain(slot, trace_downstream(problem, first, sets.sets[slot]))
            if sets.sets[slot].is_ambiguous() and first.kind != "const":
                if first in result.values:
                    sets.constrain(slot, TensorRepSet.of(result.values[first]))
        out0 = node.outputs[0][0]
        if sets.sets[out0].is_ambiguous():
            sets.constrain(out0, trace_downstream(problem, node.outputs[0][1], sets.sets[out0]))
        for slot in list(sets.sets):
            chosen = sets.sets[slot].pick()
            sets.constrain(slot, TensorRepSet.of(chosen))
            result.slots[(node, slot)] = chosen
        for name, v in node.outputs:
            result.values[v] = result.slots[(node, name)]
        for name, v in node.tensor_args():
            if v.kind != "const" and v not in result.values:
                result.values[v] = result.slots[(node, name)]  # first consumer wins
    count, _ = result.cost(problem)
    result.lower_bound = 0
    result.optimal = count == 0
    return result
