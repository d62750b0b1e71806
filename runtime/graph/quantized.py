"""Quantized (PT2E) programs: quantized_decomposed ops lowered and checked, then fused into q8ta ops.

torchao's `convert_pt2e` leaves chains such as

    x -> quantize_per_tensor -> dequantize_per_tensor --+
    w (int8 constant) -> dequantize_per_channel -------> conv2d -> relu -> quantize_per_tensor -> ...

Lowering (`lower_quantized`, called by lowering.py for every quantized_decomposed node):
- checks every quantize / dequantize's parameters (scale positive and finite, zero point inside
  [quant_min, quant_max], the range inside the dtype's, dtype int8 or uint8) and refuses bad ones
  at plan time with a QuantizationError naming the node and the argument;
- lowers quantize_per_tensor / dequantize_per_tensor (any overload whose parameters are
  constants) as the registry's ops with python numbers; uint8 becomes int8 (q - 128, zero point
  and range - 128, which changes no dequantized value) wherever every reader is shifted too;
- makes a quantize / dequantize of a constant (a frozen weight) a derived constant: the float
  weight a float op reads, whose derivation still names the int8 weight, scales and zero points,
  which the fusion takes back. A float op left unfused runs on Vulkan with that float weight;
- sends what computes its parameters at run time (dynamic quantization) to the CPU, with a reason
  (the fusion below then takes dynamic quantization's round trips back onto the device).

The q8ta fusion (`fuse_quantized`, run by fusion.fuse_patterns after the canonical conv2d rewrite
and before conv + batch norm / activation) rewrites, wherever the fused op runs on Vulkan:

    dq(x), w -> conv2d [-> act] -> q                  =>  q8ta_conv2d (im2col: groups 1, Cin % 4 == 0),
                                                          where int8 convs pay (int8_conv_form)
    dq(x), w -> linear / mm / addmm [-> act] -> q     =>  q8ta_linear (q8ta_linear_gemv: one row),
                                                          unless large where int8 convs do not pay
    dq(a), dq(b) -> add [-> act] -> q                 =>  q8ta_add
    dq(x) -> relu -> q                                =>  q8ta_relu
    dq(x) -> pixel_shuffle -> q                       =>  q8ta_pixel_shuffle
    dq(x) -> max_pool2d -> q, the same parameters     =>  q8ta_max_pool2d (the max of the integers)
    q(view(...(dq(x)))), the same parameters          =>  view(...(x)) on the int8 tensor
    dq(q(x)), the same parameters, left by the above  =>  quantize_dequantize(x), in float
    choose_qparams(x) -> (s, zp); dq(q(y, s, zp))      =>  dynamic_quantize_dequantize(y, amin(x), amax(x)),
                                                          in float (dynamic quantization; first)

`act` is relu (the kernels' activation), hardswish or gelu (erf form) after a conv or linear
(applied in float before the quantize), or hardtanh / relu6, which become a narrower output range: quantizing is
monotone, so quantize(clamp(y, lo, hi)) == clamp(quantize(y), quantize(lo), quantize(hi)) exactly. An input reached from a dequantize through identity ops (linear(view(dq(x)))) is read as the same
identity ops applied to the int8 tensor. A dequantize left without readers is removed; one with
other readers stays for them. Each fused node lists what it absorbed in `node.fused`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from texelflow.generated.ops import OPS
from texelflow.runtime.errors import QuantizationError

from .fusion import _only_user, _remove, _replace
from .ir import Node, PlanGraph, Role, Value
from .lowering import QUANTIZED_NAMESPACE as NAMESPACE
from .lowering import dtype_name, partition_reason, target_name

QUANTIZE = "quantized_decomposed.quantize_per_tensor.default"
DEQUANTIZE = "quantized_decomposed.dequantize_per_tensor.default"
CHOOSE_QPARAMS = "quantized_decomposed.choose_qparams.tensor"  # dynamic quantization's parameters
STAGED_REDUCTION_UNITS = 4096  # dynamic quantization's amin / amax reduce rows until this many are left
QUANTIZE_TENSOR = "quantized_decomposed.quantize_per_tensor.tensor"
DEQUANTIZE_TENSOR = "quantized_decomposed.dequantize_per_tensor.tensor"
PER_TENSOR = {f"{NAMESPACE}{kind}_per_tensor.{overload}": kind
              for kind in ("quantize", "dequantize") for overload in ("default", "tensor", "tensor2")}
PER_CHANNEL = {f"{NAMESPACE}quantize_per_channel.default": "quantize",
               f"{NAMESPACE}dequantize_per_channel.default": "dequantize"}
# The integer dtypes a quantized tensor may hold: int8 runs as it is, uint8 shifted by -128.
DTYPE_RANGES = {"int8": (-128, 127), "uint8": (0, 255)}
# A constant may also be dequantized from int32 (a quantizer's int32 bias): exact as a float constant.
CONSTANT_DTYPE_RANGES = {**DTYPE_RANGES, "int32": (-(2**31), 2**31 - 1)}
UINT8_SHIFT = -128
DEQUANTIZED_WEIGHTS = ("dequantized_per_channel", "dequantized_per_tensor")  # derived.py recipes
QUANTIZED_RECIPES = frozenset(DEQUANTIZED_WEIGHTS + (
    "quantized_per_channel", "quantized_per_tensor", "filled", "shifted", "transposed", "reshaped"))


@dataclass(frozen=True)
class QParams:
    """One tensor's per-tensor quantization: value = (q - zero_point) * scale, q in [quant_min, quant_max]."""

    scale: float
    zero_point: int
    quant_min: int
    quant_max: int
    dtype: str  # "int8" or "uint8"

    def as_int8(self) -> "QParams":
        """The same numbers held as int8: uint8 shifted by -128 (no dequantized value changes)."""
        if self.dtype != "uint8":
            return self
        return QParams(self.scale, self.zero_point + UINT8_SHIFT, self.quant_min + UINT8_SHIFT,
                       self.quant_max + UINT8_SHIFT, "int8")

    def args(self) -> list[tuple[str, object]]:
        import torch

        return [("scale", self.scale), ("zero_point", self.zero_point), ("quant_min", self.quant_min),
                ("quant_max", self.quant_max), ("dtype", getattr(torch, self.dtype))]


# ---- validation ---------------------------------------------------------------------------------------
def _refuse(node_name: str, message: str):
    return QuantizationError(f"{node_name}: {message}")


