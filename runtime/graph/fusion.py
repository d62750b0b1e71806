"""Pattern fusion on the planning IR, before layout planning (DESIGN §6 step 2).

Filled by the fusion work of issue 10: conv + batch-norm folding, conv + activation.
"""

from __future__ import annotations

from .ir import PlanGraph


def fuse_patterns(graph: PlanGraph) -> PlanGraph:
    """Rewrite `graph` in place with every fusion that applies; returns it."""
    return graph
