"""Push-constant derivations too specific for the vocabulary of shaders/node_rules.py.

A hook is named by a declaration (`{hook: NAME}`) in ops.yaml or a template contract; `make gen`
refuses a declaration naming no hook here, and a hook here that no declaration names. Each hook
is a pure function of the node (see node_rules.NodeFacts) returning a value of its declared type.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from .node_rules import NodeFacts


@dataclass(frozen=True)
class Hook:
    name: str
    type: str  # int, float or ivec4
    fn: Callable


HOOKS: dict[str, Hook] = {}


def hook(type_: str):
    def register(fn):
        HOOKS[fn.__name__] = Hook(fn.__name__, type_, fn)
        return fn

    return register


@hook("ivec4")
def whcn_permutation(node: NodeFacts):
    """permute's `dims` in WHCN terms: out's WHCN dim d reads self's WHCN dim result[d]."""
    from .geometry import permute_dims_whcn

    return permute_dims_whcn(node.value("dims"), len(node.shape("self")))
