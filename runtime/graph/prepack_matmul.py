"""Matrix-product kernel choice and weight prepacking (issue 13: the tiled matmul family).

A device `linear` whose weight is a constant becomes `linear_packed` (ops.yaml), its weight a
derived constant (derived.py's recipe mechanism) computed once at load:

    linear(x, W[N, K], b)  ->  linear_packed(x, Wp[K4 * 4, N16 * 16], b, out_features=N)

or `linear_packed_gemv` (same arguments) when x has one row (the product of its leading dims is
1: a classifier, a decoder step), where 8-row tiles would compute 7 rows for nothing.

Wp is W transposed, zero-padded to whole texels along K and whole 16-column tiles along N, so
the kernel (shaders/linear_packed.glsl.j2) reads one texel / aligned vec4 per 4 output columns
at one k, never clamps a column and never needs a K tail for the weight. The choice is made here,
once per node, so no kernel pays at run time for a path it does not take; the planner then puts
Wp in a texture when it fits the device's limits (faster loads on lavapipe), else in a buffer.
(A weight computed at run time never reaches here: lowering decomposes such a linear into mm.)

linear_packed and mm_tiled (the template of mm and bmm) pass operands round groups of 8 lanes
with subgroupShuffle, so they need a subgroup size that is a multiple of 8 and the shuffle
operation in compute shaders. Given the device's facts (`SubgroupFacts`), a device without them
keeps `linear` (the general kernel) and gets `matmul` for mm / bmm, and the node's note says why.
Without facts (`texelflow.plan` with no device) the shuffle kernels are assumed to fit.

On a GPU (`SubgroupFacts.device_type` discrete, integrated or virtual) a linear of several rows
takes `linear_wg` instead: the same arguments and prepacked weight, one workgroup of 64
invocations per 64 x 64 block staged in shared memory (shaders/linear_wg.glsl.j2), which needs
no subgroup operations. linear_packed's few wide invocations suit lavapipe but leave a GPU
nearly idle (an H100 ran ViT-S/16's linears at 2-6% of its FMA peak). For the same reason a GPU's
mm and bmm become `mm_wg` (shaders/mm_wg.glsl.j2), the same tiling over two activations, and a
linear of one row takes `linear_gemv_wg` (64 invocations share each output texel's K) rather
than linear_packed_gemv (one invocation walks all of K). A linear_wg of too few blocks to fill
the GPU is split along K afterwards (`split_k`).

With a cost table that `texelflow tune` measured on the device (it times both tilings of every
GEMM of its models), each node takes the tiling the table predicts faster for its own shapes,
whatever the device type; without one the device type decides. `TEXELFLOW_GEMM` (`workgroup`,
`register` or `auto`), or the `gemm` argument, forces one tiling on any device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from texelflow.generated.layouts import TEXTURE_LIMITS, Layout
from texelflow.generated.ops import OPS

from .derived import recipe
from .ir import Node, PlanGraph, Role, Value

PACKED_LINEAR = "linear_packed"
PACKED_GEMV = "linear_packed_gemv"  # one row: one invocation per output texel (its own template)
PACKED_WG = "linear_wg"  # several rows on a GPU: workgroup tiles in shared memory (its own template)
GEMV_WG = "linear_gemv_wg"  # one row on a GPU: 64 invocations per output texel (its own template)
PACKED_OPS = (PACKED_LINEAR, PACKED_GEMV, PACKED_WG, GEMV_WG)  # the ops on linear_weight_kn's prepacked weight
MM_WG = "mm_wg"  # mm / bmm on a GPU
GEMM_ENV = "TEXELFLOW_GEMM"
GEMM_TILES = ("auto", "workgroup", "register")
GPU_TYPES = ("discrete", "integrated", "virtual")  # DeviceLimits.device_type values that are GPUs
WG_INVOCATIONS = OPS[PACKED_WG].grid[-1]  # linear_wg's and mm_wg's workgroup size (their contract grid)
TILE_N = 16  # output columns per invocation of linear_packed (its template's tile)


def padded(n: int, to: int) -> int:
    """n rounded up to a multiple of `to`."""
    return -(-n // to) * to


@recipe
def linear_weight_kn(source):
    """torch's linear weight [N, K] as linear_packed's [K4 * 4, N16 * 16]: row k holds input k's
    weights for every output column; padding rows and columns are zero."""
    import torch.nn.functional as F

    n, k = source.shape
    return F.pad(source.t(), (0, padded(n, TILE_N) - n, 0, padded(k, 4) - k)).contiguous()


@recipe
def matmul_weight_kn(source):
    """A [K, N] matrix operand (addmm's constant mat2: GPT-2's Conv1D, x @ W + b) as
    linear_packed's [K4 * 4, N16 * 16]: already row k per input k, so only zero-padded."""
    import torch.nn.functional as F

    k, n = source.shape
    return F.pad(source, (0, padded(n, TILE_N) - n, 0, padded(k, 4) - k)).contiguous()


