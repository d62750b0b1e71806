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

Speed. Graphs reach tens of thousands of nodes, so everything after reading the problem works on
integers: a class is an index, a value is its index in `problem.planned`, a representation is its
bit index in REPRS (the bit order of TensorRepSet masks, which is the preference order). Class
roots are computed once after contraction, and edges, components and the constraint matrix are
built with numpy rather than row by row.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from texelflow.generated.layouts import DTYPES

from .greedy import plan_greedy
from .problem import Assignment, Problem, gc_paused
from .repr import REPRS, TensorRepSet

NB = len(REPRS)  # representations, i.e. bits of a repset mask
assert NB < 63, "repset masks are kept in int64 arrays"
_BIT_INDEX = {r: i for i, r in enumerate(REPRS)}


def _bit_list(mask: int) -> list[int]:
    """Bit indices of a mask, lowest (most preferred) first."""
    return [i for i in range(mask.bit_length()) if mask >> i & 1]


def _lowest_bits(masks: np.ndarray) -> np.ndarray:
    """Index of the lowest set bit of each (non-zero) mask: the preferred representation."""
    low = masks & -masks
    return np.log2(low.astype(np.float64)).astype(np.int64)  # exact for powers of two


@dataclass
class _Classes:
    """Union-find over class indices (slot keys first, then free values), with each domain mask."""

    keys: list = field(default_factory=list)  # index -> (node, slot) or ("free", value)
    parent: list[int] = field(default_factory=list)
    domain: list[int] = field(default_factory=list)  # TensorRepSet masks

    def add(self, key, mask: int) -> int:
        i = len(self.keys)
        self.keys.append(key)
        self.parent.append(i)
        self.domain.append(mask)
        return i

    def find(self, i: int) -> int:
        parent = self.parent
        root = i
        while parent[root] != root:
            root = parent[root]
        while parent[i] != root:
            parent[i], i = root, parent[i]
        return root

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra
            self.domain[ra] &= self.domain[rb]

    def roots(self) -> np.ndarray:
        """The root of every class, by pointer jumping (one pass instead of a find per lookup)."""
        p = np.array(self.parent, dtype=np.int64)
        while True:
            q = p[p]
            if np.array_equal(q, p):
                return p
            p = q


@dataclass
class _Tables:
    """The problem in integer form. Uses are the (consumer slot, value) pairs of every device
    node's non-constant tensor arguments, in node order; values are indexed as problem.planned."""

    classes: _Classes
    value_class: list[int]  # per value: its producer's output class, or its own free class
    vbytes: list[int]
    int8_groups: list[list[int]]  # int8 sync groups: class indices sharing packed-dim info
    use_slot: list[int]
    use_value: list[int]


def _build_tables(problem: Problem) -> _Tables:
    classes = _Classes()
    value_index = {v: i for i, v in enumerate(problem.planned)}
    index: dict = {}  # (node, slot) -> class index
    int8_groups: list[list[int]] = []
    use_slot, use_value = [], []
    for node, sets in problem.repsets.items():
        for slot, allowed in sets.sets.items():
            index[(node, slot)] = classes.add((node, slot), allowed.mask)
        if sets.sync:
            _sync_classes(node, sets.sync, index, classes, int8_groups)
        for slot, v in node.tensor_args():
            if v.kind != "const":
                use_slot.append(index[(node, slot)])
                use_value.append(value_index[v])
    value_class = []
    for v in problem.planned:
        if v.producer is not None and v.producer in problem.repsets:
            name = next(n for n, x in v.producer.outputs if x is v)
            value_class.append(index[(v.producer, name)])
        else:
            value_class.append(classes.add(("free", v), problem.free_domain(v).mask))
    return _Tables(classes, value_class, _value_bytes(problem.planned), int8_groups, use_slot, use_value)


def _sync_classes(node, sync, index, classes: _Classes, int8_groups: list) -> None:
    """Float sync groups merge their slots into one class; int8 ones are kept as groups."""
    dtype = node.outputs[0][1].dtype
    family = DTYPES[dtype].family if dtype in DTYPES else "float"
    for group in sync:
        keys = [index[(node, s)] for s in group]
        if family == "float":
            for k in keys[1:]:
                classes.union(keys[0], k)
        else:
            int8_groups.append(keys)


def _value_bytes(values) -> list[int]:
    """v.nbytes per value, computed once per (shape, dtype): graphs repeat a few of those."""
    known: dict = {}
    out = []
    for v in values:
        key = (v.shape, v.dtype)
        nbytes = known.get(key)
        if nbytes is None:
            nbytes = known[key] = v.nbytes
        out.append(nbytes)
    return out