def check_range(node_name: str, dtype: str, quant_min, quant_max, allowed=DTYPE_RANGES) -> None:
    """The dtype is one texelflow runs and [quant_min, quant_max] lies inside its range."""
    if dtype not in allowed:
        raise _refuse(node_name, f"dtype {dtype} is not supported: texelflow runs int8 quantization "
                                 f"(uint8 too, shifted to int8)")
    lo, hi = allowed[dtype]
    for arg, x in (("quant_min", quant_min), ("quant_max", quant_max)):
        if not isinstance(x, int) or isinstance(x, bool):
            raise _refuse(node_name, f"{arg} {x!r} must be an integer")
    if not lo <= quant_min <= quant_max <= hi:
        raise _refuse(node_name, f"quant_min / quant_max [{quant_min}, {quant_max}] must be an ordered range "
                                 f"inside {dtype}'s [{lo}, {hi}]")


def check_scale(node_name: str, arg: str, scale) -> None:
    if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not math.isfinite(scale) or scale <= 0:
        raise _refuse(node_name, f"{arg} {scale!r} must be positive and finite")


def check_zero_point(node_name: str, arg: str, zero_point, quant_min: int, quant_max: int) -> None:
    if not isinstance(zero_point, (int, float)) or isinstance(zero_point, bool) or zero_point != int(zero_point) \
            or not quant_min <= zero_point <= quant_max:
        raise _refuse(node_name, f"{arg} {zero_point!r} must be an integer in [quant_min, quant_max] = "
                                 f"[{quant_min}, {quant_max}]")


def check_channels(node_name: str, scales, zero_points, channels: int, quant_min: int, quant_max: int) -> None:
    """Per-channel scales (and zero points) as check_scale / check_zero_point, one per channel."""
    import torch

    for arg, t in (("scales", scales), ("zero_points", zero_points)):
        if t is not None and t.numel() != channels:
            raise _refuse(node_name, f"{arg} has {t.numel()} entries for {channels} channels")
    s = scales.double().reshape(-1)
    bad = (~torch.isfinite(s) | (s <= 0)).nonzero()
    if len(bad):
        i = int(bad[0])
        check_scale(node_name, f"scales[{i}]", float(s[i]))
    if zero_points is not None:
        z = zero_points.double().reshape(-1)
        bad = ((z != torch.round(z)) | (z < quant_min) | (z > quant_max)).nonzero()
        if len(bad):
            i = int(bad[0])
            check_zero_point(node_name, f"zero_points[{i}]", float(z[i]), quant_min, quant_max)


# ---- lowering ------------------------------------------------------------------------------------------
def lower_quantized(ctx, node, name: str, ins: list):
    """Lower quantized_decomposed fx `node` (its inputs' IR values `ins`) for lowering's `_Lowering`
    `ctx`: (its value, why it runs on the CPU or None). A registry node, a derived constant (the
    quantize / dequantize of a constant), or a CPU node with its reason."""
    target = target_name(node.target)
    given = _arguments(node)
    by_fx = dict(zip(node.all_input_nodes, ins))
    if any(isinstance(v, Value) and v.role is Role.CONST and v.source in ctx.mutated for v in ins):
        return _on_cpu(ctx, node, name, ins, None)  # a buffer forward mutates: read live, on the CPU
    if target in PER_CHANNEL:
        return _lower_per_channel(ctx, node, name, ins, given, by_fx, PER_CHANNEL[target])
    if target in PER_TENSOR:
        return _lower_per_tensor(ctx, node, name, ins, given, by_fx, PER_TENSOR[target])
    return _on_cpu(ctx, node, name, ins, None)  # choose_qparams, ...: on the CPU unless fuse_quantized takes it


def _arguments(node) -> dict:
    """Schema argument name -> the fx node's argument (fx nodes, python values)."""
    schema = node.target._schema
    given = {schema.arguments[i].name: a for i, a in enumerate(node.args)}
    given.update(node.kwargs)
    return given


def _on_cpu(ctx, node, name: str, ins: list, reason: str | None):
    ir = ctx._add(node, name, ins, node.target)  # lowering's generic IR node (its fx inputs recorded)
    if reason is not None:
        ir.fallback = reason
    return ctx._result(node, ir), ir.fallback


def _number(ctx, raw, lookup):
    """A python number argument, or the value of a one-element constant tensor; None otherwise."""
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        return raw
    v = lookup(raw) if hasattr(raw, "op") else None
    if not isinstance(v, Value) or v.role is not Role.CONST:
        return None
    t = ctx.folder.tensor(v)
    return t.item() if t is not None and t.numel() == 1 else None


def _per_tensor_params(ctx, given: dict, lookup) -> QParams | None:
    """The node's parameters as python numbers, or None when one is computed at run time."""
    nums = [_number(ctx, given.get(k), lookup) for k in ("scale", "zero_point", "quant_min", "quant_max")]
    if any(n is None for n in nums):
        return None
    scale, zero_point, quant_min, quant_max = nums
    return QParams(float(scale), zero_point, quant_min, quant_max, dtype_name(given["dtype"]))


def _checked(node_name: str, params: QParams, allowed) -> QParams:
    check_range(node_name, params.dtype, params.quant_min, params.quant_max, allowed)
    check_scale(node_name, "scale", params.scale)
    check_zero_point(node_name, "zero_point", params.zero_point, params.quant_min, params.quant_max)
    return QParams(params.scale, int(params.zero_point), params.quant_min, params.quant_max, params.dtype)


def _lower_per_tensor(ctx, node, name: str, ins: list, given: dict, by_fx: dict, kind: str):
    x = by_fx[given["input"]]
    params = _per_tensor_params(ctx, given, by_fx.get)
    if params is None:
        return _on_cpu(ctx, node, name, ins, f"{target_name(node.target)} with a scale or zero point computed at "
                                             f"run time runs on the CPU (Vulkan runs constant quantization parameters)")
    constant = x.role is Role.CONST
    params = _checked(node.name, params, CONSTANT_DTYPE_RANGES if constant and kind == "dequantize" else DTYPE_RANGES)
    val = node.meta["val"]
    if constant:  # a weight: a derived constant, computed when the program prepacks
        recipe = f"{kind}d_per_tensor"
        extra = {} if kind == "dequantize" else {"quant_min": params.quant_min, "quant_max": params.quant_max}
        return ctx.graph.add_derived(name, x.shape, dtype_name(val.dtype), recipe, (x,), scale=params.scale,
                                     zero_point=params.zero_point, **extra), None
    shift = params.dtype == "uint8" and (
        x.dtype == "int8" if kind == "dequantize" else _readers_shift(ctx, node))
    lowered = params.as_int8() if shift else params
    out_dtype = dtype_name(val.dtype) if kind == "dequantize" or not shift else "int8"
    args = [("input", x)] + lowered.args()
    out_kind = given.get("out_dtype")
    if kind == "dequantize" and out_kind is not None:
        args.append(("out_dtype", out_kind))
    ir = ctx.graph.add_node(name, f"{NAMESPACE}{kind}_per_tensor.default", OPS[f"{kind}_per_tensor"], args,
                            [("out", tuple(val.shape), out_dtype)])
    unchanged = lowered == params and target_name(node.target).endswith(".default")
    ir.fx = node if unchanged else _fx_call(kind, lowered, out_kind)  # what a CPU fallback of it runs
    ctx.graph.fx_inputs[ir] = [x]
    ir.fallback = partition_reason(ir, ctx.limits, ctx.fits)
    return ir.outputs[0][1], ir.fallback