SHUFFLE_LANES = 8  # lanes of one shuffle group in linear_packed and mm_tiled


@dataclass(frozen=True)
class SubgroupFacts:
    """The device facts the matmul kernel choice depends on (a plain object: planner tests need
    no device). `shuffle`: VK_SUBGROUP_FEATURE_SHUFFLE_BIT in supportedOperations with the
    compute stage in supportedStages; None where the device did not say (Vulkan 1.0).
    `device_type`: DeviceLimits.device_type ("cpu" for lavapipe), None when unknown.
    `workgroup_invocations`: maxComputeWorkGroupInvocations, None when unknown.
    `int8_dot`: whether packed int8 dot products are supported and accelerated (the quantized
    conv's kernel choice, quantized.int8_conv_form), None when unknown."""

    size: int | None
    shuffle: bool | None
    device_type: str | None = None
    workgroup_invocations: int | None = None
    int8_dot: bool | None = None


def subgroup_facts(limits) -> SubgroupFacts | None:
    """The SubgroupFacts of a device's plain `DeviceLimits` (runtime/vulkan/device.py reads them
    from the driver; the planner never touches Vulkan), or None for None."""
    if limits is None:
        return None
    features, emulated = getattr(limits, "features", None), getattr(limits, "emulated_features", frozenset())
    int8_dot = None if features is None else ("shaderIntegerDotProduct" in features
                                              and "shaderIntegerDotProduct" not in emulated)
    return SubgroupFacts(limits.subgroup_size, getattr(limits, "subgroup_shuffle", None),
                         getattr(limits, "device_type", None), getattr(limits, "max_workgroup_invocations", None),
                         int8_dot)


def env_choice(var: str, choices: Sequence[str]) -> str:
    """Environment variable `var` as one of `choices` (lower-cased; "auto" when unset or empty),
    for the knobs that force a kernel form (TEXELFLOW_GEMM, _CONV, _ATTENTION); another value is
    an error naming the variable and the choices."""
    import os

    value = os.environ.get(var, "").strip().lower() or "auto"
    if value not in choices:
        raise ValueError(f"{var}={os.environ[var]!r}: expected one of {', '.join(choices)}")
    return value


def forced_tiles(gemm: str | None = None) -> tuple[str, str] | None:
    """(tiling, why) when `gemm` ("workgroup" or "register"), else TEXELFLOW_GEMM, forces one;
    None for auto (unset, empty or "auto"). An unknown value is an error."""
    if gemm is not None:
        if gemm not in GEMM_TILES:
            raise ValueError(f"gemm={gemm!r}: expected one of {', '.join(GEMM_TILES)}")
        return (gemm, f"gemm={gemm}") if gemm != "auto" else None
    forced = env_choice(GEMM_ENV, GEMM_TILES)
    return (forced, f"{GEMM_ENV}={forced}") if forced != "auto" else None


