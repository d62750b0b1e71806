"""Check a finished plan: a failure here is a planner bug, reported as such."""

from __future__ import annotations

from .ir import Role
from .problem import Assignment, Problem


class PlanVerificationError(AssertionError):
    """The plan breaks its own rules; this is a bug in texelflow, not in the model."""


def verify(problem: Problem, assignment: Assignment, transitions_inserted: bool = True) -> None:
    """Every slot's representation is in its repset and sync groups agree; once transitions are
    inserted, every read also finds its value in the representation the slot wants."""
    errors = []
    for node, sets in problem.repsets.items():
        chosen = {}
        for slot, allowed in sets.sets.items():
            r = assignment.slots.get((node, slot))
            if r is None:
                errors.append(f"{node.name}.{slot}: no representation")
                continue
            chosen[slot] = r
            if r not in allowed:
                errors.append(f"{node.name}.{slot}: {r} is not in {allowed!r}")
        if not sets.is_sync_compatible(chosen):
            errors.append(f"{node.name}: sync group broken: {', '.join(f'{k}={v}' for k, v in chosen.items())}")
        for slot, v in node.tensor_args():
            if v.role is Role.CONST or not transitions_inserted:
                continue
            if assignment.values.get(v) != chosen.get(slot):
                errors.append(f"{node.name}.{slot}: reads {v.name} as {assignment.values.get(v)}, "
                              f"wants {chosen.get(slot)} and no transition is there")
    if errors:
        raise PlanVerificationError("plan verification failed (a texelflow bug):\n  " + "\n  ".join(errors))
