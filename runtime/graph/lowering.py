"""Lower an ExportedProgram to the planning IR and partition it between Vulkan and the CPU.

A node goes to Vulkan when the registry has its target and accepts its dtypes, ranks and
arguments, and when every tensor keeps at least one representation under the device's texture
limits. Everything else runs in PyTorch on the CPU; its reason goes into the plan.
"""

from __future__ import annotations

import operator
from typing import Sequence

from texelflow.generated.layouts import DTYPES, TEXTURE_LIMITS
from texelflow.generated.ops import OpEntry, op_for_target
from texelflow.shaders.node_rules import run_checks

from .ir import Node, PlanGraph, Role, Value
from .op_repsets import OpRepSets

# Schema arguments the layout system makes meaningless: dim order / memory format / placement.
IGNORED_ARGS = frozenset({"memory_format", "non_blocking", "layout", "device", "pin_memory", "dim_order"})


def dtype_name(torch_dtype) -> str:
    return str(torch_dtype).replace("torch.", "")


def target_name(target) -> str:
    if target is operator.getitem:
        return "getitem"
    return str(target)


def lower(ep, texture_limits: Sequence[int] = TEXTURE_LIMITS) -> PlanGraph:
    """The planning IR of `ep` (an ExportedProgram), with every node partitioned."""
    import torch

    graph = PlanGraph()
    values: dict[str, object] = {}
    sig = ep.graph_signature
    user_inputs = set(sig.user_inputs)
    consts = {**sig.inputs_to_parameters, **sig.inputs_to_buffers, **sig.inputs_to_lifted_tensor_constants}
    for node in ep.graph.nodes:
        if node.op == "placeholder":
            val = node.meta["val"]
            if node.name in user_inputs:
                v = graph.add_input(node.name, val.shape, dtype_name(val.dtype))
            else:
                source = consts.get(node.name, node.name)  # the state-dict key of its data
                v = graph.add_const(node.name, val.shape, dtype_name(val.dtype), source=source)
            values[node.name] = v
        elif node.op == "call_function":
            if node.target is operator.getitem:
                src, idx = node.args
                values[node.name] = values[src.name][idx]
                continue
            values[node.name] = _lower_node(graph, node, values, texture_limits, torch)
        elif node.op == "output":
            for out in node.args[0]:
                v = values.get(out.name) if hasattr(out, "name") else None
                if isinstance(v, Value):
                    graph.outputs.append(v)
    return graph


def _lower_node(graph: PlanGraph, node, values, limits, torch):
    target = target_name(node.target)
    op = op_for_target(target)
    schema = node.target._schema
    val = node.meta.get("val")
    vals = val if isinstance(val, (tuple, list)) else (val,)
    if op is not None and len(op.outputs) == len(vals):
        out_names = [o.name for o in op.outputs]
    else:
        out_names = ["out"] if len(vals) == 1 else [f"out{i}" for i in range(len(vals))]
    outputs = [(n, tuple(v.shape), dtype_name(v.dtype)) for n, v in zip(out_names, vals) if v is not None]

    args, reason = _resolve_args(graph, node, schema, op, values, torch)
    ir_node = graph.add_node(node.name, target, op, args, outputs)
    ir_node.fx = node
    if reason is None:
        reason = _partition_reason(ir_node, limits)
    ir_node.fallback = reason
    outs = [v for _, v in ir_node.outputs]
    return outs if isinstance(val, (tuple, list)) else outs[0]


def _resolve_args(graph, node, schema, op: OpEntry | None, values, torch):
    """(name, value) pairs in schema order; python numbers in tensor slots become constants."""
    given = {}
    for i, a in enumerate(node.args):
        given[schema.arguments[i].name] = a
    given.update(node.kwargs)
    declared = {a.name: a for a in op.args} if op else {}
    args = []
    reason = None
    for sarg in schema.arguments:
        if sarg.name not in given:
            continue
        raw = given[sarg.name]
        value = _convert(raw, values)
        spec = declared.get(sarg.name)
        if op is not None and spec is None:
            if sarg.name in IGNORED_ARGS or raw is None or raw == sarg.default_value:
                continue
            reason = reason or f"argument '{sarg.name}'={raw!r} is not supported by the Vulkan op"
        if spec is not None and spec.kind == "tensor" and isinstance(value, (int, float)) and not isinstance(value, bool):
            out_dtype = dtype_name(node.meta["val"].dtype) if hasattr(node.meta.get("val"), "dtype") else "float32"
            value = graph.add_const(f"{node.name}_{sarg.name}", (), out_dtype, literal=value)
        args.append((sarg.name, value))
    return args, reason


def _convert(raw, values):
    if hasattr(raw, "name") and hasattr(raw, "op"):  # an fx Node
        return values[raw.name]
    if isinstance(raw, (list, tuple)):
        return [_convert(x, values) for x in raw]
    return raw


def tensor_shapes(node: Node) -> dict[str, object]:
    """Registry tensor name -> shape (a list of shapes for a tensor list) for OpRepSets.build."""
    shapes: dict[str, object] = {}
    for name, v in node.args:
        if isinstance(v, Value):
            shapes[name] = v.shape
        elif isinstance(v, list) and v and all(isinstance(x, Value) for x in v):
            shapes[name] = [x.shape for x in v]
    for name, v in node.outputs:
        shapes[name] = v.shape
    return shapes


def node_repsets(node: Node, limits: Sequence[int] = TEXTURE_LIMITS) -> OpRepSets:
    dtype = node.outputs[0][1].dtype if node.outputs else None
    return OpRepSets.build(node.op, tensor_shapes(node), limits, dtype if dtype in DTYPES else None)


def _partition_reason(node: Node, limits) -> str | None:
    op = node.op
    if op is None:
        return f"no Vulkan op implements {node.target}"
    if not op.variants:
        return f"op '{op.name}' has no shader"
    tensors = [v for _, v in node.tensor_args()] + [v for _, v in node.outputs]
    declared = {a.name for a in op.args if a.kind in ("tensor", "tensor_list")}
    for name, v in node.args:
        if isinstance(v, (Value, list)) and name not in declared and (isinstance(v, Value) or any(isinstance(x, Value) for x in v)):
            return f"tensor argument '{name}' is not declared by op '{op.name}'"
    for v in tensors:
        if v.dtype not in op.dtypes:
            return f"dtype {v.dtype} of '{v.name}' (op '{op.name}' takes {', '.join(op.dtypes)})"
    if len({v.dtype for v in tensors}) > 1:
        return f"mixed dtypes {sorted({v.dtype for v in tensors})}"
    if "supports_highdim" not in op.flags and any(len(v.shape) > 4 for v in tensors):
        return "a tensor has more than 4 dims and the op does not support that"
    for w in op.weights:
        v = node.arg(w)
        if isinstance(v, Value) and v.role is not Role.CONST:
            return f"weight '{w}' is not a constant (it is prepacked at load)"
    reason = run_checks(node, op.checks)
    if reason:
        return reason
    sets = node_repsets(node, limits)
    empty = sets.empty_tensors()
    if empty:
        shapes = tensor_shapes(node)
        return f"no representation fits {empty[0]} {list(shapes[empty[0]])} (texture limits {tuple(limits)})"
    return None
