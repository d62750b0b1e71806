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
    # Buffers forward mutates: their prepacked copy would go stale, so their readers run on the CPU
    # (which reads the live state tensor that the call writes back).
    mutated = set(sig.buffers_to_mutate.values())
    for node in ep.graph.nodes:
        if node.op == "placeholder":
            val = node.meta.get("val")
            if not isinstance(val, torch.Tensor) and not node.users:
                continue  # a Python number torch.export specialised into the graph: the call checks it
            _check_placeholder(node, val, torch)
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
            if node.meta.get("val") is None and not node.users:
                continue  # a runtime assertion (aten._assert_tensor_metadata, ...): nothing to compute
            _check_static(node, node.meta.get("val"), torch)
            values[node.name] = _lower_node(graph, node, values, texture_limits, torch)
            ir_node = graph.nodes[-1]
            if ir_node.fallback is None and any(v.role is Role.CONST and v.source in mutated
                                                for _, v in ir_node.tensor_args()):
                ir_node.fallback = "reads a buffer that forward mutates (it runs on the CPU, on the live buffer)"
        elif node.op == "output":
            _lower_outputs(graph, node, values, sig)
    return graph


def _unsupported(message: str):
    from texelflow.runtime.errors import UnsupportedModelError

    return UnsupportedModelError(message)


def _check_placeholder(node, val, torch) -> None:
    """Refuse, clearly, a graph input texelflow cannot feed: a symbolic scalar or a dynamic shape."""
    if not isinstance(val, torch.Tensor):
        kind = type(val).__name__
        raise _unsupported(
            f"input '{node.name}' is a {kind} the graph computes with, not a tensor: texelflow compiles "
            f"tensor inputs and Python numbers torch.export specialises; pass a tensor (a 0-d one for a scalar)")
    _check_static(node, val, torch)


def _check_static(node, val, torch) -> None:
    vals = val if isinstance(val, (tuple, list)) else (val,)
    for v in vals:
        if node.op == "call_function" and v is not None and not isinstance(v, torch.Tensor):
            raise _unsupported(
                f"node '{node.name}' ({target_name(node.target)}) computes a {type(v).__name__}, not a tensor "
                f"(a Python number read from tensor data, e.g. .item() or .tolist()): texelflow compiles "
                f"graphs of tensors only")
        shape = getattr(v, "shape", ())
        if any(not isinstance(d, int) for d in shape):
            raise _unsupported(
                f"node '{node.name}' has the dynamic shape {list(shape)}: texelflow compiles static shapes "
                f"only; export without dynamic_shapes (torch.export.Dim)")


def _lower_outputs(graph: PlanGraph, node, values, sig) -> None:
    """graph.outputs: every tensor the host needs back; graph.output_specs: for each output of the
    exported graph, in order, (kind, target, value) with kind "user" (returned to the caller),
    "buffer" (target: the state-dict key written back) or "input" (target: the position of the
    user input written back among the flattened call arguments); value is a Value or a literal."""
    from torch.export.graph_signature import OutputKind

    specs = list(sig.output_specs)
    # the position of each user input among the call's flattened arguments (Python numbers included)
    user_index = {name: i for i, name in enumerate(sig.user_inputs) if isinstance(name, str)}
    graph.output_specs = []
    for i, out in enumerate(node.args[0]):
        v = values.get(out.name) if hasattr(out, "name") else out
        spec = specs[i] if i < len(specs) else None
        kind, target = "user", None
        if spec is not None and spec.kind == OutputKind.BUFFER_MUTATION:
            kind, target = "buffer", spec.target
        elif spec is not None and spec.kind == OutputKind.USER_INPUT_MUTATION:
            kind, target = "input", user_index[spec.target]
        elif spec is not None and spec.kind not in (OutputKind.USER_OUTPUT, OutputKind.LOSS_OUTPUT):
            raise _unsupported(f"output '{getattr(out, 'name', out)}' is a {spec.kind.name} output, "
                               f"which texelflow does not support")
        if isinstance(v, Value):
            graph.outputs.append(v)
        graph.output_specs.append((kind, target, v))


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
    for v in tensors:
        if 0 in v.shape:
            return f"'{v.name}' has no elements (shape {list(v.shape)})"
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