def _readers_shift(ctx, node) -> bool:
    """Whether a uint8 quantize's int8 output may be shifted: every reader is a uint8
    dequantize_per_tensor with constant parameters (shifted as well), none is the graph's output."""
    for user in node.users:
        if PER_TENSOR.get(target_name(user.target) if user.op == "call_function" else "") != "dequantize":
            return False
        params = _per_tensor_params(ctx, _arguments(user), lambda a: ctx.values.get(a.name))
        if params is None or params.dtype != "uint8":
            return False
    return True


def _fx_call(kind: str, params: QParams, out_dtype):
    """A lone fx node computing `kind`_per_tensor.default with `params` on one input: what a CPU
    fallback runs when lowering changed the node's overload or shifted it to int8."""
    import torch

    graph = torch.fx.Graph()
    x = graph.placeholder("input")
    target = getattr(torch.ops.quantized_decomposed, f"{kind}_per_tensor").default
    kwargs = {"out_dtype": out_dtype} if out_dtype is not None else {}
    return graph.call_function(target, (x,) + tuple(v for _, v in params.args()), kwargs)


def _lower_per_channel(ctx, node, name: str, ins: list, given: dict, by_fx: dict, kind: str):
    x = by_fx[given["input"]]
    quant_min, quant_max, dtype = given["quant_min"], given["quant_max"], dtype_name(given["dtype"])
    constant = x.role is Role.CONST
    check_range(node.name, dtype, quant_min, quant_max,
                CONSTANT_DTYPE_RANGES if constant and kind == "dequantize" else DTYPE_RANGES)
    op_name = f"{kind}_per_channel"
    if not constant:
        return _on_cpu(ctx, node, name, ins, f"{op_name} of '{x.name}', a tensor computed at run time, runs on "
                                             f"the CPU (Vulkan {kind}s per channel constant weights only)")
    scales_v = by_fx.get(given["scales"])
    zps_raw = given.get("zero_points")
    zps_v = by_fx.get(zps_raw) if hasattr(zps_raw, "op") else None
    scales = ctx.folder.tensor(scales_v) if isinstance(scales_v, Value) and scales_v.role is Role.CONST else None
    zps = ctx.folder.tensor(zps_v) if isinstance(zps_v, Value) and zps_v.role is Role.CONST else None
    if scales is None or (zps_v is not None and zps is None):
        return _on_cpu(ctx, node, name, ins, f"{op_name} with scales or zero points computed at run time runs "
                                             f"on the CPU (Vulkan runs constant quantization parameters)")
    axis = given["axis"]
    if not -len(x.shape) <= axis < len(x.shape):
        raise _refuse(node.name, f"axis {axis} is outside the {len(x.shape)}-d input")
    axis %= len(x.shape)
    # Float zero points (per_channel_affine_float_qparams: torchao's EmbeddingQuantizer, zero point
    # -min / scale per row) are dequantized as they are, (w - zp[c]) * s[c], like torch does; the
    # q8ta fusion never takes such a weight back as int8 (_weight).
    float_zps = (kind == "dequantize" and zps is not None and zps.is_floating_point()
                 and bool((zps != zps.round()).any()))
    if float_zps and not bool(zps.isfinite().all()):
        raise _refuse(node.name, "zero_points must be finite")
    check_channels(node.name, scales, None if float_zps else zps, x.shape[axis], quant_min, quant_max)
    zp_source = zps_v if zps is not None and bool((zps != 0).any()) else None  # all 0: symmetric, no zero points
    val = node.meta["val"]
    if kind == "dequantize":
        extra = {"float_zero_points": True} if float_zps else {}
        return ctx.graph.add_derived(name, x.shape, dtype_name(val.dtype), "dequantized_per_channel",
                                     (x, scales_v, zp_source), axis=axis, **extra), None
    return ctx.graph.add_derived(name, x.shape, dtype_name(val.dtype), "quantized_per_channel",
                                 (x, scales_v, zp_source), axis=axis, quant_min=quant_min, quant_max=quant_max,
                                 scale_dtype=dtype_name(scales.dtype)), None


# ---- the q8ta fusion -----------------------------------------------------------------------------------
def fuse_quantized(graph: PlanGraph, limits, facts=None) -> PlanGraph:
    """Rewrite every dequantize -> op -> quantize chain whose q8ta op runs on Vulkan, every
    quantize of identity ops of a dequantize with the same parameters, and then every quantize ->
    dequantize round trip left (_round_trip); in place, returns `graph`.
    `facts` (prepack_matmul.SubgroupFacts of the device, None without one) decide whether conv
    chains take the int8 kernels (int8_conv_form)."""
    conv_form = int8_conv_form(facts)
    for chooser in [n for n in graph.nodes if n.target == CHOOSE_QPARAMS]:
        _dynamic_round_trips(graph, chooser, limits)
    for q in [n for n in graph.nodes if _is_quantize(n)]:
        if q.outputs[0][1].producer is q:  # (not yet absorbed by a chain fused before it)
            _fuse_at(graph, q, limits, conv_form)
    made: dict = {}  # (the quantize, its parameters) -> the quantize_dequantize made for it
    for dq in [n for n in graph.nodes if _is_dequantize(n)]:
        _round_trip(graph, dq, limits, made)
    for node in list(graph.nodes):
        if node.op is not None and node.op.name == "permute_copy":
            _transposed_weight(graph, node, limits)
    _drop_unread_weights(graph)
    return graph


