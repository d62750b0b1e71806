"""Fold identity ops (view, reshape, flatten, clone, alias, ...) that move no data.

An identity node whose input and output hold the same representation, and whose output shape
leaves every element where the input's shape had it (`same_placement`), is the same memory under
another torch shape: it is marked folded (no dispatch; the runtime binds its output to its
input's memory and reads it with the output's own sizes). Int8 identity nodes fold the same way.
Transitions are never folded. A reshape that moves elements in memory (a texture whose W or H
changes, a channels-packed buffer whose C changes) stays a copy dispatch: its words or texels
really move.
"""

from __future__ import annotations

from typing import Sequence

from texelflow.generated.layouts import LAYOUT_INFO, STORAGE_INFO
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