def _edges(t: _Tables, root: np.ndarray):
    """(value, consumer class, producer class) per consumer class reading a value from another
    class, each pair once, in order of first use: where a transition may be needed."""
    us = np.asarray(t.use_slot, dtype=np.int64)
    uv = np.asarray(t.use_value, dtype=np.int64)
    cc = root[us]
    vc = root[np.asarray(t.value_class, dtype=np.int64)[uv]]
    crossing = np.nonzero(cc != vc)[0]
    _, first = np.unique(uv[crossing] * len(root) + cc[crossing], return_index=True)
    sel = crossing[np.sort(first)]
    return uv[sel], cc[sel], vc[sel]


def plan_optimal(problem: Problem, time_limit: float = 10.0) -> Assignment:
    with gc_paused():
        return _plan(problem, time_limit)


def _plan(problem: Problem, time_limit: float) -> Assignment:
    t = _build_tables(problem)
    classes = t.classes
    _contract_chains(t, classes.roots().tolist())
    root = classes.roots()  # final: every later lookup reads this instead of calling find
    domain = np.asarray(classes.domain, dtype=np.int64)
    ev, ecc, evc = _edges(t, root)
    groups = [[int(root[k]) for k in keys] for keys in t.int8_groups]
    comp = _components(len(root), ecc, evc, groups)
    roots = np.nonzero(root == np.arange(len(root)))[0]
    label, todo = _settle(comp, roots, domain, ecc, groups)

    fallback: dict[int, object] = {}  # class index -> greedy representation, where a solve failed
    greedy: list[Assignment] = []  # computed only if a component has to fall back to it
    certified = True
    lower = 0
    deadline = time.monotonic() + time_limit
    for cid, cls, (cev, cecc, cevc), cgroups in _unsettled(comp, todo, ev, ecc, evc, groups):
        remaining = max(0.1, deadline - time.monotonic())
        solved = _solve_component(cls, cev, cecc, cevc, cgroups, domain, t.vbytes, remaining)
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

    key_bit = label[root]
    result = _assignment(problem, t, key_bit.tolist(), fallback)
    result.optimal = certified
    result.lower_bound = _count(t, key_bit) if certified else lower
    if not certified:
        result.notes.append("time limit reached in a component: its greedy plan was kept")
    return result


def _components(n: int, ecc, evc, groups) -> np.ndarray:
    """Connected component of every class, classes being linked by edges and int8 groups."""
    a = np.concatenate([evc] + [np.full(len(g) - 1, g[0]) for g in groups]).astype(np.int64)
    b = np.concatenate([ecc] + [np.asarray(g[1:]) for g in groups]).astype(np.int64)
    graph = coo_matrix((np.ones(len(a), dtype=np.int8), (a, b)), shape=(n, n))
    return connected_components(graph, directed=False)[1]


def _settle(comp, roots, domain, ecc, groups):
    """Label the components that need no solver; (bit per class root, the roots left to solve).

    Zero transitions are possible iff every class of a component can hold one common
    representation: then the preferred one of those is optimal, certified by 0. A component of
    one class with nothing to reconcile is the special case where that is its own domain.
    """
    n_comp = int(comp.max()) + 1 if len(comp) else 0
    has_edge = np.zeros(n_comp, dtype=bool)
    has_edge[comp[ecc]] = True
    has_group = np.zeros(n_comp, dtype=bool)
    for g in groups:
        has_group[comp[g[0]]] = True
    common = np.full(n_comp, (1 << NB) - 1, dtype=np.int64)
    np.bitwise_and.at(common, comp[roots], domain[roots])
    if np.any((common == 0) & ~has_edge & ~has_group):
        TensorRepSet.empty().pick()  # a class with nothing allowed: the same error as picking it
    done = (~has_group & (common != 0))[comp[roots]]
    label = np.zeros(len(comp), dtype=np.int64)
    label[roots[done]] = _lowest_bits(common[comp[roots[done]]])
    return label, roots[~done]


def _unsettled(comp, roots, ev, ecc, evc, groups):
    """(component, its class roots, its edges, its int8 groups) for each component to solve."""
    if len(roots) == 0:
        return
    order = np.argsort(comp[roots], kind="stable")
    roots = roots[order]
    starts = np.flatnonzero(np.r_[True, np.diff(comp[roots]) != 0])
    edge_comp = comp[ecc]
    edge_order = np.argsort(edge_comp, kind="stable")
    sorted_comp = edge_comp[edge_order]
    by_comp: dict = {}
    for g in groups:
        by_comp.setdefault(int(comp[g[0]]), []).append(g)
    for s, e in zip(starts, np.r_[starts[1:], len(roots)]):
        cid = int(comp[roots[s]])
        lo, hi = np.searchsorted(sorted_comp, [cid, cid + 1])
        sel = edge_order[lo:hi]
        yield cid, roots[s:e], (ev[sel], ecc[sel], evc[sel]), by_comp.get(cid, [])


