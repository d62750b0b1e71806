"""The optimal planner: an exact integer program per connected component, solved with HiGHS.

Variables. Slots of a node that a float sync group ties together must hold the very same
representation (float packed-dim info is the storage and layout), so they are merged into one
*class*; int8 slots stay separate and a group variable picks their shared packed-dim info. A value
takes its producer's output class, or a free class of its own when it comes from the host.
x[c, r] = class c holds representation r; z[v, r] = value v is copied into r.

Before solving, chains where an optimal plan never needs a copy are contracted (exactly; see
_contract_chains), and a component whose classes share a representation is settled at once with
zero transitions. The rest is one program per component: minimise count + bytes / (all bytes + 1),
so the count comes first and bytes break its ties. The LP relaxation is tried first; when it is
integral it is the optimum, otherwise HiGHS branches and bounds within the time limit, and its dual
bound is the certified lower bound. The declared preference order then breaks the remaining ties
(a local pass that never changes count or bytes). A component the solver cannot finish in time
keeps its greedy plan, and the plan says it is not certified.
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

    greedy: list[Assignment] = []  # computed only if a component has to fall back to it

    def greedy_of(key):
        if not greedy:
            greedy.append(plan_greedy(problem))
        return greedy[0].values.get(key[1]) if key[0] == "free" else greedy[0].slots.get(key)

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
        if not groups:
            # Zero transitions are possible iff every class of the component can hold one common
            # representation: then the preferred one of those is optimal, certified by 0.
            common = classes.domain[cls[0]]
            for r in cls[1:]:
                common = common & classes.domain[r]
            if not common.is_empty():
                pick = common.pick()
                for key in keys_of[cid]:
                    label[key] = pick
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


def _lp_then_mip(c, cons, integrality, bounds, opts, rounded=None):
    """(x, certified optimal, dual bound on the objective) or None.

    The LP relaxation of these programs is often integral, and then it is the optimum. When it is
    not, rounding it often still reaches the LP's value, which certifies the rounded plan; only
    otherwise does HiGHS branch and bound, within the time limit.
    """
    lp_opts = {k: v for k, v in opts.items() if not k.startswith("mip_")}
    relaxed = milp(c, constraints=cons, integrality=np.zeros_like(integrality), bounds=bounds, options=lp_opts)
    if relaxed.x is not None and relaxed.status == 0 and np.all(np.abs(relaxed.x - np.round(relaxed.x)) < 1e-7):
        return np.round(relaxed.x), True, float(relaxed.fun)
    lp_bound = float(relaxed.fun) if relaxed.status == 0 else 0.0
    if rounded is not None and relaxed.x is not None and relaxed.status == 0:
        sol, value = rounded(relaxed.x)
        if sol is not None and value <= lp_bound + 1e-9 * max(1.0, abs(lp_bound)):
            return sol, True, lp_bound
    exact = milp(c, constraints=cons, integrality=integrality, bounds=bounds, options=opts)
    if exact.x is None:
        return None
    dual = getattr(exact, "mip_dual_bound", None)
    bound = max(lp_bound, dual) if dual is not None and np.isfinite(dual) else lp_bound
    return np.round(exact.x), exact.status == 0, bound


def _useful_domains(cls, classes, groups) -> dict:
    """Per class, the representations worth considering (exact).

    Call a class flexible when it accepts everything any class of the component accepts (F). Any
    optimal plan can be relabelled so flexible classes only use representations some constrained
    class accepts (U): mapping every other label to one in U merges transition targets and never
    adds one. So flexible classes are restricted to U, which usually halves the program.
    """
    domains = {r: classes.domain[r] for r in cls}
    if groups:
        return domains
    full = 0
    for d in domains.values():
        full |= d.mask
    useful = 0
    for d in domains.values():
        if d.mask != full:
            useful |= d.mask
    if not useful:
        return domains
    return {r: (TensorRepSet(mask=useful) if d.mask == full else d) for r, d in domains.items()}


def _solve_component(cls, cedges, groups, classes, value_class, time_limit):
    """One MILP over a component (LP first); None when no solution was found in time."""
    dom = _useful_domains(cls, classes, groups)
    xs: dict = {}
    for r in cls:
        for rep in dom[r]:
            xs[(r, rep)] = len(xs)
    zs: dict = {}
    z_rows = []  # (z index, consumer x index, producer x index or None)
    for v, cc in cedges:
        vc = classes.find(value_class[v])
        for rep in dom[cc]:
            key = (id(v), rep)
            if key not in zs:
                zs[key] = (len(xs) + len(zs), v)
            z_rows.append((zs[key][0], xs[(cc, rep)], xs.get((vc, rep))))
    n_x, n_z = len(xs), len(zs)
    ws: dict = {}
    for gi, keys in enumerate(groups):
        pdis = {(rep.storage, rep.pdi) for k in keys for rep in dom[classes.find(k)]}
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
        row([(xs[(r, rep)], 1.0) for rep in dom[r]], 1, 1)
    for zi, xc, xp in z_rows:  # z >= x_consumer - x_producer
        row([(zi, 1.0), (xc, -1.0)] + ([(xp, 1.0)] if xp is not None else []), 0, np.inf)
    for gi, keys in enumerate(groups):  # int8 sync: one packed-dim info per group
        row([(wi, 1.0) for (g, _), wi in ws.items() if g == gi], 1, 1)
        for k in keys:
            r = classes.find(k)
            for rep in dom[r]:
                row([(xs[(r, rep)], 1.0), (ws[(gi, (rep.storage, rep.pdi))], -1.0)], -np.inf, 0)

    integrality = np.ones(n)
    bounds = Bounds(np.zeros(n), np.ones(n))
    a = coo_matrix((vals, (rows, cols)), shape=(len(lo), n)).tocsr()
    cons = [LinearConstraint(a, np.array(lo, dtype=float), np.array(hi, dtype=float))]

    # Count first, bytes second: each byte term is scaled so that all of them together weigh
    # less than one transition.
    total = float(sum(v.nbytes for _, v in zs.values())) + 1.0
    obj = np.zeros(n)
    for zi, v in zs.values():
        obj[zi] = 1.0 + v.nbytes / total
    opts = {"time_limit": time_limit, "mip_rel_gap": 0.0, "disp": False}
    # For rounding a fractional LP: the values each class touches, and their exact cost.
    prod_of, cons_of, touching = {}, {}, {r: [] for r in cls}
    for v, cc in cedges:
        vc = classes.find(value_class[v])
        prod_of[v] = vc
        if v not in cons_of:
            cons_of[v] = set()
            touching[vc].append(v)
        cons_of[v].add(cc)
        touching[cc].append(v)

    def local(picks, values):
        cost = 0.0
        for v in values:
            extra = len({picks[c] for c in cons_of[v]} - {picks[prod_of[v]]})
            cost += extra * (1.0 + v.nbytes / total)
        return cost

    def rounded(x):
        """Largest x per class, then two passes of local moves on the fractional classes; the
        plan and its exact objective (None when int8 groups make it infeasible)."""
        if groups:
            return None, None
        picks = {r: max(dom[r], key=lambda rep: (x[xs[(r, rep)]], [-k for k in rep.preference_key()])) for r in cls}
        fractional = [r for r in cls if x[xs[(r, picks[r])]] < 1.0 - 1e-6]
        for _ in range(2):
            for r in fractional:
                best, best_cost = picks[r], local(picks, touching[r])
                for rep in dom[r]:
                    picks[r] = rep
                    c = local(picks, touching[r])
                    if c < best_cost - 1e-12:
                        best, best_cost = rep, c
                picks[r] = best
        sol = np.zeros(n)
        for r, rep in picks.items():
            sol[xs[(r, rep)]] = 1.0
        for zi, xc, xp in z_rows:
            sol[zi] = max(sol[zi], sol[xc] - (sol[xp] if xp is not None else 0.0))
        return sol, float(obj @ sol)

    solved = _lp_then_mip(obj, cons, integrality, bounds, opts, rounded)
    if solved is None:
        return None
    sol, exact, dual = solved
    count = round(sum(sol[zi] for zi, _ in zs.values()))
    bound = count if exact else max(0, math.floor(dual + 1e-9))
    picks = {}
    for r in cls:
        reps = [rep for rep in dom[r] if sol[xs[(r, rep)]] > 0.5]
        picks[r] = reps[0]
    pinned = {classes.find(k) for keys in groups for k in keys}
    _polish_preference(picks, cls, cedges, classes, value_class, pinned)
    return picks, bound, exact


def _polish_preference(picks, cls, cedges, classes, value_class, pinned) -> None:
    """Move classes to more preferred representations wherever that changes neither the number
    of transitions nor their bytes (the declared preference order breaks the solver's ties)."""
    prod, cons = {}, {}
    touching: dict = {r: set() for r in cls}
    if all(picks[r] == classes.domain[r].pick() for r in cls):
        return
    for v, cc in cedges:
        vc = classes.find(value_class[v])
        prod[v] = vc
        cons.setdefault(v, set()).add(cc)
        touching[vc].add(v)
        touching[cc].add(v)

    def cost(values):
        count = nbytes = 0
        for v in values:
            have = picks[prod[v]]
            extra = {picks[c] for c in cons[v]} - {have}
            count += len(extra)
            nbytes += len(extra) * v.nbytes
        return count, nbytes

    for r in sorted(cls, key=lambda c: -len(touching[c])):
        current = picks[r]
        if r in pinned or current == classes.domain[r].pick():
            continue
        base = cost(touching[r])
        for rep in classes.domain[r]:  # in preference order
            if rep == current or rep.preference_key() >= current.preference_key():
                break
            picks[r] = rep
            if cost(touching[r]) <= base:
                current = rep
                break
            picks[r] = current
