"""Size-1 dims out of a buffer permute's way, after the placement: the last step of
`optimize_permutes`.

The permute kernel moves whole vec4 words only where the innermost dim of its input is that of
its output (shape class `packed_permute`). A size-1 dim standing last on either side hides that:
Swin's window partition reached the kernel as (8, 7, 8, 7, 96, 1) -> (1, 8, 8, 7, 7, 96), whose
96 channels stay together, but element by element through the general index math (1.1-2.2 ms a
permute of 1.2 MB on lavapipe). Such a permute becomes view -> permute of the dims of size > 1 ->
view: in width-packed buffers of one element per word a view that only drops or adds size-1 dims
keeps every element where it was, so planning folds both views. Only at rank > 4 (buffers only:
a texture's view would be a copy), and only where the squeezed permute keeps its innermost dim.
"""

from __future__ import annotations

from ..ir import PlanGraph
from .dims import permute_dims
from .surgery import (fresh_name, in_graph, insert_before, new_value, only_input, out, permute_node, replace_node,
                      runs_on_device, view_node)

MIN_RANK = 5  # ranks a texture cannot hold


def squeeze_unit_dims(graph: PlanGraph) -> bool:
    """Rewrite every permute that qualifies (module docstring); True when one changed."""
    changed = False
    for node in list(graph.nodes):
        dims = permute_dims(node)
        if dims is None or not in_graph(node):
            continue
        x, y = only_input(node), out(node)
        shape = tuple(x.shape)
        keep = [d for d in range(len(shape)) if shape[d] != 1]
        if len(shape) < MIN_RANK or len(keep) in (0, len(shape)):
            continue
        position = {d: i for i, d in enumerate(keep)}
        squeezed = [position[d] for d in dims if shape[d] != 1]
        already = shape[-1] != 1 and dims[-1] == len(shape) - 1  # its innermost dim maps through as it is
        if squeezed[-1] != len(keep) - 1 or already:
            continue
        x_sq = new_value(fresh_name(graph, f"{node.name}/squeezed_in"), [shape[d] for d in keep], x)
        y_sq = new_value(fresh_name(graph, f"{node.name}/squeezed"), [shape[keep[i]] for i in squeezed], x)
        first = view_node(fresh_name(graph, f"{node.name}/squeeze"), x, x_sq)
        moved = permute_node(fresh_name(graph, f"{node.name}/permute"), x_sq, squeezed, y_sq)
        last = view_node(node.name, y_sq, y)
        if not all(runs_on_device(n) for n in (first, moved, last)):
            y.producer = node
            continue
        replace_node(graph, node, last)
        insert_before(graph, last, first)
        insert_before(graph, last, moved)
        changed = True
    return changed
