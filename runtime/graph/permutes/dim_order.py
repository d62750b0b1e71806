"""Dim-order contracts: explicit permutes around kernels that compute in another dim order.

An op of ops.yaml may declare `dim_order: {TENSOR: ORDER}`: its kernel reads or writes that tensor
as the model's tensor permuted by ORDER (conv2d_nhwc computes channels-last: input and out
(0, 2, 3, 1)). Nothing about it is hidden in a layout: lowering puts a `permute_copy` into the
kernel's order before each such input and one back after each such output, ordinary nodes that
the plan shows and counts (`plan.num_permutes`), and that the permute passes (this package) then
cancel where they can. A buffer permute whose two sides hold the same memory is free
(redundant.py), so the planner may make these permutes cost nothing.

    x [N, C, H, W] -> conv2d(x, w)                       (conv_dim_order="nchw", the default)
    x -> permute(0, 2, 3, 1) -> conv2d_nhwc(x', w') -> permute(0, 3, 1, 2)   (conv_dim_order="nhwc")

Which convolution kernel runs is the caller's explicit choice, `texelflow.plan / compile(...,
conv_dim_order=...)`: "nchw" keeps conv2d / conv2d_act on channels-packed textures, "nhwc" takes
every dense (groups 1) device conv2d / conv2d_act to conv2d_nhwc on buffers, its weight a derived
[KH, KW, Cin, Cout padded to 4] constant (`derived.nhwc_conv_weight`). Depthwise and grouped
convolutions stay.
"""

from __future__ import annotations

from typing import Sequence

from texelflow.generated.layouts import TEXTURE_LIMITS
from texelflow.generated.ops import OPS

from ..ir import Node, PlanGraph, Role, Value

CONV_DIM_ORDERS = ("nchw", "nhwc")
NHWC_CONVS = ("conv2d", "conv2d_act")  # device ops conv_dim_order="nhwc" takes to conv2d_nhwc
PERMUTE_TARGET = "aten.permute_copy.default"


def apply_dim_orders(graph: PlanGraph, conv_dim_order: str = "nchw",
                     limits: Sequence[int] = TEXTURE_LIMITS) -> PlanGraph:
    """Take convolutions to the kernel of `conv_dim_order`, then put explicit permutes around
    every node of an op with a dim-order contract. Runs once, after fusion and before the permute
    passes; returns the graph, changed in place."""
    if conv_dim_order not in CONV_DIM_ORDERS:
        raise ValueError(f"conv_dim_order={conv_dim_order!r}: expected one of {', '.join(CONV_DIM_ORDERS)}")
    if conv_dim_order == "nhwc":
        use_nhwc_convs(graph, limits)
    insert_dim_order_permutes(graph)
    return graph


