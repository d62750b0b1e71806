"""The planning problem in integer form: classes of slots, values and uses as indices.

A class is an index into a union-find over slot keys (first) and free values (then); a value is its
index in `problem.planned`; a representation is its bit index in REPRS. Class roots are computed
once after contraction, and edges are built with numpy rather than row by row.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from texelflow.generated.layouts import DTYPES

from ..ir import Role
from ..problem import Problem
from ..repr import REPRS

NB = len(REPRS)  # representations, i.e. bits of a repset mask
assert NB < 63, "repset masks are kept in int64 arrays"


def bit_list(mask: int) -> list[int]:
    """Bit indices of a mask, lowest (most preferred) first."""
    return [i for i in range(mask.bit_length()) if mask >> i & 1]


def lowest_bits(masks: np.ndarray) -> np.ndarray:
    """Index of the lowest set bit of each (non-zero) mask: the preferred representation."""
    low = masks & -masks
    return np.log2(low.astype(np.float64)).astype(np.int64)  # exact for powers of two


@dataclass
class Classes:
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
class Tables:
    """The problem in integer form. Uses are the (consumer slot, value) pairs of every device
    node's non-constant tensor arguments, in node order; values are indexed as problem.planned."""

    classes: Classes
    value_class: list[int]  # per value: its producer's output class, or its own free class
    vbytes: list[int]
    int8_groups: list[list[int]]  # int8 sync groups: class indices sharing packed-dim info
    use_slot: list[int]
    use_value: list[int]


def build_tables(problem: Problem) -> Tables:
    classes = Classes()
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
            if v.role is not Role.CONST:
                use_slot.append(index[(node, slot)])
                use_value.append(value_index[v])
    value_class = []
    for v in problem.planned:
        if v.producer is not None and v.producer in problem.repsets:
            name = next(n for n, x in v.producer.outputs if x is v)
            value_class.append(index[(v.producer, name)])
        else:
            value_class.append(classes.add(("free", v), problem.free_domain(v).mask))
    return Tables(classes, value_class, _value_bytes(problem.planned), int8_groups, use_slot, use_value)


def _sync_classes(node, sync, index, classes: Classes, int8_groups: list) -> None:
    """Float sync groups merge their slots into one class; int8 ones are kept as groups."""
    for group in sync:
        keys = [index[(node, s)] for s in group]
        member = node.value(group[0])
        dtype = (member[0] if isinstance(member, (list, tuple)) else member).dtype
        family = DTYPES[dtype].family if dtype in DTYPES else "float"
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


def crossing_edges(t: Tables, root: np.ndarray):
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


def count_transitions(t: Tables, key_bit: np.ndarray) -> int:
    """Transitions of a whole plan (a bit per class): distinct (value, representation) a consumer
    slot wants and the value does not hold (Assignment.transitions, counted on arrays)."""
    uv = np.asarray(t.use_value, dtype=np.int64)
    want = key_bit[np.asarray(t.use_slot, dtype=np.int64)]
    have = key_bit[np.asarray(t.value_class, dtype=np.int64)[uv]]
    diff = want != have
    return len(np.unique(uv[diff] * NB + want[diff]))
