"""Permutation algebra and the node shapes the permute passes look for.

A permute `y = permute(x, dims)` has `y.shape[i] == x.shape[dims[i]]`: dim i of the result is dim
`dims[i]` of the input. Everything here is a pure function of dims and shapes (no graph), so the
local passes (`local.py`, `regions.py`) and the global placement can share it.
"""

from __future__ import annotations

from typing import Sequence

from ..ir import Node
from ..narrowing import is_widening_cast

PERMUTE_OP = "permute_copy"
LAYOUT_OP = "to_layout"  # an identity op too, but a planner transition: never a view to rewrite


def normalize(dims: Sequence[int], rank: int) -> tuple[int, ...]:
    """`dims` with negative entries counted from the end (torch accepts both)."""
    return tuple(d % rank if rank else d for d in dims)


def inverse(dims: Sequence[int]) -> tuple[int, ...]:
    """The permutation that undoes `dims`: permute(permute(x, dims), inverse(dims)) == x."""
    inv = [0] * len(dims)
    for i, d in enumerate(dims):
        inv[d] = i
    return tuple(inv)


def compose(first: Sequence[int], second: Sequence[int]) -> tuple[int, ...]:
    """One permutation for two in a row: permute(permute(x, first), second) == permute(x, result)."""
    return tuple(first[d] for d in second)


def is_identity(dims: Sequence[int]) -> bool:
    return all(i == d for i, d in enumerate(dims))


def permuted(shape: Sequence[int], dims: Sequence[int]) -> tuple[int, ...]:
    """The shape of permute(x, dims) for x of `shape`."""
    return tuple(shape[d] for d in dims)


def moves_only_unit_dims(shape: Sequence[int], dims: Sequence[int]) -> bool:
    """Whether permute(x, dims) keeps the dims of size > 1 in their order: then it moves no element
    in row-major order and equals a reshape (a view)."""
    big = [d for d in dims if shape[d] != 1]
    return big == sorted(big)


def non_unit(shape: Sequence[int]) -> tuple[int, ...]:
    return tuple(s for s in shape if s != 1)


def permute_dims(node: Node) -> tuple[int, ...] | None:
    """The normalized dims of a device permute node; None for any other node."""
    if not node.on_device or node.op.name != PERMUTE_OP:
        return None
    (_, x), = node.tensor_args()
    return normalize(node.arg("dims"), len(x.shape))


def is_view(node: Node) -> bool:
    """A device identity op (view, reshape, squeeze, alias, clone, ...): its output is its one input
    read with the output's shape, in row-major order, same dtype (on the host too: an int32 ->
    int64 cast the device holds narrowed is no view, its output is what the host widens)."""
    if not node.on_device or not node.op.is_identity or node.op.name == LAYOUT_OP or node.transition:
        return False
    ins = list(node.tensor_args())
    if len(ins) != 1 or len(node.outputs) != 1:
        return False
    return ins[0][1].dtype == node.outputs[0][1].dtype and not is_widening_cast(node.fx)
