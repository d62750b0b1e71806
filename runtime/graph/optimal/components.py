"""Connected components of the class graph, each planned on its own.

Classes are linked by the edges where a transition may be needed, by int8 sync groups and, with
prices, by a permute's input and output classes (prices.Pair). Most components need no solver:
when all their classes can hold one representation, zero transitions is optimal and certified.
"""

from __future__ import annotations

import numpy as np

from ..repr import TensorRepSet
from .tables import NB, lowest_bits


def components(n: int, ecc, evc, groups, links=()) -> np.ndarray:
    """Connected component of every class, classes being linked by edges, int8 groups and
    `links` (pairs of classes)."""
    links = np.asarray(links, dtype=np.int64).reshape(-1, 2)
    a = np.concatenate([evc] + [np.full(len(g) - 1, g[0]) for g in groups] + [links[:, 0]]).astype(np.int64)
    b = np.concatenate([ecc] + [np.asarray(g[1:]) for g in groups] + [links[:, 1]]).astype(np.int64)
    # Union-find with the smallest index as root (no scipy: most plans never need the solver, and
    # importing scipy.sparse costs more than planning a large graph). Components are numbered in
    # the order of their smallest class, as scipy's connected_components numbers them.
    parent = list(range(n))
    for x, y in zip(a.tolist(), b.tolist()):
        while parent[x] != x:
            parent[x] = x = parent[parent[x]]
        while parent[y] != y:
            parent[y] = y = parent[parent[y]]
        if x != y:
            parent[max(x, y)] = min(x, y)
    for i in range(n):  # parents have smaller indices: one pass in order resolves every root
        parent[i] = parent[parent[i]]
    return np.unique(np.asarray(parent, dtype=np.int64), return_inverse=True)[1].reshape(-1) if n else \
        np.zeros(0, dtype=np.int64)


def settle(comp, roots, domain, ecc, groups, links=()):
    """Label the components that need no solver; (bit per class root, the roots left to solve).

    Zero transitions are possible iff every class of a component can hold one common
    representation: then the preferred one of those is optimal, certified by 0. A component of
    one class with nothing to reconcile is the special case where that is its own domain. A
    component with `links` (prices.Pair classes) is left to the solver: one common
    representation may still put a permute on its general path.
    """
    n_comp = int(comp.max()) + 1 if len(comp) else 0
    has_edge = np.zeros(n_comp, dtype=bool)
    has_edge[comp[ecc]] = True
    has_group = np.zeros(n_comp, dtype=bool)
    for g in groups:
        has_group[comp[g[0]]] = True
    for a, _ in links:
        has_group[comp[a]] = True
    common = np.full(n_comp, (1 << NB) - 1, dtype=np.int64)
    np.bitwise_and.at(common, comp[roots], domain[roots])
    if np.any((common == 0) & ~has_edge & ~has_group):
        TensorRepSet.empty().pick()  # a class with nothing allowed: the same error as picking it
    done = (~has_group & (common != 0))[comp[roots]]
    label = np.zeros(len(comp), dtype=np.int64)
    label[roots[done]] = lowest_bits(common[comp[roots[done]]])
    return label, roots[~done]


def unsettled(comp, roots, ev, ecc, evc, groups):
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
