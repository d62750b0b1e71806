"""One component's integer program.

Columns: x[c, r] (class c holds representation r), class by class in preference order; then
z[v, r] (value v is copied into r) for each (value, representation) some consumer class may want,
numbered by first use; then w[g, p] (int8 sync group g shares packed-dim info p); then, with
prices, u[q] per prices.Pair q (a permute's output class holds q's representation and its input
class none on the fast path). Rows: each class holds exactly one representation; z >= x_consumer -
x_producer; each int8 group picks one packed-dim info and its slots hold only representations with
it; u >= x_out - sum of x_src over the fast input representations. Objective: count first, bytes
second, as sum z * (1 + bytes / (all bytes + 1)); with prices, predicted time.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import Bounds, LinearConstraint
from scipy.sparse import coo_matrix

from ..repr import REPRS, TensorRepSet
from .edges import ComponentEdges
from .tables import NB, bit_list


@dataclass
class ComponentProgram:
    """The program of one component, with the column maps needed to read a solution back."""

    n_cls: int
    ev: np.ndarray  # per edge: the value
    lcc: np.ndarray  # per edge: the consumer's local class
    lvc: np.ndarray  # per edge: the producer's local class
    dom: np.ndarray  # per local class: the representations worth considering (a mask)
    local: dict  # class root -> local class (only filled when the component has int8 groups)
    has: np.ndarray  # class x representation: whether x[c, r] exists
    xcol: np.ndarray  # class x representation: the column of x[c, r], -1 where it does not exist
    n_x: int
    n_z: int
    z_row: np.ndarray  # per (edge, representation) pair: its z column
    xc: np.ndarray  # per pair: the consumer's x column
    xp: np.ndarray  # per pair: the producer's x column, -1 where the producer cannot hold it
    objective: np.ndarray
    constraints: list
    integrality: np.ndarray
    bounds: Bounds
    # per prices.Pair of the component: (its u column, x_out's column, x_src's fast columns)
    pair_cols: list = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.objective)

    @functools.cached_property
    def edges(self) -> ComponentEdges:
        """Built on first need: only fractional LPs and imperfect preferences walk them."""
        return ComponentEdges.of(self.n_cls, self.ev, self.lcc, self.lvc)

    def solution_of(self, picks: list[int]) -> np.ndarray:
        """The 0/1 column vector of a bit per local class: its xs, and the zs they force."""
        sol = np.zeros(self.n)
        sol[self.xcol[np.arange(self.n_cls), picks]] = 1.0
        np.maximum.at(sol, self.z_row, sol[self.xc] - np.where(self.xp >= 0, sol[self.xp], 0.0))
        for u, out, fast in self.pair_cols:
            sol[u] = max(0.0, sol[out] - sol[fast].sum())
        return sol


def build_program(cls, ev, ecc, evc, groups, domain, vbytes, priced=None) -> ComponentProgram:
    """cls: the component's class roots (sorted); ev/ecc/evc: its edges (value, consumer root,
    producer root); groups: its int8 sync groups (lists of class roots); domain: every class's mask;
    priced: prices.Prices when the objective is predicted time (None: count, then bytes)."""
    n_cls = len(cls)
    lcc, lvc = np.searchsorted(cls, ecc), np.searchsorted(cls, evc)
    # Restricting flexible classes to useful labels is exact for transitions alone, not with prices.
    dom = useful_domains(domain[cls], bool(groups)) if priced is None else domain[cls]
    has = (dom[:, None] >> np.arange(NB)) & 1 == 1
    n_x = int(has.sum())
    xcol = np.full(has.shape, -1, dtype=np.int64)
    xcol[has] = np.arange(n_x)

    e_idx, e_bit = np.nonzero(has[lcc])
    zkey = ev[e_idx] * NB + e_bit
    uniq, first, inv = np.unique(zkey, return_index=True, return_inverse=True)
    rank = np.empty(len(uniq), dtype=np.int64)
    rank[np.argsort(first)] = np.arange(len(uniq))
    n_z = len(uniq)
    z_row = n_x + rank[inv.ravel()]
    z_value = np.empty(n_z, dtype=np.int64)
    z_value[rank] = uniq // NB
    xc = xcol[lcc[e_idx], e_bit]
    xp = xcol[lvc[e_idx], e_bit]

    local = {int(r): i for i, r in enumerate(cls)} if groups else {}
    w_rows, n_w = _group_rows(groups, local, dom, xcol, n_x + n_z)
    pair_cols, pair_rows, pair_cost = _pair_rows(cls, xcol, priced, n_x + n_z + n_w)
    w_rows += pair_rows
    n = n_x + n_z + n_w + len(pair_cols)

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

    obj = np.zeros(n)
    if priced is None:
        # Count first, bytes second: each byte term is scaled so that all of them together weigh
        # less than one transition.
        zbytes = np.asarray(vbytes, dtype=np.int64)[z_value]
        total = float(int(zbytes.sum())) + 1.0
        obj[n_x:n_x + n_z] = 1.0 + zbytes / total
    else:
        # Predicted time in microseconds: each class in its representation, each copy.
        x_cls, x_bit = np.nonzero(has)
        obj[:n_x] = priced.unary[cls[x_cls], x_bit] * 1e6
        z_bit = np.empty(n_z, dtype=np.int64)
        z_bit[rank] = uniq % NB
        obj[n_x:n_x + n_z] = [priced.transition(int(v))[b] * 1e6 for v, b in zip(z_value.tolist(), z_bit.tolist())]
        for (u, _, _), seconds in zip(pair_cols, pair_cost):
            obj[u] = seconds * 1e6
    return ComponentProgram(
        n_cls, ev, lcc, lvc, dom, local, has, xcol, n_x, n_z, z_row, xc, xp,
        objective=obj,
        constraints=[LinearConstraint(a, np.concatenate(lo), np.concatenate(hi))],
        integrality=np.ones(n),
        bounds=Bounds(np.zeros(n), np.ones(n)),
        pair_cols=pair_cols,
    )


def useful_domains(masks: np.ndarray, has_groups: bool) -> np.ndarray:
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


def _pair_rows(cls, xcol, priced, first_u):
    """The u columns and rows of the component's prices.Pair terms: ([(u, x_out, x_src fast
    columns)], rows as _group_rows makes them, seconds per u)."""
    if priced is None or not priced.pairs:
        return [], [], []
    local = {int(r): i for i, r in enumerate(cls)}
    cols, rows, cost = [], [], []
    for q in priced.pairs:
        a, b = local.get(q.src), local.get(q.out)
        if a is None or b is None or xcol[b, q.bit] < 0:
            continue
        u = first_u + len(cols)
        fast = np.array([xcol[a, ra] for ra in bit_list(q.fast) if xcol[a, ra] >= 0], dtype=np.int64)
        cols.append((u, int(xcol[b, q.bit]), fast))
        rows.append(([(u, 1.0), (int(xcol[b, q.bit]), -1.0)] + [(int(c), 1.0) for c in fast], 0, np.inf))
        cost.append(q.seconds)
    return cols, rows, cost


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
            for b in bit_list(int(dom[r])):
                rep = REPRS[b]
                rows.append(([(int(xcol[r, b]), 1.0), (ws[(gi, (rep.storage, rep.pdi))], -1.0)], -np.inf, 0))
    return rows, len(ws)