def _round_trip(graph: PlanGraph, dq: Node, limits, made: dict) -> None:
    """dq(q(x)) with the same scale and zero point (a float op's result quantized, then read by
    another float op: convs kept in float, int8_conv_form) becomes quantize_dequantize(x): one
    float pass in x's own representation instead of two dispatches through an int8 tensor. The
    quantize stays where something else reads its int8 tensor (a q8ta add). PT2E gives each
    reader of a quantized tensor its own dequantize: the second and later of them read the
    quantize_dequantize made for the first (`made`), not one of their own."""
    t = dq.arg("input")
    q = t.producer
    if q is None or not _is_quantize(q) or not q.on_device or not dq.on_device:
        return
    qp, dp = _params(q), _params(dq)
    if (qp.scale, qp.zero_point) != (dp.scale, dp.zero_point):
        return
    key = (id(q), qp)
    if key in made and dq.outputs[0][1] not in graph.outputs and dq.outputs[0][1].dtype == made[key].outputs[0][1].dtype:
        _share_round_trip(graph, dq, made[key])
        if not t.users and t not in graph.outputs:
            _remove(graph, q)
        return
    op = OPS["quantize_dequantize"]
    args = [("self", q.arg("input")), ("scale", qp.scale), ("zero_point", qp.zero_point),
            ("quant_min", qp.quant_min), ("quant_max", qp.quant_max)]
    node = Node(dq.name, op.targets[0], op, args, [("out", dq.outputs[0][1])])
    if partition_reason(node, limits) is not None:
        return
    _replace(graph, dq, node)
    graph.fx_inputs.pop(node, None)  # (it never runs on the CPU)
    node.fused = [f"quantize '{q.name}'", f"dequantize '{dq.name}'"]
    made[key] = node
    if not t.users and t not in graph.outputs:
        _remove(graph, q)
        node.fused[0] += " (its int8 tensor read by nothing else)"


def _dynamic_round_trips(graph: PlanGraph, chooser: Node, limits) -> None:
    """Dynamic quantization (XNNPACK's and x86's dynamic configs): choose_qparams.tensor(x) gives
    a scale and a zero point at run time, read by quantize_per_tensor.tensor(y, scale, zp) ->
    dequantize_per_tensor.tensor pairs (y is x). Each pair becomes one float pass,
    dynamic_quantize_dequantize(y, amin(x), amax(x)), which computes torch's parameters from the
    two reductions, and the three CPU nodes (and the host round trip between them) go. Only where
    nothing else reads the parameters or an int8 tensor, and every new node runs on Vulkan."""
    scale, zero_point = (v for _, v in chooser.outputs)
    readers = list(dict.fromkeys(scale.users + zero_point.users))
    quantizes = [n for n in readers if n.target == QUANTIZE_TENSOR]
    x = chooser.arg("input")
    if (not isinstance(x, Value) or x.dtype != "float32" or scale in graph.outputs or zero_point in graph.outputs
            or not quantizes):
        return
    pairs = []  # (quantize, its dequantizes)
    for q in quantizes:
        t = q.outputs[0][1]
        dqs = list(dict.fromkeys(t.users))
        if t in graph.outputs or not dqs or not all(_reads_parameters(n, scale, zero_point) for n in [q] + dqs):
            return
        if any(n.target != DEQUANTIZE_TENSOR or n.arg("input") is not t or n.outputs[0][1].dtype != "float32"
               or (n.arg("quant_min"), n.arg("quant_max")) != (q.arg("quant_min"), q.arg("quant_max")) for n in dqs):
            return
        pairs.append((q, dqs))
    if sum(1 + len(dqs) for _, dqs in pairs) != len(readers):
        return  # something else reads the parameters
    lows, highs = (_reduction(chooser, x, kind) for kind in ("amin", "amax"))
    low, high = lows[-1], highs[-1]
    trips = [_dynamic_trip(chooser, q, dqs[0], low, high) for q, dqs in pairs]
    if any(partition_reason(n, limits) is not None for n in lows + highs + trips):
        return
    _insert_views(graph, chooser, lows + highs, limits)
    _remove(graph, chooser)
    for (q, dqs), trip in zip(pairs, trips):
        _replace(graph, dqs[0], trip)
        graph.fx_inputs.pop(trip, None)  # (it never runs on the CPU)
        for dq in dqs[1:]:
            _share_round_trip(graph, dq, trip)
        _remove(graph, q)
        trip.fused = [f"choose_qparams '{chooser.name}' (as {low.name}, {high.name})", f"quantize '{q.name}'",
                      f"dequantize '{dqs[0].name}'"] + trip.fused


def _reads_parameters(node: Node, scale: Value, zero_point: Value) -> bool:
    return node.arg("scale") is scale and node.arg("zero_point") is zero_point


def _reduction(chooser: Node, x: Value, kind: str) -> list[Node]:
    """amin / amax of every element of x into a 0-d float32 value (choose_qparams's aminmax), in
    stages: the reduce kernel gives each unit of its output one invocation, so one reduction of
    everything runs on one lane (ViT-S/16's 75,648-element activations took 1.4 ms each on
    lavapipe). While more than STAGED_REDUCTION_UNITS values are left, a stage reduces the last dim
    alone, one invocation per row, then the last stage reduces what is left."""
    op = OPS[kind]
    nodes, v, shape = [], x, tuple(x.shape)
    while len(shape) > 1 and math.prod(shape) > STAGED_REDUCTION_UNITS:
        shape = shape[:-1]
        nodes.append(Node(f"{chooser.name}.{kind}_rows{len(nodes) or ''}", op.targets[0], op,
                          [("self", v), ("dim", [-1]), ("keepdim", False)], []))
        v = Value(nodes[-1].name, shape, "float32", Role.NODE, producer=nodes[-1])
        nodes[-1].outputs.append(("out", v))
    nodes.append(Node(f"{chooser.name}.{kind}", op.targets[0], op, [("self", v), ("dim", []), ("keepdim", False)], []))
    nodes[-1].outputs.append(("out", Value(nodes[-1].name, (), "float32", Role.NODE, producer=nodes[-1])))
    return nodes


def _dynamic_trip(chooser: Node, q: Node, dq: Node, low: Node, high: Node) -> Node:
    op = OPS["dynamic_quantize_dequantize"]
    args = [("self", q.arg("input")), ("observed_min", low.outputs[0][1]), ("observed_max", high.outputs[0][1]),
            ("quant_min", q.arg("quant_min")), ("quant_max", q.arg("quant_max")), ("eps", chooser.arg("eps"))]
    return Node(dq.name, op.targets[0], op, args, [("out", dq.outputs[0][1])])


# Conv kernels that can round their result to an int8 grid as they store it (the shape class
# `rt` of their templates: shaders/_conv_activation.glsl.j2); conv2d_pw becomes conv2d_pw_act.
ROUND_TRIP_HOSTS = frozenset({"conv2d_pw_act", "conv2d_dw3_s1", "conv2d_dw5_s1", "conv2d_dw7_s1", "conv2d_dw3_s2",
                              "conv2d_dw5_s2", "conv2d_wino", "conv2d_wino_runs"})
INT8_LANE = (-128, 127)  # the folded parameters travel as int8 lanes of one push constant


