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


# ---- op-specific builders: extra push constants and optional tensors ----------------------------
class _Dummy:
    """Stands for the 1-element float32 buffer bound where an optional tensor is absent."""

    def __repr__(self) -> str:
        return "DUMMY_BUFFER"


DUMMY_BUFFER = _Dummy()


def _pair(v, default=None) -> tuple[int, int]:
    if v is None or (isinstance(v, (list, tuple)) and len(v) == 0):
        return default
    if isinstance(v, int):
        return (v, v)
    return (v[0], v[0]) if len(v) == 1 else (v[0], v[1])


def _generic(node, slot_reprs, ctx, extra: dict, optional: tuple[str, ...] = ()) -> list[DispatchSpec]:
    tensors = dict(ctx["tensors"])
    storages = {name: slot_reprs[name].storage for name in tensors}
    for name in optional:
        if name not in tensors:
            tensors[name] = DUMMY_BUFFER
    variant = select_variant(node.op.name, ctx["dtype"], storages)
    return [DispatchSpec(variant, tensors, {**pushed_scalars(node), **extra}, node.name)]


@builder("linear")
def _linear(node, slot_reprs, ctx):
    return _generic(node, slot_reprs, ctx, {"has_bias": int(node.arg("bias") is not None)}, ("bias",))


@builder("conv2d")
def _conv2d(node, slot_reprs, ctx):
    (sh, sw) = _pair(node.arg("stride"), (1, 1))
    (ph, pw) = _pair(node.arg("padding"), (0, 0))
    (dh, dw) = _pair(node.arg("dilation"), (1, 1))
    extra = {"has_bias": int(node.arg("bias") is not None), "conv_stride_pad": (sw, sh, pw, ph),
             "conv_dilation": (dw, dh, 0, 0)}
    return _generic(node, slot_reprs, ctx, extra, ("bias",))


@builder("max_pool2d", "avg_pool2d")
def _pool(node, slot_reprs, ctx):
    kh, kw = _pair(node.arg("kernel_size"))
    sh, sw = _pair(node.arg("stride"), (kh, kw))
    ph, pw = _pair(node.arg("padding"), (0, 0))
    dh, dw = _pair(node.arg("dilation"), (1, 1)) if node.op.name == "max_pool2d" else (1, 1)
    extra = {"pool_kernel_stride": (kw, kh, sw, sh), "pool_pad_dilation": (pw, ph, dw, dh)}
    return _generic(node, slot_reprs, ctx, extra)


@builder("layer_norm", "native_layer_norm")
def _layer_norm(node, slot_reprs, ctx):
    extra = {"has_weight": int(node.arg("weight") is not None), "has_bias": int(node.arg("bias") is not None)}
    return _generic(node, slot_reprs, ctx, extra, ("weight", "bias"))


@builder("permute_copy")
def _permute(node, slot_reprs, ctx):
    rank = len(node.arg("self").shape)
    dims = [d % rank for d in node.arg("dims")] if rank else []
    whcn = tuple(rank - 1 - dims[rank - 1 - d] if d < rank else d for d in range(4))
    return _generic(node, slot_reprs, ctx, {"permute_dims": whcn})


@builder("cat")
def _cat(node, slot_reprs, ctx):
    inputs = node.arg("tensors")
    out = node.outputs[0][1]
    rank = len(out.shape)
    dim = (node.arg("dim") or 0) % rank
    whcn = rank - 1 - dim
    storages = {"out": slot_reprs["out"].storage, "tensors": slot_reprs["tensors"].storage}
    variant = select_variant("cat", ctx["dtype"], storages)
    specs, offset = [], 0
    scalars = pushed_scalars(node)
    for i, v in enumerate(inputs):
        size = v.shape[dim]
        if size:
            specs.append(DispatchSpec(variant, {"out": out, "tensors": v},
                                      {**scalars, "cat_dim": whcn, "cat_offset": offset}, f"{node.name}[{i}]"))
        offset += size
    return specs
