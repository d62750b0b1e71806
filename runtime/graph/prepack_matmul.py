"""Matrix-product kernel choice and weight prepacking (issue 13: the tiled matmul family).

A device `linear` whose weight is a constant becomes `linear_packed` (ops.yaml), its weight a
derived constant (derived.py's recipe mechanism) computed once at load:

    linear(x, W[N, K], b)  ->  linear_packed(x, Wp[K4 * 4, N16 * 16], b, out_features=N)

or `linear_packed_gemv` (same arguments) when x has one row (the product of its leading dims is
1: a classifier, a decoder step), where 8-row tiles would compute 7 rows for nothing.

Wp is W transposed, zero-padded to whole texels along K and whole 16-column tiles along N, so
the kernel (shaders/linear_packed.glsl.j2) reads one texel / aligned vec4 per 4 output columns
at one k, never clamps a column and never needs a K tail for the weight. The choice is made here,
once per node, so no kernel pays at run time for a path it does not take; the planner then puts
Wp in a texture when it fits the device's limits (faster loads on lavapipe), else in a buffer.
(A weight computed at run time never reaches here: lowering decomposes such a linear into mm.)
"""

from __future__ import annotations

from typing import Sequence

from texelflow.generated.layouts import TEXTURE_LIMITS
from texelflow.generated.ops import OPS

from .derived import recipe
from .ir import Node, PlanGraph, Role, Value

PACKED_LINEAR = "linear_packed"
PACKED_GEMV = "linear_packed_gemv"  # one row: one invocation per output texel (its own template)
TILE_N = 16  # output columns per invocation of linear_packed (its template's tile)


def padded(n: int, to: int) -> int:
    """n rounded up to a multiple of `to`."""
    return -(-n // to) * to


@recipe
def linear_weight_kn(source):
    """torch's linear weight [N, K] as linear_packed's [K4 * 4, N16 * 16]: row k holds input k's
    weights for every output column; padding rows and columns are zero."""
    import torch.nn.functional as F

    n, k = source.shape
    return F.pad(source.t(), (0, padded(n, TILE_N) - n, 0, padded(k, 4) - k)).contiguous()


def choose_matmul_kernels(graph: PlanGraph, limits: Sequence[int] = TEXTURE_LIMITS) -> list[Node]:
    """Retarget every device `linear` with a constant 2-D float32 weight to linear_packed (or
    linear_packed_gemv for one row); returns the new nodes. A node the new op would not take (its partition check) is left as it was."""
    from .fusion import retarget  # graph surgery shared with the conv kernel choice

    made = []
    for node in list(graph.nodes):
        if not node.on_device or node.op.name != "linear":
            continue
        weight = node.arg("weight")
        if not isinstance(weight, Value) or weight.role is not Role.CONST or len(weight.shape) != 2 \
                or weight.dtype != "float32":
            continue
        new, packed = _packed_linear(graph, node, weight)
        if retarget(graph, node, new, packed, limits):
            made.append(new)
    return made


def _packed_linear(graph: PlanGraph, node: Node, weight: Value) -> tuple[Node, Value]:
    n, k = weight.shape
    packed = graph.add_derived(f"{weight.name}.kn", (padded(k, 4), padded(n, TILE_N)), weight.dtype,
                               "linear_weight_kn", (weight,))
    rows = 1
    for d in node.arg("input").shape[:-1]:
        rows *= d
    op = OPS[PACKED_GEMV if rows == 1 else PACKED_LINEAR]
    args = [("input", node.arg("input")), ("weight", packed), ("bias", node.arg("bias")), ("out_features", n)]
    new = Node(node.name, op.targets[0], op, args, list(node.outputs))
    new.fused = list(node.fused) + [f"{op.name} kernel, weight prepacked [K, N] (from linear)"]
    return new, packed


# ---- torch reference (the kernel tests' and the generic registry test's) -----------------------------
def linear_packed_reference(input, weight, bias=None, out_features=1):
    """What linear_packed computes: the input zero-padded to the prepacked weight's rows, times its
    first `out_features` columns, plus the bias (a NaN or inf in a padding row then reaches the
    output exactly as the kernel's 0 * weight does)."""
    import torch.nn.functional as F

    x = F.pad(input, (0, weight.shape[0] - input.shape[-1]))
    y = x @ weight[:, :out_features]
    return y + bias if bias is not None else y
