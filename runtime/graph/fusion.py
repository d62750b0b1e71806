"""Pattern fusion on the planning IR, before layout planning (DESIGN §6 step 2).

In order, in place on the graph:
0. A decomposed convolution (`aten.convolution`) that is 2-D and not transposed becomes `conv2d`,
   and a conv2d / conv1d with padding="same" / "valid" (`aten.conv2d.padding`, `aten.conv1d.padding`)
   becomes `conv2d` / `conv1d` with explicit padding: the left / top half of "same" (the rest
   lies past the input, where taps read zero). An
   adaptive max pool whose indices nobody reads and whose windows tile the input becomes
   `max_pool2d` with kernel = stride = the window.
0b. A device conv1d with a constant weight runs as conv2d over [N, C, L, 1] between two views
   (the weight a derived [Cout, Cin/g, K, 1] constant): conv2d's tiled kernel is many times faster
   than conv1d's per-element one, which stays for what conv2d cannot take (an L past the texture
   limits).
0d. A device conv_transpose2d / conv_transpose1d with a constant weight runs as a stride-1
   conv2d over the input with one group of output channels per output phase (stride_h x
   stride_w of them) and phase_shuffle, which interleaves and crops them
   (runtime/graph/conv_transpose.py): the conv2d then takes the tiled kernels of step 6 (a
   U-Net's 2 x 2 stride-2 up-convolution a pointwise GEMM) where the transposed conv's own
   kernel computes one element per invocation. One whose phases meet different numbers of taps
   (k 3 s 2), groups 1, becomes conv_transpose2d_tiles: tiles of 8 pixels of one phase.
0c. An `expand` read only by ops that broadcast that argument themselves (ops.yaml's
   `broadcast_foldable` check lists them: the binary ops, where, ...) is dropped, and they read
   its input: `x / norm.expand_as(x)` (F.normalize), `x * mask.expand_as(x)`. The expand wrote
   the whole broadcast tensor for the op to read again; the op's broadcast path reads the small
   one. An op that would then fail its checks (a broadcast inside WHCN's N) keeps the expand.
1. A decomposed inference batch norm (`_native_batch_norm_legit_no_training`, whose outputs 1 and 2
   are empty) whose extra outputs nobody reads becomes a `batch_norm` node.
2. A batch norm that is not inference (training=True, or no running statistics) falls back, with
   its reason.
2b. In a bfloat16 program (runtime/graph/bfloat16.py), the round_bfloat16 between a conv, batch
   norm, add or linear and the batch norm or activation fused into it below is dropped, so that
   they still fuse (the fused kernel keeps that value in float32).
3. conv + batch norm folding: a device conv2d whose only user is an inference batch norm with
   constant parameters takes the batch norm's output; its weight and bias become derived
   constants (runtime/graph/derived.py) computed when the program prepacks.
3b. Any other inference batch norm with constant parameters becomes scale_shift(input, scale,
   shift): one multiply-add per element, scale and shift [C, 1, ..] derived constants.
4. A depthwise conv2d (groups == Cin == Cout) becomes a `conv2d_dw` node: its own kernel (on
   lavapipe every path of a shader costs, taken or not, so depthwise and dense do not share one).
5. conv + activation: a device conv2d or conv2d_dw (folded or not) whose only user is relu,
   relu6 / hardtanh, hardswish, silu, gelu or hardsigmoid becomes one `conv2d_act` /
   `conv2d_dw_act` node (ops.yaml), one dispatch; likewise a float device add whose only user is
   relu or relu6 / hardtanh becomes one `add_act` (a residual block's add + relu).
6. Kernel choice (`choose_conv_kernels`, skipped with `choose_kernels=False`): a device conv2d /
   conv2d_act / conv2d_dw / conv2d_dw_act with a constant weight takes the specialised kernel its
   parameters allow, its weight a derived constant prepacked for it (runtime/graph/prepack_conv.py):
     pointwise (1x1, stride 1, padding 0, groups 1)  -> conv2d_pw / conv2d_pw_act (a GEMM)
     3x3 (stride 1, dilation 1, groups 1), >= 64     -> conv2d_wino4_input, linear_packed (batched weight),
       channels in and out (WINO4_MIN_CHANNELS)        conv2d_wino4_output (Winograd F(4x4, 3x3))
     other 3x3 (stride 1, dilation 1, groups 1)      -> conv2d_wino (Winograd F(2x2, 3x3), any padding),
                                                        or conv2d_wino_runs where subgroups fit and
                                                        the output blocks fill runs of 8 (fills_runs)
     depthwise 3x3 / 5x5 / 7x7 (stride 1, dil. 1)    -> conv2d_dw3_s1 / _dw5_s1 / _dw7_s1 (rows loaded once)
     depthwise 3x3 / 5x5 (stride 2, dilation 1)      -> conv2d_dw3_s2 / conv2d_dw5_s2 (the same at stride 2)
     any other dense conv (groups 1), Cout >= 64     -> conv_im2col, linear_packed (linear_wg on a GPU), permute_copy
     any other dense conv (groups 1)                 -> conv2d_gemm (an implicit GEMM)
   Grouped convs, dilated depthwise ones (and those of other strides or sizes) and tall outputs
   narrower than 4 (conv1d runs as [N, C, L, 1]: the specialised kernels tile along W, the
   general one 4 x 8) stay on the general conv2d / conv2d_act (conv2d_dw / conv2d_dw_act). The
   decision is made here, once, so no kernel pays at run time for a path it does not take.
   Where every conv takes the im2col form (a GPU), a pointwise conv of one output pixel (a
   squeeze-excite block's) takes conv2d_pw_gemv_wg instead: a GEMV on channels-packed texels.
   The im2col form (ResNet's stem and strided convs, ViT's patch embedding) builds the column
   matrix [N, OH, OW, Cin * KH * KW] and multiplies it by the weight on linear_packed (or
   linear_wg, as step 7 chooses), whose output [N, OH, OW, Cout] a permute takes back to NCHW; it
   needs a GEMM the device can run (`subgroup`, as step 7) and a column matrix of at most
   IM2COL_MAX_BYTES.
6a. At the end of step 6, a conv2d_pw whose input is, for it alone, a mul of x by s
   [N or 1, Cin, 1, 1] (a squeeze-excite gate: MobileNetV3, EfficientNet) becomes
   conv2d_pw_scaled(x, s, ...): it multiplies each input texel as it loads it, and the mul's
   dispatch goes.
6b. linear + constant scale: a device linear with a constant float32 weight whose only user
   multiplies it by a constant that varies along its last dim at most (ConvNeXt's layer scale
   gamma [C], a query's 1 / sqrt(d)) takes the mul's output; its weight and bias become the
   scaled derived constants (the weight's rows times the scale), one dispatch fewer.
7. Matmul kernel choice (runtime/graph/prepack_matmul.py, always): a device linear with a constant
   float32 weight becomes linear_packed / linear_packed_gemv (linear_wg for several rows on a
   GPU, linear_gemv_wg for one), its weight prepacked [K, N].
8. linear + activation: a linear_packed / linear_packed_gemv / linear_wg / linear_gemv_wg whose
   only user is relu, relu6 / hardtanh, hardswish, silu, gelu or hardsigmoid applies it at its
   store (its `activation` argument): a transformer MLP's linear + gelu, one dispatch.
8b. A global average pool (adaptive_avg_pool2d to 1 x 1) where GEMMs take workgroup tiles (a GPU)
   becomes global_avg_pool_wg: 64 invocations share each unit of out.
9. Split K (prepack_matmul.split_k; with `choose_kernels=False` the caller runs it after choosing
   the conv kernels): a linear_wg whose 64 x 64 blocks would launch fewer than SPLITK_WORKGROUPS
   workgroups becomes linear_wg_splitk (slices along K) + linear_splitk_sum (their sum, the bias
   and the activation). Only a GPU takes linear_wg, so only a GPU's plans change.
Each fused node lists what it absorbed in `node.fused`, which the plan shows.
"""

from __future__ import annotations

from typing import Sequence

from texelflow.generated.layouts import TEXTURE_LIMITS
from texelflow.generated.ops import OPS

from .ir import Node, PlanGraph, Role, Value
from .lowering import partition_reason
from .prepack_conv import hw_pair as _pair

