"""Kernels that take their tensors in another dim order, absorbing the permutes around them.

After the permute optimisation a model written channels-last (ConvNeXt: [N, H, W, C] blocks whose
depthwise conv runs in NCHW) still has a permute to NCHW before each depthwise conv and one back
after it: two copies of the whole activation per block. A 3x3 / 5x5 / 7x7 stride-1 depthwise conv
(`conv2d_dwK_s1`) reads and writes channels-packed textures, whose texels hold the 4 channels of
one pixel; an [N, H, W, C] tensor in a width-packed texture holds the very same texels at other
positions. So `conv2d_dwK_s1_nhwc` (shaders/conv2d_dw_s1.glsl.j2 with NHWC "1") computes the same
conv on the [N, H, W, C] tensors, and where a depthwise conv's input is a permute (0, 3, 1, 2) and
its only reader the permute (0, 2, 3, 1), it takes both in: the conv reads the permute's input and
writes the second permute's output. The first permute stays where something else reads it.
"""

from __future__ import annotations

from typing import Sequence

from texelflow.generated.layouts import TEXTURE_LIMITS
from texelflow.generated.ops import OPS

from ..ir import Node, PlanGraph
from ..lowering import partition_reason
from .surgery import is_output, out, remove_node, replace_node

NHWC_FORMS = {f"conv2d_dw{k}_s1": f"conv2d_dw{k}_s1_nhwc" for k in (3, 5, 7)}
TO_NCHW = (0, 3, 1, 2)
TO_NHWC = (0, 2, 3, 1)


def _permute_dims(node: Node | None) -> tuple[int, ...] | None:
    """The dims of a device permute_copy of a rank-4 tensor (negative ones normalised), else None."""
    if node is None or not node.on_device or node.op.name != "permute_copy" or len(out(node).shape) != 4:
        return None
    return tuple(int(d) % 4 for d in node.value("dims"))


def absorb_permutes(graph: PlanGraph, limits: Sequence[int] = TEXTURE_LIMITS) -> int:
    """Give each depthwise conv between a permute to NCHW and one back its NHWC form (in place);
    returns how many convs changed."""
    changed = 0
    for conv in list(graph.nodes):
        if not conv.on_device or conv.op is None or conv.op.name not in NHWC_FORMS:
            continue
        x = conv.arg("input")
        before, result = x.producer, out(conv)
        after = result.users[0] if len(result.users) == 1 and not is_output(graph, result) else None
        if _permute_dims(before) != TO_NCHW or _permute_dims(after) != TO_NHWC:
            continue
        op = OPS[NHWC_FORMS[conv.op.name]]
        args = [("input", before.arg("self"))] + [(k, v) for k, v in conv.args if k != "input"]
        nhwc = Node(conv.name, op.targets[0], op, args, [("out", out(after))])
        if partition_reason(nhwc, limits):
            continue
        nhwc.fused = conv.fused + [f"reads and writes [N, H, W, C]: permutes '{before.name}' and '{after.name}' "
                                   "taken in"]
        remove_node(graph, after)
        replace_node(graph, conv, nhwc)
        graph.fx_inputs.pop(nhwc, None)  # no CPU form: torch's conv reads NCHW
        if not x.users and not is_output(graph, x):
            remove_node(graph, before)
        changed += 1
    return changed
