"""The labelling problem behind the global permute placement, and its exact solvers.

Variable ops (commuting ops) each take one label (a dim order) from those allowed to them. A
tensor class (one canonical tensor: a value and its permutes) is produced in its producer's label
(fixed, or a variable op's) and read in labels (fixed demands: pinned ops, graph outputs; or the
label of a variable op reading it). It costs `weight[L]` for every label L it is read in other
than its producer's: one permute per (tensor, order), shared by every reader. Weights are
integers, count first (`COUNT`) and bytes second.

- Two labels: exactly a minimum s-t cut (label 0 on the source side); among equal cuts the one
  moving fewest ops off their current labels (weights scaled by ops + 1, a unit edge per op). Per class, a producer in
  label 0 and some reader in label 1 costs weight[1]: an aux node `a` with p -> a (weight[1])
  and a -> reader (inf); the mirror for weight[0]. Fixed producers and fixed demands become
  terminal edges; a label an op may not take, an infinite terminal edge.
- More labels: the integer program (scipy's HiGHS) x[op, L] in {0, 1}, one label per op,
  z[c, L] >= x[reader, L] - x[producer, L], minimise sum weight * z; exact unless the time
  limit stops it (then `optimal` is False and the caller keeps the graph as it was).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

COUNT = 1 << 40  # one permute outweighs any number of bytes
FORBIDDEN = COUNT << 20  # a permute that cannot run on the device


@dataclass
class TensorClass:
    producer: int | None  # variable op index, or None when the producer's label is fixed
    fixed: int | None  # the producer's label when fixed
    demands: set[int] = field(default_factory=set)  # fixed labels read
    readers: set[int] = field(default_factory=set)  # variable ops reading it
    weight: list[int] = field(default_factory=list)  # cost of a permute to each label


@dataclass
class Solution:
    labels: list[int]
    cost: int
    optimal: bool


def cost_of(classes: list[TensorClass], labels: list[int]) -> int:
    total = 0
    for c in classes:
        p = c.fixed if c.producer is None else labels[c.producer]
        for lab in c.demands | {labels[r] for r in c.readers}:
            if lab != p:
                total += c.weight[lab]
    return total


def solve(num_labels: int, allowed: list[set[int]], classes: list[TensorClass], current: list[int],
          time_limit: float = 10.0) -> Solution:
    """The cheapest labelling of the ops (`allowed[i]`: op i's labels; `current`: a feasible one)."""
    if not allowed:
        return Solution([], cost_of(classes, []), True)
    if num_labels == 1:
        labels = [0] * len(allowed)
        return Solution(labels, cost_of(classes, labels), True)
    if num_labels == 2:
        return _min_cut(allowed, classes, current)
    return _integer_program(num_labels, allowed, classes, current, time_limit)


# ---- two labels: min cut --------------------------------------------------------------------------------
class _Flow:
    """Dinic's max flow on integer capacities, plain lists (a 10k-node region cuts in about 0.1 s)."""

    def __init__(self, n: int):
        self.adj: list[list[int]] = [[] for _ in range(n)]
        self.to: list[int] = []
        self.cap: list[int] = []

    def edge(self, u: int, v: int, c: int) -> None:
        if c <= 0 or u == v:
            return
        for a, b, cap in ((u, v, c), (v, u, 0)):  # the edge, then its residual twin (index ^ 1)
            self.adj[a].append(len(self.to))
            self.to.append(b)
            self.cap.append(cap)

    def max_flow(self, s: int, t: int) -> int:
        total = 0
        while True:
            level = self._levels(s)
            if level[t] < 0:
                return total
            it = [0] * len(self.adj)
            while True:
                pushed = self._augment(s, t, level, it)
                if not pushed:
                    break
                total += pushed

    def _levels(self, s: int) -> list[int]:
        level = [-1] * len(self.adj)
        level[s] = 0
        queue = deque([s])
        while queue:
            u = queue.popleft()
            for e in self.adj[u]:
                if self.cap[e] > 0 and level[self.to[e]] < 0:
                    level[self.to[e]] = level[u] + 1
                    queue.append(self.to[e])
        return level

    def _augment(self, s: int, t: int, level: list[int], it: list[int]) -> int:
        """One blocking-flow path (iterative DFS over the level graph)."""
        path: list[int] = []
        u = s
        while True:
            if u == t:
                pushed = min(self.cap[e] for e in path)
                for e in path:
                    self.cap[e] -= pushed
                    self.cap[e ^ 1] += pushed
                return pushed
            edges = self.adj[u]
            while it[u] < len(edges):
                e = edges[it[u]]
                v = self.to[e]
                if self.cap[e] > 0 and level[v] == level[u] + 1:
                    break
                it[u] += 1
            else:
                if u == s:
                    return 0
                level[u] = -1  # a dead end
                e = path.pop()
                u = self.to[e ^ 1]
                it[u] += 1
                continue
            path.append(edges[it[u]])
            u = self.to[edges[it[u]]]

    def source_side(self, s: int) -> set[int]:
        seen = {s}
        queue = deque([s])
        while queue:
            u = queue.popleft()
            for e in self.adj[u]:
                if self.cap[e] > 0 and self.to[e] not in seen:
                    seen.add(self.to[e])
                    queue.append(self.to[e])
        return seen


def _min_cut(allowed: list[set[int]], classes: list[TensorClass], current: list[int]) -> Solution:
    n = len(allowed)
    s, t = n, n + 1
    inf = sum(sum(c.weight) for c in classes) + 1
    edges: list[tuple[int, int, int]] = []
    aux = n + 2
    for i, labs in enumerate(allowed):
        if 0 not in labs:  # held on the sink side
            edges.append((i, t, inf))
        if 1 not in labs:
            edges.append((s, i, inf))
    for c in classes:
        readers = sorted(c.readers)
        if c.producer is None:
            other = 1 - c.fixed
            if other in c.demands or not readers:
                continue  # paid whatever the readers take (or nothing to decide)
            if c.fixed == 0:  # some reader in label 1 costs weight[1]
                a, aux = aux, aux + 1
                edges.append((s, a, c.weight[1]))
                edges += [(a, r, inf) for r in readers]
            else:
                b, aux = aux, aux + 1
                edges.append((b, t, c.weight[0]))
                edges += [(r, b, inf) for r in readers]
            continue
        p = c.producer
        if 0 in c.demands:
            edges.append((s, p, c.weight[0]))  # p in label 1 pays a permute to 0
        if 1 in c.demands:
            edges.append((p, t, c.weight[1]))
        readers = [r for r in readers if r != p]
        if not readers:
            continue
        if 1 not in c.demands:  # p in 0 and a reader in 1
            if len(readers) == 1:
                edges.append((p, readers[0], c.weight[1]))
            else:
                a, aux = aux, aux + 1
                edges.append((p, a, c.weight[1]))
                edges += [(a, r, inf) for r in readers]
        if 0 not in c.demands:  # p in 1 and a reader in 0
            if len(readers) == 1:
                edges.append((readers[0], p, c.weight[0]))
            else:
                b, aux = aux, aux + 1
                edges.append((b, p, c.weight[0]))
                edges += [(r, b, inf) for r in readers]
    # ties go to the current labels: every weight scaled past the sum of unit moves from them
    scale = n + 1
    edges = [(u, v, cap * scale) for u, v, cap in edges]
    edges += [(s, i, 1) if cur == 0 else (i, t, 1) for i, cur in enumerate(current)]
    flow = _Flow(aux)
    for u, v, cap in edges:
        flow.edge(u, v, cap)
    flow.max_flow(s, t)
    side = flow.source_side(s)
    labels = [0 if i in side else 1 for i in range(n)]
    return Solution(labels, cost_of(classes, labels), True)


# ---- more labels: integer program --------------------------------------------------------------------------
def _integer_program(num_labels: int, allowed: list[set[int]], classes: list[TensorClass], current: list[int],
                     time_limit: float) -> Solution:
    import numpy as np
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    x = {}
    for i, labs in enumerate(allowed):
        for lab in sorted(labs):
            x[(i, lab)] = len(x)
    z, weights = {}, []
    rows, cols, vals, lo, hi = [], [], [], [], []

    def row(entries, low, high):
        r = len(lo)
        for col, val in entries:
            rows.append(r)
            cols.append(col)
            vals.append(val)
        lo.append(low)
        hi.append(high)

    for i, labs in enumerate(allowed):
        row([(x[(i, lab)], 1.0) for lab in labs], 1.0, 1.0)
    total = num_labels * sum(max(w % COUNT for w in c.weight) for c in classes) + 1  # bytes sum below one permute
    for k, c in enumerate(classes):
        for lab in range(num_labels):
            if c.producer is None and lab == c.fixed:
                continue
            readers = [r for r in c.readers if (r, lab) in x]
            if lab in c.demands:
                if c.producer is None:
                    continue  # paid whatever the ops take
                terms = [1.0]  # z >= 1 - x[p, lab]
            elif not readers:
                continue
            else:
                terms = None
            col = len(x) + len(z)
            z[(k, lab)] = col
            weights.append(c.weight[lab] // COUNT + (c.weight[lab] % COUNT) / total)
            p = c.producer
            if terms is not None:
                row([(col, 1.0)] + ([(x[(p, lab)], 1.0)] if (p, lab) in x else []), 1.0, np.inf)
                continue
            for r in readers:
                entries = [(col, 1.0), (x[(r, lab)], -1.0)]
                if p is not None and (p, lab) in x:
                    entries.append((x[(p, lab)], 1.0))
                row(entries, 0.0, np.inf)
    n = len(x) + len(z)
    objective = np.concatenate([np.zeros(len(x)), np.array(weights, dtype=float)])
    integrality = np.concatenate([np.ones(len(x)), np.zeros(len(z))])
    a = coo_matrix((vals, (rows, cols)), shape=(len(lo), n)).tocsr()
    result = milp(objective, constraints=[LinearConstraint(a, np.array(lo), np.array(hi))], integrality=integrality,
                  bounds=Bounds(np.zeros(n), np.ones(n)),
                  options={"time_limit": time_limit, "mip_rel_gap": 0.0, "disp": False})
    if result.x is None:
        return Solution(list(current), cost_of(classes, current), False)
    labels = [max(labs, key=lambda lab: result.x[x[(i, lab)]]) for i, labs in enumerate(allowed)]
    best = min((labels, list(current)), key=lambda ls: cost_of(classes, ls))
    return Solution(best, cost_of(classes, best), result.status == 0)