def use_nhwc_convs(graph: PlanGraph, limits: Sequence[int] = TEXTURE_LIMITS) -> list[Node]:
    """Replace every dense device conv2d / conv2d_act by conv2d_nhwc (tensors still in the model's
    order: insert_dim_order_permutes reorders them). Returns the new nodes."""
    from ..lowering import partition_reason

    made = []
    for node in list(graph.nodes):
        if not node.on_device or node.op.name not in NHWC_CONVS or node.arg("groups", 1) != 1:
            continue
        weight = node.arg("weight")
        if not isinstance(weight, Value) or weight.role is not Role.CONST or len(weight.shape) != 4:
            continue
        cout, cin, kh, kw = weight.shape
        w_nhwc = Value(f"{weight.name}.nhwc", (kh, kw, cin, -(-cout // 4) * 4), weight.dtype, Role.CONST)
        args = [(n, w_nhwc if n == "weight" else v) for n, v in node.args if n != "groups"] + [("out_channels", cout)]
        conv = Node(node.name, OPS["conv2d_nhwc"].targets[0], OPS["conv2d_nhwc"], args, list(node.outputs),
                    fused=list(node.fused) + [f"channels-last (from {node.op.name})"])
        if partition_reason(_in_kernel_order(conv), limits) is not None:
            continue
        derived = graph.add_derived(w_nhwc.name, w_nhwc.shape, weight.dtype, "nhwc_conv_weight", [weight])
        conv.args = [(n, derived if v is w_nhwc else v) for n, v in conv.args]
        _swap(graph, node, conv)
        made.append(conv)
    return made


def insert_dim_order_permutes(graph: PlanGraph) -> list[Node]:
    """For every device node of an op with a dim_order, a permute_copy into the kernel's order
    before each listed input and one back after each listed output (the node's output value
    keeps its readers: the back permute produces it). Returns the permutes inserted."""
    inserted = []
    for node in [n for n in graph.nodes if n.on_device and n.op.dim_order]:
        orders = dict(node.op.dim_order)
        for name, v in list(node.tensor_args()) + node.outputs:
            if name in orders and len(v.shape) != len(orders[name]):
                raise ValueError(f"node '{node.name}': op '{node.op.name}' computes '{name}' in dim order "
                                 f"{list(orders[name])}, but '{v.name}' has rank {len(v.shape)}")
        at = graph.nodes.index(node)
        for i, (name, v) in enumerate(node.args):
            if name in orders and isinstance(v, Value):
                p = _permute(f"{node.name}.{name}_{_label(orders[name])}", v, orders[name])
                node.args[i] = (name, p.outputs[0][1])
                v.users.remove(node)
                p.outputs[0][1].users.append(node)
                graph.nodes.insert(at, p)
                at += 1
                inserted.append(p)
        for i, (name, v) in enumerate(node.outputs):
            if name in orders:
                order = orders[name]
                kept = Value(f"{v.name}.{_label(order)}", _permuted(v.shape, order), v.dtype, Role.NODE, producer=node)
                node.outputs[i] = (name, kept)
                back = _permute(f"{node.name}.{name}_back", kept, inverse(order), out=v)
                graph.nodes.insert(at + 1, back)
                at += 1
                inserted.append(back)
    return inserted


def inverse(order: Sequence[int]) -> tuple[int, ...]:
    """The permutation that undoes `order`: x.permute(order).permute(inverse(order)) is x."""
    inv = [0] * len(order)
    for i, d in enumerate(order):
        inv[d] = i
    return tuple(inv)


def conv2d_nhwc_reference(input, weight, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), out_channels=1,
                          activation="none", act_min=0.0, act_max=0.0):
    """What conv2d_nhwc computes, in torch (the kernel test's reference): the NCHW convolution of
    the channels-last input with the first `out_channels` of the [KH, KW, Cin, Cout4] weight, its
    result channels-last."""
    from texelflow.runtime.graph.fusion import conv2d_act_reference

    w = weight[..., :out_channels].permute(3, 2, 0, 1)  # [Cout, Cin, KH, KW]
    y = conv2d_act_reference(input.permute(0, 3, 1, 2), w, bias, stride, padding, dilation, 1, activation,
                             act_min, act_max)
    return y.permute(0, 2, 3, 1).contiguous()


# ---- helpers ---------------------------------------------------------------------------------------------
def _permuted(shape: Sequence[int], order: Sequence[int]) -> tuple[int, ...]:
    return tuple(shape[d] for d in order)


def _label(order: Sequence[int]) -> str:
    return "dims" + "".join(map(str, order))


def _permute(name: str, src: Value, order: Sequence[int], out: Value | None = None) -> Node:
    """A device permute_copy of `src` by `order`, writing `out` (a new value when None)."""
    node = Node(name, PERMUTE_TARGET, OPS["permute_copy"], [("self", src), ("dims", list(order))], [])
    if out is None:
        out = Value(name, _permuted(src.shape, order), src.dtype, Role.NODE)
    out.producer = node
    node.outputs.append(("out", out))
    src.users.append(node)
    return node


def _in_kernel_order(node: Node) -> Node:
    """A detached copy of `node` whose dim-ordered tensors have the kernel's shapes (for checks)."""
    orders = dict(node.op.dim_order)

    def reorder(name, v):
        if name in orders and isinstance(v, Value):
            return Value(v.name, _permuted(v.shape, orders[name]), v.dtype, v.role)
        return v

    return Node(node.name, node.target, node.op, [(n, reorder(n, v)) for n, v in node.args],
                [(n, reorder(n, v)) for n, v in node.outputs])


def _swap(graph: PlanGraph, old: Node, new: Node) -> None:
    """Put `new` where `old` was (same outputs); inputs count `new` as their user instead."""
    graph.nodes[graph.nodes.index(old)] = new
    graph.fx_inputs.pop(old, None)
    for _, v in old.tensor_args():
        if old in v.users:
            v.users.remove(old)
    for _, v in new.tensor_args():
        v.users.append(new)
    for _, v in new.outputs:
        v.producer = new
