"""Which classes produce and read each value, and the transitions a labelling pays on them.

Kept free of scipy: the LP rounding and preference polish (local_search) and the permute pair
ties (pair_ties) all judge a move by `transition_cost`, and the last runs on plans that never load
the solver.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ComponentEdges:
    """Edges by value, in class indices (a component's local ones, or the whole plan's class
    roots): what the local searches of rounding and polishing walk."""

    prod: dict  # value -> producer class
    cons: dict  # value -> set of consumer classes
    touching: list  # class -> values it produces or consumes, each once

    @classmethod
    def of(cls, n_cls, ev, lcc, lvc) -> "ComponentEdges":
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


def transition_cost(edges: ComponentEdges, picks: list[int], values, vbytes) -> tuple[int, int]:
    """(transitions, bytes they copy) on `values` under `picks` (a bit per local class): each
    distinct representation a consumer wants and the producer does not hold is one copy."""
    count = nbytes = 0
    for v in values:
        extra = {picks[c] for c in edges.cons[v]}
        extra.discard(picks[edges.prod[v]])
        count += len(extra)
        nbytes += len(extra) * vbytes[v]
    return count, nbytes
