"""Graph surgery for the permute passes: swap, remove and insert nodes, make a value's readers
read an equal one, and build device permute / view nodes. Users lists and `graph.fx_inputs` (what
a CPU fallback reads) stay consistent; graph outputs are never rewired (a caller checks
`is_output` first and keeps the value, e.g. as a view)."""

from __future__ import annotations

from texelflow.generated.layouts import TEXTURE_LIMITS
from texelflow.generated.ops import OPS

from ..ir import Node, PlanGraph, Role, Value
from ..lowering import partition_reason

PERMUTE_TARGET = "aten.permute_copy.default"
VIEW_TARGET = "aten.view_copy.default"


def is_output(graph: PlanGraph, v: Value) -> bool:
    return v in graph.outputs  # (values compare by identity: eq=False)


def only_input(node: Node) -> Value:
    (_, v), = node.tensor_args()
    return v


def out(node: Node) -> Value:
    return node.outputs[0][1]


def replace_node(graph: PlanGraph, old: Node, new: Node, remap: dict | None = None) -> None:
    """Put `new` where `old` was; inputs count `new` as their user, outputs name it their
    producer. `remap` (old value -> new value) updates what a CPU fallback of it would read."""
    graph.nodes[graph.nodes.index(old)] = new
    recorded = graph.fx_inputs.pop(old, None)
    if recorded is not None:
        graph.fx_inputs[new] = _mapped(recorded, remap or {})
    _drop_uses(old)
    for _, v in new.tensor_args():
        v.users.append(new)
    for _, v in old.outputs:
        v.producer = None
    for _, v in new.outputs:
        v.producer = new


def remove_node(graph: PlanGraph, node: Node) -> None:
    graph.nodes.remove(node)
    graph.fx_inputs.pop(node, None)
    _drop_uses(node)
    for _, v in node.outputs:
        v.producer = None


def in_graph(node: Node) -> bool:
    """Whether `node` is still in the graph (neither removed nor replaced by these helpers, which
    unset a dropped node's outputs' producer): O(1), for passes sweeping a snapshot of the nodes."""
    return all(v.producer is node for _, v in node.outputs)


def insert_before(graph: PlanGraph, anchor: Node, node: Node) -> None:
    graph.nodes.insert(graph.nodes.index(anchor), node)
    graph.fx_inputs[node] = [v for _, v in node.tensor_args()]
    for _, v in node.tensor_args():
        v.users.append(node)


def substitute(graph: PlanGraph, old: Value, new: Value) -> None:
    """Every reader of `old` reads `new` (same shape, same elements) instead."""
    if is_output(graph, old):
        raise ValueError(f"'{old.name}' is a graph output: it cannot be replaced by '{new.name}'")
    if tuple(old.shape) != tuple(new.shape):
        raise ValueError(f"'{old.name}' {list(old.shape)} cannot be replaced by '{new.name}' {list(new.shape)}")
    for user in list(dict.fromkeys(old.users)):
        reads = sum(1 for _, v in user.tensor_args() if v is old)
        user.args = [(n, _mapped(v, {old: new})) for n, v in user.args]
        if user in graph.fx_inputs:
            graph.fx_inputs[user] = _mapped(graph.fx_inputs[user], {old: new})
        new.users.extend([user] * reads)
    old.users.clear()


def fresh_name(graph: PlanGraph, base: str) -> str:
    taken = {n.name for n in graph.nodes} | {v.name for v in graph.values()}
    name, i = base, 1
    while name in taken:
        name, i = f"{base}_{i}", i + 1
    return name


def view_node(name: str, x: Value, result: Value) -> Node:
    """A device view_copy of `x` as `result` (same numel and dtype): free when planning folds it."""
    node = Node(name, VIEW_TARGET, OPS["view_copy"], [("self", x), ("size", list(result.shape))], [("out", result)])
    result.producer = node
    return node


def permute_node(name: str, x: Value, dims, result: Value) -> Node:
    node = Node(name, PERMUTE_TARGET, OPS["permute_copy"], [("self", x), ("dims", list(dims))], [("out", result)])
    result.producer = node
    return node


def new_value(name: str, shape, like: Value) -> Value:
    return Value(name, tuple(shape), like.dtype, Role.NODE)


def runs_on_device(node: Node) -> bool:
    return partition_reason(node, TEXTURE_LIMITS) is None


def as_view(graph: PlanGraph, node: Node) -> bool:
    """Replace a one-input node whose output holds its input's elements in row-major order (an
    identity permute, a permute of size-1 dims) by a view of that input. False when the view
    could not run on the device (the node is then left as it was)."""
    x, result = only_input(node), out(node)
    view = view_node(node.name, x, result)
    if not runs_on_device(view):
        result.producer = node
        return False
    replace_node(graph, node, view)
    return True


def bypass(graph: PlanGraph, node: Node, x: Value) -> None:
    """Drop `node` whose output equals `x` element for element (same shape): its readers read `x`.
    A graph output keeps its value: the node then becomes a view of `x` (free when it folds)."""
    result = out(node)
    if is_output(graph, result):
        replace_node(graph, node, view_node(node.name, x, result))
        return
    substitute(graph, result, x)
    remove_node(graph, node)


def _drop_uses(node: Node) -> None:
    for _, v in node.tensor_args():
        if node in v.users:
            v.users.remove(node)


def _mapped(v, mapping: dict):
    if isinstance(v, Value):
        return mapping.get(v, v)
    if isinstance(v, list):
        return [_mapped(x, mapping) for x in v]
    if isinstance(v, tuple):
        return tuple(_mapped(x, mapping) for x in v)
    return v
