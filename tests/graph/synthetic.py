"""Planning graphs built in code from registry ops: for tests, property checks and benchmarks.

`GraphBuilder` appends nodes of real registry entries (or copies with other repsets) without
torch.export. `model_like(n)` stacks blocks shaped like vision and transformer models (conv,
residual adds, pooling, layer norm, linear) until it has n nodes; `random_dag(n)` wires registry
ops at random, skip connections included, as a stress test.

It lives with the tests, not in the package: nothing at run time builds graphs this way. The
planner benchmark (bench/planner.py) imports it as `tests.graph.synthetic`, from the repository
root it already puts on sys.path for the acceptance cases.
"""

from __future__ import annotations

import dataclasses
import random

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


class GraphBuilder:
    """g = GraphBuilder(); x = g.input([1,4,16,16]); y = g.unary("relu", x); g.output(y)."""

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
        out_shape = tuple(shape) if shape is not None else first.shape
        outs = [(o.name, out_shape, first.dtype) for o in op.outputs]
        node = self.graph.add_node(self._name(op.name), op.targets[0], op, args, outs)
        return node.outputs[0][1]

    def unary(self, op, x: Value) -> Value:
        return self.node(op, [("self", x)])

    def binary(self, op, x: Value, y: Value) -> Value:
        other = "exponent" if (op if isinstance(op, str) else op.name) == "pow" else "other"
        return self.node(op, [("self", x), (other, y)])

    def conv(self, x: Value, channels: int) -> Value:
        w = self.const((channels, x.shape[1], 3, 3))
        shape = (x.shape[0], channels, x.shape[2], x.shape[3])
        return self.node("conv2d", [("input", x), ("weight", w), ("padding", [1, 1])], shape)

    def linear(self, x: Value, features: int) -> Value:
        w = self.const((features, x.shape[-1]))
        return self.node("linear", [("input", x), ("weight", w)], x.shape[:-1] + (features,))

    def view(self, x: Value, shape) -> Value:
        return self.node("view_copy", [("self", x), ("size", list(shape))], shape)

    def output(self, *values: Value) -> PlanGraph:
        self.graph.outputs.extend(values)
        return self.graph


def model_like(n_nodes: int, seed: int = 0) -> PlanGraph:
    """Blocks of the kind vision and transformer models are made of, to about n_nodes nodes."""
    rng = random.Random(seed)
    g = GraphBuilder()
    x = g.input((1, 16, 16, 16))
    while len(g.graph.nodes) < n_nodes:
        kind = rng.choice(["conv", "conv", "transformer", "pool"])
        if kind == "conv":  # conv -> add(residual) -> relu
            y = g.conv(x, 16)
            x = g.unary("relu", g.binary("add", y, x))
        elif kind == "pool":
            x = g.node("max_pool2d", [("self", x), ("kernel_size", [1, 1])])
        else:  # tokens: view -> layer_norm -> linear -> gelu -> linear -> add -> view back
            t = g.view(x, (256, 16))
            h = g.node("layer_norm", [("input", t), ("normalized_shape", [16])])
            h = g.linear(g.unary("gelu", g.linear(h, 32)), 16)
            x = g.view(g.binary("add", h, t), (1, 16, 16, 16))
    return g.output(x)


def random_dag(n_nodes: int, seed: int = 0) -> PlanGraph:
    """Registry ops wired at random (with skip connections): a stress test, not a model."""
    rng = random.Random(seed)
    g = GraphBuilder()
    values = [g.input((1, 16, 16, 16))]
    while len(g.graph.nodes) < n_nodes:
        x = values[-1] if rng.random() < 0.7 else rng.choice(values[-20:])
        r = rng.random()
        if r < 0.05:
            v = g.conv(x, 16)
        elif r < 0.1:
            v = g.linear(x, 16)
        elif r < 0.13:
            v = g.node("max_pool2d", [("self", x), ("kernel_size", [1, 1])])
        elif r < 0.4:
            v = g.binary(rng.choice(["add", "mul"]), x, rng.choice(values[-10:]))
        else:
            v = g.unary(rng.choice(["relu", "sigmoid", "clone", "tanh"]), x)
        values.append(v)
    return g.output(values[-1])
