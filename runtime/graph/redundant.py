"""Fold identity ops (view, reshape, flatten, clone, alias, ...) that move no data.

An identity node whose input and output hold the same representation, and whose output shape
leaves every element where the input's shape had it (`same_placement`), is the same memory under
another torch shape: it is marked folded (no dispatch; the runtime binds its output to its
input's memory and reads it with the output's own sizes). Int8 identity nodes fold the same way.
Transitions are never folded. A reshape that moves elements in memory (a texture whose W or H
changes, a channels-packed buffer whose C changes) stays a copy dispatch: its words or texels
really move.

A permute is free the same way when both its sides are buffers whose memory orders line up
(`permute_is_free`): an NCHW tensor in a channels-packed buffer is NHWC memory, and its
permute(0, 2, 3, 1), [N, H, W, C] in a width-packed buffer, is that very memory. The planner
narrows such permutes to their free pair where a neighbour already forces one side
(problem.py); `fold_free_permutes` marks them. It is not yet called by plan_graph: the runtime's
folded views still take their root's layout (runtime/program.py binds the root tensor and
overrides only its sizes), which holds for reshapes but not for a view in another layout.
"""

from __future__ import annotations

from typing import Sequence

from texelflow.generated.layouts import DTYPES, LAYOUT_INFO, STORAGE_INFO, Storage
from texelflow.shaders.geometry import whcn_sizes

from .ir import Node
from .problem import Assignment, Problem
from .repr import TensorRepr


def same_placement(shape: Sequence[int], new_shape: Sequence[int], r: TensorRepr) -> bool:
    """Whether a tensor of `shape` stored in `r`, read as `new_shape` (same numel) in `r`, finds
    every element in the same word and lane (or texel and lane): the WHCN sizes agree in every
    dim that orders memory ahead of the others. The twin of indexing.glslh's tf_same_buffer_order.

    Buffers put the packed dim (and a blocked outer dim) first, then the rest in NCHW order, so
    sizes must agree up to the packed dim: a contiguous (width-packed, block 1) buffer keeps any
    reshape, a height-packed one needs W and H, a channels-packed one W, H and C. Textures hold
    (x, y) = (W, H) with the packed one divided by 4 and stack C and N on z (C / 4 when C is
    packed): W and H must agree, and C too when it is packed."""
    a, b = whcn_sizes(shape), whcn_sizes(new_shape)
    if a == b:
        return True
    info = LAYOUT_INFO[r.layout]
    pd = info.packed_dim
    if STORAGE_INFO[r.storage].is_image:
        last = 2 if pd == 2 else 1
    elif pd == 0 and info.buffer_block == 1:
        return True
    else:
        last = max(pd, info.outer_dim) if info.outer_block > 1 else pd
    return a[:last + 1] == b[:last + 1]


def fold_identity_ops(problem: Problem, assignment: Assignment) -> list[Node]:
    folded = []
    for node in problem.graph.device_nodes():
        if node.transition or not node.op.is_identity:
            continue
        (in_name, src), = [(n, v) for n, v in node.tensor_args()]
        out_name, out = node.outputs[0]
        r = assignment.slots[(node, in_name)]
        if r == assignment.slots[(node, out_name)] and assignment.values.get(src) == r and \
                same_placement(src.shape, out.shape, r):
            node.folded = True
            folded.append(node)
    return folded


def buffer_memory_order(shape: Sequence[int], layout) -> tuple[int, ...] | None:
    """The torch dims of `shape` (size-1 dims left out) from fastest to slowest in a buffer of
    `layout`, or None when the layout blocks (int8) or the rank is over 4 (dims fold into N).
    A buffer puts the packed dim first, then the others in NCHW order (W fastest)."""
    info = LAYOUT_INFO[layout]
    rank = len(shape)
    if rank > 4 or info.buffer_block != 1 or info.outer_block != 1 or info.family != "float":
        return None
    whcn = [info.packed_dim] + [d for d in range(4) if d != info.packed_dim]
    return tuple(rank - 1 - d for d in whcn if d < rank and shape[rank - 1 - d] != 1)


def permute_is_free(shape: Sequence[int], dims: Sequence[int], dtype: str, src: TensorRepr, out: TensorRepr) -> bool:
    """Whether permute(dims) of a `shape` tensor held in `src` written in `out` moves no data:
    both buffers of one-element lanes whose memory orders name the same input dims."""
    if src.storage != Storage.BUFFER or out.storage != Storage.BUFFER:
        return False
    if dtype in DTYPES and DTYPES[dtype].family != "float":
        return False
    rank = len(shape)
    dims = [d % rank for d in dims] if rank else []
    out_shape = [shape[d] for d in dims]
    a, b = buffer_memory_order(shape, src.layout), buffer_memory_order(out_shape, out.layout)
    return a is not None and b is not None and a == tuple(dims[k] for k in b)


def free_permute_pairs(node: Node, src_set, out_set) -> list[tuple[TensorRepr, TensorRepr]]:
    """(self, out) representation pairs of `src_set` x `out_set` in which permute node `node` is free."""
    (_, src), = [(n, v) for n, v in node.tensor_args()]
    dims = node.arg("dims")
    return [(a, b) for a in src_set for b in out_set if permute_is_free(src.shape, dims, src.dtype, a, b)]


def fold_free_permutes(problem: Problem, assignment: Assignment) -> list[Node]:
    """Mark folded every permute whose input holds its slot's representation (no transition
    before it) and whose (self, out) slots are a free pair."""
    folded = []
    for node in problem.graph.device_nodes():
        if node.transition or node.op.name != "permute_copy":
            continue
        src = node.arg("self")
        r_in, r_out = assignment.slots[(node, "self")], assignment.slots[(node, "out")]
        if assignment.values.get(src) == r_in and \
                permute_is_free(src.shape, node.arg("dims"), src.dtype, r_in, r_out):
            node.folded = True
            folded.append(node)
    return folded