def fold_round_trips(graph: PlanGraph, limits) -> int:
    """Each quantize_dequantize that alone reads a conv kernel's result (a float conv between its
    int8 neighbours: MobileNetV3's pointwise and depthwise convs, int8_conv_form "float") becomes
    part of that conv's store: the conv rounds its activated value to the int8 grid as it writes
    it (rt_scale, rt_zero_point, rt_min, rt_max), the same float32 operations, one memory pass
    fewer. Run after the conv kernels are chosen; returns how many were folded."""
    folded = 0
    for trip in [n for n in graph.nodes if n.on_device and n.op.name == "quantize_dequantize"]:
        x = trip.arg("self")
        host = x.producer
        if (host is None or not host.on_device or x in graph.outputs or any(u is not trip for u in x.users)
                or x.dtype != "float32"):
            continue
        name = "conv2d_pw_act" if host.op.name == "conv2d_pw" else host.op.name
        if name not in ROUND_TRIP_HOSTS or host.arg("rt_scale"):
            continue
        params = [trip.value(k) for k in ("zero_point", "quant_min", "quant_max")]
        if not all(INT8_LANE[0] <= v <= INT8_LANE[1] for v in params):
            continue
        op = OPS[name]
        rt_args = [("rt_scale", trip.arg("scale")), ("rt_zero_point", params[0]), ("rt_min", params[1]),
                   ("rt_max", params[2])]
        node = Node(host.name, op.targets[0], op, list(host.args) + rt_args, [("out", trip.outputs[0][1])],
                    fx=host.fx, fused=list(host.fused) + [f"quantize_dequantize '{trip.name}' (rounded as it stores)"])
        if partition_reason(node, limits) is not None:
            continue
        _remove(graph, trip)
        _replace(graph, host, node)
        folded += 1
    return folded


def _share_round_trip(graph: PlanGraph, dq: Node, shared: Node) -> None:
    """`dq`'s readers read `shared`'s result instead (the same numbers); `dq` goes. `shared` took
    the place of an earlier dequantize (fuse_quantized walks the graph in order), so it still
    precedes every reader."""
    _redirect_readers(graph, dq.outputs[0][1], shared.outputs[0][1])
    _remove(graph, dq)
    shared.fused.append(f"dequantize '{dq.name}' (another reader's)")


def _redirect_readers(graph: PlanGraph, old: Value, new: Value) -> list[Node]:
    """Every reader of `old` reads `new` instead (its arguments and its CPU fallback's inputs);
    returns the readers."""
    readers = list(dict.fromkeys(old.users))
    for reader in readers:
        reader.args = [(a, _swap(x, old, new)) for a, x in reader.args]
        if reader in graph.fx_inputs:
            graph.fx_inputs[reader] = [_swap(x, old, new) for x in graph.fx_inputs[reader]]
        new.users += [reader] * old.users.count(reader)
    old.users.clear()
    return readers


def _transposed_weight(graph: PlanGraph, node: Node, limits) -> None:
    """A float mm / addmm left unfused reads its weight through a transpose of a dequantized
    weight: the transpose becomes a derived constant too, and a reader that ran on the CPU only
    because that weight was not a constant runs on Vulkan."""
    src, out = node.arg("self"), node.outputs[0][1]
    transpose = len(src.shape) == 2 and [d % 2 for d in node.arg("dims")] == [1, 0]
    if _weight(src) is None or not transpose or out in graph.outputs:
        return
    const = graph.add_derived(out.name, out.shape, src.dtype, "transposed", (src,))
    readers = _redirect_readers(graph, out, const)
    _remove(graph, node)
    for reader in readers:
        if reader.fallback is not None and NOT_CONSTANT in reader.fallback and reader.op is not None:
            reader.fallback = partition_reason(reader, limits)


NOT_CONSTANT = "is not a constant (it is prepacked at load)"  # lowering's reason for a weight computed at run time


def _swap(x, old: Value, new: Value):
    """`x` (an argument: a value, a list of values or a python value) with `old` replaced by `new`."""
    if x is old:
        return new
    if isinstance(x, list):
        return [new if y is old else y for y in x]
    return x


def _is_quantize(node: Node) -> bool:
    return node.target == QUANTIZE and node.outputs[0][1].dtype == "int8"


def _is_dequantize(node: Node | None) -> bool:
    return (node is not None and node.target == DEQUANTIZE and node.arg("input").dtype == "int8"
            and node.outputs[0][1].dtype == "float32")


def _params(node: Node) -> QParams:
    """The parameters of a lowered quantize / dequantize node."""
    return QParams(node.arg("scale"), node.arg("zero_point"), node.arg("quant_min"), node.arg("quant_max"),
                   dtype_name(node.arg("dtype")))


INT8_CONV_ENV = "TEXELFLOW_INT8_CONV"
INT8_CONV_FORMS = ("auto", "q8ta", "float")


def int8_conv_form(facts) -> tuple[str, str | None]:
    """("q8ta" or "float", why) for the quantized conv chains dq(x), w -> conv2d [-> act] -> q, and
    for the linear chains of at least FLOAT_LINEAR_MACS multiply-adds (smaller linears keep q8ta).
    "float" leaves the chain as it is: the conv runs on the float kernels (Winograd, im2col GEMM,
    depthwise) with the dequantized weight, between its input's dequantize and its output's
    quantize, so int8 tensors still flow between them and the numbers are the quantized graph's
    own (float sums rather than exact integer ones).
    TEXELFLOW_INT8_CONV=q8ta / float forces a form. "auto" takes "float" on a CPU device whose
    int8 dot products are not accelerated (lavapipe): there an int8 multiply-add costs an unpack
    and a float FMA, so q8ta_conv2d does a direct conv's work in float anyway, and the float
    kernels ran 1.3-3.2x faster per conv and int8 ResNet-18 1.7x faster (bench/int8.py,
    bench/RESULTS.md). Elsewhere (a GPU, or planning without a device) "q8ta"."""
    from .prepack_matmul import env_choice

    forced = env_choice(INT8_CONV_ENV, INT8_CONV_FORMS)
    if forced != "auto":
        return forced, f"{INT8_CONV_ENV}={forced}"
    if facts is not None and facts.device_type == "cpu" and facts.int8_dot is not True:
        return "float", "a cpu device without accelerated int8 dot products, where the float kernels run faster"
    return "q8ta", None


def _fuse_at(graph: PlanGraph, q: Node, limits, conv_form: tuple[str, str | None] = ("q8ta", None)) -> None:
    src = q.arg("input")
    core = src.producer
    if core is not None and core.op is not None and _only_user(graph, src) is q:
        if core.op.name in CLAMPS or _weighted_activation(core):
            inner = core.arg("self")
            p = inner.producer if isinstance(inner, Value) else None
            takes = TAKES_RELU if core.op.name in CLAMPS else TAKES_WEIGHTED_ACTIVATIONS
            if p is not None and p.op is not None and p.op.name in takes and _only_user(graph, inner) is core:
                if PATTERNS[p.op.name](_Match(graph, limits, q, p, core, conv_form=conv_form)):
                    return
        build = PATTERNS.get(core.op.name)
        if build is not None and build(_Match(graph, limits, q, core, None, conv_form=conv_form)):
            return
    _int8_identity(graph, q, limits)