def gemm_tiles(facts: SubgroupFacts | None, gemm: str | None = None) -> tuple[str, str]:
    """("workgroup" or "register", why) for a GEMM of several rows on a device with `facts`:
    the forced tiling (forced_tiles), else workgroup tiles on a GPU and register tiles elsewhere
    (a CPU device, a GPU whose workgroups are smaller than the tiles' WG_INVOCATIONS, or planning
    without a device). Forcing workgroup tiles on a device whose workgroups are too small is an
    error that names the knob."""
    forced = forced_tiles(gemm)
    have = facts.workgroup_invocations if facts is not None else None
    if forced is not None:
        if forced[0] == "workgroup" and have is not None and have < WG_INVOCATIONS:
            raise ValueError(f"{forced[1]}: this device runs at most {have} invocations per workgroup; "
                             f"workgroup tiles need {WG_INVOCATIONS}")
        return forced
    kind = facts.device_type if facts is not None else None
    if kind in GPU_TYPES:
        gpu = f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} GPU"
        if have is not None and have < WG_INVOCATIONS:
            return "register", f"{gpu} with {have} invocations per workgroup (workgroup tiles need {WG_INVOCATIONS})"
        return "workgroup", gpu
    return "register", f"a {kind} device" if kind else "no device facts"


ATTENTION_ENV = "TEXELFLOW_ATTENTION"
ATTENTION_FORMS = ("auto", "fused", "gemm")
SDPA_TARGET = "aten.scaled_dot_product_attention.default"


def attention_form(facts: SubgroupFacts | None, gemm: str | None = None) -> tuple[str, str]:
    """("fused" or "gemm", why) for scaled_dot_product_attention on a device with `facts`:
    TEXELFLOW_ATTENTION=fused or =gemm forces one (an unknown value is an error); else "gemm"
    where GEMMs take workgroup tiles (gemm_tiles: a GPU), "fused" elsewhere. "fused" is the
    one-dispatch flash kernel (shaders/sdpa.glsl.j2), shaped for a CPU device: a few wide
    invocations, which leave a GPU idle (on an H100 it took 0.83 ms per ViT-S/16 block). "gemm" is
    torch's own decomposition (scale, bmm, softmax, bmm), whose bmm take workgroup tiles there."""
    forced = env_choice(ATTENTION_ENV, ATTENTION_FORMS)
    if forced != "auto":
        return forced, f"{ATTENTION_ENV}={forced}"
    tiles, why = gemm_tiles(facts, gemm)
    return ("gemm", f"GEMMs take workgroup tiles ({why})") if tiles == "workgroup" else ("fused", why)


def packed_gemm_op(rows: int, facts: SubgroupFacts | None, gemm: str | None = None, costs=None,
                   args: list | None = None, outputs: list | None = None,
                   limits: Sequence[int] = TEXTURE_LIMITS) -> tuple[str, str]:
    """(op name, why) of the kernel that multiplies `rows` rows by a linear_weight_kn weight:
    for one row linear_gemv_wg where GEMMs take workgroup tiles (gemm_tiles), else
    linear_packed_gemv; else linear_wg or linear_packed: the forced tiling, else the
    one a measured cost table predicts faster for the node (`args`, `outputs`), else by
    gemm_tiles."""
    if rows == 1:  # a GEMV: where GEMMs take workgroup tiles, K is shared by 64 invocations too
        tiles, why = gemm_tiles(facts, gemm)
        return (GEMV_WG, f"one row, workgroup tiles: {why}") if tiles == "workgroup" else (PACKED_GEMV, "one row")
    if forced_tiles(gemm) is None and args is not None:
        priced = priced_choice((PACKED_LINEAR, PACKED_WG), args, outputs, costs, limits)
        if priced is not None:
            return priced
    tiles, why = gemm_tiles(facts, gemm)
    return (PACKED_WG if tiles == "workgroup" else PACKED_LINEAR), f"{tiles} tiles: {why}"


