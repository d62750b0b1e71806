r"""Insert one `to_layout` node per (value, target representation), shared by its consumers.

Before:  v --> consumer_a (wants CP)      After:  v --> to_layout(v, CP) --> consumer_a
         v --> consumer_b (wants CP)                                   \--> consumer_b
Transition nodes are marked (`Node.transition`), so they are never mistaken for a user's clone
and redundant-op removal never folds them. Constants get no transition: they are prepacked into
every representation their consumers want, once, at load.
"""

from __future__ import annotations

from texelflow.generated.ops import OPS

from .ir import Node, Role, Value
from .problem import Assignment, Problem
from .repr import TensorRepr


def insert_transitions(problem: Problem, assignment: Assignment) -> list[Node]:
    graph = problem.graph
    needed = assignment.transitions(problem)
    created: list[Node] = []
    for (value, want), consumers in needed.items():
        first = min(graph.nodes.index(n) for n, _ in consumers)
        name = f"to_layout_{value.name}_{want.storage.name.lower()}_{want.layout.name.lower()}"
        node = Node(name, "texelflow.to_layout.default", OPS["to_layout"], [("self", value)], [])
        out = Value(name, value.shape, value.dtype, Role.NODE, producer=node)
        node.outputs.append(("out", out))
        node.transition = True
        value.users.append(node)
        graph.nodes.insert(first, node)
        for consumer, slot in consumers:
            _rewire(consumer, slot, value, out)
        assignment.values[out] = want
        assignment.slots[(node, "self")] = assignment.values[value]
        assignment.slots[(node, "out")] = want
        problem.repsets[node] = _transition_repsets(node, assignment.values[value], want)
        created.append(node)
    return created


def _rewire(consumer: Node, slot: str, old: Value, new: Value) -> None:
    for i, (name, v) in enumerate(consumer.args):
        if name != slot:
            continue
        if v is old:
            consumer.args[i] = (name, new)
        elif isinstance(v, list):
            consumer.args[i] = (name, [new if x is old else x for x in v])
    while consumer in old.users:
        old.users.remove(consumer)
    new.users.append(consumer)


def _transition_repsets(node: Node, src: TensorRepr, dst: TensorRepr):
    from .op_repsets import OpRepSets
    from .repr import TensorRepSet

    return OpRepSets(node.op, {"self": TensorRepSet.of(src), "out": TensorRepSet.of(dst)}, ())
