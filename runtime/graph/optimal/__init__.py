"""The optimal planner: an exact integer program per connected component, solved with HiGHS.

Variables. Slots of a node that a float sync group ties together must hold the very same
representation (float packed-dim info is the storage and layout), so they are merged into one
*class*; int8 slots stay separate and a group variable picks their shared packed-dim info. A value
takes its producer's output class, or a free class of its own when it comes from the host.
x[c, r] = class c holds representation r; z[v, r] = value v is copied into r.

Before solving, chains where an optimal plan never needs a copy are contracted (exactly), and a
component whose classes share a representation is settled at once with zero transitions. The rest
is one program per component: minimise count + bytes / (all bytes + 1), so the count comes first
and bytes break its ties. The LP relaxation is tried first; when it is integral it is the optimum,
otherwise HiGHS branches and bounds within the time limit, and its dual bound is the certified
lower bound. The declared preference order then breaks the remaining ties (a local pass that never
changes count or bytes), and permutes left on their general path move to their fast one where that
too keeps count and bytes. A component the solver cannot finish in time keeps its greedy plan, and
the plan says it is not certified.

Speed. Graphs reach tens of thousands of nodes, so everything after reading the problem works on
integers: a class is an index, a value is its index in `problem.planned`, a representation is its
bit index in REPRS (the bit order of TensorRepSet masks, which is the preference order).

Modules, in the order a plan goes through them:
  tables          the problem in integer form: classes (union-find), values, uses, bit helpers
  contraction     exact chain contraction before solving
  components      connected components; those needing no solver are settled at once
  integer_program one component's integer program (variables, rows, objective)
  solver          LP relaxation first, then branch and bound; the solver tolerances
  edges           which classes produce and read each value; a labelling's transition cost
  local_search    LP rounding and preference polish, local moves judged by that cost
  pair_ties       transitions alone: equal-cost moves that put permutes on their fast path
  planner         the driver: tables -> components -> solves -> Assignment, greedy where a solve failed

Only this module is imported with the package; numpy and scipy are loaded when a plan is made.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..problem import Assignment, Problem

# Seconds the solver may spend on one plan, all components together; a component it cannot finish
# in time keeps its greedy plan. The default of every public entry point that takes a time limit.
SOLVER_TIME_LIMIT_S = 10.0


def plan_optimal(problem: "Problem", time_limit: float = SOLVER_TIME_LIMIT_S) -> "Assignment":
    from .planner import plan  # scipy is imported here, the first time the optimal planner runs

    return plan(problem, time_limit)