def _assignment(problem: Problem, t: _Tables, key_bit: list[int], fallback: dict) -> Assignment:
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


def _count(t: _Tables, key_bit: np.ndarray) -> int:
    """Transitions of a plan: distinct (value, representation) a consumer slot wants and the
    value does not hold (Assignment.transitions, counted on arrays)."""
    uv = np.asarray(t.use_value, dtype=np.int64)
    want = key_bit[np.asarray(t.use_slot, dtype=np.int64)]
    have = key_bit[np.asarray(t.value_class, dtype=np.int64)[uv]]
    diff = want != have
    return len(np.unique(uv[diff] * NB + want[diff]))


def _contract_chains(t: _Tables, root: list[int]) -> int:
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
    order. `root` is every class's root before contraction; classes and values are indices.
    """
    parent, domain, vbytes = t.classes.parent, t.classes.domain, t.vbytes
    pinned = {root[k] for keys in t.int8_groups for k in keys}
    prod: dict[int, int] = {}
    cons: dict[int, set] = {}
    ins: dict[int, set] = {}
    outs: dict[int, set] = {}
    value_class = t.value_class
    for s, v in zip(t.use_slot, t.use_value):
        p, c = root[value_class[v]], root[s]
        prod[v] = p
        if c != p:
            cons.setdefault(v, set()).add(c)
            ins.setdefault(c, set()).add(v)
            outs.setdefault(p, set()).add(v)

    def subset(a, b) -> bool:
        return domain[a] & ~domain[b] == 0

    def merge(keep, gone) -> None:
        parent[gone] = keep
        domain[keep] &= domain[gone]
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

    empty: set = set()
    merges = 0
    work = sorted(set(ins) | set(outs))
    while work:
        b = work.pop()
        if parent[b] != b or b in pinned:
            continue
        b_in, b_out = ins.get(b, empty), outs.get(b, empty)
        if len(b_in) <= 1 and len(b_out) == 1:
            (w,) = b_out
            if len(cons[w]) == 1:
                (c,) = cons[w]
                if c not in pinned and subset(c, b) and all(vbytes[v] <= vbytes[w] for v in b_in):
                    merge(c, b)
                    merges += 1
                    work.append(c)
                    work.extend(prod[x] for x in ins.get(c, ()))
                    work.extend(k for x in outs.get(c, ()) for k in cons[x])
                    continue
        if len(b_in) == 1 and len(b_out) <= 1:
            (v,) = b_in
            a = prod[v]
            if cons[v] == {b} and a not in pinned and subset(a, b) and all(vbytes[w] <= vbytes[v] for w in b_out):
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
    start = time.monotonic()
    lp_opts = {k: v for k, v in opts.items() if not k.startswith("mip_")}
    relaxed = milp(c, constraints=cons, integrality=np.zeros_like(integrality), bounds=bounds, options=lp_opts)
    if relaxed.x is not None and relaxed.status == 0 and np.all(np.abs(relaxed.x - np.round(relaxed.x)) < 1e-7):
        return np.round(relaxed.x), True, float(relaxed.fun)
    lp_bound = float(relaxed.fun) if relaxed.status == 0 else 0.0
    if rounded is not None and relaxed.x is not None and relaxed.status == 0:
        sol, value = rounded(relaxed.x)
        if sol is not None and value <= lp_bound + 1e-9 * max(1.0, abs(lp_bound)):
            return sol, True, lp_bound
    left = max(0.1, opts.get("time_limit", 10.0) - (time.monotonic() - start))  # one budget for both
    exact = milp(c, constraints=cons, integrality=integrality, bounds=bounds, options={**opts, "time_limit": left})
    if exact.x is None:
        return None
    dual = getattr(exact, "mip_dual_bound", None)
    bound = max(lp_bound, dual) if dual is not None and np.isfinite(dual) else lp_bound
    return np.round(exact.x), exact.status == 0, bound


def _useful_domains(masks: np.ndarray, has_groups: bool) -> np.ndarray:
    """Per class, the representations worth considering (exact).

    Call a class flexible when it accepts everything any class of the component accepts (F). Any
    optimal plan can be relabelled so flexible classes only use representations some constrained
    class accepts (U): mapping every other label to one in U merges transition targets and never
    adds one. So flexible classes are restricted to U, which usually halves the program.
    """
    if has_groups:
        return masks
    full = np.bitwise_or.reduce(masks)
    useful = np.bitwise_or.reduce(masks[masks != full]) if np.any(masks != full) else 0
    if not useful:
        return masks
    return np.where(masks == full, useful, masks)


@dataclass
class _Edges:
    """A component's edges in local class indices, with who touches which value (for the local
    searches of rounding and polishing)."""

    prod: dict  # value -> producer class
    cons: dict  # value -> set of consumer classes
    touching: list  # class -> values it produces or consumes, each once

    @classmethod
    def of(cls, n_cls, ev, lcc, lvc) -> "_Edges":
        prod, cons, touching = {}, {}, [[] for _ in range(n_cls)]
        for v, cc, vc in zip(ev.tolist(), lcc.tolist(), lvc.tolist()):
            prod[v] = vc
            if v not in cons:
                cons[v] = set()
                touching[vc].append(v)
            cons[v].add(cc)
            if v not in touching[cc]:
                touching[cc].append(v)
        return cls(prod, cons, touching)


def _solve_component(cls, ev, ecc, evc, groups, domain, vbytes, time_limit):
    """One MILP over a component (LP first); None when no solution was found in time.

    cls: the component's class roots (sorted); ev/ecc/evc: its edges (value, consumer root,
    producer root); groups: its int8 sync groups (lists of class roots). Returns (the bit picked
    per class of cls, lower bound on the count, certified).
    """
    n_cls = len(cls)
    lcc, lvc = np.searchsorted(cls, ecc), np.searchsorted(cls, evc)
    dom = _useful_domains(domain[cls], bool(groups))
    has = (dom[:, None] >> np.arange(NB)) & 1 == 1  # class x representation: a variable x
    n_x = int(has.sum())
    xcol = np.full(has.shape, -1, dtype=np.int64)
    xcol[has] = np.arange(n_x)  # class by class, representations in preference order

    # z[v, r] per (value, representation) some consumer class may want, numbered by first use.
    e_idx, e_bit = np.nonzero(has[lcc])
    zkey = ev[e_idx] * NB + e_bit
    uniq, first, inv = np.unique(zkey, return_index=True, return_inverse=True)
    rank = np.empty(len(uniq), dtype=np.int64)
    rank[np.argsort(first)] = np.arange(len(uniq))
    n_z = len(uniq)
    z_row = n_x + rank[inv.ravel()]  # per (edge, representation): its z column
    z_value = np.empty(n_z, dtype=np.int64)
    z_value[rank] = uniq // NB
    xc = xcol[lcc[e_idx], e_bit]
    xp = xcol[lvc[e_idx], e_bit]  # -1 where the producer cannot hold it

    local = {int(r): i for i, r in enumerate(cls)} if groups else {}
    w_rows, n_w = _group_rows(groups, local, dom, xcol, n_x + n_z)
    n = n_x + n_z + n_w

    # Rows: each class holds exactly one representation; z >= x_consumer - x_producer.
    n_zr = len(e_idx)
    x_class = np.nonzero(has)[0]
    zr = np.arange(n_zr) + n_cls
    hasp = xp >= 0
    rows = [x_class, zr, zr, zr[hasp]]
    cols = [np.arange(n_x), z_row, xc, xp[hasp]]
    vals = [np.ones(n_x), np.ones(n_zr), -np.ones(n_zr), np.ones(int(hasp.sum()))]
    lo = [np.ones(n_cls), np.zeros(n_zr)]
    hi = [np.ones(n_cls), np.full(n_zr, np.inf)]
    if w_rows:
        base = n_cls + n_zr
        rows.append(np.array([base + i for i, (entries, _, _) in enumerate(w_rows) for _ in entries], dtype=np.int64))
        cols.append(np.array([c for entries, _, _ in w_rows for c, _ in entries], dtype=np.int64))
        vals.append(np.array([a for entries, _, _ in w_rows for _, a in entries], dtype=float))
        lo.append(np.array([l for _, l, _ in w_rows], dtype=float))
        hi.append(np.array([h for _, _, h in w_rows], dtype=float))
    n_rows = n_cls + n_zr + len(w_rows)
    a = coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(n_rows, n)).tocsr()
    cons = [LinearConstraint(a, np.concatenate(lo), np.concatenate(hi))]
    integrality = np.ones(n)
    bounds = Bounds(np.zeros(n), np.ones(n))

    # Count first, bytes second: each byte term is scaled so that all of them together weigh
    # less than one transition.
    zbytes = np.asarray(vbytes, dtype=np.int64)[z_value]
    total = float(int(zbytes.sum())) + 1.0
    obj = np.zeros(n)
    obj[n_x:n_x + n_z] = 1.0 + zbytes / total
    opts = {"time_limit": time_limit, "mip_rel_gap": 0.0, "disp": False}
    edges = []  # built on first need

    def edges_of() -> _Edges:
        if not edges:
            edges.append(_Edges.of(n_cls, ev, lcc, lvc))
        return edges[0]

    def rounded(x):
        """Largest x per class, then two passes of local moves on the fractional classes; the
        plan and its exact objective (None when int8 groups make it infeasible)."""
        if groups:
            return None, None
        e = edges_of()

        def local_cost(picks, values):
            cost = 0.0
            for v in values:
                extra = len({picks[c] for c in e.cons[v]} - {picks[e.prod[v]]})
                cost += extra * (1.0 + vbytes[v] / total)
            return cost

        bits = [_bit_list(int(m)) for m in dom]
        picks = [max(bits[r], key=lambda b: (x[xcol[r, b]], -b)) for r in range(n_cls)]
        fractional = [r for r in range(n_cls) if x[xcol[r, picks[r]]] < 1.0 - 1e-6]
        for _ in range(2):
            for r in fractional:
                best, best_cost = picks[r], local_cost(picks, e.touching[r])
                for b in bits[r]:
                    picks[r] = b
                    c = local_cost(picks, e.touching[r])
                    if c < best_cost - 1e-12:
                        best, best_cost = b, c
                picks[r] = best
        sol = np.zeros(n)
        sol[xcol[np.arange(n_cls), picks]] = 1.0
        np.maximum.at(sol, z_row, sol[xc] - np.where(hasp, sol[xp], 0.0))
        return sol, float(obj @ sol)

    solved = _lp_then_mip(obj, cons, integrality, bounds, opts, rounded)
    if solved is None:
        return None
    sol, exact, dual = solved
    count = round(float(sol[n_x:n_x + n_z].sum()))
    bound = count if exact else max(0, math.floor(dual + 1e-9))
    chosen = has & (sol[np.maximum(xcol, 0)] > 0.5)
    picks = np.argmax(chosen, axis=1).tolist()  # the first representation set per class
    pinned = {local[r] for g in groups for r in g}
    _polish_preference(picks, domain[cls].tolist(), pinned, edges_of, vbytes)
    return picks, bound, exact


def _group_rows(groups, local, dom, xcol, first_w):
    """Rows tying each int8 sync group to one packed-dim info, through a variable w per (group,
    packed-dim info): ([(column, coefficient)], lower, upper) per row, and the number of ws."""
    ws: dict = {}
    rows = []
    for gi, keys in enumerate(groups):
        pdis = {(rep.storage, rep.pdi) for k in keys for rep in TensorRepSet(mask=int(dom[local[k]]))}
        for p in sorted(pdis, key=str):
            ws[(gi, p)] = first_w + len(ws)
    for gi, keys in enumerate(groups):  # int8 sync: one packed-dim info per group
        rows.append(([(wi, 1.0) for (g, _), wi in ws.items() if g == gi], 1, 1))
        for k in keys:
            r = local[k]
            for b in _bit_list(int(dom[r])):
                rep = REPRS[b]
                rows.append(([(int(xcol[r, b]), 1.0), (ws[(gi, (rep.storage, rep.pdi))], -1.0)], -np.inf, 0))
    return rows, len(ws)


def _polish_preference(picks, domains, pinned, edges_of, vbytes) -> None:
    """Move classes to more preferred representations wherever that changes neither the number
    of transitions nor their bytes (the declared preference order breaks the solver's ties).
    picks and domains are per local class: a bit index and a mask."""
    preferred = [(m & -m).bit_length() - 1 for m in domains]
    if picks == preferred:
        return
    e = edges_of()
    prod, cons, touching = e.prod, e.cons, e.touching

    def cost(values):
        count = nbytes = 0
        for v in values:
            extra = {picks[c] for c in cons[v]}
            extra.discard(picks[prod[v]])
            count += len(extra)
            nbytes += len(extra) * vbytes[v]
        return count, nbytes

    for r in sorted(range(len(picks)), key=lambda c: -len(touching[c])):
        current = picks[r]
        if r in pinned or current == preferred[r]:
            continue
        base = cost(touching[r])
        for b in _bit_list(domains[r] & ((1 << current) - 1)):  # more preferred, in preference order
            picks[r] = b
            if cost(touching[r]) <= base:
                current = b
                break
            picks[r] = current