@dataclass
class _Int8Input:
    """A float op's input read in int8: the dequantize it comes from, through `chain` (identity
    ops only this path reads, nearest the dequantize first), and `views`: those identity ops
    rebuilt on the int8 tensor (not yet in the graph)."""

    dequantize: Node
    params: QParams
    chain: list[Node]
    views: list[Node] = field(default_factory=list)

    @property
    def value(self) -> Value:
        return self.views[-1].outputs[0][1] if self.views else self.dequantize.arg("input")


def _int8_input(graph: PlanGraph, v, reader: Node, last: Value | None = None) -> _Int8Input | None:
    """`v` (read by `reader`) as a dequantize of an int8 tensor, perhaps through identity ops that
    only this path reads; their int8 copies are built (the graph is not touched until they are
    inserted), the last one's output `last` when given."""
    if not isinstance(v, Value):
        return None
    chain, user = [], reader
    while not _is_dequantize(v.producer):
        p = v.producer
        if p is None or p.op is None or not p.op.is_identity or len(p.outputs) != 1 or _only_user(graph, v) is not user:
            return None
        ins = [x for _, x in p.tensor_args()]
        if len(ins) != 1:
            return None
        chain.insert(0, p)
        user, v = p, ins[0]
    found = _Int8Input(v.producer, _params(v.producer), chain)
    src = found.dequantize.arg("input")
    for i, n in enumerate(chain):
        out = n.outputs[0][1]
        value = last if last is not None and i == len(chain) - 1 else Value(out.name, out.shape, "int8", Role.NODE)
        args = [(a, src if isinstance(x, Value) else x) for a, x in n.args]
        found.views.append(Node(n.name, n.target, n.op, args, [(n.outputs[0][0], value)], fx=n.fx))
        src = value
    return found


def _same_numbers(a: QParams, b: QParams) -> bool:
    """Whether quantizing with `b` what was dequantized with `a` gives back the same integers."""
    same = (a.scale, a.zero_point) == (b.scale, b.zero_point)
    return same and b.quant_min <= a.quant_min <= a.quant_max <= b.quant_max


def _int8_identity(graph: PlanGraph, q: Node, limits) -> None:
    """q(identity ops(dq(x))) with the same parameters is exactly the identity ops on x: they run
    (and fold) in int8, and the quantize and the dequantize go."""
    found = _int8_input(graph, q.arg("input"), q, last=q.outputs[0][1])
    if found is None or not found.chain or not _same_numbers(found.params, _params(q)):
        return
    last = found.views.pop()  # takes the quantize's place and its output value
    _replace(graph, q, last)
    graph.fx_inputs[last] = [x for _, x in last.tensor_args()]
    last.fallback = partition_reason(last, limits)
    _insert_views(graph, last, found.views, limits)
    last.fused = [f"runs on int8 '{found.dequantize.arg('input').name}': absorbed dequantize "
                  f"'{found.dequantize.name}' and quantize '{q.name}' (same parameters)"]
    _drop_absorbed(graph, found.chain[::-1], [found])


def _insert_views(graph: PlanGraph, before: Node, views: list[Node], limits) -> None:
    """Insert new nodes (int8 identity nodes, dynamic quantization's reductions) ahead of `before`,
    in order, each counted as a user of its inputs. A CPU fallback of an int8 view runs its float
    node's fx on the int8 tensor (`graph.fx_inputs`)."""
    at = graph.nodes.index(before)
    for view in views:
        graph.nodes.insert(at, view)
        at += 1
        ins = [v for _, v in view.tensor_args()]
        for v in ins:
            v.users.append(view)
        view.outputs[0][1].producer = view
        graph.fx_inputs[view] = ins
        view.fallback = partition_reason(view, limits)


def _drop_absorbed(graph: PlanGraph, nodes: list[Node], inputs: list[_Int8Input]) -> None:
    """Remove the absorbed float nodes (readers first), then each dequantize nothing reads any more."""
    for n in nodes:
        if n in graph.nodes:
            _remove(graph, n)
    for found in inputs:
        dq = found.dequantize
        out = dq.outputs[0][1]
        if dq in graph.nodes and not out.users and out not in graph.outputs:
            _remove(graph, dq)


# ---- one fused chain -----------------------------------------------------------------------------------
@dataclass
class _Match:
    """A chain being fused: `core` (the float op), `act` (its relu, or None), `q` (the quantize
    that ends the chain), and what a fused node absorbs besides them."""

    graph: PlanGraph
    limits: object
    q: Node
    core: Node
    act: Node | None
    inputs: list[_Int8Input] = field(default_factory=list)
    extra: list[Node] = field(default_factory=list)  # nodes only the chain read (a weight's transpose)
    conv_form: tuple[str, str | None] = ("q8ta", None)  # int8_conv_form of the device

    def input(self, v) -> _Int8Input | None:
        found = _int8_input(self.graph, v, self.core)
        if found is not None:
            self.inputs.append(found)
        return found

    def io_args(self, x: _Int8Input, prefix: str = "input_") -> list[tuple[str, object]]:
        """The input's and output's quantization arguments of a single-input q8ta op; a hardtanh /
        relu6 activation narrows the output's range (see clamped_range)."""
        out = _params(self.q)
        low, high = clamped_range(out, self.act)
        return [(f"{prefix}scale", x.params.scale), (f"{prefix}zero_point", x.params.zero_point),
                ("out_scale", out.scale), ("out_zero_point", out.zero_point),
                ("quant_min", low), ("quant_max", high)]

    def activation(self) -> list[tuple[str, object]]:
        """relu and hardswish are the kernels' own activations; hardtanh and relu6 live in the
        output range."""
        name = self.act.op.name if self.act is not None else "none"
        return [("activation", name if name in ("relu",) + WEIGHTED_ACTIVATIONS else "none")]

    def fuse(self, op_names: list[str], args: list[tuple[str, object]]) -> Node | None:
        """The first of `op_names` whose node runs on Vulkan takes the chain's place; None (the
        graph unchanged) when none does."""
        for op_name in op_names:
            op = OPS[op_name]
            fused = Node(self.core.name, op.targets[0], op, list(args), [("out", self.q.outputs[0][1])])
            if partition_reason(fused, self.limits) is None:
                break
        else:
            return None
        graph = self.graph
        _replace(graph, self.q, fused)
        graph.fx_inputs.pop(fused, None)  # (it never runs on the CPU)
        for found in self.inputs:
            _insert_views(graph, fused, found.views, self.limits)
        chains = [n for found in self.inputs for n in found.chain[::-1]]
        absorbed = [n for n in (self.act, self.core) if n is not None] + self.extra
        _drop_absorbed(graph, absorbed + chains, self.inputs)
        fused.fused = ([f"dequantize '{found.dequantize.name}'" for found in self.inputs]
                       + [f"{self.core.op.name} '{self.core.name}'"]
                       + [f"weight transpose '{n.name}'" for n in self.extra]
                       + ([f"{self.act.op.name} '{self.act.name}'"] if self.act is not None else [])
                       + [f"quantize '{self.q.name}'"]
                       + [f"reads {n.op.name} '{n.name}' in int8" for found in self.inputs for n in found.chain])
        return fused


