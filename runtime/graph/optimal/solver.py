"""Solve a component's program: the LP relaxation first, branch and bound only when needed.

The LP relaxation of these programs is often integral, and then it is the optimum. When it is
not, rounding it often still reaches the LP's value, which certifies the rounded plan; only
otherwise does HiGHS branch and bound, within what is left of the time limit.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np
from scipy.optimize import milp

from .integer_program import ComponentProgram

# An LP solution whose every entry is this close to an integer is taken as integral (HiGHS's own
# primal feasibility tolerance is 1e-7).
INTEGRALITY_TOL = 1e-7
# A rounded plan whose objective exceeds the LP bound by at most this much, relative to the bound
# (or absolute below 1), reaches it: floating-point noise, not a worse plan.
LP_MATCH_RTOL = 1e-9
# Added to a fractional dual bound before rounding it down to a whole number of transitions, so a
# bound of 2.9999999999 certifies 3.
DUAL_BOUND_SLACK = 1e-9
# A solved 0/1 column counts as 1 above this (solvers return values like 0.9999999 or 1e-10).
BINARY_ONE = 0.5
# The least time a solve is given, even when the deadline has passed: enough for HiGHS to return
# the incumbent it finds at once, so a component never fails for lack of a start.
MIN_SOLVE_S = 0.1


def lp_then_mip(prog: ComponentProgram, time_limit: float,
                rounded: Callable[[np.ndarray], tuple[np.ndarray, float]] | None = None):
    """(0/1 solution, certified optimal, lower bound on the objective), or None when no solution
    was found in time. `rounded` maps a fractional LP solution to a plan and its objective."""
    start = time.monotonic()
    relaxed = milp(prog.objective, constraints=prog.constraints, integrality=np.zeros_like(prog.integrality),
                   bounds=prog.bounds, options={"time_limit": time_limit, "disp": False})
    lp_solved = relaxed.status == 0 and relaxed.x is not None
    if lp_solved and np.all(np.abs(relaxed.x - np.round(relaxed.x)) < INTEGRALITY_TOL):
        return np.round(relaxed.x), True, float(relaxed.fun)
    lp_bound = float(relaxed.fun) if relaxed.status == 0 else 0.0
    if rounded is not None and lp_solved:
        sol, value = rounded(relaxed.x)
        if value <= lp_bound + LP_MATCH_RTOL * max(1.0, abs(lp_bound)):
            return sol, True, lp_bound
    left = max(MIN_SOLVE_S, time_limit - (time.monotonic() - start))  # one budget for both solves
    exact = milp(prog.objective, constraints=prog.constraints, integrality=prog.integrality, bounds=prog.bounds,
                 options={"time_limit": left, "mip_rel_gap": 0.0, "disp": False})
    if exact.x is None:
        return None
    dual = getattr(exact, "mip_dual_bound", None)
    bound = max(lp_bound, dual) if dual is not None and np.isfinite(dual) else lp_bound
    return np.round(exact.x), exact.status == 0, bound
