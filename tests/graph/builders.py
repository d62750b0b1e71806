"""Build planning graphs inline from registry entries (real ones, or copies with other repsets)."""

from __future__ import annotations

import dataclasses

from texelflow.generated.ops import OPS, OpEntry
from texelflow.runtime.graph.ir import PlanGraph, Value


def variant_of(base: str, name: str, repset: str) -> OpEntry:
    """A copy of registry op `base` whose every tensor takes `repset` (a test-only op)."""
    op = OPS[base]
    return dataclasses.replace(
        op,
        name=name,
        args=tuple(dataclasses.replace(a, repset=repset) if a.repset else a for a in op.args),
        outputs=tuple(dataclasses.replace(o, repset=repset) for o in op.outputs),
    )


class Builder:
    """g = Builder(); x = g.input([1,4,16,16]); y = g.unary("relu", x); g.output(y)."""

    def __init__(self):
        self.graph = PlanGraph()
        self.count = 0

    def _name(self, base: str) -> str:
        self.count += 1
        return f"{base}_{self.count}"

    def input(self, shape, dtype: str = "float32") -> Value:
        return self.graph.add_input(self._name("x"), shape, dtype)

    def const(self, shape, dtype: str = "float32") -> Value:
        return self.graph.add_const(self._name("w"), shape, dtype)

    def node(self, op: OpEntry | str, args: list[tuple[str, object]], shape=None) -> Value:
        op = OPS[op] if isinstance(op, str) else op
        first = next(v for _, v in args if isinstance(v, Value))
        out_shape = shape if shape is not None else first.shape
        outs = [(o.name, out_shape, first.dtype) for o in op.outputs]
        node = self.graph.add_node(self._name(op.name), op.targets[0], op, args, outs)
        return node.outputs[0][1]

    def unary(self, op, x: Value) -> Value:
        return self.node(op, [("self", x)])

    def binary(self, op, x: Value, y: Value) -> Value:
        other = "exponent" if (op if isinstance(op, str) else op.name) == "pow" else "other"
        return self.node(op, [("self", x), (other, y)])

    def output(self, *values: Value) -> PlanGraph:
        self.graph.outputs.extend(values)
        return self.graph