def _conv2d(m: _Match) -> Node | None:
    conv = m.core
    x, w, bias = m.input(conv.arg("input")), _weight(conv.arg("weight")), conv.arg("bias")
    if x is None or w is None or w.axis not in (0, None) or len(x.value.shape) != 4 or not _float_constant(bias, 1):
        return None
    window = [_pair(conv.value(a)) for a in ("stride", "padding", "dilation")]
    if not all(isinstance(i, int) for pair in window for i in pair):
        return None  # (padding="same" / "valid" the canonical rewrite could not make explicit)
    if m.conv_form[0] == "float":
        conv.fused.append(f"kept in float between dequantize and quantize, not q8ta_conv2d: {m.conv_form[1]}")
        return None
    weight, scales, zero_points = w.operands(m.graph, conv.name)
    groups = conv.value("groups")
    args = [("input", x.value), ("weight", weight), ("weight_scales", scales), ("weight_zero_points", zero_points),
            ("bias", bias), ("stride", window[0]), ("padding", window[1]), ("dilation", window[2]),
            ("groups", groups)] + m.io_args(x) + m.activation()
    im2col = groups == 1 and x.value.shape[1] % 4 == 0
    return m.fuse(["q8ta_conv2d_im2col", "q8ta_conv2d"] if im2col else ["q8ta_conv2d"], args)


# The least multiply-adds for which a quantized linear takes the device's float form
# (int8_conv_form): on lavapipe linear_packed ran 1.4-1.9x faster than q8ta_linear at ViT-S/16's
# shapes (197 rows, 29M-116M multiply-adds; int8 ViT-S/16 1.44x faster), but a small linear saves
# less than its float form's added round trip costs (vit_tiny at 64 x 64, linears of 0.3M-2.5M:
# 14% slower in float); bench/RESULTS.md, eighth 2026-11-27 session.
FLOAT_LINEAR_MACS = 1 << 24


def _linear(m: _Match) -> Node | None:
    """linear(x, w [N, K], bias), mm(x, w [K, N]) or addmm(bias, x, w [K, N]), the [K, N] weight a
    transpose of a quantized [N, K] one or itself quantized along N. In the device's float form
    (int8_conv_form) a linear of at least FLOAT_LINEAR_MACS multiply-adds stays as it is, for the
    float GEMM kernels."""
    node, kind = m.core, m.core.op.name
    if kind == "linear":
        x_v, bias = node.arg("input"), node.arg("bias")
        w = _weight(node.arg("weight"))
        w = w if w is not None and w.axis in (0, None) else None
    else:
        x_v, bias = node.arg("mat1" if kind == "addmm" else "self"), node.arg("self") if kind == "addmm" else None
        if kind == "addmm" and (node.value("beta") != 1 or node.value("alpha") != 1):
            return None
        w = _matmul_weight(m, node.arg("mat2"))
    x = m.input(x_v)
    if x is None or w is None:
        return None
    weight, scales, zero_points = w.operands(m.graph, node.name)
    n = weight.shape[0]
    if isinstance(bias, Value) and bias.shape == (1, n) and _float_constant(bias, 2):
        bias = m.graph.add_derived(f"{node.name}_bias", (n,), "float32", "reshaped", (bias,), size=(n,))
    if not _float_constant(bias, 1) or (bias is not None and bias.shape != (n,)):
        return None
    macs = x.value.numel // weight.shape[1] * weight.shape[0] * weight.shape[1]
    if m.conv_form[0] == "float" and macs >= FLOAT_LINEAR_MACS:
        node.fused.append(f"kept in float between dequantize and quantize, not q8ta_linear: {m.conv_form[1]} "
                          f"({macs} multiply-adds)")
        return None
    args = [("input", x.value), ("weight", weight), ("weight_scales", scales), ("weight_zero_points", zero_points),
            ("bias", bias)] + m.io_args(x) + m.activation()
    k = weight.shape[1]
    one_row = x.value.shape[-1] == k and x.value.numel // k == 1
    return m.fuse(["q8ta_linear_gemv", "q8ta_linear"] if one_row else ["q8ta_linear"], args)


def _matmul_weight(m: _Match, v) -> "_Weight | None":
    """The quantized [N, K] weight behind mm / addmm's [K, N] operand: a transpose (permute
    [1, 0]) of one quantized along N, which the fused node absorbs when only it reads it, or a
    [K, N] weight quantized along N (or per tensor), transposed by a derived constant."""
    if not isinstance(v, Value) or len(v.shape) != 2:
        return None
    p = v.producer
    if p is not None and p.op is not None and p.op.name == "permute_copy" and [d % 2 for d in p.arg("dims")] == [1, 0]:
        w = _weight(p.arg("self"))
        if w is None or w.axis not in (0, None):
            return None
        if _only_user(m.graph, v) is m.core:
            m.extra.append(p)
        return w
    w = _weight(v)
    return w.transposed() if w is not None and w.axis in (1, None) else None


def _add(m: _Match) -> Node | None:
    add = m.core
    a, b = m.input(add.arg("self")), m.input(add.arg("other"))
    if a is None or b is None:
        return None  # (an operand that broadcasts: q8ta_add's checks decide)
    alpha = add.value("alpha")
    args = ([("self", a.value), ("other", b.value)] + m.io_args(a, "self_")[:2] + m.io_args(b, "other_")[:2]
            + m.io_args(a)[2:] + [("alpha", float(1.0 if alpha is None else alpha))] + m.activation())
    return m.fuse(["q8ta_add"], args)


def _relu(m: _Match) -> Node | None:
    x = m.input(m.core.arg("self"))
    return m.fuse(["q8ta_relu"], [("self", x.value)] + m.io_args(x, "self_")) if x is not None else None


def _pixel_shuffle(m: _Match) -> Node | None:
    x = m.input(m.core.arg("self"))
    if x is None:
        return None
    args = [("self", x.value), ("upscale_factor", m.core.arg("upscale_factor"))] + m.io_args(x, "self_")
    return m.fuse(["q8ta_pixel_shuffle"], args)


def quantize_number(x: float, p: QParams) -> int:
    """What quantize_per_tensor makes of the float `x`: float32 arithmetic, as torchao computes it."""
    import numpy as np

    scaled = np.float32(x) * np.float32(1.0 / p.scale)
    return int(min(max(np.round(scaled) + p.zero_point, p.quant_min), p.quant_max))