DECOMPOSED_BN = "aten._native_batch_norm_legit_no_training.default"
DECOMPOSED_CONV = "aten.convolution.default"
PADDING_MODE_CONVS = {"aten.conv2d.padding": ("conv2d", 4), "aten.conv1d.padding": ("conv1d", 3)}  # -> (op, rank)
ADAPTIVE_MAX_POOL = "aten.adaptive_max_pool2d.default"
ADAPTIVE_MAX_POOL_1D = "aten.adaptive_max_pool1d.default"
CONV_DW_TARGET = "texelflow.conv2d_dw.default"
# conv or add op -> the op that also applies an activation (step 5)
WITH_ACTIVATION = {"conv2d": "conv2d_act", "conv2d_dw": "conv2d_dw_act", "add": "add_act",
                   "linear_packed": "linear_packed", "linear_packed_gemv": "linear_packed_gemv",
                   "linear_wg": "linear_wg", "linear_gemv_wg": "linear_gemv_wg"}

# activation target -> (the `activation` value of conv2d_act / conv2d_dw_act, act_min, act_max)
ACTIVATIONS = {
    "aten.relu.default": ("relu", 0.0, 0.0),
    "aten.relu6.default": ("hardtanh", 0.0, 6.0),
    "aten.hardtanh.default": ("hardtanh", -1.0, 1.0),  # torch's defaults; min_val / max_val override
    "aten.hardswish.default": ("hardswish", 0.0, 0.0),
    "aten.hardsigmoid.default": ("hardsigmoid", 0.0, 0.0),  # MobileNetV3's squeeze-excite gate
    "aten.silu.default": ("silu", 0.0, 0.0),
    "aten.gelu.default": ("gelu", 0.0, 0.0),  # approximate='tanh' -> gelu_tanh
}


def fuse_patterns(graph: PlanGraph, texture_limits: Sequence[int] = TEXTURE_LIMITS,
                  choose_kernels: bool = True, subgroup=None, gemm: str | None = None, costs=None) -> PlanGraph:
    """Rewrite `graph` in place with every fusion that applies; returns it. `choose_kernels=False`
    leaves every dense conv on the general conv2d / conv2d_act kernel (step 6 skipped: what
    conv_dim_order="nhwc" retargets, and the baseline of bench/conv.py). `subgroup`: the device's
    prepack_matmul.SubgroupFacts, which decide whether the subgroup-shuffle matmul kernels fit
    (None: assumed to fit) and which GEMM tiling a device takes; `gemm` forces a tiling and
    `costs` (a measured cost table) chooses one per node (prepack_matmul.py)."""
    for node in list(graph.nodes):
        if node.target == DECOMPOSED_CONV:
            canonical_conv2d(graph, node, texture_limits)
        elif node.target == DECOMPOSED_BN:
            _canonical_batch_norm(graph, node, texture_limits)
        elif node.target in PADDING_MODE_CONVS:
            _explicit_padding_conv(graph, node, texture_limits)
        elif node.target == ADAPTIVE_MAX_POOL:
            _tiled_adaptive_max_pool(graph, node, texture_limits)
        elif node.target == ADAPTIVE_MAX_POOL_1D:
            _adaptive_max_pool1d(graph, node, texture_limits)
    _fold_broadcast_expands(graph, texture_limits)
    from .quantized import fold_round_trips, fuse_quantized  # (it imports this module's graph surgery)

    fuse_quantized(graph, texture_limits, subgroup)  # before float fusion takes a quantized chain's conv or relu
    for node in list(graph.nodes):
        if node.on_device and node.op.name == "conv1d":
            _conv1d_as_conv2d(graph, node, texture_limits)
        elif node.on_device and node.op.name in ("conv_transpose2d", "conv_transpose1d"):
            _conv_transpose_as_phases(graph, node, texture_limits)
    for node in graph.nodes:
        if node.op is not None and node.op.name == "batch_norm" and node.fallback is None:
            node.fallback = _not_inference(node)
    for node in list(graph.nodes):  # 2b: a bfloat16 program's roundings between ops fused below
        if node.on_device and node.op.name == "round_bfloat16":
            _round_inside_fusion(graph, node)
    for node in list(graph.nodes):
        if _is_device_conv(node):
            _fold_batch_norm(graph, node)
    for node in list(graph.nodes):  # 3b: the batch norms no conv took
        if node.on_device and node.op.name == "batch_norm":
            _batch_norm_as_scale_shift(graph, node, texture_limits)
    for node in list(graph.nodes):
        if _is_device_conv(node) and _is_depthwise(node):
            _to_depthwise(graph, node)
    for node in list(graph.nodes):
        if _is_device_conv(node) or (node.on_device and node.op.name == "conv2d_dw"):
            _fuse_activation(graph, node)
        elif node.on_device and node.op.name == "add" and node.outputs[0][1].dtype in ("float32", "float16"):
            _fuse_activation(graph, node)
    if choose_kernels:
        choose_conv_kernels(graph, texture_limits, subgroup, gemm, costs)
    from .prepack_matmul import PACKED_OPS, choose_matmul_kernels, split_k

    for node in list(graph.nodes):  # 6b: a constant scale after a linear, into its weight
        if node.on_device and node.op.name == "linear":
            _fold_column_scale(graph, node)
    choose_matmul_kernels(graph, texture_limits, subgroup, gemm, costs)  # linear -> linear_packed (prepack_matmul.py)
    for node in list(graph.nodes):  # 8: the packed linears take their activation
        if node.on_device and node.op.name in PACKED_OPS:
            _fuse_activation(graph, node)
    _gpu_global_pools(graph, texture_limits, subgroup, gemm)  # 8b: a GPU's global average pools
    if choose_kernels:  # else the caller splits and folds, after it has chosen the conv kernels
        split_k(graph, texture_limits)  # 9: a GPU's GEMMs of few blocks, split along K
        fold_round_trips(graph, texture_limits)  # 10: round trips into the conv kernels' stores
    return graph


# ---- graph surgery ---------------------------------------------------------------------------------
def _only_user(graph: PlanGraph, v: Value) -> Node | None:
    """The one node reading `v` once, when no one else (nor the graph's outputs) reads it."""
    if len(v.users) != 1 or v in graph.outputs:
        return None
    return v.users[0]


def _replace(graph: PlanGraph, old: Node, new: Node) -> None:
    """Put `new` where `old` was; `new`'s inputs count it as a user instead of `old`."""
    graph.nodes[graph.nodes.index(old)] = new
    if old in graph.fx_inputs:  # what a CPU fallback of it reads (lowering's record)
        graph.fx_inputs[new] = graph.fx_inputs.pop(old)
    _drop_uses(old)
    for _, v in new.tensor_args():
        v.users.append(new)
    for _, v in new.outputs:
        v.producer = new


def _drop_uses(node: Node) -> None:
    for _, v in node.tensor_args():
        if node in v.users:
            v.users.remove(node)


def _remove(graph: PlanGraph, node: Node) -> None:
    graph.nodes.remove(node)
    graph.fx_inputs.pop(node, None)
    _drop_uses(node)


# ---- 0c: expands that a broadcasting op does itself ------------------------------------------------
def _broadcast_args(node: Node) -> set[str]:
    """The arguments that `node`'s op broadcasts to its output (its broadcast_foldable checks)."""
    names: set[str] = set()
    for check in node.op.checks:
        if check.rule == "broadcast_foldable":
            listed = dict(check.params)["broadcast_foldable"]
            names.update([listed] if isinstance(listed, str) else listed)
    return names


def _broadcast_shape(*shapes: Sequence[int]) -> tuple[int, ...] | None:
    """torch's broadcast of `shapes` (aligned to the right), or None where they do not broadcast."""
    rank = max(map(len, shapes), default=0)
    out = []
    for i in range(rank):
        sizes = {s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0} - {1}
        if len(sizes) > 1:
            return None
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def _fold_broadcast_expands(graph: PlanGraph, limits: Sequence[int]) -> None:
    """Step 0c: each user of an expand that broadcasts the expanded argument itself (to the same
    output shape, its checks still passing) reads the expand's input; an expand left unread goes."""
    for node in list(graph.nodes):
        if not (node.on_device and node.op.name == "expand"):
            continue
        src, out = node.arg("self"), node.outputs[0][1]
        if not isinstance(src, Value) or out in graph.outputs:
            continue
        for user in list(dict.fromkeys(out.users)):
            if not user.on_device:
                continue
            names = _broadcast_args(user)
            at = [i for i, (name, v) in enumerate(user.args) if v is out]
            if not at or any(user.args[i][0] not in names for i in at):
                continue
            others = [tuple(v.shape) for name, v in user.args if name in names and isinstance(v, Value) and v is not out]
            if _broadcast_shape(tuple(src.shape), *others) != tuple(user.outputs[0][1].shape):
                continue
            before = list(user.args)
            for i in at:
                user.args[i] = (user.args[i][0], src)
            if partition_reason(user, limits) is not None:
                user.args[:] = before
                continue
            out.users[:] = [u for u in out.users if u is not user]
            src.users.extend([user] * len(at))
            user.fused.append(f"{node.name}: an expand of {list(src.shape)} to {list(out.shape)}, broadcast by the op itself")
        if not out.users:
            _remove(graph, node)


