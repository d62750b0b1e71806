"""Ties between plans of equal transitions, broken toward permutes' fast paths (transitions alone).

Planned by transitions alone, a permute's input and output classes take whatever representations
keep the count and bytes least, then the declared preference order. Many equally cheap plans
differ in whether the permute's units move whole (costs.fast_pair: NCHW -> NHWC from a
channels-packed to a width-packed tensor) or one element at a time, up to GENERAL_FACTOR times
slower. With a cost model the integer program prices that (prices.Pair); here, after every
component is labelled, each permute left on its general path tries to move its output class, then
its input class, to a representation that puts it on the fast path. A move is kept only when the
transitions on the values the class touches keep their count and bytes and fewer of the permutes
touching the class stay general, so the certified count and bytes hold. Where no single class
can move, the class and those joined to it without a transition (same representation, shared
values: a video's frame slices, their padding and the permute before them, each a class) move
together, under the same test. slice, constant_pad_nd and select are pair-priced too
(costs.PAIR_PATHS), their input and output one class. It is a local search: a fast path that needs
classes of different representations moved at once is not found.
"""

from __future__ import annotations

import functools

from ..costs import fast_pair
from ..repr import REPRS
from .edges import ComponentEdges, transition_cost
from .prices import pair_classes
from .tables import Tables, bit_list


def polish_pairs(t: Tables, root, domain, label, edges: tuple, frozen: set) -> int:
    """Move classes of `label` (a bit per class root, changed in place) so permutes take their fast
    path where transitions allow; returns how many fewer permutes are general. edges: (ev, ecc, evc) of
    the whole plan (tables.crossing_edges); frozen: class roots that must keep their bit (int8 sync
    groups, classes a failed solve left to the greedy plan)."""
    terms = pair_classes(t, root)
    if not terms:
        return 0

    def general(term) -> bool:
        node, a, b = term
        return not fast_pair(node, REPRS[label[a]], REPRS[label[b]])

    todo = [term for term in terms if general(term)]
    if not todo:
        return 0
    by_class: dict = {}
    for term in terms:
        for c in dict.fromkeys(term[1:]):
            by_class.setdefault(c, []).append(term)
    ev, ecc, evc = edges
    graph = ComponentEdges.of(len(label), ev, ecc, evc)
    for term in todo:
        if not general(term):  # put on its fast path by an earlier move
            continue
        ends = [c for c in dict.fromkeys((term[2], term[1])) if c not in frozen]
        if any(_move(c, label, int(domain[c]), graph, by_class[c], general, t.vbytes) for c in ends):
            continue
        for c in ends:  # the classes that share its representation and values, moved together
            region = _region(c, label, graph, frozen)
            mask = functools.reduce(int.__and__, (int(domain[k]) for k in region))
            if len(region) > 1 and _move_region(region, label, mask, graph, by_class, general, t.vbytes):
                break
    return len(todo) - sum(map(general, terms))  # pair-priced nodes now on their fast path, net


def _move(c, label, mask, graph, terms, general, vbytes) -> bool:
    """Relabel class c with the most preferred representation that keeps its transitions and
    makes fewer of `terms` general; False (c unchanged) when none does."""
    current = label[c]
    touching = graph.touching[c]
    base = transition_cost(graph, label, touching, vbytes)
    slow = sum(map(general, terms))
    for b in bit_list(mask):
        if b == current:
            continue
        label[c] = b
        if transition_cost(graph, label, touching, vbytes) <= base and sum(map(general, terms)) < slow:
            return True
    label[c] = current
    return False


REGION_LIMIT = 64  # classes one region move may relabel at most


def _region(c, label, graph, frozen) -> list[int]:
    """Class c and the classes joined to it through values whose producer and consumer share
    c's representation (no transition between them), up to REGION_LIMIT, frozen ones left out."""
    bit, seen, todo = label[c], [c], [c]
    found = {c}
    while todo and len(seen) < REGION_LIMIT:
        for v in graph.touching[todo.pop()]:
            for k in (graph.prod[v], *sorted(graph.cons[v])):
                if k not in found and k not in frozen and label[k] == bit and len(seen) < REGION_LIMIT:
                    found.add(k)
                    seen.append(k)
                    todo.append(k)
    return seen


def _move_region(region, label, mask, graph, by_class, general, vbytes) -> bool:
    """Relabel every class of `region` with the most preferred representation in `mask` that
    keeps the transitions on the values they touch and makes fewer pair-priced nodes touching
    them general (a video's frame slices, their padding and the permute before them, each its
    own class, move to a width-packed buffer together); False (unchanged) when none does."""
    current = label[region[0]]
    values = list(dict.fromkeys(v for c in region for v in graph.touching[c]))
    terms = list({id(x): x for c in region for x in by_class.get(c, ())}.values())
    base = transition_cost(graph, label, values, vbytes)
    slow = sum(map(general, terms))
    for b in bit_list(mask):
        if b == current:
            continue
        for c in region:
            label[c] = b
        if transition_cost(graph, label, values, vbytes) <= base and sum(map(general, terms)) < slow:
            return True
    for c in region:
        label[c] = current
    return False