def clamped_range(out: QParams, act: Node | None) -> tuple[int, int]:
    """The output range of a fused op whose activation is `act`. Quantizing is monotone, so
    quantize(hardtanh(y, lo, hi)) == clamp(quantize(y), quantize(lo), quantize(hi)) exactly:
    hardtanh and relu6 become a narrower [quant_min, quant_max] (relu is the kernels' own)."""
    if act is None or act.op.name not in ("relu6", "hardtanh"):
        return out.quant_min, out.quant_max
    lo, hi = (0.0, 6.0) if act.op.name == "relu6" else (act.value("min_val"), act.value("max_val"))
    return quantize_number(float(lo), out), quantize_number(float(hi), out)


def _max_pool2d(m: _Match) -> Node | None:
    """max_pool2d between one quantization before and after is the max of the integers."""
    x = m.input(m.core.arg("self"))
    if x is None or not _same_numbers(x.params, _params(m.q)):
        return None
    args = [("self", x.value)] + [(name, v) for name, v in m.core.args if name != "self"]
    return m.fuse(["q8ta_max_pool2d"], args)


PATTERNS = {"conv2d": _conv2d, "linear": _linear, "mm": _linear, "addmm": _linear, "add": _add,
            "relu": _relu, "pixel_shuffle": _pixel_shuffle, "max_pool2d": _max_pool2d}
TAKES_RELU = ("conv2d", "linear", "mm", "addmm", "add")  # their q8ta ops apply relu themselves
CLAMPS = ("relu", "relu6", "hardtanh")  # activations a fused op applies (hardtanh, relu6: clamped_range)
TAKES_WEIGHTED_ACTIVATIONS = ("conv2d", "linear", "mm", "addmm")  # their q8ta ops also apply ...
WEIGHTED_ACTIVATIONS = ("hardswish", "gelu")  # ... these, in float before the quantize (gelu: erf form)


def _weighted_activation(node: Node) -> bool:
    """Whether `node` is an activation the q8ta convs and linears apply themselves."""
    if node.op.name == "gelu":
        return node.value("approximate") == "none"
    return node.op.name in WEIGHTED_ACTIVATIONS


def _pair(v) -> list[int]:
    """A conv's int[2] argument as two ints (an int or a one-element list repeats)."""
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return v * 2 if len(v) == 1 else v


def _float_constant(v, rank: int) -> bool:
    """None, or a float32 constant of `rank` dims (a bias the q8ta op reads as it is)."""
    return v is None or (isinstance(v, Value) and v.role is Role.CONST and v.dtype == "float32"
                         and len(v.shape) == rank)


# ---- quantized weights ---------------------------------------------------------------------------------
@dataclass
class _Weight:
    """A weight lowering dequantized from an int8 constant: the int8 tensor, its scales and zero
    points (per channel along `axis`; python numbers and axis None per tensor; zero points None
    when all 0), and whether the q8ta op takes it transposed."""

    int8: Value
    scales: Value | float
    zero_points: Value | int | None
    axis: int | None
    transpose: bool = False

    def transposed(self) -> "_Weight":
        return _Weight(self.int8, self.scales, self.zero_points, None if self.axis is None else 1 - self.axis, True)

    def operands(self, graph: PlanGraph, name: str) -> tuple[Value, Value, Value | None]:
        """(weight [N, ...] int8, scales [N] float32, zero points [N] int32 or None) as q8ta ops take
        them: derived constants where the frozen ones differ (uint8, a [K, N] weight, per tensor,
        int64 zero points, float64 scales)."""
        w = self.int8
        shift = w.dtype == "uint8"
        if shift:
            w = graph.add_derived(f"{name}_weight_int8", w.shape, "int8", "shifted", (w,), by=UINT8_SHIFT)
        if self.transpose:
            w = graph.add_derived(f"{name}_weight_t", w.shape[::-1], "int8", "transposed", (w,))
        n = w.shape[0]
        if isinstance(self.scales, Value):
            scales = self.scales
            if scales.dtype != "float32" or scales.shape != (n,):
                scales = graph.add_derived(f"{name}_weight_scales", (n,), "float32", "reshaped", (scales,), size=(n,))
        else:
            scales = graph.add_derived(f"{name}_weight_scales", (n,), "float32", "filled", (), value=self.scales,
                                       size=(n,))
        zp = self.zero_points
        if isinstance(zp, Value):
            if shift:
                zp = graph.add_derived(f"{name}_weight_zero_points", (n,), "int32", "shifted", (zp,), by=UINT8_SHIFT)
            elif zp.dtype != "int32" or zp.shape != (n,):
                zp = graph.add_derived(f"{name}_weight_zero_points", (n,), "int32", "reshaped", (zp,), size=(n,))
        else:
            number = (zp or 0) + (UINT8_SHIFT if shift else 0)
            zp = graph.add_derived(f"{name}_weight_zero_points", (n,), "int32", "filled", (), value=number,
                                   size=(n,)) if number else None
        return w, scales, zp


def _weight(v) -> _Weight | None:
    """The quantized weight behind a float weight `v`, when lowering dequantized it from an int8 /
    uint8 constant (a derived constant of a dequantize recipe), else None."""
    if not isinstance(v, Value) or v.role is not Role.CONST or v.derive is None:
        return None
    if v.derive.recipe not in DEQUANTIZED_WEIGHTS:
        return None
    d = v.derive
    params = dict(d.params)
    int8 = d.sources[0]
    if int8.dtype not in DTYPE_RANGES:
        return None
    if d.recipe == "dequantized_per_channel":
        if params.get("float_zero_points"):
            return None  # not an int8 weight with integer zero points: it stays float
        return _Weight(int8, d.sources[1], d.sources[2], params["axis"])
    return _Weight(int8, params["scale"], params["zero_point"] or None, None)


def _drop_unread_weights(graph: PlanGraph) -> None:
    """Remove the derived constants of quantized weights that no node reads, directly or as a
    source of one that is read (a weight the fusion took back as int8)."""
    live = {id(v) for v in graph.outputs}
    for n in graph.nodes:
        live.update(id(v) for _, v in n.tensor_args())
        live.update(id(v) for v in graph.fx_inputs.get(n, ()) if isinstance(v, Value))
    stack = [v for v in graph.constants if id(v) in live]
    while stack:
        v = stack.pop()
        for s in (v.derive.sources if v.derive is not None else ()):
            if s is not None and id(s) not in live:
                live.add(id(s))
                stack.append(s)
    graph.constants[:] = [v for v in graph.constants if id(v) in live or v.derive is None
                          or v.derive.recipe not in QUANTIZED_RECIPES]