# ---- 2b: bfloat16 roundings inside a fusion -------------------------------------------------------------
# ops whose result fusion joins with a batch norm or an activation read after it
FUSES_INTO = {"conv2d": ("batch_norm", "activation"), "conv2d_dw": ("batch_norm", "activation"),
              "batch_norm": ("activation",), "add": ("activation",), "linear": ("activation",)}


def _round_inside_fusion(graph: PlanGraph, node: Node) -> None:
    """Drop a bfloat16 program's round_bfloat16 (runtime/graph/bfloat16.py) between a conv, batch
    norm, add or linear and the batch norm or activation that steps 3, 5 and 8 fuse into it, so
    they still fuse: the fused kernel keeps that value in float32 where torch rounds it to
    bfloat16 (one rounding fewer, docs/runtime.md)."""
    src, out = node.arg("self"), node.outputs[0][1]
    producer, reader = src.producer, _only_user(graph, out)
    if producer is None or not producer.on_device or _only_user(graph, src) is not node or reader is None \
            or not reader.on_device or next(iter(reader.tensor_args()), (None, None))[1] is not out:
        return
    wanted = FUSES_INTO.get(producer.op.name, ())
    if not ("batch_norm" in wanted and reader.op.name == "batch_norm" or "activation" in wanted and _activation(reader)):
        return
    from .bfloat16 import bypass

    bypass(graph, node)
    producer.fused = producer.fused + [f"bfloat16 rounding '{node.name}' dropped (fuses with '{reader.name}')"]
    if graph.bfloat16 is not None:
        graph.bfloat16.in_fusion += 1


# ---- 0, 1, 2: decomposed ops, batch norm ----------------------------------------------------------------
def canonical_conv2d(graph: PlanGraph, node: Node, limits) -> Node | None:
    """A decomposed 2-D convolution as the conv2d op in its place, or a transposed one as
    conv_transpose2d (the new node), else None. Lowering calls it on a decomposition's pieces
    (conv3d's per-frame convs, fold's one-hot transposed conv), the fusion pass on the
    convolutions of a run_decompositions graph."""
    x = node.arg("input")
    if node.op is None or node.op.name != "convolution" or not isinstance(x, Value) or len(x.shape) != 4:
        return None
    if node.arg("transposed"):
        keep = ("input", "weight", "bias", "stride", "padding", "output_padding", "groups", "dilation")
        op = OPS["conv_transpose2d"]
    elif any(node.arg("output_padding") or ()):
        return None
    else:
        keep = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
        op = OPS["conv2d"]
    args = dict(node.args)
    conv = Node(node.name, node.target, op, [(n, args[n]) for n in keep if n in args], list(node.outputs), fx=node.fx)
    _replace(graph, node, conv)
    conv.fallback = partition_reason(conv, limits)
    return conv


