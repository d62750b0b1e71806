"""Prices of a problem with a cost model: each class's predicted time in each representation, and
each transition's.

A class's price in representation r is the sum of its slots' shares of their nodes' predicted
times (costs.CostModel.slot_seconds: a slot's bytes, and for a node's first output its fixed and
FLOP terms). A value's copy into r costs costs.CostModel.transition_seconds. The integer program
then minimises the plan's predicted time. A permute's general path (costs.pair_seconds) depends on
its input's and output's representations together: each is a `Pair`, which the integer program
charges through a variable per output representation. Assignment.predicted_seconds computes the
same sum for any plan, so optimal and greedy are compared on one scale.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..costs import fast_pair, pair_slots
from ..repr import REPRS
from .tables import NB, Tables, bit_list

# Representations whose prices differ by at most this (relative) are equally cheap.
TIE_RTOL = 1e-9


@dataclass(frozen=True)
class Pair:
    """A pair-priced node's general path with its output class in one representation: `seconds`
    are paid when the input class holds none of the representations in `fast` (a bit mask)."""

    src: int  # the input slot's class root
    out: int  # the output slot's class root
    bit: int  # the output's representation
    fast: int  # input representations on the fast path with that output
    seconds: float


@dataclass
class Prices:
    unary: np.ndarray  # (classes, NB): seconds of each root class per representation, inf outside its domain
    cheapest: np.ndarray  # per class: mask of the representations at its least price (roots only)
    problem: object
    pairs: list = field(default_factory=list)  # Pair terms between two classes
    _transition: dict = field(default_factory=dict)  # value index -> NB seconds

    def transition(self, value_index: int) -> np.ndarray:
        row = self._transition.get(value_index)
        if row is None:
            v = self.problem.planned[value_index]
            model = self.problem.costs
            row = self._transition[value_index] = np.array([model.transition_seconds(v, r) for r in REPRS])
        return row


def price(problem, t: Tables, root: np.ndarray, roots: np.ndarray, domain: np.ndarray) -> Prices:
    model = problem.costs
    n = len(root)
    unary = np.zeros((n, NB))
    values_of: dict = {}  # node -> slot -> its values (a list argument's elements share one slot)
    for k, key in enumerate(t.classes.keys):
        if key[0] == "free":
            continue
        node, slot = key
        slots = values_of.get(node)
        if slots is None:
            slots = values_of[node] = {}
            for name, v in list(node.tensor_args()) + list(node.outputs):
                slots.setdefault(name, []).append(v)
        r = int(root[k])
        for b in bit_list(int(domain[r])):
            rep = REPRS[b]
            unary[r, b] += sum(model.slot_seconds(node, slot, v, rep) for v in slots.get(slot, ()))
    pairs = _pairs(problem, t, root, domain, unary)
    allowed = ((domain[:, None] >> np.arange(NB)) & 1) == 1
    unary[~allowed] = np.inf
    cheapest = np.zeros(n, dtype=np.int64)
    for r in roots.tolist():
        row = unary[r]
        if not np.isfinite(row).any():
            continue
        low = row.min()
        ties = np.nonzero(row <= low + TIE_RTOL * max(abs(low), 1e-12))[0]
        cheapest[r] = int(sum(1 << int(b) for b in ties))
    return Prices(unary, cheapest, problem, pairs)


def pair_classes(t: Tables, root: np.ndarray) -> list[tuple]:
    """(node, input class root, output class root) of every pair-priced node (costs.pair_slots)
    whose two slots are both classes, in the order of the classes."""
    cls: dict = {}
    for k, key in enumerate(t.classes.keys):
        if key[0] != "free" and pair_slots(key[0]) is not None:
            cls[key] = int(root[k])
    found = []
    for node in dict.fromkeys(key[0] for key in cls):
        s_in, s_out = pair_slots(node)
        a, b = cls.get((node, s_in)), cls.get((node, s_out))
        if a is not None and b is not None:
            found.append((node, a, b))
    return found


def _pairs(problem, t: Tables, root: np.ndarray, domain: np.ndarray, unary: np.ndarray) -> list[Pair]:
    """The Pair terms of every pair-priced node; where its input and output share a class, its
    general path is a unary price of that class instead (added to `unary`)."""
    model = problem.costs
    pairs = []
    for node, a, b in pair_classes(t, root):
        for rb in bit_list(int(domain[b])):
            seconds = model.general_seconds(node, REPRS[rb])
            if seconds <= 0:
                continue
            fast = sum(1 << ra for ra in bit_list(int(domain[a])) if fast_pair(node, REPRS[ra], REPRS[rb]))
            if a == b:
                unary[b, rb] += 0.0 if fast >> rb & 1 else seconds
            else:
                pairs.append(Pair(a, b, rb, fast, seconds))
    return pairs
