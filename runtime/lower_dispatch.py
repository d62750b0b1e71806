"""Turn a planned device node into Vulkan dispatches: pick the variant, fill its scalars.

The variant is chosen from the generated registry by the op, the dtype and the storage each
binding must have, never by building a name. Scalars follow the registry: pushed arguments by
name (defaults when absent, enums as their index); ops whose kernels need extra push constants
(convolution geometry, concat offsets, ...) register a builder in `BUILDERS`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from texelflow.generated.layouts import Storage
from texelflow.generated.variants import VARIANTS

STORAGE_AXIS = {Storage.BUFFER: "buffer", Storage.TEXTURE_3D: "texture3d"}


@dataclass
class DispatchSpec:
    """What the program needs to launch one kernel: variant, tensors by binding name, scalars."""

    variant: object
    tensors: dict  # binding name -> Value (the program maps values to device tensors)
    scalars: dict
    label: str


def select_variant(op_name: str, dtype: str, storages: dict[str, Storage]):
    """The variant of `op_name` whose dtype and binding storages match; KeyError lists them."""
    candidates = [v for v in VARIANTS.values() if v.op == op_name]
    for v in candidates:
        if v.dtype == dtype and all(STORAGE_AXIS[storages[b.tensor]] == b.storage for b in v.bindings if b.tensor in storages):
            return v
    have = ", ".join(sorted(v.name for v in candidates)) or "none"
    want = ", ".join(f"{k}={STORAGE_AXIS[s]}" for k, s in sorted(storages.items()))
    raise KeyError(f"no shader variant of '{op_name}' for dtype={dtype}, {want}; variants: {have}")


def pushed_scalars(node) -> dict:
    """Push constants for the registry's scalar arguments of `node`."""
    values = {}
    for a in node.op.args:
        if a.kind not in ("float", "int", "bool", "enum"):
            continue
        v = node.arg(a.name)
        if v is None:
            v = a.default
        if a.kind == "enum":
            v = a.values.index(v if v is not None else a.values[0])
        elif a.kind == "bool":
            v = int(bool(v))
        if v is None:
            raise ValueError(f"{node.name}: argument '{a.name}' has no value and no default")
        values[a.name] = v
    return values


Builder = Callable[[object, dict, dict], "list[DispatchSpec]"]
BUILDERS: dict[str, Builder] = {}


def builder(*ops: str):
    def register(fn: Builder) -> Builder:
        for op in ops:
            BUILDERS[op] = fn
        return fn

    return register


def node_dispatches(node, slot_reprs: dict, dtype: str) -> list[DispatchSpec]:
    """Dispatches for one planned node. `slot_reprs`: slot name -> TensorRepr."""
    tensors = {name: v for name, v in node.args if name in slot_reprs and not isinstance(v, list)}
    tensors.update({name: v for name, v in node.outputs})
    fn = BUILDERS.get(node.op.name)
    if fn is not None:
        return fn(node, slot_reprs, {"dtype": dtype, "tensors": tensors})
    storages = {name: slot_reprs[name].storage for name in tensors}
    variant = select_variant(node.op.name, dtype, storages)
    return [DispatchSpec(variant, tensors, pushed_scalars(node), node.name)]
