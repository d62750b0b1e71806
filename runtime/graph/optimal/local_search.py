"""Local moves on one component's labelling: rounding a fractional LP, and the preference polish.

Both judge a move with the same cost, `transition_cost`: (count, bytes) of the transitions on the
values a class touches, compared lexicographically as the objective orders them.
"""

from __future__ import annotations

import numpy as np

from .edges import transition_cost
from .integer_program import ComponentProgram
from .tables import bit_list

# A class whose largest LP value is below 1 minus this is fractional: rounding revisits it.
FRACTIONAL_TOL = 1e-6
# Sweeps of local moves over the fractional classes after rounding.
ROUNDING_SWEEPS = 2


def round_relaxation(x: np.ndarray, prog: ComponentProgram, vbytes) -> tuple[np.ndarray, float]:
    """Largest x per class, then sweeps of local moves on the fractional classes; the plan as a
    solution vector and its exact objective."""
    e = prog.edges
    xcol = prog.xcol
    bits = [bit_list(int(m)) for m in prog.dom]
    picks = [max(bits[r], key=lambda b: (x[xcol[r, b]], -b)) for r in range(prog.n_cls)]
    fractional = [r for r in range(prog.n_cls) if x[xcol[r, picks[r]]] < 1.0 - FRACTIONAL_TOL]
    for _ in range(ROUNDING_SWEEPS):
        for r in fractional:
            best, best_cost = picks[r], transition_cost(e, picks, e.touching[r], vbytes)
            for b in bits[r]:
                picks[r] = b
                cost = transition_cost(e, picks, e.touching[r], vbytes)
                if cost < best_cost:
                    best, best_cost = b, cost
            picks[r] = best
    sol = prog.solution_of(picks)
    return sol, float(prog.objective @ sol)


def polish_preference(picks: list[int], domains: list[int], pinned: set, prog: ComponentProgram, vbytes) -> None:
    """Move classes to more preferred representations wherever that changes neither the number
    of transitions nor their bytes (the declared preference order breaks the solver's ties).
    picks and domains are per local class: a bit index and a mask; pinned classes stay."""
    preferred = [(m & -m).bit_length() - 1 for m in domains]
    if picks == preferred:
        return
    e = prog.edges
    touching = e.touching
    for r in sorted(range(len(picks)), key=lambda c: -len(touching[c])):
        current = picks[r]
        if r in pinned or current == preferred[r]:
            continue
        base = transition_cost(e, picks, touching[r], vbytes)
        for b in bit_list(domains[r] & ((1 << current) - 1)):  # more preferred, in preference order
            picks[r] = b
            if transition_cost(e, picks, touching[r], vbytes) <= base:
                current = b
                break
            picks[r] = current
