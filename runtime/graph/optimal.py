"""The optimal planner: an exact integer program per connected component, solved with HiGHS.

Variables. Slots of a node that a float sync group ties together must hold the very same
representation (float packed-dim info is the storage and layout), so they are merged into one
*class*; int8 slots stay separate and a group variable picks their shared packed-dim info. A value
takes its producer's output class, or a free class of its own when it comes from the host.
x[c, r] = class c holds representation r; z[v, r] = value v is copied into r.

Objective, lexicographic: the number of transitions, then the bytes they copy, then the declared
preference order. Stage one minimises the count and yields a certified lower bound (the MIP dual
bound); stage two fixes the count and minimises bytes with the preference as a tie-break worth
less than one byte. A component whose greedy plan needs no transition is already optimal and is
not solved. When the solver runs out of time the greedy plan of that component is kept, and the
plan says it is not certified.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from texelflow.generated.layouts import DTYPES

from .greedy import plan_greedy
from .ir import Node, Value
from .problem import Assignment, Problem
from .repr import TensorRepr, TensorRepSet


@dataclass
class _Classes:
    """Union-find over slot keys and free values, with each class's domain."""

    parent: dict = field(default_factory=dict)
    domain: dict = field(default_factory=dict)

    def add(self, key, domain: TensorRepSet) -> None:
        self.parent[key] = key
        self.domain[key] = domain

    def find(self, key):
        root = key
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[key] != root:
            self.parent[key], key = root, self.parent[key]
        return root

    def union(self, a, b) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra
            self.domain[ra] = self.domain[ra] & self.domain[rb]


def _build_classes(problem: Problem):
    classes = _Classes()
    int8_groups: list[list] = []
    for node, sets in problem.repsets.items():
        for slot, allowed in sets.sets.items():
            classes.add((node, slot), allowed)
        dtype = node.outputs[0][1].dtype
        family = DTYPES[dtype].family if dtype in DTYPES else "float"
        for group in sets.sync:
            keys = [(node, s) for s in group]
            if family == "float":
                for k in keys[1:]:
                    classes.union(keys[0], k)
            else:
                int8_groups.append(keys)
    value_class = {}
    for v in problem.planned:
        if v.producer is not None and v.producer in problem.repsets:
            name = next(n for n, x in v.producer.outputs if x is v)
            value_class[v] = (v.producer, name)
        else:
            classes.add(("free", v), problem.free_domain(v))
            value_class[v] = ("free", v)
    return classes, value_class, int8_groups


def plan_optimal(problem: Problem, time_limit: float = 10.0) -> Assignment:
    greedy = plan_greedy(problem)
    classes, value_class, int8_groups = _build_classes(problem)

    # Edges: a consumer slot reading a value from another class may need a transition.
    contracted = _contract_chains(problem, classes, value_class, int8_groups)
    edges: list[tuple[Value, object]] = []  # (value, consumer class root)
    seen = set()
    for node in problem.repsets:
        for slot, v in node.tensor_args():
            if v.kind == "const":
                continue
            cc, vc = classes.find((node, slot)), classes.find(value_class[v])
            if cc != vc and (id(v), cc) not in seen:
                seen.add((id(v), cc))
                edges.append((v, cc))

    # Connected components over class roots.
    comp = _Classes()
    roots = {classes.find(k) for k in classes.parent}
    for r in roots:
        comp.add(r, TensorRepSet.empty())
    for v, cc in edges:
        comp.union(classes.find(value_class[v]), cc)
    for keys in int8_groups:
        for k in keys[1:]:
            comp.union(classes.find(keys[0]), classes.find(k))
    members: dict = {}
    for r in roots:
        members.setdefault(comp.find(r), []).append(r)
    comp_edges: dict = {}
    for v, cc in edges:
        comp_edges.setdefault(comp.find(cc), []).append((v, cc))
    comp_groups: dict = {}
    for keys in int8_groups:
        comp_groups.setdefault(comp.find(classes.find(keys[0])), []).append(keys)

    def greedy_of(key):
        return greedy.values.get(key[1]) if key[0] == "free" else greedy.slots.get(key)

    # Greedy's transitions per component: a component where greedy needs none is already optimal.
    greedy_needs: dict = {}
    for (v, _), _users in greedy.transitions(problem).items():
        cid = comp.find(classes.find(value_class[v]))
        greedy_needs[cid] = greedy_needs.get(cid, 0) + 1

    keys_of: dict = {}
    for key in classes.parent:
        keys_of.setdefault(comp.find(classes.find(key)), []).append(key)

    label: dict = {}  # original key -> representation
    certified = True
    lower = 0
    deadline = time.monotonic() + time_limit
    for cid, cls in members.items():
        cedges = comp_edges.get(cid, [])
        groups = comp_groups.get(cid, [])
        if not cedges and not groups:
            for key in keys_of[cid]:  # one class, nothing to reconcile: the preferred representation
                label[key] = classes.domain[classes.find(key)].pick()
            continue
        if greedy_needs.get(cid, 0) == 0:
            for key in keys_of[cid]:
                label[key] = greedy_of(key)
            continue
        remaining = max(0.1, deadline - time.monotonic())
        solved = _solve_component(cls, cedges, groups, classes, value_class, remaining)
        if solved is None:
            certified = False
            for key in keys_of[cid]:
                label[key] = greedy_of(key)
            continue
        picks, bound, exact = solved
        for key in keys_of[cid]:
            label[key] = picks[classes.find(key)]
        certified &= exact
        lower += bound

    result = Assignment(planner="optimal")
    for key, r in label.items():
        if key[0] == "free":
            result.values[key[1]] = r
        else:
            result.slots[key] = r
    for v, key in value_class.items():
        if key[0] != "free":
            result.values[v] = result.slots[key]
    count, _ = result.cost(problem)
    result.optimal = certified
    result.lower_bound = count if certified else lower
    if not certified:
        result.notes.append("time limit reached in a component: its greedy plan was kept")
    return result


