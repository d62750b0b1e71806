"""Which device ops commute with permutes, and how they run in another dim order.

An op commutes with a permute when running it on permuted inputs, with its dim arguments
remapped, gives the permuted output: elementwise ops (broadcasting operands of the same rank
align dim by dim; masked_fill), scalar ops, quantize / dequantize per tensor, same-shape identity
ops, softmax along a dim, keepdim reductions, cat, slice and flip along their dims. The global placement
(placement.py) may run such an op in any dim order; every other op pins its tensors' orders.

Orders are tuples over a region's canonical dims: a tensor in order `T` holds canonical dim
`T[i]` as its dim i. A permute `y = x.permute(p)` gives `T_y[i] = T_x[p[i]]`.
"""

from __future__ import annotations

from ..ir import Node, Role, Value

PERMUTE = "permute_copy"
ELEMENTWISE_TEMPLATES = ("unary", "binary", "where", "masked_fill", "quantize", "dequantize")
SAME_SHAPE_COPIES = ("alias_copy", "clone", "contiguous", "detach", "lift_fresh_copy")  # no shape or dim args
DIM_TEMPLATES = {"softmax": "dim", "reduce": "dim", "cat": "dim", "slice": "dim", "flip": "dims"}  # template -> dim arg


def is_permute(node: Node) -> bool:
    """A device permute_copy of one tensor with explicit dims: an edge between two orders."""
    if not node.on_device or node.op.name != PERMUTE:
        return False
    x, dims = node.arg("self"), node.arg("dims")
    return isinstance(x, Value) and isinstance(dims, (list, tuple)) and sorted(d % max(len(x.shape), 1) for d in dims) \
        == list(range(len(x.shape)))


def permute_dims(node: Node) -> tuple[int, ...]:
    rank = len(node.arg("self").shape)
    return tuple(d % rank for d in node.arg("dims"))


def commuting_rank(node: Node) -> int | None:
    """The rank R an op runs in when it may run in any dim order (its outputs have rank R, its
    computed inputs too; constants of rank <= R broadcast), else None: the op pins its orders."""
    if not node.on_device or node.transition or not node.outputs:
        return None
    op = node.op
    rank = len(node.outputs[0][1].shape)
    if rank < 2 or any(len(v.shape) != rank for _, v in node.outputs):
        return None
    if op.template in ELEMENTWISE_TEMPLATES:
        pass
    elif op.name in SAME_SHAPE_COPIES:
        pass  # (views and reshapes name shapes or dims: they pin)
    elif op.template == "reduce":
        if not node.value("keepdim"):
            return None
    elif op.template not in DIM_TEMPLATES:
        return None
    for _, v in node.tensor_args():
        if len(v.shape) != rank and not (v.role is Role.CONST and len(v.shape) < rank):
            return None  # a computed operand of another rank: its dims do not line up
    return rank


def members(node: Node, rank: int) -> list[Value]:
    """The computed tensors of a commuting op that share its order (constants are remapped)."""
    return [v for _, v in node.tensor_args() if v.role is not Role.CONST and len(v.shape) == rank]


def relative(source: tuple[int, ...], target: tuple[int, ...]) -> tuple[int, ...]:
    """The permute dims taking a tensor in order `source` to order `target`."""
    where = {c: i for i, c in enumerate(source)}
    return tuple(where[c] for c in target)


def remap_dim(d: int, rank: int, current: tuple[int, ...], target: tuple[int, ...]) -> int:
    """Dim `d` of a tensor in order `current`, as a dim of the same tensor in order `target`."""
    return target.index(current[d % rank])


def remapped_args(node: Node, rank: int, current, target) -> list[tuple[str, object]]:
    """`node`'s arguments with its dim argument remapped from `current` to `target` order
    (tensors untouched: the caller substitutes them)."""
    dim_arg = DIM_TEMPLATES.get(node.op.template)
    out = []
    for name, v in node.args:
        if name == dim_arg and v is not None:
            if isinstance(v, (list, tuple)):
                v = [remap_dim(d, rank, current, target) for d in v]
            else:
                v = remap_dim(v, rank, current, target)
        out.append((name, v))
    return out


def constant_as(v: Value, rank: int, current, target) -> tuple[int, ...] | None:
    """The shape constant `v` (broadcast as rank `rank` in order `current`) takes in order
    `target`, when that is a reshape of it (its non-1 dims keep their relative order), else None."""
    shape = (1,) * (rank - len(v.shape)) + tuple(v.shape)
    q = relative(current, target)
    new = tuple(shape[i] for i in q)
    kept = [i for i in q if shape[i] != 1]
    return new if kept == sorted(kept) else None
