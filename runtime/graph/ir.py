"""The planning IR: values (tensors) and nodes, independent of torch.fx.

Passes and planners work on this small graph so they can be tested on graphs built inline or at
random from the registry, without torch.export. `lowering.py` builds it from an ExportedProgram.

A value is produced by a graph input, a constant (weights, lifted scalars: prepacked at load, so
never a run-time transition), or a node. A node runs on the Vulkan device when `op` is set and
`fallback` is None; otherwise it runs in PyTorch on the CPU.
"""

from __future__ import annotations

import enum
import functools
import math
from dataclasses import dataclass, field
from typing import Iterator

from texelflow.generated.layouts import DTYPES
from texelflow.generated.ops import OpEntry


class Role(enum.Enum):
    """Where a value comes from."""

    INPUT = "input"  # a graph input, uploaded at every call
    CONST = "const"  # a weight, buffer or lifted number: prepacked at load, never planned
    NODE = "node"  # an output of a node


@dataclass(frozen=True, eq=False)
class Derivation:
    """How a derived constant is computed from source constants when the program prepacks:
    `recipe` names a function of runtime/graph/derived.py, `sources` are its constant inputs (None
    for an absent optional one), `params` its python arguments. The user's model is never touched."""

    recipe: str
    sources: tuple["Value | None", ...]
    params: tuple[tuple[str, object], ...] = ()

    def describe(self) -> str:
        names = ", ".join(v.name if v is not None else "None" for v in self.sources)
        return f"{self.recipe}({names})"


@dataclass(eq=False)
class Value:
    name: str
    shape: tuple[int, ...]
    dtype: str  # a layouts.yaml dtype name, or a torch dtype name for values Vulkan cannot hold
    role: Role
    producer: "Node | None" = None
    users: list["Node"] = field(default_factory=list)  # in insertion order, one entry per use site
    # Where a constant's data comes from: `source`, its key in the ExportedProgram's state dict or
    # constants; or `literal`, a python number that lowering lifted into a 0-d tensor.
    source: str | None = None
    literal: float | int | None = None
    # A derived constant (no `source`, no `literal`): computed at load from other constants by a
    # recipe of runtime/graph/derived.py (a conv weight with a batch norm folded in, ...).
    derive: "Derivation | None" = None

    @functools.cached_property
    def numel(self) -> int:
        return math.prod(self.shape)

    @functools.cached_property
    def nbytes(self) -> int:
        info = DTYPES.get(self.dtype)
        return self.numel * (info.bytes if info else 4)

    def __repr__(self) -> str:
        return f"Value({self.name}, {list(self.shape)}, {self.dtype})"


@dataclass(eq=False)
class Node:
    name: str
    target: str
    op: OpEntry | None
    args: list[tuple[str, object]]  # (registry or schema arg name, Value | list[Value] | python scalar)
    outputs: list[tuple[str, Value]]
    fallback: str | None = None  # why this node runs on the CPU; None when it runs on Vulkan
    fx: object = None  # the torch.fx node it was lowered from: what a CPU fallback runs
    transition: bool = False  # a to_layout the planner inserted (never a user's clone)
    folded: bool = False  # an identity op whose input and output share memory: no dispatch
    fused: list[str] = field(default_factory=list)  # what the fusion pass merged into this node
    round_bfloat16: bool = False  # a bfloat16 program's result, rounded at its store (bfloat16.fold_roundings)

    @property
    def on_device(self) -> bool:
        return self.op is not None and self.fallback is None

    def tensor_args(self) -> Iterator[tuple[str, Value]]:
        """(arg name, value) for every tensor input, list elements included, in argument order."""
        for name, v in self.args:
            if isinstance(v, Value):
                yield name, v
            elif isinstance(v, (list, tuple)):
                for x in v:
                    if isinstance(x, Value):
                        yield name, x

    def arg(self, name: str, default=None):
        for n, v in self.args:
            if n == name:
                return v
        return default

    # The NodeFacts view that the push derivations and checks of texelflow.shaders.node_rules read.
    def value(self, name: str):
        """An argument (its schema default when the node leaves it out) or an output, by name."""
        for n, v in self.args:
            if n == name:
                return v
        for n, v in self.outputs:
            if n == name:
                return v
        spec = self.op.arg_spec(name) if self.op is not None else None
        return spec.default if spec is not None else None

    def shape(self, name: str) -> tuple[int, ...]:
        return self.value(name).shape

    def __repr__(self) -> str:
        return f"Node({self.name}, {self.target})"


@dataclass(eq=False)
class PlanGraph:
    nodes: list[Node] = field(default_factory=list)  # topological order
    inputs: list[Value] = field(default_factory=list)
    constants: list[Value] = field(default_factory=list)
    outputs: list[Value] = field(default_factory=list)
    # IR node -> the IR values of its fx node's inputs (all_input_nodes order): what a CPU fallback
    # reads, recorded by lowering because a later in-place op may rebind an input's fx name
    fx_inputs: dict = field(default_factory=dict)
    # value name -> the dtype the host holds where the device holds int32: an int64 user input the
    # caller passes, a narrowed int64 constant, or a view of either (lowering's `_device_input_dtype`)
    input_host_dtypes: dict = field(default_factory=dict)
    # Narrowed int64 user inputs assumed to lie in a range (name -> (low, high)), checked at each
    # call, so that the int64 arithmetic read from them fits int32 (lowering's input_bounds)
    input_bounds: dict = field(default_factory=dict)
    # value name -> (least, greatest) element of an integer value lowering bounded (int_ranges.py)
    int_ranges: dict = field(default_factory=dict)
    # A bfloat16 program held as float32 (bfloat16.py's HeldAsFloat32): the caller's bfloat16
    # inputs (by name) and outputs (by position), converted at the call; None for any other
    bfloat16: object = None

    def add_input(self, name: str, shape, dtype: str = "float32") -> Value:
        v = Value(name, tuple(shape), dtype, Role.INPUT)
        self.inputs.append(v)
        return v

    def add_const(self, name: str, shape, dtype: str = "float32", source: str | None = None,
                  literal: float | int | None = None) -> Value:
        v = Value(name, tuple(shape), dtype, Role.CONST, source=source, literal=literal)
        self.constants.append(v)
        return v

    def add_derived(self, name: str, shape, dtype: str, recipe: str, sources, **params) -> Value:
        """A constant computed at load from `sources` (constants, or None) by `recipe`."""
        v = Value(name, tuple(shape), dtype, Role.CONST,
                  derive=Derivation(recipe, tuple(sources), tuple(sorted(params.items()))))
        self.constants.append(v)
        return v

    def add_node(self, name: str, target: str, op: OpEntry | None, args, outputs) -> Node:
        """Append a node; `outputs` is [(name, shape, dtype)], values are created here."""
        node = Node(name, target, op, list(args), [])
        for i, (oname, shape, dtype) in enumerate(outputs):
            vname = name if i == 0 else f"{name}.{oname}"
            node.outputs.append((oname, Value(vname, tuple(shape), dtype, Role.NODE, producer=node)))
        for _, v in node.tensor_args():
            v.users.append(node)
        self.nodes.append(node)
        return node

    def values(self) -> Iterator[Value]:
        yield from self.inputs
        yield from self.constants
        for n in self.nodes:
            for _, v in n.outputs:
                yield v

    def device_nodes(self) -> list[Node]:
        return [n for n in self.nodes if n.on_device]
