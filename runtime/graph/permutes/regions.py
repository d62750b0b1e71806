"""Elementwise regions: connected ops that commute with a permute, and how to move one out of them.

An op commutes with permute P when computing it on permuted operands equals permuting what it
computes on the original ones, once its dim arguments are renamed (dim d of the permuted tensor is
dim P[d] of the original):

    pointwise unary / binary / where / masked_fill, quantize / dequantize per tensor,
    same-shape identity ops (alias, clone)       no dim argument
    softmax, log_softmax; cat, slice             `dim` -> P[dim]
    reductions that keep their rank (keepdim)    `dim` (a list) -> [P[d] ...]

`find_region` grows such a region from one permute: entered only through permutes P (whose
outputs nothing else reads), left only through permutes P^-1, never a graph output. Operands from
elsewhere (biases, scales) broadcast against the permuted shape; `Region.rewrite` gives them the
original order: a scalar-like operand as it is, a constant as a derived constant (`reshaped` or
`permuted`, runtime/graph/derived.py), another tensor through a view when only size-1 dims move.
Anything else and the region is refused: the local pass gives up (the global placement may not).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..ir import Derivation, Node, PlanGraph, Role, Value
from .commuting import DIM_TEMPLATES, ELEMENTWISE_TEMPLATES
from .dims import inverse, is_view, moves_only_unit_dims, normalize, permute_dims, permuted
from .surgery import (bypass, fresh_name, insert_before, is_output, new_value, remove_node, replace_node,
                      runs_on_device, view_node)

# Templates whose ops compute each output element from the same position of their operands
# (the global placement's table, commuting.py), and those with one `dim` the local passes rename
# (a subset of commuting.DIM_TEMPLATES: reductions are handled below, flip's `dims` list is not).
POINTWISE = frozenset(ELEMENTWISE_TEMPLATES)
DIM_ARG = frozenset(DIM_TEMPLATES) - {"reduce", "flip"}
REDUCTION = "reduce"  # `dim` (int, list or None) renamed when the rank is kept


def commutes(node: Node, rank: int) -> bool:
    """Whether `node` (every output of rank `rank`) commutes with a permute of that rank."""
    if not node.on_device or not node.outputs or any(len(v.shape) != rank for _, v in node.outputs):
        return False
    if any(len(v.shape) > rank for _, v in node.tensor_args()):
        return False
    template = node.op.template
    if template in POINTWISE or template in DIM_ARG:
        return True
    if template == REDUCTION:
        return all(len(v.shape) == rank for _, v in node.tensor_args())
    return is_view(node) and node.outputs[0][1].shape == next(node.tensor_args())[1].shape


def remapped_args(node: Node, dims: tuple[int, ...]) -> list:
    """The node's arguments with its dim arguments renamed for the original order; tensors as
    they are."""
    rank = len(dims)
    template = node.op.template
    args = []
    for name, v in node.args:
        if name == "dim" and template in DIM_ARG and isinstance(v, int):
            v = dims[normalize([v], rank)[0]]
        elif name == "dim" and template == REDUCTION and v is not None:
            v = dims[normalize([v], rank)[0]] if isinstance(v, int) else [dims[d] for d in normalize(v, rank)]
        args.append((name, v))
    if template in DIM_ARG and node.arg("dim") is None:  # torch's default dim 0 (cat, slice)
        args.append(("dim", dims[0]))
    return args


@dataclass
class Region:
    dims: tuple[int, ...]  # P: the permute every entry applies
    nodes: list[Node] = field(default_factory=list)  # each after the region nodes it reads
    entries: list[Node] = field(default_factory=list)  # permutes P whose outputs only the region reads
    exits: list[Node] = field(default_factory=list)  # permutes P^-1 of region values
    operands: list[Value] = field(default_factory=list)  # other tensors the region reads

    def rewrite(self, graph: PlanGraph) -> bool:
        """Compute the region in the original order and drop its entries and exits; False (graph
        untouched) when an operand or a renamed op cannot be had on the device."""
        inv = inverse(self.dims)
        mapping: dict[Value, Value] = {e.outputs[0][1]: e.args[0][1] for e in self.entries}
        views, constants = [], []
        for w in self.operands:
            mapped = self._operand(graph, w, inv, views, constants)
            if mapped is None:
                return False
            mapping[w] = mapped
        replacements = []
        for node in self.nodes:
            args = [(n, _map(v, mapping)) for n, v in remapped_args(node, self.dims)]
            outputs = []
            for oname, v in node.outputs:
                nv = new_value(v.name, permuted(v.shape, inv), v)
                mapping[v] = nv
                outputs.append((oname, nv))
            new = Node(node.name, node.target, node.op, args, outputs, fx=node.fx, fused=list(node.fused))
            for _, v in outputs:
                v.producer = new
            if not runs_on_device(new):
                return False
            replacements.append((node, new))
        for user, view in views:
            insert_before(graph, user, view)
        graph.constants.extend(constants)
        for node, new in replacements:
            replace_node(graph, node, new, mapping)
        for e in self.exits:
            bypass(graph, e, mapping[e.args[0][1]])
        for e in self.entries:
            remove_node(graph, e)
        return True

    def _operand(self, graph: PlanGraph, w: Value, inv, views: list, constants: list) -> Value | None:
        """`w` (broadcast against the permuted shape) for the original order, or None."""
        rank = len(inv)
        padded = (1,) * (rank - len(w.shape)) + tuple(w.shape)
        target = permuted(padded, inv)
        if _broadcasts_same(w.shape, target):
            return w
        name = fresh_name(graph, f"{w.name}_permuted")
        if w.role is Role.CONST:
            if moves_only_unit_dims(padded, inv):
                c = _derived(name, target, w, "reshaped", size=target)
            else:
                c = _derived(name, target, w, "permuted", rank_shape=padded, dims=inv)
            constants.append(c)
            return c
        if not moves_only_unit_dims(padded, inv):
            return None
        readers = {id(n) for n in self.nodes if any(v is w for _, v in n.tensor_args())}
        user = next(n for n in graph.nodes if id(n) in readers)  # the first: the view goes before it
        view = view_node(name, w, new_value(name, target, w))
        if not runs_on_device(view):
            return None
        views.append((user, view))
        return view.outputs[0][1]


def find_region(graph: PlanGraph, seed: Node) -> Region | None:
    """The region entered through permute `seed`, or None when it is not one the local pass can
    move the permutes out of (a graph output, a reader that does not commute, a join with a
    tensor in another order)."""
    dims = permute_dims(seed)
    if dims is None:
        return None
    rank, inv = len(dims), inverse(dims)
    region = Region(dims)
    members: set[Node] = set()
    entries: set[Node] = {seed}
    exits: set[Node] = set()
    operands: dict[Value, None] = {}
    values = [seed.outputs[0][1]]
    pending: list[Node] = []
    while values or pending:
        if values:
            v = values.pop()
            if is_output(graph, v):
                return None
            for user in v.users:
                if user in members or user in exits:
                    continue
                if permute_dims(user) == inv:
                    exits.add(user)
                elif commutes(user, rank):
                    members.add(user)
                    pending.append(user)
                    values.extend(o for _, o in user.outputs)
                else:
                    return None
            continue
        node = pending.pop()
        for _, w in node.tensor_args():
            p = w.producer
            if p in members or p in entries:
                continue
            if p is not None and permute_dims(p) == dims:
                entries.add(p)
                values.append(w)
            else:
                operands[w] = None
    region.nodes = _topological(members)
    region.entries = list(entries)
    region.exits = list(exits)
    region.operands = list(operands)
    return region


def _topological(members: set[Node]) -> list[Node]:
    """The region's nodes, each after the region nodes it reads (without scanning the graph)."""
    done: dict[Node, None] = {}

    def visit(node: Node) -> None:
        stack = [(node, False)]
        while stack:
            n, ready = stack.pop()
            if n in done:
                continue
            if ready:
                done[n] = None
                continue
            stack.append((n, True))
            stack.extend((v.producer, False) for _, v in n.tensor_args() if v.producer in members)

    for node in members:
        visit(node)
    return list(done)


def _map(v, mapping: dict):
    if isinstance(v, Value):
        return mapping.get(v, v)
    if isinstance(v, list):
        return [_map(x, mapping) for x in v]
    return v


def _broadcasts_same(shape, target) -> bool:
    """Whether `shape` broadcast to the region's rank is `target` (so the operand needs nothing)."""
    padded = (1,) * (len(target) - len(shape)) + tuple(shape)
    return len(shape) <= len(target) and padded == tuple(target)


def _derived(name: str, shape, source: Value, recipe: str, **params) -> Value:
    """A derived constant not yet in the graph (added only when the region is rewritten)."""
    params = {k: tuple(v) if isinstance(v, (list, tuple)) else v for k, v in params.items()}
    return Value(name, tuple(shape), source.dtype, Role.CONST,
                 derive=Derivation(recipe, (source,), tuple(sorted(params.items()))))