def priced_choice(op_names: Sequence[str], args: list, outputs: list, costs, limits: Sequence[int]):
    """(op name, why) of the op among `op_names` (taking the same `args` and `outputs`) that the
    cost table `costs` predicts fastest, each in the float representation (texture or buffer,
    width-packed) it runs fastest in; None without a measured table, or when the table has no
    entry for one of the ops (a table from before the op existed, or a kernel that failed there)."""
    from .costs import slots_of
    from .repr import TensorRepSet

    if costs is None or getattr(costs, "source", None) != "table":
        return None
    known = {cls for cls, _ in costs.entries}
    if any(name not in known for name in op_names):
        return None
    allowed = TensorRepSet.named("CONTIGUOUS_ANY")
    times = {}
    for name in op_names:
        op = OPS[name]
        node = Node("priced", op.targets[0], op, list(args), list(outputs))  # never enters the graph
        computed = [(slot, v) for slot, v in slots_of(node) if v.role is not Role.CONST]
        for r in allowed.filter_invalid_reprs(computed[-1][1].shape, limits):
            if r.layout is not Layout.WIDTH_PACKED or \
                    any(r not in allowed.filter_invalid_reprs(v.shape, limits) for _, v in computed):
                continue
            t = costs.node_seconds(node, {slot: r for slot, _ in slots_of(node)})
            times[name] = min(t, times.get(name, t))
    if len(times) != len(op_names):
        return None
    best = min(op_names, key=lambda n: times[n])
    other = ", ".join(f"{n} {times[n] * 1e6:.0f} us" for n in op_names if n != best)
    return best, f"cost table: {times[best] * 1e6:.0f} us predicted, {other}"


def shuffle_unfit(facts: SubgroupFacts | None) -> str | None:
    """Why the 8-lane shuffle kernels cannot run on a device with `facts`, or None (also for no
    facts: planning without a device assumes they fit)."""
    if facts is None:
        return None
    if not facts.size or facts.size % SHUFFLE_LANES:
        return f"subgroup size {facts.size or 'unknown'} is not a multiple of {SHUFFLE_LANES}"
    if not facts.shuffle:
        return "no subgroupShuffle in compute shaders" if facts.shuffle is False else "subgroup operations unknown"
    return None


def choose_matmul_kernels(graph: PlanGraph, limits: Sequence[int] = TEXTURE_LIMITS,
                          subgroup: SubgroupFacts | None = None, gemm: str | None = None,
                          costs=None) -> list[Node]:
    """Retarget every device `linear` with a constant 2-D float32 weight to linear_packed (or
    linear_packed_gemv for one row, linear_wg on a GPU: packed_gemm_op), and so `x @ W + b` as
    addmm and `x @ W` as mm / matmul by a constant [K, N] W (_weight_as_linear); a matmul of two
    operands with the same batch dims becomes mm / bmm first (_matmul_as_bmm). Returns the new
    nodes. A node the new op would not take (its partition check) is left as it was. On a GPU mm / bmm
    become mm_wg. Where `subgroup` rules out the shuffle kernels (shuffle_unfit), linear_packed
    is not chosen and mm / bmm become `matmul` (on a device that does not take workgroup tiles).
    `gemm` forces a tiling (forced_tiles); `costs`, a measured table, chooses per node
    (priced_choice)."""
    from .fusion import retarget  # graph surgery shared with the conv kernel choice

    unfit = shuffle_unfit(subgroup)
    forced = forced_tiles(gemm)  # a bad TEXELFLOW_GEMM is an error even in a graph with no linear
    made = []
    for node in list(graph.nodes):
        if not node.on_device:
            continue
        if node.op.name in ("mm", "matmul") and _constant_kn(node.arg("mat2" if node.op.name == "mm" else "other")):
            weight = node.arg("mat2" if node.op.name == "mm" else "other")
            new = _weight_as_linear(graph, node, node.arg("self"), weight, None, subgroup, gemm, costs, unfit, limits)
            if new is not None:
                made.append(new)
                continue
        if node.op.name == "matmul" and not unfit:
            node = _matmul_as_bmm(graph, node, limits) or node
        if node.op.name in ("mm", "bmm"):
            operands = [("self", node.arg("self")), ("mat2", node.arg("mat2"))]
            priced = None if forced else priced_choice((node.op.name, MM_WG), operands, node.outputs, costs, limits)
            tiles, why = (("workgroup" if priced[0] == MM_WG else "register", priced[1]) if priced
                          else gemm_tiles(subgroup, gemm))
            if tiles == "workgroup":
                new = _retarget_matmul(graph, node, MM_WG, operands,
                                       f"mm_wg kernel (from {node.op.name}): workgroup tiles, {why}", limits)
            elif unfit:
                new = _retarget_matmul(graph, node, "matmul", [("self", node.arg("self")), ("other", node.arg("mat2"))],
                                       f"matmul kernel (from {node.op.name}): mm_tiled unfit, {unfit}", limits)
            else:
                if priced:
                    node.fused = list(node.fused) + [f"mm_tiled kernel: register tiles, {why}"]
                made += [m for m in [_transposed_b(graph, node, limits)] if m is not None]
                continue
            made += [new] if new is not None else []
            continue
        if node.op.name == "addmm":
            new = _addmm_as_linear(graph, node, subgroup, gemm, costs, unfit, limits)
            made += [new] if new is not None else []
            continue
        if node.op.name != "linear":
            continue
        weight = node.arg("weight")
        if not isinstance(weight, Value) or weight.role is not Role.CONST or len(weight.shape) != 2 \
                or weight.dtype != "float32":
            continue
        n = weight.shape[0]
        priced_args = [("input", node.arg("input")),
                       ("weight", Value(f"{weight.name}.kn", (padded(weight.shape[1], 4), padded(n, TILE_N)),
                                        weight.dtype, Role.CONST)),
                       ("bias", node.arg("bias")), ("out_features", n)]
        op_name, op_why = packed_gemm_op(_rows(node), subgroup, gemm, costs, priced_args, node.outputs, limits)
        if unfit and op_name == PACKED_LINEAR:  # linear_packed_gemv and linear_wg shuffle nothing: they still fit
            node.fused = list(node.fused) + [f"linear kernel kept, not linear_packed: {unfit}"]
            continue
        new, packed = _packed_linear(graph, node, weight, op_name, op_why)
        if retarget(graph, node, new, packed, limits):
            made.append(new)
    return made