def _contract_chains(problem: Problem, classes: _Classes, value_class: dict, int8_groups) -> int:
    """Merge classes along chains where an optimal plan never needs a transition (exact).

    Forward: a class B whose only input value v is read by B alone, and whose outputs reach at
    most one value w that anyone reads, can take v's producer's representation: the copy it could
    save on v is worth at least what it could cost on w (by count; by bytes when bytes(w) <= bytes(v)),
    provided B accepts everything the producer may hold. Backward is the mirror image: B with at
    most one input value and one read output w, read by class C alone, can take C's representation.
    Elementwise chains, views and single-consumer inputs collapse; returns the number of merges.
    Backward merges are tried first, so a chain takes its constrained consumer's representation
    and the copy sits at the constrained producer, as in the reference. Among plans equal in count
    and bytes, where a transition sits along such a chain is decided here, not by the preference
    order.
    """
    pinned = {classes.find(k) for keys in int8_groups for k in keys}
    prod: dict[Value, object] = {}
    cons: dict[Value, set] = {}
    ins: dict[object, set] = {}
    outs: dict[object, set] = {}
    for node in problem.repsets:
        for slot, v in node.tensor_args():
            if v.kind == "const":
                continue
            p, c = classes.find(value_class[v]), classes.find((node, slot))
            prod[v] = p
            if c != p:
                cons.setdefault(v, set()).add(c)
                ins.setdefault(c, set()).add(v)
                outs.setdefault(p, set()).add(v)

    def subset(a, b) -> bool:
        return classes.domain[a].mask & ~classes.domain[b].mask == 0

    def merge(keep, gone) -> None:
        classes.parent[gone] = keep
        classes.domain[keep] = classes.domain[keep] & classes.domain[gone]
        for v in outs.pop(gone, set()):
            prod[v] = keep
            cons[v].discard(keep)
            ins.get(keep, set()).discard(v)
            if cons[v]:
                outs.setdefault(keep, set()).add(v)
        for v in ins.pop(gone, set()):
            cons[v].discard(gone)
            if prod[v] != keep:
                cons[v].add(keep)
                ins.setdefault(keep, set()).add(v)
            if not cons[v]:
                outs.get(prod[v], set()).discard(v)
        if keep in outs:
            outs[keep] = {v for v in outs[keep] if cons.get(v)}

    merges = 0
    work = list(set(ins) | set(outs))
    while work:
        b = work.pop()
        if classes.parent.get(b) != b or b in pinned:
            continue
        b_in, b_out = ins.get(b, set()), outs.get(b, set())
        if len(b_in) <= 1 and len(b_out) == 1:
            (w,) = b_out
            if len(cons[w]) == 1:
                (c,) = cons[w]
                if c not in pinned and subset(c, b) and all(v.nbytes <= w.nbytes for v in b_in):
                    merge(c, b)
                    merges += 1
                    work.append(c)
                    work.extend(prod[x] for x in ins.get(c, ()))
                    work.extend(k for x in outs.get(c, ()) for k in cons[x])
                    continue
        if len(b_in) == 1 and len(b_out) <= 1:
            (v,) = b_in
            a = prod[v]
            if cons[v] == {b} and a not in pinned and subset(a, b) and all(w.nbytes <= v.nbytes for w in b_out):
                merge(a, b)
                merges += 1
                work.append(a)
                work.extend(prod[x] for x in ins.get(a, ()))
                work.extend(c for x in outs.get(a, ()) for c in cons[x])
    return merges