def _explicit_padding_conv(graph: PlanGraph, node: Node, limits) -> None:
    """conv2d / conv1d(padding="same" | "valid") as conv2d / conv1d with explicit padding. torch
    pads "same" by d * (k - 1) per dim, the odd element on the right / bottom: the kernel pads the
    left / top half and reads zero past the input, so the output (sized by the node) is the same."""
    op_name, rank = PADDING_MODE_CONVS[node.target]
    x, w = node.arg("input"), node.arg("weight")
    mode = node.arg("padding", "valid")
    if not isinstance(x, Value) or not isinstance(w, Value) or len(x.shape) != rank or mode not in ("same", "valid"):
        return
    spatial = w.shape[2:]
    dilation = list(node.arg("dilation") or [1])
    dilation = dilation * len(spatial) if len(dilation) == 1 else dilation
    padding = [d * (k - 1) // 2 if mode == "same" else 0 for d, k in zip(dilation, spatial)]
    args = []
    for name in ("input", "weight", "bias", "stride", "padding", "dilation", "groups"):
        value = padding if name == "padding" else node.arg(name)
        if value is not None or name == "bias":
            args.append((name, value))
    conv = Node(node.name, node.target, OPS[op_name], args, list(node.outputs), fx=node.fx)
    _replace(graph, node, conv)
    conv.fallback = partition_reason(conv, limits)


def _gpu_global_pools(graph: PlanGraph, limits, subgroup, gemm: str | None) -> None:
    """Step 8b: where GEMMs take workgroup tiles (a GPU: prepack_matmul.gemm_tiles), a device
    adaptive_avg_pool2d to 1 x 1 becomes global_avg_pool_wg, 64 invocations per unit of out
    (adaptive_pool2d walks all of H x W in one invocation per texel: a few hundred on a GPU)."""
    from .prepack_matmul import gemm_tiles

    pools = [n for n in graph.nodes if n.on_device and n.op.name == "adaptive_avg_pool2d"
             and tuple(n.outputs[0][1].shape[-2:]) == (1, 1)]
    if not pools or gemm_tiles(subgroup, gemm)[0] != "workgroup":
        return
    op = OPS["global_avg_pool_wg"]
    for node in pools:
        new = Node(node.name, op.targets[0], op, [("self", node.arg("self"))], list(node.outputs))
        new.fused = list(node.fused) + ["global_avg_pool_wg kernel: 64 invocations per unit of out, "
                                        "where GEMMs take workgroup tiles (a GPU)"]
        if partition_reason(new, limits) is None:
            _replace(graph, node, new)


def _tiled_adaptive_max_pool(graph: PlanGraph, node: Node, limits) -> None:
    """adaptive_max_pool2d whose indices nobody reads: as max_pool2d where its windows tile the
    input (H, W multiples of the output size: torch's windows are then [i * k, (i + 1) * k)),
    else as adaptive_max_pool2d_values (torch's windows of unequal size, one by one)."""
    x = node.arg("self")
    if not isinstance(x, Value) or len(x.shape) not in (3, 4) or len(node.outputs) != 2:
        return
    out, indices = node.outputs[0][1], node.outputs[1][1]
    (h, w), (oh, ow) = x.shape[-2:], out.shape[-2:]
    if indices.users or indices in graph.outputs:
        node.fallback = "adaptive_max_pool2d's indices are read: only its values run on Vulkan"
        return
    if oh and ow and h % oh == 0 and w % ow == 0:
        window = [h // oh, w // ow]
        pool = Node(node.name, node.target, OPS["max_pool2d"],
                    [("self", x), ("kernel_size", window), ("stride", window)], [("out", out)], fx=node.fx)
    else:
        op = OPS["adaptive_max_pool2d_values"]
        pool = Node(node.name, op.targets[0], op, [("self", x), ("output_size", [oh, ow])], [("out", out)],
                    fx=node.fx)
    _replace(graph, node, pool)
    pool.fallback = partition_reason(pool, limits)


def _adaptive_max_pool1d(graph: PlanGraph, node: Node, limits) -> None:
    """adaptive_max_pool1d whose indices nobody reads (`F.adaptive_max_pool1d(x, 1)`, a text
    CNN's max over time) as view(x, [.., 1, L]) -> adaptive_max_pool2d_values -> view back; left
    as it is unless all three run on Vulkan."""
    x = node.arg("self")
    if not isinstance(x, Value) or len(x.shape) not in (2, 3) or len(node.outputs) != 2:
        return
    out, indices = node.outputs[0][1], node.outputs[1][1]
    if indices.users or indices in graph.outputs:
        node.fallback = "adaptive_max_pool1d's indices are read: only its values run on Vulkan"
        return
    lead, length, size = list(x.shape[:-1]), x.shape[-1], out.shape[-1]
    view_op, pool_op = OPS["view_copy"], OPS["adaptive_max_pool2d_values"]
    to_2d = Node(f"{node.name}/as_2d", "aten.view.default", view_op, [("self", x), ("size", lead + [1, length])], [])
    to_2d.outputs = [("out", Value(f"{node.name}/as_2d", tuple(lead + [1, length]), x.dtype, Role.NODE, producer=to_2d))]
    pool = Node(f"{node.name}/pool", pool_op.targets[0], pool_op, [("self", to_2d.outputs[0][1]), ("output_size", [1, size])], [])
    pool.outputs = [("out", Value(f"{node.name}/pool", tuple(lead + [1, size]), x.dtype, Role.NODE, producer=pool))]
    back = Node(node.name, "aten.view.default", view_op, [("self", pool.outputs[0][1]), ("size", list(out.shape))],
                [("out", out)])
    if any(partition_reason(m, limits) for m in (to_2d, pool, back)):
        return
    back.fused = node.fused + ["adaptive_max_pool1d as adaptive_max_pool2d_values over [.., 1, L]"]
    _replace_by_chain(graph, node, [to_2d, pool, back])


def _conv1d_as_conv2d(graph: PlanGraph, node: Node, limits) -> None:
    """Step 0b: view(input, [N, C, L, 1]) -> conv2d (stride, padding, dilation (s, 1), (p, 0),
    (d, 1)) -> view back to [N, Cout, Lout]; left as it is unless all three run on Vulkan. L goes
    to H, not W: conv2d's tiles are 4 x 8 output texels (W x H), so a [.., 1, L] output would
    fill an eighth of each tile, [.., L, 1] a quarter."""
    x, w, b = node.arg("input"), node.arg("weight"), node.arg("bias")
    out = node.outputs[0][1]
    if not isinstance(w, Value) or w.role is not Role.CONST or len(x.shape) != 3:
        return
    (n, cin, length), (cout, cin_g, k), lout = x.shape, w.shape, out.shape[-1]
    view_op = OPS["view_copy"]

    def value(suffix, shape, producer):
        return Value(f"{node.name}/{suffix}", shape, out.dtype, Role.NODE, producer=producer)

    to_2d = Node(f"{node.name}/as_2d", "aten.view.default", view_op, [("self", x), ("size", [n, cin, length, 1])], [])
    to_2d.outputs = [("out", value("as_2d", (n, cin, length, 1), to_2d))]
    w2d = graph.add_derived(f"{w.name}_as_2d", (cout, cin_g, k, 1), w.dtype, "reshaped", (w,), size=(cout, cin_g, k, 1))
    stride, padding, dilation = (_single(node.value(a)) for a in ("stride", "padding", "dilation"))
    args = [("input", to_2d.outputs[0][1]), ("weight", w2d), ("bias", b), ("stride", [stride, 1]),
            ("padding", [padding, 0]), ("dilation", [dilation, 1]), ("groups", node.value("groups"))]
    conv = Node(f"{node.name}/conv2d", "aten.conv2d.default", OPS["conv2d"], args, [])
    conv.outputs = [("out", value("conv2d", (n, cout, lout, 1), conv))]
    back = Node(node.name, "aten.view.default", view_op, [("self", conv.outputs[0][1]), ("size", list(out.shape))],
                [("out", out)])
    if any(partition_reason(m, limits) for m in (to_2d, conv, back)):
        graph.constants.remove(w2d)
        return
    back.fused = node.fused + ["conv1d as conv2d over [N, C, L, 1]"]
    _replace_by_chain(graph, node, [to_2d, conv, back])


def _conv_transpose_as_phases(graph: PlanGraph, node: Node, limits) -> None:
    """Step 0d: a transposed conv with a constant weight as a stride-1 conv2d of its phases and
    phase_shuffle, or where its phases meet different numbers of taps (groups 1) as
    conv_transpose2d_tiles (runtime/graph/conv_transpose.py); left as it is where neither applies."""
    from .conv_transpose import phase_conv_chain, tiles_chain

    chain = phase_conv_chain(graph, node, limits) or tiles_chain(graph, node, limits)
    if chain is not None:
        _replace_by_chain(graph, node, chain)


def _replace_by_chain(graph: PlanGraph, node: Node, chain: list[Node]) -> None:
    """`node` replaced by the nodes of `chain` in order, the last taking its place and outputs."""
    at = graph.nodes.index(node)
    _replace(graph, node, chain[-1])
    for m in reversed(chain[:-1]):
        graph.nodes.insert(at, m)
        for _, v in m.tensor_args():
            v.users.append(m)


def _single(v):
    """The one value of a 1-D conv's int[1] argument (an int as it is)."""
    return v[0] if isinstance(v, (list, tuple)) else v


def _canonical_batch_norm(graph: PlanGraph, node: Node, limits) -> None:
    extra = [v for _, v in node.outputs[1:]]
    if any(v.users or v in graph.outputs for v in extra):
        return
    keep = {"input", "weight", "bias", "running_mean", "running_var", "momentum", "eps"}
    bn = Node(node.name, node.target, OPS["batch_norm"], [(n, v) for n, v in node.args if n in keep],
              [("out", node.outputs[0][1])], fx=node.fx)
    bn.args.append(("training", False))
    _replace(graph, node, bn)
    bn.fallback = partition_reason(bn, limits)


def _not_inference(node: Node) -> str | None:
    if node.arg("training"):
        return "training=True: batch statistics are computed on the CPU (only inference batch norm runs on Vulkan)"
    for name in ("running_mean", "running_var"):
        if node.arg(name) is None:
            return f"'{name}' is None: batch statistics are computed on the CPU"
    return None


def _is_device_conv(node: Node) -> bool:
    return node.on_device and node.op.name == "conv2d"


def _const_or_none(v) -> bool:
    return v is None or (isinstance(v, Value) and v.role is Role.CONST and v.dtype == "float32")


# ---- 3: conv + batch norm ------------------------------------------------------------------------------
def _fold_batch_norm(graph: PlanGraph, conv: Node) -> None:
    out = conv.outputs[0][1]
    bn = _only_user(graph, out)
    if bn is None or not bn.on_device or bn.op.name != "batch_norm" or bn.arg("input") is not out:
        return  # (a batch norm on the CPU stays there: training, mutated statistics, ...)
    params = [bn.arg(n) for n in ("weight", "bias", "running_mean", "running_var")]
    weight, bias = conv.arg("weight"), conv.arg("bias")
    if not all(_const_or_none(v) for v in [weight, bias] + params) or weight is None:
        return
    gamma, beta, mean, var = params
    eps = float(bn.value("eps"))
    cout = weight.shape[0]
    new_w = graph.add_derived(f"{weight.name}_bn_folded", weight.shape, "float32", "bn_folded_conv_weight",
                              (weight, gamma, var), eps=eps)
    new_b = graph.add_derived(f"{bias.name if bias is not None else conv.name + '_bias'}_bn_folded", (cout,),
                              "float32", "bn_folded_conv_bias", (bias, gamma, beta, mean, var), eps=eps)
    args = [(n, v) for n, v in conv.args if n not in ("weight", "bias")]
    args.insert(1, ("weight", new_w))
    args.insert(2, ("bias", new_b))
    folded = Node(conv.name, conv.target, conv.op, args, [("out", bn.outputs[0][1])])
    folded.fused = conv.fused + [f"folded batch norm '{bn.name}' into weight and bias"]
    _remove(graph, bn)
    _replace(graph, conv, folded)


def _batch_norm_as_scale_shift(graph: PlanGraph, bn: Node, limits) -> None:
    """Step 3b: an inference batch norm with constant parameters that no conv absorbed (after a
    concat, an add, a pool) as scale_shift(input, scale, shift), both [C, 1, ..] derived
    constants computed at load: one multiply-add per element where the batch_norm kernel loads
    four parameters, takes a square root and divides for every element (DenseNet's
    pre-activations ran at a fifth of relu's speed)."""
    x = bn.arg("input")
    params = [bn.arg(n) for n in ("weight", "bias", "running_mean", "running_var")]
    gamma, beta, mean, var = params
    if not isinstance(x, Value) or len(x.shape) < 2 or mean is None or var is None \
            or not all(_const_or_none(v) for v in params):
        return
    eps = float(bn.value("eps"))
    size = (x.shape[1],) + (1,) * (len(x.shape) - 2)
    scale = graph.add_derived(f"{bn.name}_scale", size, "float32", "bn_scale", (gamma, var), eps=eps, size=size)
    shift = graph.add_derived(f"{bn.name}_shift", size, "float32", "bn_shift", (beta, gamma, mean, var), eps=eps,
                              size=size)
    op = OPS["scale_shift"]
    node = Node(bn.name, op.targets[0], op, [("self", x), ("scale", scale), ("shift", shift)], list(bn.outputs))
    if partition_reason(node, limits):
        graph.constants.remove(scale)
        graph.constants.remove(shift)
        return
    node.fused = bn.fused + ["inference batch norm as one multiply-add per element (scale and shift at load)"]
    _replace(graph, bn, node)


# ---- 6b: linear + constant scale ----------------------------------------------------------------------
def _column_scale(mul: Node, out: Value) -> Value | None:
    """The constant `mul` multiplies `out` by, where it varies along the last dim at most and
    leaves the shape as it is (one element, or [.., 1, N]); else None."""
    if not mul.on_device or mul.op.name != "mul" or mul.outputs[0][1].shape != out.shape:
        return None
    args = dict(mul.tensor_args())
    if set(args) != {"self", "other"}:
        return None
    scale = args["other"] if args["self"] is out else args["self"] if args["other"] is out else None
    if scale is None or scale is out or not _const_or_none(scale) or len(scale.shape) > len(out.shape):
        return None
    if scale.numel != 1 and (scale.numel != out.shape[-1] or scale.shape[-1] != out.shape[-1]):
        return None
    return scale


def _fold_column_scale(graph: PlanGraph, linear: Node) -> None:
    """Step 6b: a linear whose only user multiplies it by a constant along its columns (directly,
    or through identity ops such as an inference dropout) takes the product as its output, with
    weight[n, :] and bias[n] times scale[n], derived at load."""
    out = linear.outputs[0][1]
    weight, bias = linear.arg("weight"), linear.arg("bias")
    if weight is None or not _const_or_none(weight) or not _const_or_none(bias) or out.dtype != "float32":
        return
    between = []  # identity ops on the way (an inference dropout), dropped with the mul
    mul = _only_user(graph, out)
    while mul is not None and mul.on_device and mul.op.is_identity and mul.outputs[0][1].shape == out.shape:
        between.append(mul)
        mul = _only_user(graph, mul.outputs[0][1])
    if mul is None:
        return
    scale = _column_scale(mul, between[-1].outputs[0][1] if between else out)
    if scale is None:
        return
    n = weight.shape[0]
    new_w = graph.add_derived(f"{weight.name}_scaled_{mul.name}", weight.shape, "float32", "column_scaled_weight",
                              (weight, scale))
    args = [(k, new_w if k == "weight" else v) for k, v in linear.args]
    if bias is not None:
        new_b = graph.add_derived(f"{bias.name}_scaled_{mul.name}", (n,), "float32", "column_scaled_bias",
                                  (bias, scale), n=n)
        args = [(k, new_b if k == "bias" else v) for k, v in args]
    folded = Node(linear.name, linear.target, linear.op, args, [("out", mul.outputs[0][1])])
    folded.fused = linear.fused + [f"folded mul by '{scale.name}' into weight and bias"]
    for node in between + [mul]:
        _remove(graph, node)
    _replace(graph, linear, folded)


# ---- 4: depthwise --------------------------------------------------------------------------------------
def _is_depthwise(conv: Node) -> bool:
    cin = conv.arg("input").shape[1]
    groups = conv.value("groups")
    return conv.arg("weight").shape[:2] == (cin, 1) and groups == cin


def _to_depthwise(graph: PlanGraph, conv: Node) -> None:
    dw = Node(conv.name, CONV_DW_TARGET, OPS["conv2d_dw"], list(conv.args), list(conv.outputs))
    dw.fused = list(conv.fused)
    _replace(graph, conv, dw)


# ---- 5: conv + activation -------------------------------------------------------------------------------
def _activation(node: Node) -> tuple[str, float, float] | None:
    """(activation, act_min, act_max) of a node conv2d_act can absorb, else None."""
    spec = ACTIVATIONS.get(node.target)
    if spec is None:
        return None
    name, lo, hi = spec
    if node.target == "aten.hardtanh.default":
        lo, hi = float(node.arg("min_val", lo)), float(node.arg("max_val", hi))
    if node.target == "aten.gelu.default":
        approximate = node.arg("approximate", "none")
        if approximate not in ("none", "tanh"):
            return None
        name = "gelu_tanh" if approximate == "tanh" else "gelu"
    values = set(OPS["conv2d_act"].arg_spec("activation").values) & set(OPS["conv2d_dw_act"].arg_spec("activation").values)
    return (name, lo, hi) if name in values else None


def _activation_of(graph: PlanGraph, node: Node, allowed) -> tuple[Node, Value, tuple] | None:
    """(the activation node, its result, (activation, act_min, act_max)) when `node`'s output has
    one user, an activation whose value is in `allowed` (ACTIVATIONS), of its shape and dtype."""
    out = node.outputs[0][1]
    act = _only_user(graph, out)
    if act is None or not act.outputs or next(iter(act.tensor_args()), (None, None))[1] is not out:
        return None
    spec = _activation(act)
    result = act.outputs[0][1]
    if spec is None or spec[0] not in allowed or len(act.outputs) != 1 or result.shape != out.shape \
            or result.dtype != out.dtype:
        return None
    return act, result, spec


def _fuse_activation(graph: PlanGraph, node: Node) -> None:
    """Steps 5 and 8: `node` (a device conv, an add into add_act, a packed linear) takes its
    activation's output."""
    op = OPS[WITH_ACTIVATION[node.op.name]]
    found = _activation_of(graph, node, op.arg_spec("activation").values)
    if found is None:
        return
    act, result, (name, lo, hi) = found
    args = list(node.args) + [("activation", name), ("act_min", lo), ("act_max", hi)]
    fused = Node(node.name, op.targets[0], op, args, [("out", result)])
    fused.fused = node.fused + [f"fused {name} '{act.name}'"]
    _remove(graph, act)
    _replace(graph, node, fused)


# ---- 6: kernel choice ------------------------------------------------------------------------------------
# (kernel size, stride) of the square depthwise convs with a kernel of their own (conv2d_dw{K}_s{S}:
# MobileNet's 3 and 5 at strides 1 and 2, ConvNeXt's 7 at stride 1); kernel class "depthwise{K}" at
# stride 1, "depthwise{K}s2" at stride 2
DEPTHWISE_SIZES = (3, 5, 7)
DEPTHWISE_S2_SIZES = (3, 5)
DEPTHWISE = {**{f"depthwise{k}": f"conv2d_dw{k}_s1" for k in DEPTHWISE_SIZES},
             **{f"depthwise{k}s2": f"conv2d_dw{k}_s2" for k in DEPTHWISE_S2_SIZES}}
# general conv op -> {kernel class: the specialised op}
WINOGRAD = {"winograd": "conv2d_wino", "winograd_runs": "conv2d_wino_runs"}  # both for conv2d and conv2d_act
SPECIALISED = {"conv2d": {"pointwise": "conv2d_pw", **WINOGRAD, "dense": "conv2d_gemm"},
               "conv2d_act": {"pointwise": "conv2d_pw_act", **WINOGRAD, "dense": "conv2d_gemm"},
               "conv2d_dw": DEPTHWISE, "conv2d_dw_act": DEPTHWISE}
# kernel class -> (prepack recipe, weight suffix)
PREPACKS = {"pointwise": ("pointwise_conv_weight", "pointwise"),
            **{kind: ("winograd_f2_weight", "winograd") for kind in WINOGRAD},
            "dense": ("conv_gemm_weight", "gemm"),
            **{kind: ("depthwise_conv_weight", "depthwise") for kind in DEPTHWISE}}


def fills_runs(channels: int) -> bool:
    """Whether `channels` output channels (blocks of 4) rounded up to whole runs of 8 blocks leave
    at most one lane in 8 idle: conv2d_wino_runs gives each run of 8 lanes 8 output blocks of one
    tile, so 8, 12, 24 or 48 channels (2, 3, 6, 12 blocks) would idle most or a quarter of a run;
    60 channels (15 blocks, one lane idle in 16) and any multiple of 32 fill them."""
    blocks = -(-channels // 4)
    return 8 * -(-blocks // 8) * 7 <= blocks * 8


def conv_kernel_class(node: Node) -> str:
    """Which kernel a device conv2d / conv2d_act / conv2d_dw / conv2d_dw_act runs on, from its
    parameters: "pointwise", "winograd", "dense", a key of DEPTHWISE ("depthwise3", "depthwise5s2", ...)
    or "general"."""
    weight = node.arg("weight")
    if not isinstance(weight, Value) or weight.role is not Role.CONST or len(weight.shape) != 4:
        return "general"
    (kh, kw), groups = weight.shape[2:], node.value("groups") or 1
    stride, padding = _pair(node.value("stride") or [1]), _pair(node.value("padding") or [0])
    dilation = _pair(node.value("dilation") or [1])
    oh, ow = node.outputs[0][1].shape[-2:]
    if ow < 4 and oh >= 4:
        return "general"  # their tiles run along W: the general one's 4 x 8 suits a tall, narrow output better
    if node.op.name in ("conv2d_dw", "conv2d_dw_act"):
        if dilation == (1, 1) and kh == kw and stride in ((1, 1), (2, 2)):
            kind = f"depthwise{kh}" + ("s2" if stride == (2, 2) else "")
            if kind in DEPTHWISE:
                return kind
        return "general"
    if groups != 1:
        return "general"
    if stride != (1, 1):
        return "dense"
    if (kh, kw) == (1, 1) and padding == (0, 0):
        return "pointwise"
    if (kh, kw) == (3, 3) and dilation == (1, 1):
        return "winograd"
    return "dense"


def _dense_weight(node: Node) -> bool:
    """Whether conv `node` has groups=1 and a constant 4-D weight: the convs an im2col GEMM can run."""
    w = node.arg("weight")
    return ((node.value("groups") or 1) == 1 and isinstance(w, Value) and w.role is Role.CONST
            and len(w.shape) == 4)


def choose_conv_kernels(graph: PlanGraph, limits: Sequence[int] = TEXTURE_LIMITS, subgroup=None,
                        gemm: str | None = None, costs=None) -> list[Node]:
    """Step 6: retarget every device conv2d / conv2d_act that a specialised kernel takes; returns
    the new nodes. `subgroup` (prepack_matmul.SubgroupFacts, None: assumed to fit) decides
    whether a 3x3 conv may take conv2d_wino_runs, whose runs of 8 lanes share each input window
    through subgroupShuffle (where its output blocks fill such runs, fills_runs; else, or where
    subgroups do not fit, conv2d_wino, and the note says why), and whether a dense conv may take
    the im2col form, whose GEMM is linear_packed (or linear_wg: `gemm`, `costs` and the facts
    choose, as for a linear: prepack_matmul.packed_gemm_op). The other conv kernels use no
    subgroup operations."""
    from .prepack_matmul import gemm_tiles, shuffle_unfit

    form = conv_forms()
    # Where GEMMs take workgroup tiles (a GPU), every conv the im2col GEMM holds takes it: the
    # Winograd and pointwise kernels are register-tiled for a CPU device, and on an H100 ResNet-18
    # ran in 5.2 ms GPU time this way against 12.0 ms with them (bench/RESULTS.md)
    every_im2col = form == "im2col" or (form == "auto" and gemm_tiles(subgroup, gemm)[0] == "workgroup")
    made = []
    for node in list(graph.nodes):
        if not node.on_device or node.op.name not in SPECIALISED:
            continue
        kernel = conv_kernel_class(node)
        if every_im2col and kernel == "pointwise" and tuple(node.outputs[0][1].shape[-2:]) == (1, 1):
            gemv = _pixel_gemv(graph, node, limits)  # a squeeze-excite conv: no im2col, no layout change
            if gemv is not None:
                made.append(gemv)
                continue
        im2col_wanted = kernel == "dense" or (every_im2col and _dense_weight(node))
        if im2col_wanted and _im2col_fits(node, subgroup, gemm, every_im2col):
            why = None if kernel == "dense" else (f"a {kernel} conv in im2col form: " + (
                f"{CONV_ENV}=im2col" if form == "im2col" else "GEMMs take workgroup tiles"))
            im2col = _im2col_gemm(graph, node, limits, subgroup, gemm, costs, why)
            if im2col:
                made += im2col
                continue
        note = None
        if kernel == "winograd" and wino4_fits(node, subgroup):
            wino4 = _wino4_gemm(graph, node, limits)
            if wino4:
                made += wino4
                continue
        if kernel == "winograd":
            cout = node.arg("weight").shape[0]
            unfit = shuffle_unfit(subgroup)
            if unfit is None and fills_runs(cout):
                kernel = "winograd_runs"
            else:
                note = f", not conv2d_wino_runs: {unfit or f'{cout} output channels leave runs of 8 lanes idle'}"
        op_name = SPECIALISED[node.op.name].get(kernel)
        if op_name is None:
            continue
        new, packed = _specialised(graph, node, OPS[op_name], kernel)
        if note:  # the kernel note says why: "conv2d_wino kernel (from conv2d), not conv2d_wino_runs: ..."
            new.fused[-1] += note
        if retarget(graph, node, new, packed, limits):
            made.append(new)
    for node in list(made):  # 6a: a squeeze-excite gate's mul into the pointwise conv after it
        if node.op.name == "conv2d_pw":
            scaled = _scaled_pointwise(graph, node, limits)
            if scaled is not None:
                made[made.index(node)] = scaled
    return made


def _scaled_pointwise(graph: PlanGraph, conv: Node, limits: Sequence[int]) -> Node | None:
    """Step 6a: a conv2d_pw whose input is, for it alone, x * s with s [N or 1, Cin, 1, 1] (a
    squeeze-excite block's gate: MobileNetV3, EfficientNet) becomes conv2d_pw_scaled(x, s, ...),
    which multiplies each input texel as it loads it; the mul's dispatch goes."""
    x = conv.arg("input")
    mul = x.producer
    if mul is None or not mul.on_device or mul.op.name != "mul" or _only_user(graph, x) is not conv \
            or x.dtype != "float32":
        return None
    args = dict(mul.tensor_args())
    if set(args) != {"self", "other"}:
        return None
    n, c = x.shape[0], x.shape[1]
    for data, scale in ((args["self"], args["other"]), (args["other"], args["self"])):
        if data.shape == x.shape and scale.dtype == "float32" and len(scale.shape) == 4 \
                and scale.shape[0] in (1, n) and tuple(scale.shape[1:]) == (c, 1, 1):
            break
    else:
        return None
    op = OPS["conv2d_pw_scaled"]
    rest = [(k, v) for k, v in conv.args if k != "input"]
    new = Node(conv.name, op.targets[0], op, [("input", data), ("in_scale", scale)] + rest, list(conv.outputs))
    if partition_reason(new, limits):
        return None
    new.fused = conv.fused + [f"the mul by '{scale.name}' taken in as its input is loaded"]
    _remove(graph, mul)
    _replace(graph, conv, new)
    return new


def _pixel_gemv(graph: PlanGraph, conv: Node, limits: Sequence[int]) -> Node | None:
    """A pointwise conv of one output pixel as conv2d_pw_gemv_wg (a GPU's GEMV on channels-packed
    texels, the weight prepacked as for the im2col form), or None where that op would not take
    it. The im2col form would copy the pixel into a width-packed row, multiply, and view the
    result back through a buffer: 4 transitions per conv in MobileNetV3-small's GPU plan."""
    from .prepack_matmul import TILE_N, padded

    w = conv.arg("weight")
    cout, cin = w.shape[:2]
    packed = graph.add_derived(f"{w.name}.im2col_kn", (padded(cin, 4), padded(cout, TILE_N)), w.dtype,
                               "conv_im2col_weight_kn", (w,))
    op = OPS["conv2d_pw_gemv_wg"]
    new = Node(conv.name, op.targets[0], op,
               [("input", conv.arg("input")), ("weight", packed), ("bias", conv.arg("bias")), ("out_channels", cout)]
               + [(a, v) for a, v in conv.args if a in ("activation", "act_min", "act_max")], list(conv.outputs))
    new.fused = list(conv.fused) + [f"conv2d_pw_gemv_wg kernel (from {conv.op.name}): a pointwise conv of one "
                                    "output pixel, where GEMMs take workgroup tiles; weight prepacked [Cin, Cout]"]
    return new if retarget(graph, conv, new, packed, limits) else None


# A dense conv takes the im2col form when it has at least this many output channels and its
# column matrix holds at most IM2COL_MAX_BYTES (float32). Measured on lavapipe (bench/RESULTS.md),
# per conv, im2col + GEMM + permute against conv2d_gemm: ResNet-18's stem (64 channels) 43 vs 50
# ms, its seven dense convs together 70-74 vs 84-86 ms (each from 4% slower to 40% faster),
# ViT-S/16's patch embedding (384) 10 vs 27 ms;
# with fewer channels linear_packed's 16-column tiles fill badly (MobileNetV3's 16-channel stem:
# 5.4 vs 3.3 ms for the GEMM alone) and ConvNeXt-atto's 40-channel stem was no faster (its
# 80- to 320-channel 2x2 downsampling convs, which take it, come out about even).
IM2COL_MIN_COUT = 64
IM2COL_MAX_BYTES = 64 << 20


CONV_ENV = "TEXELFLOW_CONV"
CONV_FORMS = ("auto", "im2col", "specialised")


def conv_forms() -> str:
    """TEXELFLOW_CONV, the form of a groups=1 conv: "im2col" (every one the im2col GEMM can hold
    takes it, whatever its kernel class and channel count), "specialised" (only the "dense" class
    with IM2COL_MIN_COUT channels or more does; Winograd and pointwise convs keep their kernels) or
    "auto" (the default: "im2col" where GEMMs take workgroup tiles, on a GPU; else "specialised").
    `bench/gemm_tiles.py` times the forms against each other on the device at hand."""
    from .prepack_matmul import env_choice

    return env_choice(CONV_ENV, CONV_FORMS)


def _im2col_fits(conv: Node, subgroup, gemm: str | None = None, any_cout: bool = False) -> bool:
    from .prepack_matmul import PACKED_LINEAR, packed_gemm_op, shuffle_unfit

    w = conv.arg("weight")
    n, _, oh, ow = conv.outputs[0][1].shape
    cout, cin, kh, kw = w.shape
    return ((any_cout or cout >= IM2COL_MIN_COUT)
            and (shuffle_unfit(subgroup) is None or packed_gemm_op(n * oh * ow, subgroup, gemm)[0] != PACKED_LINEAR)
            and n * oh * ow * -(-cin * kh * kw // 4) * 16 <= IM2COL_MAX_BYTES)


def _conv_geometry(conv: Node) -> list[tuple[str, list[int]]]:
    """kernel_size, stride, padding and dilation of `conv`, explicit (torch's export omits
    defaults): the arguments conv2d_gemm and conv_im2col take."""
    return [("kernel_size", list(conv.arg("weight").shape[2:])), ("stride", list(_pair(conv.value("stride") or [1]))),
            ("padding", list(_pair(conv.value("padding") or [0]))),
            ("dilation", list(_pair(conv.value("dilation") or [1])))]


def _im2col_gemm(graph: PlanGraph, conv: Node, limits: Sequence[int], subgroup=None, tiling: str | None = None,
                 costs=None, form_why: str | None = None) -> list[Node]:
    """Put conv_im2col -> linear_packed (or linear_wg: packed_gemm_op) -> permute_copy where the
    dense conv `conv` was (its activation applied by the GEMM at the store); returns the three
    nodes, or [] (and leaves the graph as it was) when one of them could not run on the device.
    `form_why`, for a conv outside the dense class, says in the GEMM's note why it took this form."""
    from .prepack_matmul import TILE_N, packed_gemm_op, padded

    x, w, out = conv.arg("input"), conv.arg("weight"), conv.outputs[0][1]
    cout, cin, kh, kw = w.shape
    n, _, oh, ow = out.shape
    k = cin * kh * kw
    im2col = Node(f"{conv.name}.im2col", OPS["conv_im2col"].targets[0], OPS["conv_im2col"],
                  [("input", x)] + _conv_geometry(conv), [])
    cols = Value(im2col.name, (n, oh, ow, k), out.dtype, Role.NODE, producer=im2col)
    im2col.outputs = [("out", cols)]
    packed = graph.add_derived(f"{w.name}.im2col_kn", (padded(k, 4), padded(cout, TILE_N)), w.dtype,
                               "conv_im2col_weight_kn", (w,))
    priced_out = [("out", Value("priced", (n, oh, ow, cout), out.dtype, Role.NODE))]
    gemm_name, why = packed_gemm_op(n * oh * ow, subgroup, tiling, costs,
                                    [("input", cols), ("weight", packed), ("bias", conv.arg("bias")),
                                     ("out_features", cout)], priced_out, limits)
    gemm_op = OPS[gemm_name]
    gemm = Node(f"{conv.name}.gemm", gemm_op.targets[0], gemm_op,
                [("input", cols), ("weight", packed), ("bias", conv.arg("bias")), ("out_features", cout)]
                + [(a, v) for a, v in conv.args if a in ("activation", "act_min", "act_max")], [])
    nhwc = Value(gemm.name, (n, oh, ow, cout), out.dtype, Role.NODE, producer=gemm)
    gemm.outputs = [("out", nhwc)]
    permute = Node(conv.name, OPS["permute_copy"].targets[0], OPS["permute_copy"],
                   [("self", nhwc), ("dims", [0, 3, 1, 2])], [("out", out)])
    made = [im2col, gemm, permute]
    if not _splice(graph, conv, made, [packed], limits):
        return []
    kind = f"conv_im2col + {gemm_op.name} ({why}; from {conv.op.name}{'; ' + form_why if form_why else ''})"
    im2col.fused = [f"im2col of {conv.name}"]
    gemm.fused = list(conv.fused) + [kind]
    permute.fused = [f"NHWC -> NCHW of {conv.name}"]
    return made


# A 3x3 stride-1 conv takes Winograd F(4x4, 3x3) as three nodes (conv2d_wino4_input, linear_packed,
# conv2d_wino4_output) where both channel counts reach WINO4_MIN_CHANNELS: the input transform is
# then done once per tile and input channel, not once per output block as in conv2d_wino's fused
# F(2x2) kernel, and the 36 products run as one batched GEMM (a quarter of the direct conv's
# multiply-adds, against F(2x2)'s 4/9). Against conv2d_wino_runs on lavapipe, one conv each, relu
# fused: 64 -> 64 at 56 x 56 1.20x, 128 at 28 1.49x, 256 at 14 1.73x, 512 at 7 1.23x, but 32 -> 32
# at 64 x 64 0.83x (bench/RESULTS.md): with fewer channels the transforms' memory traffic outweighs
# the multiply-adds saved.
WINO4_MIN_CHANNELS = 64
# ... and where its two intermediates, [36, T, Cin] and [36, T, Cout] float32 (2.25 times the
# input and the output), each hold at most this many bytes: the fused kernels need none, so a
# large image keeps them rather than grow the program's memory by hundreds of MiB.
WINO4_MAX_BYTES = 64 << 20


def _wino4_rows(conv: Node) -> int:
    """Rows of each of F(4x4)'s 36 product matrices: the conv's 4x4 output tiles, rounded up to
    whole 8-row tiles of the GEMM."""
    from .prepack_conv import wino4_tiles
    from .prepack_matmul import padded

    n, _, h, w = conv.arg("input").shape
    _, _, th, tw = wino4_tiles(h, w, list(_pair(conv.value("padding") or [0])))
    return padded(n * th * tw, 8)


def wino4_fits(conv: Node, subgroup=None) -> bool:
    """Whether a Winograd-class conv takes the F(4x4) form: enough input and output channels,
    intermediates within WINO4_MAX_BYTES, and subgroups that linear_packed's shuffles fit
    (prepack_matmul.shuffle_unfit)."""
    from .prepack_matmul import shuffle_unfit

    cout, cin = conv.arg("weight").shape[:2]
    return (min(cin, cout) >= WINO4_MIN_CHANNELS and 36 * _wino4_rows(conv) * max(cin, cout) * 4 <= WINO4_MAX_BYTES
            and shuffle_unfit(subgroup) is None)


def _wino4_gemm(graph: PlanGraph, conv: Node, limits: Sequence[int]) -> list[Node]:
    """Put conv2d_wino4_input -> linear_packed -> conv2d_wino4_output where the 3x3 stride-1 conv
    `conv` was (its bias and activation applied by the output transform); returns the three nodes,
    or [] (and leaves the graph as it was) when one of them could not run on the device (a device
    limit)."""
    from .prepack_conv import padded4
    from .prepack_matmul import PACKED_LINEAR, TILE_N, padded

    x, w, out = conv.arg("input"), conv.arg("weight"), conv.outputs[0][1]
    cout, cin = w.shape[:2]
    padding = list(_pair(conv.value("padding") or [0]))
    tiles = _wino4_rows(conv)
    v_node = Node(f"{conv.name}.wino4_in", OPS["conv2d_wino4_input"].targets[0], OPS["conv2d_wino4_input"],
                  [("input", x), ("padding", padding)], [])
    v = Value(v_node.name, (36, tiles, cin), out.dtype, Role.NODE, producer=v_node)
    v_node.outputs = [("out", v)]
    u = graph.add_derived(f"{w.name}.winograd4", (36, padded(cin, 4), padded(cout, TILE_N)), w.dtype,
                          "winograd_f4_weight", (w,))
    # the untransformed weight, for the direct sums of tiles that come out NaN
    direct = graph.add_derived(f"{w.name}.wino4_direct", (9, padded4(cin), padded4(cout)), w.dtype, "conv_gemm_weight",
                               (w,))
    gemm_op = OPS[PACKED_LINEAR]
    gemm = Node(f"{conv.name}.wino4_gemm", gemm_op.targets[0], gemm_op,
                [("input", v), ("weight", u), ("bias", None), ("out_features", cout)], [])
    m = Value(gemm.name, (36, tiles, cout), out.dtype, Role.NODE, producer=gemm)
    gemm.outputs = [("out", m)]
    o_node = Node(conv.name, OPS["conv2d_wino4_output"].targets[0], OPS["conv2d_wino4_output"],
                  [("m", m), ("input", x), ("weight", direct), ("bias", conv.arg("bias")), ("padding", padding),
                   ("out_channels", cout)] + [(a, val) for a, val in conv.args if a in ("activation", "act_min", "act_max")],
                  [("out", out)])
    made = [v_node, gemm, o_node]
    if not _splice(graph, conv, made, [u, direct], limits):
        return []
    v_node.fused = [f"Winograd F(4x4, 3x3) input transform of {conv.name}"]
    gemm.fused = [f"Winograd F(4x4, 3x3) products of {conv.name}: {cin} and {cout} channels "
                  f"(>= {WINO4_MIN_CHANNELS})"]
    o_node.fused = list(conv.fused) + [f"conv2d_wino4_input + linear_packed + conv2d_wino4_output (from {conv.op.name})"]
    return made


def _splice(graph: PlanGraph, conv: Node, made: list[Node], constants: list[Value], limits: Sequence[int]) -> bool:
    """Put the nodes `made` (the last one writing conv's output) where `conv` was, if every one of
    them runs on the device; else drop their new `constants` and leave the graph as it was."""
    if any(partition_reason(node, limits) is not None for node in made):
        for c in constants:
            graph.constants.remove(c)
        return False
    at = graph.nodes.index(conv)
    graph.nodes[at:at + 1] = made
    graph.fx_inputs.pop(conv, None)
    _drop_uses(conv)
    for node in made:
        for _, v in node.tensor_args():
            v.users.append(node)
    made[-1].outputs[0][1].producer = made[-1]
    return True


def retarget(graph: PlanGraph, old: Node, new: Node, packed: Value, limits: Sequence[int]) -> bool:
    """Put `new`, a faster kernel's node reading its prepacked weight `packed`, where `old` was,
    if the new op takes it (its partition check); else drop `packed` and keep `old`. Shared by the
    conv and matmul kernel choices."""
    if partition_reason(new, limits) is not None:
        graph.constants.remove(packed)
        return False
    _replace(graph, old, new)
    return True


def _specialised(graph: PlanGraph, conv: Node, op, kernel: str) -> tuple[Node, Value]:
    """The `op` node of a conv of kernel class `kernel`, and its prepacked weight (a new derived
    constant, runtime/graph/prepack_conv.py)."""
    from .prepack_conv import padded4

    recipe, suffix = PREPACKS[kernel]
    w = conv.arg("weight")
    cout, cin, kh, kw = w.shape
    shape = {"pointwise": (padded4(cin), padded4(cout)),
             **{kind: (padded4(cout) // 4, padded4(cin) // 4, 256) for kind in WINOGRAD},
             "dense": (kh * kw, padded4(cin), padded4(cout)),
             **{kind: (kh * kw, padded4(cout)) for kind in DEPTHWISE}}[kernel]
    packed = graph.add_derived(f"{w.name}.{suffix}", shape, w.dtype, recipe, (w,))
    args = [("input", conv.arg("input")), ("weight", packed), ("bias", conv.arg("bias"))]
    padding = list(_pair(conv.value("padding") or [0]))  # explicit: torch's export omits defaults
    args += {"pointwise": [("out_channels", cout)],
             **{kind: [("padding", padding), ("out_channels", cout)] for kind in WINOGRAD},
             "dense": _conv_geometry(conv) + [("out_channels", cout)],
             **{kind: [("padding", padding)] for kind in DEPTHWISE}}[kernel]
    args += [(n, v) for n, v in conv.args if n in ("activation", "act_min", "act_max")]
    new = Node(conv.name, op.targets[0], op, args, list(conv.outputs))
    new.fused = list(conv.fused) + [f"{op.name} kernel (from {conv.op.name})"]
    return new, packed


def conv2d_act_reference(input, weight, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1,
                         activation="none", act_min=0.0, act_max=0.0):
    """What texelflow's conv2d_act, conv2d_dw and conv2d_dw_act compute, in torch (the kernel
    test's reference)."""
    import torch.nn.functional as F

    return activation_reference(F.conv2d(input, weight, bias, stride, padding, dilation, groups), activation,
                                act_min, act_max)


def round_trip_reference(y, rt_scale=0.0, rt_zero_point=0, rt_min=-128, rt_max=127):
    """A folded quantize_dequantize (`rt_scale` > 0) applied to `y`, in torchao's float32 operations:
    clamp(round(y * (1 / scale)) + zero_point, min, max), then (q - zero_point) * scale. NaN gives
    0 (the zero point), as the kernels do; torch leaves it undefined."""
    import torch

    if not rt_scale:
        return y
    inv = float(torch.tensor(1.0 / rt_scale, dtype=torch.float32))
    q = torch.clamp(torch.round(y * inv) + rt_zero_point, rt_min, rt_max)
    q = torch.where(torch.isnan(q), torch.full_like(q, rt_zero_point), q)
    return (q - rt_zero_point) * rt_scale


def adaptive_max_pool2d_values_reference(self, output_size):
    """What adaptive_max_pool2d_values computes: adaptive_max_pool2d's values."""
    import torch

    return torch.nn.functional.adaptive_max_pool2d(self, output_size)


def global_avg_pool_reference(self):
    """What global_avg_pool_wg computes: adaptive_avg_pool2d to 1 x 1."""
    import torch

    return torch.nn.functional.adaptive_avg_pool2d(self, 1)


def activation_reference(y, activation="none", act_min=0.0, act_max=0.0):
    """A fused op's `activation` (act_min, act_max: hardtanh's bounds) applied to `y`, in torch."""
    import torch
    import torch.nn.functional as F

    if activation == "none":
        return y
    if activation == "hardtanh":
        return F.hardtanh(y, act_min, act_max)
    if activation == "hardsigmoid":
        return F.hardsigmoid(y)
    if activation in ("gelu", "gelu_tanh"):  # +inf: the limit, +inf (torch's vectorised exact gelu says NaN)
        return torch.where(torch.isposinf(y), y, F.gelu(y, approximate="tanh" if activation == "gelu_tanh" else "none"))
    return {"relu": F.relu, "hardswish": F.hardswish, "silu": F.silu}[activation](y)


def add_act_reference(self, other, alpha=1, activation="relu", act_min=0.0, act_max=0.0):
    """What texelflow's add_act computes, in torch (the kernel test's reference)."""
    import torch

    return activation_reference(torch.add(self, other, alpha=alpha), activation, act_min, act_max)


def scale_shift_reference(self, scale, shift):
    """What texelflow's scale_shift computes, in torch (the kernel test's reference)."""
    return self * scale + shift


def fusion_op_name(node: Node) -> str:
    """The op a node stands for before step 6 chose its kernel: conv2d, conv2d_act, conv2d_dw or
    conv2d_dw_act for a specialised conv kernel (by its activation), else the node's own op (tests
    and reports that are about what fused, not about which kernel runs it)."""
    name = node.op.name
    if not any(name in kernels.values() for kernels in SPECIALISED.values()):
        return name
    base = "conv2d_dw" if name.startswith("conv2d_dw") else "conv2d"
    act = node.value("activation") if any(a.name == "activation" for a in node.op.args) else None
    return base + "_act" if act not in (None, "none") else base