SPLITK_ENV = "TEXELFLOW_SPLITK"
SPLITK_FORMS = ("auto", "off")
SPLITK_OP, SPLITK_SUM = "linear_wg_splitk", "linear_splitk_sum"
WG_BLOCK = 64  # rows and columns of out per workgroup of linear_wg (its contract grid)
# Split K until a linear_wg launches about this many workgroups: a large GPU's multiprocessors
# (an H100 or H200 has 132). Fewer blocks leave most of them idle: ResNet-18's 7 x 7 stage has 8
# blocks of 64 x 64 for K = 4,608, ViT-S/16's 384-wide linears 24.
SPLITK_WORKGROUPS = 128
SPLITK_MIN_STEPS = 4  # each slice at least 4 of _gemm_wg's steps of 16 along K
SPLITK_MAX_BYTES = 32 << 20  # the slices' intermediate, float32 [S, rows, N]


def splitk_texels(k4: int, splits: int) -> int:
    """Texels along K per slice of a K of `k4` texels cut into `splits` (linear_wg_splitk's KS4):
    rounded up to whole steps of 16 along K."""
    return padded(-(-k4 // splits), 4)


def split_count(rows: int, k: int, n: int) -> int:
    """Slices along K for linear_wg on `rows` x `k` x `n`: 1 where its 64 x 64 blocks already
    launch SPLITK_WORKGROUPS workgroups; else enough slices to launch them, each at least
    SPLITK_MIN_STEPS steps long, none empty, the intermediate within SPLITK_MAX_BYTES."""
    blocks = -(-rows // WG_BLOCK) * -(-n // WG_BLOCK)
    k4 = -(-k // 4)
    s = min(-(-SPLITK_WORKGROUPS // blocks), -(-k4 // 4) // SPLITK_MIN_STEPS,
            SPLITK_MAX_BYTES // max(1, 4 * rows * n))
    if s < 2:
        return 1
    while True:  # the slices that are not empty
        used = -(-k4 // splitk_texels(k4, s))
        if used == s:
            return s if s >= 2 else 1
        s = used


def split_k(graph: PlanGraph, limits: Sequence[int] = TEXTURE_LIMITS) -> list[Node]:
    """Cut every linear_wg whose 64 x 64 blocks would launch too few workgroups (split_count) into
    linear_wg_splitk (S slices along K, S times the workgroups) and linear_splitk_sum (the
    slices added, the bias and the activation); returns the new nodes. linear_wg runs only
    where GEMMs take workgroup tiles (a GPU), so lavapipe's plans never change. On an H200 it
    took ResNet-18 from 10.1 to 2.7 ms of GPU time (bench/RESULTS.md). TEXELFLOW_SPLITK=off keeps
    every linear_wg whole. A node already float16 here (a half model) is not split; with
    precision="fp16", applied after planning, the slices are stored as float16 like the other
    activations and summed in float32 (tests/kernels/test_linear_wg.py bounds the error)."""
    from .fusion import _splice

    if env_choice(SPLITK_ENV, SPLITK_FORMS) == "off":
        return []
    made = []
    for node in list(graph.nodes):
        if not node.on_device or node.op.name != PACKED_WG:
            continue
        x, out = node.arg("input"), node.outputs[0][1]
        if out.dtype != "float32":  # a half model's linear: its slices would each round to float16
            continue
        rows, n = _rows(node), out.shape[-1]
        splits = split_count(rows, x.shape[-1], n)
        if splits < 2:
            continue
        part_op, sum_op = OPS[SPLITK_OP], OPS[SPLITK_SUM]
        part = Node(f"{node.name}.slices", part_op.targets[0], part_op,
                    [("input", x), ("weight", node.arg("weight")), ("out_features", n), ("splits", splits)], [])
        slices = Value(part.name, (splits, rows, n), out.dtype, Role.NODE, producer=part)
        part.outputs = [("out", slices)]
        total = Node(node.name, sum_op.targets[0], sum_op,
                     [("partials", slices), ("sizes", list(out.shape)), ("bias", node.arg("bias"))]
                     + [(a, v) for a, v in node.args if a in ("activation", "act_min", "act_max")],
                     [("out", out)])
        if not _splice(graph, node, [part, total], [], limits):
            continue
        part.fused = list(node.fused) + [f"split along K into {splits} slices: {-(-rows // WG_BLOCK)} x "
                                         f"{-(-n // WG_BLOCK)} blocks of 64 x 64 launch too few workgroups "
                                         f"(under {SPLITK_WORKGROUPS})"]
        total.fused = [f"sum of the {splits} slices of {node.name}, bias and activation"]
        made += [part, total]
    return made


def _retarget_matmul(graph: PlanGraph, node: Node, op_name: str, args: list, note: str,
                     limits: Sequence[int]) -> Node | None:
    """mm / bmm as `op_name` (mm_wg on a GPU; the general `matmul`, which shuffles nothing, when
    the device cannot run mm_tiled), or None where that op would not take the node."""
    from .fusion import _replace
    from .lowering import partition_reason

    op = OPS[op_name]
    new = Node(node.name, op.targets[0], op, args, list(node.outputs))
    new.fused = list(node.fused) + [note]
    if partition_reason(new, limits) is not None:
        return None
    _replace(graph, node, new)
    return new


def _matmul_as_bmm(graph: PlanGraph, node: Node, limits: Sequence[int]) -> Node | None:
    """torch.matmul of two operands of rank 2 to 4 with the same batch dims (attention written by
    hand: q @ k.transpose(-2, -1), weights @ v) as mm / bmm, whose register tiles take every
    batch of WHCN's C and N alike; torch.matmul's general kernel ran BERT / GPT-2 style
    attention at about 2% of the FMA peak on lavapipe. None where it does not apply (a batch that
    broadcasts, a 1-D operand: the general kernel keeps it)."""
    a, b = node.arg("self"), node.arg("other")
    if not isinstance(a, Value) or not isinstance(b, Value) or len(a.shape) != len(b.shape) \
            or len(a.shape) not in (2, 3, 4) or tuple(a.shape[:-2]) != tuple(b.shape[:-2]) or a.dtype != b.dtype:
        return None
    op_name = "mm" if len(a.shape) == 2 else "bmm"
    return _retarget_matmul(graph, node, op_name, [("self", a), ("mat2", b)],
                            f"{op_name} kernel (from matmul): the same batch dims", limits)


def _transposed_b(graph: PlanGraph, node: Node, limits: Sequence[int]) -> Node | None:
    """mm / bmm (register tiles) whose mat2 is a permute that only swaps the last two dims of a
    tensor B (attention's q @ k.transpose(-2, -1)) as bmm_nt(self, B): the tiles read B's rows
    along K, and the permute, a re-layout of all of k, goes where nothing else reads it. On
    lavapipe a Swin stage's k^T of 49 x 32 windows took 1.1 ms in buffers per block. None where
    it does not apply."""
    from .fusion import _remove

    t = node.arg("mat2")
    perm = t.producer if isinstance(t, Value) else None
    if perm is None or not perm.on_device or perm.op.name != "permute_copy":
        return None
    b, dims, rank = perm.arg("self"), list(perm.arg("dims") or ()), len(t.shape)
    if not isinstance(b, Value) or rank < 2 or [d % rank for d in dims] != list(range(rank - 2)) + [rank - 1, rank - 2]:
        return None
    new = _retarget_matmul(graph, node, "bmm_nt", [("self", node.arg("self")), ("mat2", b)],
                           f"bmm_nt kernel (from {node.op.name} of a transposed operand): B read along K, "
                           f"permute '{perm.name}' not needed", limits)
    if new is not None and not t.users and t not in graph.outputs:
        _remove(graph, perm)
    return new


def _addmm_as_linear(graph: PlanGraph, node: Node, subgroup, gemm, costs, unfit, limits) -> Node | None:
    """addmm(bias, x, W) with W a constant 2-D float32 [K, N], bias an [N] row and beta = alpha =
    1 (GPT-2's Conv1D, x @ W + b written by hand) as a packed linear (_weight_as_linear). The
    general matmul kernel it ran on took 162 ms of a GPT-2 block of 188 ms on lavapipe. None
    where it does not apply or the kernel refuses the node (it then stays addmm)."""
    mat2, bias = node.arg("mat2"), node.arg("self")
    if not _constant_kn(mat2) or not isinstance(bias, Value) or tuple(bias.shape) != (mat2.shape[1],) \
            or bias.dtype != "float32" or any(node.value(a) not in (None, 1, 1.0) for a in ("beta", "alpha")):
        return None
    return _weight_as_linear(graph, node, node.arg("mat1"), mat2, bias, subgroup, gemm, costs, unfit, limits)


def _constant_kn(w) -> bool:
    """A constant 2-D float32 matrix operand [K, N]: what a packed linear can prepack."""
    return isinstance(w, Value) and w.role is Role.CONST and len(w.shape) == 2 and w.dtype == "float32"


def _weight_as_linear(graph: PlanGraph, node: Node, x, mat2: Value, bias, subgroup, gemm, costs, unfit,
                      limits) -> Node | None:
    """`node` (addmm, or mm / matmul by a constant: x @ W written by hand) as a packed linear of
    `x` [..., K] by the constant `mat2` [K, N] (plus `bias` [N] or None), W prepacked as it stands
    (matmul_weight_kn, no transpose; one prepacked copy for every node that multiplies by the same
    constant: an unrolled RNN's steps). None where the node does not qualify or the kernel
    refuses it (it is left as it was)."""
    if not isinstance(x, Value) or len(x.shape) < 2 or x.shape[-1] != mat2.shape[0] or x.dtype != "float32":
        return None
    from .fusion import _replace
    from .lowering import partition_reason

    k, n = mat2.shape
    packed_shape = (padded(k, 4), padded(n, TILE_N))
    rows = math.prod(x.shape[:-1])
    priced_args = [("input", x), ("weight", Value(f"{mat2.name}.kn", packed_shape, mat2.dtype, Role.CONST)),
                   ("bias", bias), ("out_features", n)]
    op_name, why = packed_gemm_op(rows, subgroup, gemm, costs, priced_args, node.outputs, limits)
    if unfit and op_name == PACKED_LINEAR:
        node.fused = list(node.fused) + [f"{node.op.name} kernel kept, not linear_packed: {unfit}"]
        return None
    packed = next((c for c in graph.constants if c.derive is not None and c.derive.recipe == "matmul_weight_kn"
                   and c.derive.sources[0] is mat2), None)
    made = packed is None
    if made:
        packed = graph.add_derived(f"{mat2.name}.kn", packed_shape, mat2.dtype, "matmul_weight_kn", (mat2,))
    op = OPS[op_name]
    new = Node(node.name, op.targets[0], op, [("input", x), ("weight", packed), ("bias", bias), ("out_features", n)],
               list(node.outputs))
    new.fused = list(node.fused) + [f"{op.name} kernel ({why}), weight prepacked [K, N] (from {node.op.name})"]
    if partition_reason(new, limits) is not None:
        if made:
            graph.constants.remove(packed)
        return None
    _replace(graph, node, new)
    return new


def _rows(node: Node) -> int:
    rows = 1
    for d in node.arg("input").shape[:-1]:
        rows *= d
    return rows


def _packed_linear(graph: PlanGraph, node: Node, weight: Value, op_name: str, why: str) -> tuple[Node, Value]:
    n, k = weight.shape
    packed = graph.add_derived(f"{weight.name}.kn", (padded(k, 4), padded(n, TILE_N)), weight.dtype,
                               "linear_weight_kn", (weight,))
    op = OPS[op_name]
    args = [("input", node.arg("input")), ("weight", packed), ("bias", node.arg("bias")), ("out_features", n)]
    new = Node(node.name, op.targets[0], op, args, list(node.outputs))
    new.fused = list(node.fused) + [f"{op.name} kernel ({why}), weight prepacked [K, N] (from linear)"]
    return new, packed


# ---- torch reference (the kernel tests' and the generic registry test's) -----------------------------
def linear_packed_reference(input, weight, bias=None, out_features=1, activation="none", act_min=0.0, act_max=0.0):
    """What linear_packed computes: the input zero-padded to the prepacked weight's rows, times its
    first `out_features` columns (a batched weight [B, Kp, Np]: input [B, R, K] batch by batch),
    plus the bias (a NaN or inf in a padding row then reaches the output exactly as the kernel's
    0 * weight does), then the activation."""
    import torch.nn.functional as F

    from .fusion import activation_reference

    x = F.pad(input, (0, weight.shape[-2] - input.shape[-1]))
    y = x @ weight[..., :out_features]  # a batched weight [B, K4 * 4, N16 * 16]: batch by batch
    return activation_reference(y + bias if bias is not None else y, activation, act_min, act_max)


def conv2d_pw_gemv_reference(input, weight, bias=None, out_channels=1, activation="none", act_min=0.0,
                             act_max=0.0):
    """What conv2d_pw_gemv_wg computes: a pointwise conv of one pixel, [N, Cin, 1, 1] -> [N, Cout,
    1, 1], as linear_packed on the channels."""
    assert input.shape[-2:] == (1, 1), input.shape
    y = linear_packed_reference(input.reshape(input.shape[0], -1), weight, bias, out_channels, activation,
                                act_min, act_max)
    return y.reshape(input.shape[0], out_channels, 1, 1)


def linear_wg_splitk_reference(input, weight, out_features=1, splits=2):
    """What linear_wg_splitk computes: slice s of out [splits, rows, N] is the input's flattened
    rows, K texels s * KS4 .. s * KS4 + KS4 - 1 of them (splitk_texels; zero past K), times the
    same rows of the prepacked weight (rows past 4 * K4 are not read)."""
    import torch
    import torch.nn.functional as F

    k4 = -(-input.shape[-1] // 4)
    ks = 4 * splitk_texels(k4, splits)
    x = F.pad(input, (0, 4 * k4 - input.shape[-1])).reshape(-1, 4 * k4)
    w = weight[:4 * k4, :out_features]
    return torch.stack([x[:, s * ks:(s + 1) * ks] @ w[s * ks:(s + 1) * ks] for s in range(splits)])


def linear_splitk_sum_reference(partials, sizes, bias=None, activation="none", act_min=0.0, act_max=0.0):
    """What linear_splitk_sum computes: the slices of partials [S, rows, N] added in order, shaped
    `sizes`, plus the bias, then the activation."""
    from .fusion import activation_reference

    y = partials[0]
    for s in range(1, partials.shape[0]):
        y = y + partials[s]
    y = y.reshape(list(sizes))
    return activation_reference(y + bias if bias is not None else y, activation, act_min, act_max)


def mm_wg_reference(self, mat2):
    """What mm_wg computes: mm of 2-D operands, bmm of 3-D ones."""
    return self @ mat2


def bmm_nt_reference(self, mat2):
    """What bmm_nt computes, in torch: self @ mat2^T over the batch dims."""
    return self @ mat2.transpose(-1, -2)