def _lp_then_mip(c, cons, integrality, bounds, opts):
    """(x, certified optimal, lower bound) or None. The LP relaxation of these programs is
    usually integral, and then it is the optimum; otherwise branch and bound within the time limit."""
    relaxed = milp(c, constraints=cons, integrality=np.zeros_like(integrality), bounds=bounds, options=opts)
    if relaxed.x is not None and relaxed.status == 0 and np.all(np.abs(relaxed.x - np.round(relaxed.x)) < 1e-7):
        return np.round(relaxed.x), True, math.ceil(relaxed.fun - 1e-6)
    lp_bound = math.ceil(relaxed.fun - 1e-6) if relaxed.status == 0 else 0
    exact = milp(c, constraints=cons, integrality=integrality, bounds=bounds, options=opts)
    if exact.x is None:
        return None
    dual = getattr(exact, "mip_dual_bound", None)
    bound = max(lp_bound, math.ceil(dual - 1e-6)) if dual is not None and np.isfinite(dual) else lp_bound
    return np.round(exact.x), exact.status == 0, bound


def _solve_component(cls, cedges, groups, classes, value_class, time_limit):
    """Two-stage MILP over one component; None when no solution was found in time."""
    xs: dict = {}
    for r in cls:
        for rep in classes.domain[r]:
            xs[(r, rep)] = len(xs)
    zs: dict = {}
    z_rows = []  # (z index, consumer x index, producer x index or None)
    for v, cc in cedges:
        vc = classes.find(value_class[v])
        for rep in classes.domain[cc]:
            key = (id(v), rep)
            if key not in zs:
                zs[key] = (len(xs) + len(zs), v)
            z_rows.append((zs[key][0], xs[(cc, rep)], xs.get((vc, rep))))
    n_x, n_z = len(xs), len(zs)
    ws: dict = {}
    for gi, keys in enumerate(groups):
        pdis = {(rep.storage, rep.pdi) for k in keys for rep in classes.domain[classes.find(k)]}
        for p in sorted(pdis, key=str):
            ws[(gi, p)] = n_x + n_z + len(ws)
    n = n_x + n_z + len(ws)

    rows, cols, vals, lo, hi = [], [], [], [], []

    def row(entries, lower, upper):
        i = len(lo)
        for c, a in entries:
            rows.append(i)
            cols.append(c)
            vals.append(a)
        lo.append(lower)
        hi.append(upper)

    for r in cls:  # each class holds exactly one representation
        row([(xs[(r, rep)], 1.0) for rep in classes.domain[r]], 1, 1)
    for zi, xc, xp in z_rows:  # z >= x_consumer - x_producer
        row([(zi, 1.0), (xc, -1.0)] + ([(xp, 1.0)] if xp is not None else []), 0, np.inf)
    for gi, keys in enumerate(groups):  # int8 sync: one packed-dim info per group
        row([(wi, 1.0) for (g, _), wi in ws.items() if g == gi], 1, 1)
        for k in keys:
            r = classes.find(k)
            for rep in classes.domain[r]:
                row([(xs[(r, rep)], 1.0), (ws[(gi, (rep.storage, rep.pdi))], -1.0)], -np.inf, 0)

    integrality = np.ones(n)
    bounds = Bounds(np.zeros(n), np.ones(n))
    a = coo_matrix((vals, (rows, cols)), shape=(len(lo), n)).tocsr()
    cons = [LinearConstraint(a, np.array(lo, dtype=float), np.array(hi, dtype=float))]

    count_obj = np.zeros(n)
    for zi, _ in zs.values():
        count_obj[zi] = 1.0
    start = time.monotonic()
    opts = {"time_limit": time_limit, "mip_rel_gap": 0.0, "disp": False}
    first = _lp_then_mip(count_obj, cons, integrality, bounds, opts)
    if first is None:
        return None
    x1, exact, bound = first
    best = round(float(count_obj @ x1))
    bound = best if exact else bound

    # Stage two: keep the count, minimise bytes, then preference (worth < 1 byte in total).
    byte_obj = np.zeros(n)
    for zi, v in zs.values():
        byte_obj[zi] = float(v.nbytes)
    pref_scale = 1.0 / (len(cls) * 16 + 1)
    for (r, rep), xi in xs.items():
        s, l = rep.preference_key()
        byte_obj[xi] = pref_scale * (s * 8 + l) / 16
    cap = LinearConstraint(count_obj.reshape(1, -1), -np.inf, best + 0.5)
    left = max(0.1, time_limit - (time.monotonic() - start))
    second = _lp_then_mip(byte_obj, cons + [cap], integrality, bounds, {**opts, "time_limit": left})
    sol = second[0] if second is not None else x1
    picks = {}
    for r in cls:
        reps = [rep for rep in classes.domain[r] if sol[xs[(r, rep)]] > 0.5]
        picks[r] = reps[0]
    return picks, bound, exact
