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

from .ir import Node, Role, Value
from .op_repsets import OpRepSets
from .problem import Assignment, Problem, gc_paused
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


class _Downstream:
    """The downstream searches of one plan, with each value's search steps computed once.

    A step is what one use site of a value contributes to a search: the consumer slot's pristine
    repset (a mask) and, when the consumer propagates, the value the search continues into. The
    graph and the pristine repsets do not change while planning, so the steps of a value are the
    same in every search that reaches it; caching them turns each dequeue into a few integer ANDs.
    For the same reason a search is a function of (origin, allowed), and its result is kept too:
    a value is searched from by its producer and by each of its consumers, often with one mask.
    """

    def __init__(self, problem: Problem):
        self.problem = problem
        self.steps: dict[Value, list[tuple[int, Value | None]]] = {}
        self.results: dict[tuple[Value, int], int] = {}

    def _steps(self, value: Value) -> list[tuple[int, Value | None]]:
        steps = self.steps.get(value)
        if steps is None:
            steps = self.steps[value] = []
            for user in value.users:  # one entry per use site, duplicates included
                sets = self.problem.repsets.get(user)
                slot = _first_positional_slot(user, value)
                if sets is None or slot is None or slot not in sets.sets:
                    continue
                nxt = user.outputs[0][1] if _propagates(sets, slot) else None
                steps.append((sets.sets[slot].mask, nxt))
        return steps

    def trace(self, origin: Value, allowed: int) -> int:
        """The mask a downstream search from `origin` narrows `allowed` to (cached)."""
        result = self.results.get((origin, allowed))
        if result is None:
            result = self.results[(origin, allowed)] = self._search(origin, allowed)
        return result

    def _search(self, origin: Value, allowed: int) -> int:
        """The reference search on masks: breadth-first over propagating consumers, intersecting
        every requirement that leaves something, until one representation is left or the budget
        (SEARCH_BUDGET per search, so at most SEARCH_BUDGET - 1 dequeues) runs out."""
        if allowed and not allowed & (allowed - 1):
            return allowed
        known = self.steps
        budget = SEARCH_BUDGET
        queue = deque([origin])
        while queue:
            budget -= 1
            if budget <= 0:
                return allowed
            value = queue.popleft()
            steps = known.get(value)
            for req, nxt in steps if steps is not None else self._steps(value):
                if not req & allowed:
                    continue
                allowed &= req
                if not allowed & (allowed - 1):  # constrained: exactly one left
                    return allowed
                if nxt is not None:
                    queue.append(nxt)
        return allowed


def plan_greedy(problem: Problem) -> Assignment:
    with gc_paused():
        return _plan(problem)


def _plan(problem: Problem) -> Assignment:
    result = Assignment(planner="greedy")
    downstream = _Downstream(problem)

    def trace(origin: Value, allowed: TensorRepSet) -> TensorRepSet:
        return TensorRepSet(mask=downstream.trace(origin, allowed.mask))

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
                sets.constrain(slot, trace(first, sets.sets[slot]))
            if sets.sets[slot].is_ambiguous() and first.role is not Role.CONST:
                if first in result.values:
                    sets.constrain(slot, TensorRepSet.of(result.values[first]))
        out0 = node.outputs[0][0]
        if sets.sets[out0].is_ambiguous():
            sets.constrain(out0, trace(node.outputs[0][1], sets.sets[out0]))
        for slot in list(sets.sets):
            allowed = sets.sets[slot]
            chosen = allowed.pick()
            sets.constrain(slot, TensorRepSet(mask=allowed.mask & -allowed.mask))  # {chosen}: its lowest bit
            result.slots[(node, slot)] = chosen
        for name, v in node.outputs:
            result.values[v] = result.slots[(node, name)]
        for name, v in node.tensor_args():
            if v.role is not Role.CONST and v not in result.values:
                result.values[v] = result.slots[(node, name)]  # first consumer wins
    count, _ = result.cost(problem)
    result.lower_bound = 0
    result.optimal = count == 0
    return result
