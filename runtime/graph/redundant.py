"""Fold identity ops (view, clone, alias, clone_dim_order, ...) that move no data.

An identity node whose input and output hold the same representation and the same WHCN sizes
is the same memory under another torch shape: it is marked folded (no dispatch; the runtime
aliases its output to its input). Int8 identity nodes fold the same way. Transitions are never
folded. A reshape that changes WHCN sizes stays a copy: its texels or words really move.
"""

from __future__ import annotations

from texelflow.shaders.geometry import whcn_sizes

from .ir import Node
from .problem import Assignment, Problem


def fold_identity_ops(problem: Problem, assignment: Assignment) -> list[Node]:
    folded = []
    for node in problem.graph.device_nodes():
        if node.transition or not node.op.is_identity:
            continue
        (in_name, src), = [(n, v) for n, v in node.tensor_args()]
        out_name, out = node.outputs[0]
        same_repr = assignment.slots[(node, in_name)] == assignment.slots[(node, out_name)]
        if same_repr and assignment.values.get(src) == assignment.slots[(node, in_name)] and \
                whcn_sizes(src.shape) == whcn_sizes(out.shape):
            node.folded = True
            folded.append(node)
    return folded
