"""The optimal planner's driver: contract, split into components, solve each, read the plan back.

A component the solver cannot finish in time keeps its greedy plan (computed only then), and the
plan is then not certified; its lower bound is the sum of the components' bounds.
"""

from __future__ import annotations

import math
import time

import numpy as np

from ..greedy import plan_greedy
from ..problem import Assignment, Problem, gc_paused
from ..repr import REPRS
from .components import components, settle, unsettled
from .contraction import contract_chains
from .pair_ties import polish_pairs
from .prices import price
from .tables import Tables, build_tables, count_transitions, crossing_edges

# integer_program, local_search and solver import scipy (about a second): they are imported only
# when a component needs the solver; a plan whose components all settle never loads scipy.


def plan(problem: Problem, time_limit: float) -> Assignment:
    with gc_paused():
        return _plan(problem, time_limit)


def _plan(problem: Problem, time_limit: float) -> Assignment:
    t = build_tables(problem)
    classes = t.classes
    costs = problem.costs
    if costs is None:  # exact for transition counts and bytes only: with unary costs it is not
        contract_chains(t, classes.roots().tolist())
    root = classes.roots()  # final: every later lookup reads this instead of calling find
    domain = np.asarray(classes.domain, dtype=np.int64)
    ev, ecc, evc = crossing_edges(t, root)
    groups = [[int(root[k]) for k in keys] for keys in t.int8_groups]
    roots = np.nonzero(root == np.arange(len(root)))[0]
    priced = None
    if costs is None:
        comp = components(len(root), ecc, evc, groups)
        label, todo = settle(comp, roots, domain, ecc, groups)
    else:
        priced = price(problem, t, root, roots, domain)
        links = sorted({(p.src, p.out) for p in priced.pairs})
        comp = components(len(root), ecc, evc, groups, links)
        label, todo = settle(comp, roots, priced.cheapest, ecc, groups, links)

    fallback: dict[int, object] = {}  # class index -> greedy representation, where a solve failed
    greedy: list[Assignment] = []  # computed only if a component has to fall back to it
    certified = True
    lower = 0
    deadline = time.monotonic() + time_limit
    for cid, cls, (cev, cecc, cevc), cgroups in unsettled(comp, todo, ev, ecc, evc, groups):
        from .solver import MIN_SOLVE_S

        remaining = max(MIN_SOLVE_S, deadline - time.monotonic())
        solved = solve_component(cls, cev, cecc, cevc, cgroups, domain, t.vbytes, remaining, priced)
        if solved is None:
            certified = False
            if not greedy:
                greedy.append(plan_greedy(problem))
            for k in np.nonzero(comp[root] == cid)[0].tolist():
                key = classes.keys[k]
                fallback[k] = greedy[0].values.get(key[1]) if key[0] == "free" else greedy[0].slots.get(key)
            continue
        picks, bound, exact = solved
        label[cls] = picks
        certified &= exact
        lower += bound

    moved = 0
    if costs is None:  # equal transitions: permutes on their fast path (with prices, priced)
        frozen = {r for g in groups for r in g} | {int(root[k]) for k in fallback}
        picks = label.tolist()
        moved = polish_pairs(t, root, domain, picks, (ev, ecc, evc), frozen)
        label = np.asarray(picks, dtype=np.int64)
    key_bit = label[root]
    result = _assignment(problem, t, key_bit.tolist(), fallback)
    result.optimal = certified
    result.lower_bound = count_transitions(t, key_bit) if certified else lower
    if not certified:
        result.notes.append("time limit reached in a component: its greedy plan was kept")
    if moved:
        result.notes.append(f"{moved} permute(s), slice(s), pad(s) or select(s) moved to their fast path among "
                            "plans of equal transitions")
    return result


def solve_component(cls, ev, ecc, evc, groups, domain, vbytes, time_limit, priced=None):
    """One program over a component (LP first); None when no solution was found in time.

    cls: the component's class roots (sorted); ev/ecc/evc: its edges (value, consumer root,
    producer root); groups: its int8 sync groups (lists of class roots); priced: the Prices of a
    problem with a cost model (None: transitions alone). Returns (the bit picked per class of cls,
    lower bound on the count, certified); with prices the bound is the count when certified, else 0.
    """
    from .integer_program import build_program
    from .local_search import polish_preference, round_relaxation
    from .solver import BINARY_ONE, DUAL_BOUND_SLACK, lp_then_mip

    prog = build_program(cls, ev, ecc, evc, groups, domain, vbytes, priced)
    # Rounding ignores int8 groups, so it could break them: with groups only the MIP decides.
    rounded = None if groups else (lambda x: round_relaxation(x, prog, vbytes))
    solved = lp_then_mip(prog, time_limit, rounded)
    if solved is None:
        return None
    sol, exact, dual = solved
    count = round(float(sol[prog.n_x:prog.n_x + prog.n_z].sum()))
    if priced is None:
        bound = count if exact else max(0, math.floor(dual + DUAL_BOUND_SLACK))
    else:
        bound = count if exact else 0  # the dual bounds predicted time, not the count
    chosen = prog.has & (sol[np.maximum(prog.xcol, 0)] > BINARY_ONE)
    picks = np.argmax(chosen, axis=1).tolist()  # the first representation set per class
    if priced is None:  # with prices, ties are already broken by time (preference only as a last resort)
        pinned = {prog.local[r] for g in groups for r in g}
        polish_preference(picks, domain[cls].tolist(), pinned, prog, vbytes)
    return picks, bound, exact


def _assignment(problem: Problem, t: Tables, key_bit: list[int], fallback: dict) -> Assignment:
    """The Assignment of a bit per class index (or a greedy representation where one fell back)."""
    reps = [REPRS[b] for b in key_bit]
    for k, r in fallback.items():
        reps[k] = r
    result = Assignment(planner="optimal")
    slots = result.slots
    for key, r in zip(t.classes.keys, reps):
        if key[0] != "free":
            slots[key] = r
    for v, c in zip(problem.planned, t.value_class):
        result.values[v] = reps[c]
    return result
