"""int64 on an int32 device: which placeholders the device holds narrowed, and what that implies.

The Vulkan device has no int64; torch's default integer dtype is int64 (token ids, position ids).
Lowering asks this module which dtype the device holds a placeholder in, narrows the views of a
narrowed value, and sends to the CPU a node that compares a narrowed value with a number outside
the narrow range. The call (runtime/call_args.py) checks that a narrowed input's values fit, and
runtime/program.py uploads the int32 copy; docs/runtime.md ("Guarantees") has the rules.
"""

from __future__ import annotations

from .ir import Node, PlanGraph, Value


# Placeholders the device holds in a narrower dtype than the host: int64 (torch's default integer
# dtype: token ids, position ids) runs as int32, which the device has. A user input is narrowed
# always (the call checks that every value fits and uploads an int32 copy); a constant only when
# every value fits and forward does not mutate it (it is narrowed when prepacked); a view of a
# narrowed value as it is (`narrow_view`). CPU fallbacks and returned values get the host's int64.
# Values computed in the graph (`ids + 1`) are never narrowed, except an int32 value widened to
# int64 by a cast (`narrow_widening`: its values fit by construction).
NARROWED_INPUT_DTYPES = {"int64": "int32"}


def device_input_dtype(graph: PlanGraph, name: str, dtype: str) -> str:
    """The dtype the device holds placeholder `name` in; a narrowed one is recorded in
    `graph.input_host_dtypes` (name -> the dtype the caller passes, or the constant's own)."""
    narrow = NARROWED_INPUT_DTYPES.get(dtype)
    if narrow is None:
        return dtype
    graph.input_host_dtypes[name] = dtype
    return narrow


# Templates whose output holds only elements of their tensor inputs, moved bit for bit: a move
# of narrowed values is narrowed as they are (`ids[:, 1:]`, `ids.flip(-1)`, `torch.cat([a, b])`).
MOVE_TEMPLATES = frozenset({"copy", "slice", "select", "permute", "expand", "cat", "flip", "roll"})
# Ops whose output holds only elements of the tensor arguments named here (their other tensors
# choose, but are not moved): the extremes of narrowed values (argmax's decomposition of token
# ids), a choice between them, a gather of them. A number beside them must fit the narrow dtype
# (narrowed_scalar_reason).
MOVE_OPS = {
    "amax": ("self",), "amin": ("self",), "maximum": ("self", "other"), "minimum": ("self", "other"),
    "where": ("self", "other"), "where_scalar_other": ("self",), "where_scalar_self": ("other",),
    "index_select": ("self",),
}


def narrow_view(graph: PlanGraph, node: Node) -> bool:
    """Narrow the output of a view-like op (the registry's identity ops: view, reshape, squeeze,
    ...) or a move (MOVE_TEMPLATES, MOVE_OPS) of narrowed values, as its inputs: it moves the
    same, already checked values (`input_ids.view(-1, T)` before an embedding). True when it did."""
    narrowed = graph.input_host_dtypes
    moved = MOVE_OPS.get(node.op.name)
    read = [v for k, v in node.tensor_args() if moved is None or k in moved]
    out = node.outputs[0][1] if len(node.outputs) == 1 else None
    if not read or out is None or not (node.op.is_identity and len(read) == 1 or node.op.template in MOVE_TEMPLATES
                                       or moved is not None):
        return False
    hosts = {narrowed.get(v.name) for v in read}
    host = hosts.pop() if len(hosts) == 1 else None
    if host is None or any(v.dtype == host for v in read) or out.dtype != host:
        return False
    out.dtype = read[0].dtype
    narrowed[out.name] = host
    return True


def narrow_widening(graph: PlanGraph, node: Node) -> bool:
    """Hold the result of an identity op that widens int32 to int64 (`x.long()`, the indices of
    argmax) narrowed: the device keeps the int32 values, exact in int64, and the host gets int64
    where a CPU node reads them or they are returned. True when it did."""
    read = [v for _, v in node.tensor_args()]
    out = node.outputs[0][1] if len(node.outputs) == 1 else None
    if len(read) != 1 or out is None or NARROWED_INPUT_DTYPES.get(out.dtype) != read[0].dtype:
        return False
    graph.input_host_dtypes[out.name] = out.dtype
    out.dtype = read[0].dtype
    return True


def is_widening_cast(fx) -> bool:
    """Whether torch.fx node `fx` computes an int64 tensor from an int32 one of its shape (a cast:
    `x.long()`, the indices of argmax). Lowering holds its result narrowed (narrow_widening)."""
    src = fx.args[0] if fx is not None and fx.args else None
    out, before = getattr(fx, "meta", {}).get("val"), getattr(src, "meta", {}).get("val")
    return out is not None and before is not None and str(before.dtype) == "torch.int32" and \
        str(out.dtype) == "torch.int64" and tuple(out.shape) == tuple(before.shape)


def narrowed_scalar_reason(graph: PlanGraph, node: Node) -> str | None:
    """Why a device node reading a narrowed value must run on the CPU: a number beside it outside
    the narrowed dtype's range (`ids > 3_000_000_000` would compare wrapped values)."""
    narrowed = graph.input_host_dtypes
    read = [v for _, v in node.tensor_args() if narrowed.get(v.name, v.dtype) != v.dtype]
    if not read:
        return None
    host = narrowed[read[0].name]
    device = NARROWED_INPUT_DTYPES[host]
    low, high = NARROWED_RANGES[device]
    for _, arg in node.args:
        x = arg.literal if isinstance(arg, Value) else arg
        if isinstance(x, (int, float)) and not isinstance(x, bool) and not low <= x <= high:
            return (f"the number {x!r} is outside {device}, the dtype the device holds {host} "
                    f"'{read[0].name}' in (it runs on the CPU, on the {host} data)")
    return None


NARROWED_RANGES = {"int32": (-(2**31), 2**31 - 1)}


def fits_narrowed(data, dtype: str, torch) -> bool:
    """Whether constant `data` (a tensor of `dtype`) has every value in its narrowed dtype's range."""
    narrow = NARROWED_INPUT_DTYPES.get(dtype)
    if narrow is None or not isinstance(data, torch.Tensor) or data.is_meta or data.numel() == 0:
        return False
    info = torch.iinfo(getattr(torch, narrow))
    return info.min <= int(data.min()) and int(data.max()) <= info.max
