"""The vocabulary ops.yaml and template contracts use to derive push constants and to check nodes.

Each rule is a pure function of a node's arguments and tensor shapes, so `make gen` can check
that every declaration names a rule with the right parameters, and the runtime (and the kernel
tests, through the same dispatch code) evaluates the very same functions. A derivation the
vocabulary cannot say is a named hook in shaders/hooks.py.

A rule sees the node through `NodeFacts`: `value(name)` is an argument's value (its schema
default when the node leaves it out; a tensor argument is anything with a `.shape`, or None when
an optional one is absent), `shape(name)` a tensor argument's or output's shape.
"""

from __future__ import annotations

import math

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence


class NodeFacts(Protocol):
    def value(self, name: str): ...

    def shape(self, name: str) -> tuple[int, ...]: ...


@dataclass(frozen=True)
class Rule:
    name: str
    required: tuple[str, ...]  # parameter keys besides the rule's own key
    optional: tuple[str, ...]
    type: str | None  # int, float or ivec4; None: the argument's kind decides (rule `arg`)
    fn: Callable
    doc: str
    choices: tuple = ()  # (parameter, its allowed values) pairs, checked by `make gen`


PUSH_RULES: dict[str, Rule] = {}
CHECK_RULES: dict[str, Rule] = {}


def _rule(table: dict, name: str, type_: str | None, required=(), optional=(), choices=None):
    def register(fn):
        table[name] = Rule(name, tuple(required), tuple(optional), type_, fn, (fn.__doc__ or "").strip(),
                           tuple((k, tuple(v)) for k, v in (choices or {}).items()))
        return fn

    return register


def whcn(dim: int, rank: int) -> int:
    """A torch dim (maybe negative) of a rank-`rank` tensor, in WHCN numbering (0 = last dim)."""
    return rank - 1 - (dim % rank) if rank else 0


def pair_wh(value, default=None) -> tuple[int, int]:
    """A 2-D op's int-list argument as (w, h): one value means both; empty or None -> default."""
    if value is None or (isinstance(value, (list, tuple)) and len(value) == 0):
        return default
    if isinstance(value, int):
        return (value, value)
    return (value[0], value[0]) if len(value) == 1 else (value[1], value[0])


# ---- push constants -----------------------------------------------------------------------------
@_rule(PUSH_RULES, "arg", None, optional=("none", "values"))
def _arg(node: NodeFacts, p: dict, element=None):
    """The scalar argument `arg` (bool as 0/1, an enum as its index in `values`); `none` is what
    the shader gets when an optional argument is None."""
    v = node.value(p["arg"])
    if v is None:
        if p.get("none") is None:
            raise ValueError(f"argument '{p['arg']}' is None and its push constant has no `none` value")
        return p["none"]
    if p.get("values"):
        return list(p["values"]).index(v)
    return int(v) if isinstance(v, bool) else v


@_rule(PUSH_RULES, "present", "int")
def _present(node: NodeFacts, p: dict, element=None):
    """1 when the optional tensor `present` is given, else 0 (a dummy buffer is bound instead)."""
    return int(node.value(p["present"]) is not None)


@_rule(PUSH_RULES, "whcn_dim", "int", required=("of",))
def _whcn_dim(node: NodeFacts, p: dict, element=None):
    """The int argument `whcn_dim` (a torch dim of tensor `of`) in WHCN numbering."""
    return whcn(node.value(p["whcn_dim"]), len(node.shape(p["of"])))


@_rule(PUSH_RULES, "ivec4", "ivec4")
def _ivec4(node: NodeFacts, p: dict, element=None):
    """Four ints from pieces: an int literal, or {pair: ARG, default: ARG | [h, w]} giving the
    (w, h) of a 2-D int-list argument; missing lanes are 0."""
    out: list[int] = []
    for piece in p["ivec4"]:
        if isinstance(piece, int):
            out.append(piece)
            continue
        _, arg, default = piece
        if isinstance(default, str):
            default = pair_wh(node.value(default))
        elif default is not None:
            default = pair_wh(list(default))
        out.extend(pair_wh(node.value(arg), default))
    return tuple(out + [0] * (4 - len(out)))


@_rule(PUSH_RULES, "dims_mask", "ivec4", required=("of",))
def _dims_mask(node: NodeFacts, p: dict, element=None):
    """1 in each WHCN lane named by the int-list argument `dims_mask` (torch dims of `of`)."""
    rank = len(node.shape(p["of"]))
    mask = [0, 0, 0, 0]
    for d in node.value(p["dims_mask"]) or ():
        mask[whcn(d, rank)] = 1
    return tuple(mask)


@_rule(PUSH_RULES, "list_offset", "int", required=("dim",))
def _list_offset(node: NodeFacts, p: dict, element=None):
    """For one element of the tensor list `list_offset` (a per-element dispatch): the summed sizes
    along torch dim `dim` of the elements before it."""
    items = node.value(p["list_offset"])
    rank = len(items[0].shape)
    dim = node.value(p["dim"]) % rank
    return sum(x.shape[dim] for x in items[:element])


@_rule(PUSH_RULES, "hook", None)
def _hook(node: NodeFacts, p: dict, element=None):
    """A named function of shaders/hooks.py."""
    from .hooks import HOOKS

    return HOOKS[p["hook"]].fn(node)


# ---- checks: a reason when the node cannot run on Vulkan, else None ----------------------------------
@_rule(CHECK_RULES, "rank", None)
def _rank(node: NodeFacts, p: dict) -> str | None:
    """`rank: {TENSOR: [ranks]}`: each given tensor has one of these ranks."""
    for tensor, ranks in dict(p["rank"]).items():
        v = node.value(tensor)
        if v is not None and not isinstance(v, (list, tuple)) and len(v.shape) not in ranks:
            return f"'{tensor}' has rank {len(v.shape)}; the kernel takes rank {' or '.join(map(str, ranks))}"
    return None


@_rule(CHECK_RULES, "normalized_last", None, required=("of",))
def _normalized_last(node: NodeFacts, p: dict) -> str | None:
    """The int-list argument `normalized_last` is exactly the last dim of tensor `of`."""
    normalized = node.value(p["normalized_last"])
    shape = node.shape(p["of"])
    if normalized is None or len(normalized) != 1 or tuple(shape[-1:]) != tuple(normalized):
        return f"normalizes over {list(normalized or [])} (only the last dim is implemented)"
    return None


@_rule(CHECK_RULES, "broadcast_foldable", None, required=("of",))
def _broadcast_foldable(node: NodeFacts, p: dict) -> str | None:
    """`{broadcast_foldable: [TENSORS], of: TENSOR}`: each tensor broadcasts to `of` without
    broadcasting inside WHCN's N, which folds every dim but the last 3: aligned to the right, a
    tensor's folded dims equal those of `of` or are all 1 (a lower-rank tensor pads with 1s)."""
    out = tuple(node.shape(p["of"]))
    folded = len(out) - 3
    if folded < 2:  # N is at most one dim: the kernels broadcast it like W, H and C
        return None
    for name in p["broadcast_foldable"]:
        v = node.value(name)
        if v is None or not hasattr(v, "shape"):
            continue
        padded = (1,) * (len(out) - len(v.shape)) + tuple(v.shape)
        lead = padded[:folded]
        if lead != out[:folded] and any(d != 1 for d in lead):
            return (f"'{name}' {list(v.shape)} broadcasts to {list(out)} within the leading dims "
                    f"{list(out[:folded])} that WHCN folds into N")
    return None


@_rule(CHECK_RULES, "dim_unfolded", None, required=("of",))
def _dim_unfolded(node: NodeFacts, p: dict) -> str | None:
    """The int (or int-list) argument `dim_unfolded` (torch dims of tensor `of`) names WHCN dims of
    their own: the tensor has rank <= 4, or each dim is one of its last 3 (WHCN's N folds all the
    others)."""
    rank = len(node.shape(p["of"]))
    dims = node.value(p["dim_unfolded"])
    for dim in (dims if isinstance(dims, (list, tuple)) else [dims]):
        if rank > 4 and dim % rank < rank - 3:
            return f"dim {dim} of a rank-{rank} '{p['of']}' is folded into WHCN's N with other dims"
    return None


@_rule(CHECK_RULES, "arg_equals", None, required=("value", "of"))
def _arg_equals(node: NodeFacts, p: dict) -> str | None:
    """`{arg_equals: ARG, value: V, of: TENSOR}`: the scalar argument ARG is V, the only value the
    kernel computing tensor `of` implements (sdpa's dropout_p 0.0); `of` names it in the reason."""
    v = node.value(p["arg_equals"])
    if v != p["value"]:
        return f"{p['arg_equals']}={v!r} is not implemented for '{p['of']}' (only {p['value']!r})"
    return None


@_rule(CHECK_RULES, "nonempty", None, required=("of",))
def _nonempty(node: NodeFacts, p: dict) -> str | None:
    """`{nonempty: LIST_ARG, of: TENSOR}`: the list argument names at least one element (roll's
    empty `dims` means the flattened tensor, which the kernel computing `of` does not implement)."""
    if not node.value(p["nonempty"]):
        return f"an empty '{p['nonempty']}' is not implemented for '{p['of']}'"
    return None


@_rule(CHECK_RULES, "size_multiple", None, required=("dim", "value", "of"))
def _size_multiple(node: NodeFacts, p: dict) -> str | None:
    """`{size_multiple: TENSOR, dim: D, value: V, of: TENSOR}`: torch dim D of the tensor is a
    multiple of V, the only case the kernel computing `of` implements (q8ta_conv2d_im2col reads
    whole words of 4 input channels: dim 1 a multiple of 4)."""
    shape = node.shape(p["size_multiple"])
    size = shape[p["dim"]]
    if size % p["value"]:
        return (f"dim {p['dim']} of '{p['size_multiple']}' is {size}, not a multiple of {p['value']} "
                f"as the kernel computing '{p['of']}' needs")
    return None


@_rule(CHECK_RULES, "at_most", None, required=("value", "of"))
def _at_most(node: NodeFacts, p: dict) -> str | None:
    """`{at_most: ARG, value: V, of: TENSOR}`: the int or int-list argument ARG is at most V
    (every element), what the kernel computing `of` can hold (q8ta conv2d's stride, padding and
    dilation travel as bytes of a push constant)."""
    v = node.value(p["at_most"])
    values = [] if v is None else [v] if isinstance(v, int) else list(v)
    if any(x > p["value"] for x in values):
        return f"{p['at_most']}={values} is over {p['value']}, the most the kernel computing '{p['of']}' takes"
    return None


@_rule(CHECK_RULES, "reduction_at_most", None, required=("from_dim", "value", "of"))
def _reduction_at_most(node: NodeFacts, p: dict) -> str | None:
    """`{reduction_at_most: TENSOR, from_dim: D, value: V, of: TENSOR}`: the product of the
    tensor's dims from D on is at most V: the number of terms the kernel computing `of` sums (a
    q8ta linear's K, a q8ta conv's Cin / groups * KH * KW: int8 products summed in int32, exact
    up to 33,025 terms of 255 * 255)."""
    import math

    terms = math.prod(node.shape(p["reduction_at_most"])[p["from_dim"]:])
    if terms > p["value"]:
        return (f"'{p['of']}' sums {terms} products per output, over the {p['value']} whose int32 "
                f"sum is exact")
    return None


# lavapipe (Mesa's llvmpipe) stops every loop of an invocation once their iterations together reach
# 65535 (gallivm's LP_MAX_TGSI_LOOP_ITERATIONS, shared by every loop of a shader, nested ones
# included, counted once per SIMD batch) and carries on: the kernel silently computes from part
# of its data. Kernels that loop over a reduced extent in one invocation are refused past it (with
# some room), so the node is decomposed into smaller pieces or runs on the CPU, on every device:
# a plan does not depend on the device. The trip counts below are upper bounds of each template's
# loops per invocation, measured on lavapipe at the sizes where it breaks (tests/reliability/
# test_loop_limit.py): reduce 8 per reduced element (4 lanes of a texel, 2 passes), softmax 5
# per element of the lines it takes (one line along W; about W / n lines along a dim of n), scan
# 1, layer_norm 1, group_norm 8 per element of a group, pools 2 (adaptive 8: 4 lanes a texel),
# matmul 2 per K, transposed convs 4 x 9 per input channel of a group at 3 x 3 stride 2 (4 lanes
# of a texel, conv_transpose_trips), convs 2 per tap and
# input channel of a group (1 per 2 where groups = 1: a texel of 4 channels a step), sort_lines
# n (n - 1) / 2 moves of an insertion sort (counted, not measured: a bound).
LOOP_TRIPS_LIMIT = 60000


def conv_transpose_trips(kernel, stride, dilation, cin_g: int) -> int:
    """Loop iterations of one invocation of conv_transpose1d / 2d: a texel's 4 lanes each walk
    every tap, and per input channel of the group the taps that land (at most ceil(k gcd(s, d) /
    s) along a dim) or, as the 8 lanes of a SIMD batch land on different ones, every tap; counted
    as max(taps, 2 landed + 1) per channel. lavapipe computed a 3 x 3 stride-2 one of 1,800
    channels a group right and of 1,820 wrong in channels-packed textures (36 per channel)."""
    taps = math.prod(kernel)
    landed = math.prod(-(-k * math.gcd(s, d) // s) for k, s, d in zip(kernel, stride, dilation))
    return 4 * (taps + max(taps, 2 * landed + 1) * cin_g) + 64


def _ints(v, n: int, fill: int) -> tuple[int, ...]:
    """An int or int-list conv argument as n ints (one value for all; None: fill)."""
    if v is None or (isinstance(v, (list, tuple)) and not v):
        return (fill,) * n
    v = [v] if isinstance(v, int) else list(v)
    return tuple(v) * n if len(v) == 1 else tuple(v[:n])


def _reduced_elements(node: NodeFacts, tensor: str) -> tuple[int, int]:
    """(elements reduced into one output, the innermost reduced dim's size) of a reduction of
    `tensor` over `dim` (None, [] or absent: every dim)."""
    shape = tuple(node.shape(tensor))
    try:
        dims = node.value("dim")
    except (KeyError, AttributeError):
        dims = None
    rank = len(shape)
    dims = list(range(rank)) if dims is None or dims == [] else [dims] if isinstance(dims, int) else list(dims)
    dims = sorted({d % rank for d in dims}) if rank else []
    elements = math.prod(shape[d] for d in dims) if dims else 1
    return elements, (shape[dims[-1]] if dims else 1)


LOOP_KINDS = ("reduce", "softmax", "scan", "layer_norm", "group_norm", "pool", "adaptive_pool", "matmul", "conv",
              "conv_transpose", "conv_transpose_tiles", "sort")


def _trips(node: NodeFacts, kind: str, tensor: str) -> int:
    """An upper bound of the loop iterations of one invocation of a `kind` template over `tensor`."""
    if kind == "reduce":  # each of a texel's 4 lanes may reduce its own elements, var in two passes
        e, inner = _reduced_elements(node, tensor)
        return 8 * (e + e // max(inner, 1)) + 16
    if kind in ("softmax", "scan"):
        shape = tuple(node.shape(tensor))
        if not shape:
            return 1
        d = node.value("dim") % len(shape)
        n, w = shape[d], shape[-1]
        if kind == "scan":
            return n + 16
        # softmax: an invocation per W-row, taking the lines along d in turn: about w / n lines of n
        return 5 * n + 16 if d == len(shape) - 1 else -(-w // n) * (5 * n + 3) + 16
    if kind == "layer_norm":
        return math.prod(node.value("normalized_shape")) + 64
    if kind == "sort":  # an insertion sort of a row: n (n - 1) / 2 moves at most, a read and a write each
        n = tuple(node.shape(tensor))[-1]
        return n * (n - 1) // 2 + 3 * n + 16
    if kind == "group_norm":
        shape = tuple(node.shape(tensor))
        groups = node.value("num_groups") if node.value("group") is None else node.value("group")
        g = math.prod(shape) // max(shape[0] * max(int(groups or 1), 1), 1) if shape else 1
        return 8 * (g + g // max(shape[-1], 1)) + 4 * shape[-1] + 64
    if kind in ("adaptive_pool", "pool"):
        shape = tuple(node.shape(tensor))
        if kind == "pool":
            kw, kh = pair_wh(node.value("kernel_size"))
            window, rows = kw * kh, kh
        else:
            out = tuple(node.shape("out"))
            rows = -(-shape[-2] // out[-2]) + 1
            window = rows * (-(-shape[-1] // out[-1]) + 1)
            return 8 * (window + rows) + 16
        return 2 * (window + rows) + 16
    if kind == "matmul":
        return 2 * tuple(node.shape(tensor))[-1] + 16
    if kind == "conv":  # grouped convs channel by channel; others 4 channels (a texel) a step
        w = tuple(node.shape("weight"))
        groups = max(int(node.value("groups") or 1), 1)
        taps = math.prod(w[1:])
        return (2 * taps if groups > 1 else taps // 2) + 64
    if kind == "conv_transpose_tiles":  # conv_transpose_trips over input blocks of 4 channels, one lane
        kernel = _ints(node.value("kernel"), 2, 1)
        return conv_transpose_trips(kernel, _ints(node.value("stride"), 2, 1), _ints(node.value("dilation"), 2, 1),
                                    -(-tuple(node.shape(tensor))[1] // 4)) // 4 + 64
    if kind == "conv_transpose":
        cin_g = tuple(node.shape(tensor))[1] // max(int(node.value("groups") or 1), 1)
        kernel = tuple(node.shape("weight"))[2:]
        return conv_transpose_trips(kernel, _ints(node.value("stride"), len(kernel), 1),
                                    _ints(node.value("dilation"), len(kernel), 1), cin_g)
    raise KeyError(kind)


@_rule(CHECK_RULES, "loop_trips", None, required=("kind", "of"), choices={"kind": LOOP_KINDS})
def _loop_trips(node: NodeFacts, p: dict) -> str | None:
    """`{loop_trips: INPUT, kind: KIND, of: TENSOR}`: the loops of one invocation computing `of`
    over tensor INPUT (KIND, one of LOOP_KINDS: how the template loops) stay within
    LOOP_TRIPS_LIMIT iterations, under the 65535 at which lavapipe cuts every loop of an
    invocation short."""
    trips = _trips(node, p["kind"], p["loop_trips"])
    if trips > LOOP_TRIPS_LIMIT:
        return (f"one invocation computing '{p['of']}' would loop about {trips} times, past the "
                f"{LOOP_TRIPS_LIMIT} iterations a kernel may loop on lavapipe (which cuts loops short at 65535)")
    return None


def run_checks(node: NodeFacts, checks: Sequence) -> str | None:
    """The first failing check's reason, or None. `checks`: items with `.rule` and `.params`."""
    for check in checks:
        reason = CHECK_RULES[check.rule].fn(node, dict(check.params))
        if reason:
            return reason
    return None


def push_values(node: NodeFacts, pushes: Sequence, element: int | None = None) -> dict:
    """Push constant name -> value; `pushes`: items with `.name`, `.rule` and `.params`."""
    return {p.name: PUSH_RULES[p.rule].fn(node, dict(p.params), element) for p in pushes}


# ---- specialization constants: shape classes decided once, when the program is built ------------
# A template contract's `spec: {NAME: {RULE: ..., params}}` declares an int specialization constant
# per NAME. The runtime evaluates its rule once per dispatch from the node's shapes and the
# representations its tensors were planned in (`SpecFacts`), so the driver folds the branch and
# no invocation pays for a path it does not take. Each rule has a `general` value: the shader's
# default, whose path is correct for every node, so a dispatch built without spec values (a bare
# Dispatch) still computes the right thing.
class SpecFacts(Protocol):
    span: int  # units of `out` each invocation handles (the variant's reflection)
    element: int | None  # a per-element dispatch's index in its tensor list, else None

    def shape(self, name: str) -> tuple[int, ...]: ...

    def value(self, name: str): ...  # a non-tensor argument's value (permute's dims)

    def present(self, name: str) -> bool: ...

    def repr(self, name: str):  # the planned representation: `.storage` and `.layout`
        ...


@dataclass(frozen=True)
class SpecRule:
    name: str
    required: tuple[str, ...]  # parameter keys besides the rule's own key
    tensor_params: tuple[str, ...]  # keys (the rule's own included) whose values name tensors
    general: int  # the value whose path is right for every node: the shader's default
    fn: Callable
    doc: str


SPEC_RULES: dict[str, SpecRule] = {}


def _spec_rule(name: str, general: int, required=(), tensor_params=()):
    def register(fn):
        SPEC_RULES[name] = SpecRule(name, tuple(required), tuple(tensor_params), general, fn,
                                    (fn.__doc__ or "").strip())
        return fn

    return register


def _listed(value) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def _same_repr(facts: SpecFacts, a: str, b: str) -> bool:
    ra, rb = facts.repr(a), facts.repr(b)
    return (ra.storage, ra.layout) == (rb.storage, rb.layout)


def _whcn_of(facts: SpecFacts, name: str) -> tuple[int, int, int, int]:
    from .geometry import whcn_sizes

    return whcn_sizes(facts.shape(name))


@_spec_rule("same_as", 0, required=("of",), tensor_params=("same_as", "of"))
def _same_as(facts: SpecFacts, p: dict) -> int:
    """1 when each listed tensor that the node has (an absent optional one, or a Scalar in its
    place, is skipped) has the WHCN sizes and the representation of `of`: every unit of `of` then
    reads the same unit of each, word for word (a direct elementwise op, no broadcast)."""
    want = _whcn_of(facts, p["of"])
    for name in _listed(p["same_as"]):
        if not facts.present(name):
            continue
        if _whcn_of(facts, name) != want or not _same_repr(facts, name, p["of"]):
            return 0
    return 1


READ_GENERAL, READ_DIRECT, READ_ROW, READ_SINGLE = 0, 1, 2, 3
# Runs (buffers only): the input's word for out's word w is (w / i1) % p1 + ((w / i2) % p2) p1,
# indexing.glslh tf_runs. 4 + mode + 3 * two: mode 0 when a vec4 word of out reads one input
# word (i1 % 4 == 0), 1 when it reads one whole input vec4 (i1 == 1, p1 % 4 == 0), 2 otherwise
# (binary.glsl.j2 goes word by word); two when the input keeps a second run of out's dims.
READ_RUNS = 4
RUNS_SCALAR, RUNS_VEC4, RUNS_LANES = 0, 1, 2


def buffer_dim_order(layout) -> tuple[int, ...] | None:
    """The WHCN dims of a float buffer of one element per word, fastest first (the word of the
    element at idx is idx's linear number in this order, as indexing.glslh tf_buffer_word_lane
    computes it), or None for a blocked layout."""
    from texelflow.generated.layouts import LAYOUT_INFO

    info = LAYOUT_INFO[layout]
    if info.family != "float" or info.buffer_block != 1 or info.outer_block != 1:
        return None
    pd, od = info.packed_dim, info.outer_dim
    rest = tuple(d for d in range(4) if d not in (pd, od))
    return ((od, pd) if info.block_transposed else (pd, od)) + rest


def broadcast_runs(out_sizes, in_sizes, order) -> tuple[int, int, int, int] | None:
    """(i1, p1, i2, p2) such that an input of sizes `in_sizes` broadcast to `out_sizes`, both held
    in dim order `order` (fastest first), has its element for out's word w at word
    (w / i1) % p1 + ((w / i2) % p2) p1: out's dims in order fall in runs of broadcast dims
    (size 1 in the input) and kept ones, and the input keeps at most two runs (p2 = 1 with one).
    None when the sizes do not broadcast or the input keeps more than two runs."""
    if any(a not in (1, b) for a, b in zip(in_sizes, out_sizes)):
        return None
    runs = [1, 1, 1, 1]
    block = 0  # 0 before the first kept run, 1 in it, 2 after it, 3 in the second, 4 after it
    span = 1
    for d in order:
        n = out_sizes[d]
        if n == 1:
            continue
        if in_sizes[d] > 1:
            if block == 4:
                return None
            if block in (0, 2):
                runs[2 * (block // 2)] = span
                block += 1
            runs[1 if block == 1 else 3] *= n
        elif block in (1, 3):
            block += 1
        span *= n
    return tuple(runs)


def contiguous_runs(in_shape, out_shape) -> tuple[int, int, int, int] | None:
    """broadcast_runs of torch shapes (any rank) held contiguously, the last dim fastest: the
    word order of a width-packed buffer of one element per word, whatever the rank."""
    rank = len(out_shape)
    if len(in_shape) > rank:
        return None
    padded = (1,) * (rank - len(in_shape)) + tuple(in_shape)
    return broadcast_runs(tuple(reversed(tuple(out_shape))), tuple(reversed(padded)), range(rank))


def _runs_class(facts: SpecFacts, a: str, b: str) -> int:
    """READ_RUNS + mode + 3 * two for input `a` read by `of` = b in buffers, or READ_GENERAL."""
    from texelflow.generated.layouts import STORAGE_INFO

    ra, rb = facts.repr(a), facts.repr(b)
    if STORAGE_INFO[ra.storage].is_image or STORAGE_INFO[rb.storage].is_image:
        return READ_GENERAL
    oa, ob = buffer_dim_order(ra.layout), buffer_dim_order(rb.layout)
    if oa is None or ob is None:
        return READ_GENERAL
    sa, sb = _whcn_of(facts, a), _whcn_of(facts, b)
    if [d for d in oa if sa[d] > 1] != [d for d in ob if sa[d] > 1]:
        return READ_GENERAL  # the input holds its kept dims in another order
    runs = broadcast_runs(sb, sa, ob)
    if runs is None:
        return READ_GENERAL
    i1, p1, _, p2 = runs
    mode = RUNS_SCALAR if i1 % 4 == 0 else RUNS_VEC4 if i1 == 1 and p1 % 4 == 0 else RUNS_LANES
    return READ_RUNS + mode + 3 * int(p2 > 1)


@_spec_rule("read_class", READ_GENERAL, required=("of",), tensor_params=("read_class", "of"))
def _read_class(facts: SpecFacts, p: dict) -> int:
    """How an input broadcast to `of` is read: 1 direct (`of`'s sizes and representation: at
    `of`'s own unit), 2 a row along `of`'s packed dim (the same representation, sizes 1 in every
    other dim: a bias; element idx is element idx[packed] of the row), 3 a single element, 4-9
    runs (buffers of one element per word holding the input's dims in `of`'s order: its word
    is (w / i1) % p1 + ((w / i2) % p2) p1 for `of`'s word w, READ_RUNS + mode + 3 * two, see
    READ_RUNS), 0 anything else (the general broadcast index math). An absent input (a Scalar)
    reads 0."""
    from texelflow.generated.layouts import LAYOUT_INFO

    a, b = p["read_class"], p["of"]
    if not facts.present(a):
        return READ_GENERAL
    sa, sb = _whcn_of(facts, a), _whcn_of(facts, b)
    same = _same_repr(facts, a, b)
    if sa == sb and same:
        return READ_DIRECT
    if sa == (1, 1, 1, 1):
        return READ_SINGLE
    pd = LAYOUT_INFO[facts.repr(b).layout].packed_dim
    row = tuple(sb[d] if d == pd else 1 for d in range(4))
    if same and sa == row:
        return READ_ROW
    return _runs_class(facts, a, b)


@_spec_rule("contiguous_runs", 0, required=("of",), tensor_params=("contiguous_runs", "of"))
def _contiguous_runs(facts: SpecFacts, p: dict) -> int:
    """For a copy that broadcasts tensor `contiguous_runs` to `of` (expand): 1 + mode + 3 * (a
    second run) when both are width-packed buffers of one element per word (held in torch's
    contiguous order at any rank) and the input keeps at most two runs of `of`'s dims
    (contiguous_runs: its word for `of`'s word w is (w / i1) % p1 + ((w / i2) % p2) p1), else 0
    (the general index math). mode, as in READ_RUNS: RUNS_SCALAR where a vec4 word of `of` reads
    one input word (i1 a multiple of 4, or no dim kept), RUNS_VEC4 where it reads one input vec4
    (i1 = 1, p1 a multiple of 4), RUNS_LANES word by word."""
    from texelflow.generated.layouts import STORAGE_INFO

    a, b = p["contiguous_runs"], p["of"]
    for name in (a, b):
        r = facts.repr(name)
        if STORAGE_INFO[r.storage].is_image or buffer_dim_order(r.layout) != (0, 1, 2, 3):
            return 0  # (0, 1, 2, 3): width-packed, W fastest, then H, C, N
    runs = contiguous_runs(facts.shape(a), facts.shape(b))
    if runs is None:
        return 0
    i1, p1, _, p2 = runs
    mode = RUNS_SCALAR if i1 % 4 == 0 or p1 == 1 else RUNS_VEC4 if i1 == 1 and p1 % 4 == 0 else RUNS_LANES
    return 1 + mode + 3 * int(p2 > 1)


@_spec_rule("same_order", 0, required=("of",), tensor_params=("same_order", "of"))
def _same_order(facts: SpecFacts, p: dict) -> int:
    """1 when tensor `same_order` holds its elements in the units and lanes where `of` holds the
    same elements (NCHW order): the same representation and either the same WHCN sizes or a
    reshape that keeps every unit (a width-packed buffer, or sizes agreeing up to the packed and
    blocked outer dims). A copy between them is then unit for unit."""
    from texelflow.generated.layouts import LAYOUT_INFO, STORAGE_INFO

    a, b = p["same_order"], p["of"]
    if not _same_repr(facts, a, b):
        return 0
    sa, sb = _whcn_of(facts, a), _whcn_of(facts, b)
    if sa == sb:
        return 1
    r = facts.repr(b)
    if STORAGE_INFO[r.storage].is_image:
        return 0
    info = LAYOUT_INFO[r.layout]
    if info.packed_dim == 0 and info.buffer_block == 1:
        return 1
    last = max(info.packed_dim, info.outer_dim) if info.outer_block > 1 else info.packed_dim
    return int(sa[:last + 1] == sb[:last + 1])


@_spec_rule("same_sizes", 0, required=("of",), tensor_params=("same_sizes", "of"))
def _same_sizes(facts: SpecFacts, p: dict) -> int:
    """1 when tensor `same_sizes` has the WHCN sizes of `of` (whatever their representations):
    element idx of `of` is element idx of the other, no reshape between them."""
    return int(_whcn_of(facts, p["same_sizes"]) == _whcn_of(facts, p["of"]))


# a fused activation's index in the ops' `activation` values (shaders/_conv_activation.glsl.j2)
ACTIVATION_CODES = ("none", "relu", "hardtanh", "hardswish", "silu", "gelu", "gelu_tanh", "hardsigmoid")


@_spec_rule("activation_code", 0, tensor_params=("activation_code",))
def _activation_code(facts: SpecFacts, p: dict) -> int:
    """1 + the index of the node's `activation` argument (the fused activation applied to tensor
    `activation_code`) in ACTIVATION_CODES, so that the
    pipeline compiles only that activation's arithmetic (1: none at all); 0 (general) reads the
    push constant `activation` instead."""
    return 1 + ACTIVATION_CODES.index(facts.value("activation"))


@_spec_rule("round_trip_code", 0, tensor_params=("round_trip_code",))
def _round_trip_code(facts: SpecFacts, p: dict) -> int:
    """2 when the node rounds its result to an int8 grid as it stores it (a quantize_dequantize the
    fusion folded in: `rt_scale` > 0), 1 when it does not, so that the pipeline compiles only
    what the node does; 0 (general) decides by the push constant `rt_scale`."""
    return 2 if (facts.value("rt_scale") or 0.0) > 0.0 else 1


@_spec_rule("ragged", 1, tensor_params=("ragged",))
def _ragged(facts: SpecFacts, p: dict) -> int:
    """1 when the tensor's packed dim (in its planned layout) is not a multiple of 4: its last
    texel along that dim has padding lanes, which the kernel must keep at zero."""
    from texelflow.generated.layouts import LAYOUT_INFO

    name = p["ragged"]
    return int(_whcn_of(facts, name)[LAYOUT_INFO[facts.repr(name).layout].packed_dim] % 4 != 0)


@_spec_rule("packed_at_least", 0, required=("size",), tensor_params=("packed_at_least",))
def _packed_at_least(facts: SpecFacts, p: dict) -> int:
    """1 when the tensor's packed dim (in its planned layout) is at least `size` long: a pointwise
    conv over that many input channels keeps two output blocks per invocation, a shallower one
    one (shaders/_conv2d_pw_main.glsl.j2)."""
    from texelflow.generated.layouts import LAYOUT_INFO

    name = p["packed_at_least"]
    return int(_whcn_of(facts, name)[LAYOUT_INFO[facts.repr(name).layout].packed_dim] >= int(p["size"]))


@_spec_rule("packed_lines", 0, required=("dim",), tensor_params=("packed_lines",))
def _packed_lines(facts: SpecFacts, p: dict) -> int:
    """1 when the node works along lines of its argument `dim` (a torch dim) that is the tensor's
    packed dim (in its planned layout) and a multiple of 4 long: in a one-element-per-word buffer
    every line is then whole vec4 words, read and written four at a time (softmax.glsl.j2)."""
    from texelflow.generated.layouts import LAYOUT_INFO

    name = p["packed_lines"]
    shape = tuple(facts.shape(name))
    if not shape:
        return 0
    d = facts.value(p["dim"]) % len(shape)
    whcn = len(shape) - 1 - d
    return int(whcn == LAYOUT_INFO[facts.repr(name).layout].packed_dim and shape[d] % 4 == 0)


INT8_WORDS_GENERAL, INT8_WORDS_LOOKUP, INT8_WORDS_SAME = 0, 1, 2


@_spec_rule("int8_words", INT8_WORDS_GENERAL, required=("of",), tensor_params=("int8_words", "of"))
def _int8_words(facts: SpecFacts, p: dict) -> int:
    """How the listed int8 tensors (PACKED_INT8 buffers; absent ones skipped) read the words of
    the int8 tensor `of`, the least of them: 2 when a tensor has `of`'s WHCN sizes and layout
    (word u of `of` is its word u), 1 when it has `of`'s sizes and packed dim (each word of `of`
    is one whole word of it, lane for lane, found once per word through its own layout), 0
    otherwise (a broadcast, or another packed dim: element by element)."""
    from texelflow.generated.layouts import LAYOUT_INFO

    want = _whcn_of(facts, p["of"])
    info = LAYOUT_INFO[facts.repr(p["of"]).layout]
    if info.family != "int8x4":
        return INT8_WORDS_GENERAL
    least = INT8_WORDS_SAME
    for name in _listed(p["int8_words"]):
        if not facts.present(name):
            continue
        mine = LAYOUT_INFO[facts.repr(name).layout]
        if _whcn_of(facts, name) != want or mine.family != "int8x4" or mine.packed_dim != info.packed_dim:
            return INT8_WORDS_GENERAL
        if not _same_repr(facts, name, p["of"]):
            least = INT8_WORDS_LOOKUP
    return least


QUANT_GENERAL, QUANT_WORDS, QUANT_BLOCKS = 0, 1, 2


@_spec_rule("quant_words", QUANT_GENERAL, required=("of",), tensor_params=("quant_words", "of"))
def _quant_words(facts: SpecFacts, p: dict) -> int:
    """How a float tensor and an int8 tensor (a PACKED_INT8 buffer) of the same WHCN sizes meet,
    either being `of`: 1 when the float one packs the int8 one's packed dim (a texture, or a
    buffer of one element per word whose packed size is a multiple of 4): an int8 word's 4 lanes
    are one texel or 4 neighbouring words of it; 2 when the float one is a texture packed along a
    dim q that the int8 one does not pack, q's size a multiple of 4: 4 int8 words neighbouring
    along q meet the 4 texels along the int8 packed dim, each read once (quantize.glsl.j2); 0
    otherwise (element by element)."""
    from texelflow.generated.layouts import LAYOUT_INFO, STORAGE_INFO

    a, b = p["quant_words"], p["of"]
    if LAYOUT_INFO[facts.repr(a).layout].family != "float":
        a, b = b, a  # a: the float tensor, b: the int8 one
    sizes = _whcn_of(facts, b)
    ra, rb = facts.repr(a), facts.repr(b)
    ia, ib = LAYOUT_INFO[ra.layout], LAYOUT_INFO[rb.layout]
    if _whcn_of(facts, a) != sizes or ia.family != "float" or ib.family != "int8x4":
        return QUANT_GENERAL
    image = STORAGE_INFO[ra.storage].is_image
    if ia.packed_dim == ib.packed_dim:
        whole = image or (ia.buffer_block == 1 and sizes[ia.packed_dim] % 4 == 0)
        return QUANT_WORDS if whole else QUANT_GENERAL
    return QUANT_BLOCKS if image and sizes[ia.packed_dim] % 4 == 0 else QUANT_GENERAL


@_spec_rule("padded_words", 1, tensor_params=("padded_words",))
def _padded_words(facts: SpecFacts, p: dict) -> int:
    """1 when a PACKED_INT8 buffer holds lanes or words past its sizes (a packed size not a
    multiple of 4, or a blocked outer dim not a multiple of its block), which a kernel must
    write as zero; 0 when every lane of every word is an element."""
    from texelflow.generated.layouts import LAYOUT_INFO

    name = p["padded_words"]
    info = LAYOUT_INFO[facts.repr(name).layout]
    sizes = _whcn_of(facts, name)
    return int(sizes[info.packed_dim] % info.buffer_block != 0 or sizes[info.outer_dim] % info.outer_block != 0)


@_spec_rule("row_groups", 0, tensor_params=("row_groups",))
def _row_groups(facts: SpecFacts, p: dict) -> int:
    """1 when the tensor is a buffer whose packed dim is a multiple of 4 and whose rows along it
    (numel / packed size) come in whole groups of 4: an invocation can then take one vec4 column
    of 4 neighbouring rows, and a row operand (a bias) is read once for all 4."""
    from texelflow.generated.layouts import LAYOUT_INFO, STORAGE_INFO

    name = p["row_groups"]
    r = facts.repr(name)
    if STORAGE_INFO[r.storage].is_image:
        return 0
    sizes = _whcn_of(facts, name)
    n = sizes[LAYOUT_INFO[r.layout].packed_dim]
    numel = sizes[0] * sizes[1] * sizes[2] * sizes[3]
    return int(n % 4 == 0 and (numel // n) % 4 == 0)


@_spec_rule("float_index", 0, required=("per",), tensor_params=("float_index",))
def _float_index(facts: SpecFacts, p: dict) -> int:
    """1 when the tensor's elements divided by `per` (the elements each index a kernel divides
    counts: 1 for an element index, 16 for one index per 4 x 4 block) are fewer than 2^22: such
    an index and its quotients are exact in float32 and a float quotient (2.5 ulp in Vulkan) is
    off by less than one, so indexing.glslh tf_divmod may divide through it, corrected by one
    step, which lavapipe vectorises, instead of an integer division, which it runs lane by lane."""
    sizes = _whcn_of(facts, p["float_index"])
    per = max(int(p["per"]), 1)
    return int(sizes[0] * sizes[1] * sizes[2] * sizes[3] // per < FLOAT_INDEX_LIMIT)


def _whole_words(size: int, one_per_word: bool) -> int:
    """packed_permute / packed_select on buffers: 2 when a packed size of `size` makes whole rows of
    16 words (an invocation's span lies in one row), 1 whole vec4 words, 0 neither."""
    if not one_per_word or size % 4:
        return 0
    return 2 if size % 16 == 0 else 1


@_spec_rule("packed_permute", 0, required=("of",), tensor_params=("packed_permute", "of"))
def _packed_permute(facts: SpecFacts, p: dict) -> int:
    """1 when permute's `dims` take `of`'s packed dim to tensor `packed_permute`'s packed dim and
    both lie in textures (rank <= 4: permute.glsl.j2's texel index has no leading dims), or both in
    buffers with one element per word whose packed size is a multiple of 4: each texel or vec4 word of `of` is then one texel or vec4 word of the other,
    4 elements along each packed dim (permute.glsl.j2 moves units whole); 2 for buffers whose
    packed size is a multiple of 16 (16 words of a row at once)."""
    from texelflow.generated.layouts import LAYOUT_INFO, STORAGE_INFO

    from .hooks import _whcn_permutation8

    a, b = p["packed_permute"], p["of"]
    ra, rb = facts.repr(a), facts.repr(b)
    ia, ib = LAYOUT_INFO[ra.layout], LAYOUT_INFO[rb.layout]
    a_image, b_image = STORAGE_INFO[ra.storage].is_image, STORAGE_INFO[rb.storage].is_image
    if a_image != b_image or ia.family != "float" or ib.family != "float":
        return 0
    if _whcn_permutation8(facts)[ib.packed_dim] != ia.packed_dim:
        return 0
    if a_image:  # textures: rank <= 4 too, so the kernel's index needs no leading dims
        return int(len(facts.shape(a)) <= 4)
    return _whole_words(_whcn_of(facts, b)[ib.packed_dim], ia.buffer_block == 1 and ib.buffer_block == 1)


@_spec_rule("packed_select", 0, required=("of",), tensor_params=("packed_select", "of"))
def _packed_select(facts: SpecFacts, p: dict) -> int:
    """1 when select's removed `dim` lies above the packed dim of tensor `packed_select` (its WHCN
    lane is higher; `of`, one rank less, shares the layout) and both are textures, or buffers
    with one element per word whose packed size is a multiple of 4: each texel or vec4 word of
    `of` is then one texel or vec4 word of the other (select.glsl.j2 moves units whole); 2 for
    buffers whose packed size is a multiple of 16 (16 words of a row at once)."""
    from texelflow.generated.layouts import LAYOUT_INFO, STORAGE_INFO

    a, b = p["packed_select"], p["of"]
    ra, rb = facts.repr(a), facts.repr(b)
    ia = LAYOUT_INFO[ra.layout]
    if (ra.storage, ra.layout) != (rb.storage, rb.layout) or ia.family != "float":
        return 0
    rank = len(facts.shape(a))
    if rank == 0 or rank - 1 - facts.value("dim") % rank <= ia.packed_dim:
        return 0
    if STORAGE_INFO[ra.storage].is_image:
        return 1
    return _whole_words(_whcn_of(facts, b)[ia.packed_dim], ia.buffer_block == 1)


def _one_float_repr(facts: SpecFacts, a: str, b: str):
    """The layout info of tensors `a` and `b` where they share one float-family representation
    and `a` has a dim (slice's and pad's whole units need both), else None."""
    from texelflow.generated.layouts import LAYOUT_INFO

    ra, rb = facts.repr(a), facts.repr(b)
    info = LAYOUT_INFO[ra.layout]
    if (ra.storage, ra.layout) != (rb.storage, rb.layout) or info.family != "float" or not facts.shape(a):
        return None
    return info


@_spec_rule("packed_slice", 0, required=("of",), tensor_params=("packed_slice", "of"))
def _packed_slice(facts: SpecFacts, p: dict) -> int:
    """1 when each unit of slice's output `of` (a texel, or a vec4 word of 4 elements along the
    packed dim) is one whole unit of tensor `packed_slice` (slice.glsl.j2 then moves units whole):
    the sliced dim lies off the packed dim, in textures or in one-element-per-word buffers whose
    packed size is a multiple of 4; or it is the packed dim, sliced with step 1 from a multiple of
    4, in such buffers with both packed sizes multiples of 4, or in textures where out's padding
    lanes are self's (out ends where self does, or holds whole texels). 2 for such buffers with
    out's packed size a multiple of 16 (16 words of one row per index)."""
    from texelflow.generated.layouts import STORAGE_INFO

    from .hooks import slice_start

    a, b = p["packed_slice"], p["of"]
    info, shape = _one_float_repr(facts, a, b), facts.shape(a)
    if info is None:
        return 0
    image = STORAGE_INFO[facts.repr(a).storage].is_image
    if image and len(shape) > 4:
        return 0
    pd = info.packed_dim
    size_out, size_in = _whcn_of(facts, b)[pd], _whcn_of(facts, a)[pd]
    lane = len(shape) - 1 - (facts.value("dim") or 0) % len(shape)
    if lane != pd:
        return 1 if image else _whole_words(size_out, info.buffer_block == 1)
    start, step = slice_start(facts), facts.value("step") or 1
    if step != 1 or start % 4:
        return 0
    if image:
        return int(size_out % 4 == 0 or start + size_out == size_in)
    return _whole_words(size_out, info.buffer_block == 1) if size_in % 4 == 0 else 0


@_spec_rule("packed_pad", 0, required=("of",), tensor_params=("packed_pad", "of"))
def _packed_pad(facts: SpecFacts, p: dict) -> int:
    """1 when constant_pad_nd pads (or crops) tensor `packed_pad` into `of` off the packed dim
    only: rank <= 4 in textures (out's packed size a multiple of 4, or a fill of 0, as a fill
    texel's padding lanes must be), or in one-element-per-word buffers whose packed size is a
    multiple of 4: each unit of `of` (a texel, or a vec4 word) is then one whole unit of self or
    all fill (pad.glsl.j2 moves units whole); 2 for such buffers with the packed size a multiple of
    16 (16 words of one row per index)."""
    from texelflow.generated.layouts import STORAGE_INFO

    a, b = p["packed_pad"], p["of"]
    info, shape = _one_float_repr(facts, a, b), facts.shape(a)
    if info is None:
        return 0
    pad = list(facts.value("pad"))
    if any(pad[2 * info.packed_dim + k] for k in (0, 1) if 2 * info.packed_dim + k < len(pad)):
        return 0
    size = _whcn_of(facts, b)[info.packed_dim]
    if STORAGE_INFO[facts.repr(a).storage].is_image:  # a fill texel's padding lanes hold the fill: +0 only
        value = 0.0 if facts.value("value") is None else float(facts.value("value"))
        return int(len(shape) <= 4 and (size % 4 == 0 or (value == 0 and math.copysign(1.0, value) > 0)))
    return _whole_words(size, info.buffer_block == 1)


def _packed_dim_kept(facts: SpecFacts, a: str, b: str, moved_lanes) -> int:
    """For an op whose output `b` holds each element of `a` (one shared representation) at an
    index that differs only along the WHCN lanes `moved_lanes`: 1 when the packed dim is not one
    of them, in a texture (rank <= 4) or a one-element-per-word buffer whose packed size is a
    multiple of 4, so each unit of `b` is one whole unit of `a`; 2 for such buffers with the
    packed size a multiple of 16 (16 words of one row per index)."""
    from texelflow.generated.layouts import STORAGE_INFO

    info, shape = _one_float_repr(facts, a, b), facts.shape(a)
    if info is None or len(shape) > 4 and STORAGE_INFO[facts.repr(a).storage].is_image:
        return 0
    if info.packed_dim in set(moved_lanes):
        return 0
    if STORAGE_INFO[facts.repr(a).storage].is_image:
        return 1
    return _whole_words(_whcn_of(facts, b)[info.packed_dim], info.buffer_block == 1)


@_spec_rule("packed_roll", 0, required=("of",), tensor_params=("packed_roll", "of"))
def _packed_roll(facts: SpecFacts, p: dict) -> int:
    """1 when roll leaves the packed dim of tensor `packed_roll` (whose representation `of`
    shares) unshifted, in a texture or in a one-element-per-word buffer whose packed size is a
    multiple of 4: each unit of `of` (a texel, or a vec4 word) is then one whole unit of self
    (roll.glsl.j2 moves units whole); 2 for such buffers with the packed size a multiple of 16."""
    from .hooks import roll_whcn_shifts

    a, b = p["packed_roll"], p["of"]
    if not facts.shape(a):
        return 0
    return _packed_dim_kept(facts, a, b, [lane for lane, shift in enumerate(roll_whcn_shifts(facts)) if shift])


@_spec_rule("packed_phase", 0, required=("of",), tensor_params=("packed_phase", "of"))
def _packed_phase(facts: SpecFacts, p: dict) -> int:
    """1 when phase_shuffle moves tensor `packed_phase`'s elements into `of` (one shared
    representation) only along W and H, and C / groups, if C is the packed dim, is a multiple of 4 (each
    phase's channels then start on a whole texel or vec4 word of self): each unit of `of` is one
    whole unit of self (phase_shuffle.glsl.j2 moves units whole); 2 for one-element-per-word
    buffers with the packed size (C / groups along C) a multiple of 16."""
    from texelflow.generated.layouts import STORAGE_INFO

    a, b = p["packed_phase"], p["of"]
    info = _one_float_repr(facts, a, b)
    if info is None or len(facts.shape(a)) > 4 or info.packed_dim in (0, 1):
        return 0
    size = _whcn_of(facts, b)[info.packed_dim]
    if info.packed_dim == 2:  # a phase's channels of one group start at a multiple of C / groups
        size //= facts.value("groups") or 1
    if STORAGE_INFO[facts.repr(a).storage].is_image:
        return int(info.packed_dim != 2 or size % 4 == 0)
    return _whole_words(size, info.buffer_block == 1)


@_spec_rule("packed_flip", 0, required=("of",), tensor_params=("packed_flip", "of"))
def _packed_flip(facts: SpecFacts, p: dict) -> int:
    """1 when flip leaves the packed dim of tensor `packed_flip` (whose representation `of`
    shares) unflipped, in a texture (rank <= 4) or in a one-element-per-word buffer whose packed
    size is a multiple of 4: each unit of `of` (a texel, or a vec4 word) is then one whole unit of
    self (flip.glsl.j2 moves units whole); 2 for such buffers with the packed size a multiple of 16."""
    a, b = p["packed_flip"], p["of"]
    rank = len(facts.shape(a))
    return _packed_dim_kept(facts, a, b, [whcn(d, rank) for d in facts.value("dims") or ()])


@_spec_rule("list_units", 0, required=("of", "dim"), tensor_params=("list_units", "of"))
def _list_units(facts: SpecFacts, p: dict) -> int:
    """For one element of the tensor list `list_units` concatenated into `of` along torch dim
    `dim` (a per-element dispatch: `facts.element` is its index): 1 when each unit (texel, or
    buffer word of one element) of the element is one whole unit of `of`, at the element's index
    moved along the cat dim by the sizes of the elements before it. That holds for rank <= 4 (no
    leading dims), one float-family representation for both, and a cat dim that is not the
    packed dim, or is with an offset that is a multiple of 4 and an element whose size along it
    is too or that ends `of` (its padding lanes are `of`'s). The kernel then runs over the
    element's units instead of all of `of`'s, with no read-back of `of`. 2 for a texture element
    along the packed dim that is not whole texels: the kernel runs over `of`'s texels that hold
    some of it (its slab: list_slab_shape), reading each back, not over all of `of`'s."""
    from texelflow.generated.layouts import LAYOUT_INFO, STORAGE_INFO

    element = getattr(facts, "element", None)
    a, b = p["list_units"], p["of"]
    out_shape = facts.shape(b)
    if element is None or len(out_shape) > 4 or len(out_shape) == 0:
        return 0
    ra, rb = facts.repr(a), facts.repr(b)
    info = LAYOUT_INFO[rb.layout]
    if (ra.storage, ra.layout) != (rb.storage, rb.layout) or info.family != "float":
        return 0
    items = facts.value(a)[:element + 1]
    if any(len(x.shape) != len(out_shape) for x in items):  # a legacy empty 1-D element
        return 0
    if not STORAGE_INFO[rb.storage].is_image:  # one element per word: any word moves whole
        return int(info.buffer_block == 1)
    dim = facts.value(p["dim"]) % len(out_shape)
    if whcn(dim, len(out_shape)) != info.packed_dim:
        return 1
    offset = sum(x.shape[dim] for x in items[:-1])  # as push rule list_offset
    size = items[-1].shape[dim]
    return 1 if offset % 4 == 0 and (size % 4 == 0 or offset + size == out_shape[dim]) else 2


def list_slab_shape(out_shape, offset: int, size: int, dim: int) -> list[int]:
    """The shape whose texture extents are the texels of `out_shape` that hold elements offset ..
    offset + size - 1 along its packed dim `dim` (list_units 2: cat.glsl.j2's slab): out's, with
    dim 4 per texel from the one holding `offset` to the one holding the last."""
    shape = list(out_shape)
    shape[dim] = 4 * ((offset + size - 1) // 4 - offset // 4 + 1)
    return shape


@_spec_rule("round_bfloat16", 0, tensor_params=("round_bfloat16",))
def _round_bfloat16(facts: SpecFacts, p: dict) -> int:
    """1 when the node's float32 result holds a bfloat16 program's value (runtime/graph/bfloat16.py)
    that its store rounds to bfloat16, in place of a round_bfloat16 node after it (the node's
    `round_bfloat16` mark, set by bfloat16.fold_roundings)."""
    return int(bool(getattr(facts.node, "round_bfloat16", False)))


@_spec_rule("units_tail", 1, tensor_params=("units_tail",))
def _units_tail(facts: SpecFacts, p: dict) -> int:
    """1 when some invocation covers a partial span of the tensor: in a buffer, its words are
    not a multiple of the variant's span; in a texture (a span runs along one x-row), its x
    extent is not. Only then does the kernel need bounds checks inside a span."""
    from texelflow.generated.layouts import STORAGE_INFO

    from .geometry import texture_extents, units

    name = p["units_tail"]
    r, span = facts.repr(name), max(facts.span, 1)
    if STORAGE_INFO[r.storage].is_image:
        return int(texture_extents(facts.shape(name), r.layout, r.storage)[0] % span != 0)
    return int(units(facts.shape(name), r.storage, r.layout) % span != 0)


def spec_values(facts: SpecFacts, specs: Sequence) -> dict:
    """Spec constant name -> value; `specs`: items with `.name`, `.rule` and `.params`."""
    return {s.name: int(SPEC_RULES[s.rule].fn(facts, dict(s.params))) for s in specs}


FLOAT_INDEX_LIMIT = 1 << 22  # indices below it divide exactly through a float quotient (tf_divmod)
TRANSPOSE_GATHER = 2  # transpose4's value for a buffer input gathered word by word


@_spec_rule("transpose4", 0, required=("of",), tensor_params=("transpose4", "of"))
def _transpose4(facts: SpecFacts, p: dict) -> int:
    """1 when a copy from tensor `transpose4` to `of` (same WHCN sizes, float family, packed dims
    q and p that differ) can move 4 x 4 blocks: four vec4 reads along q, a transpose, four vec4
    writes along p. Buffers (one element per word) need their packed size a multiple of 4 (whole
    vec4 words); a buffer `of` needs both sizes so (its invocations then cover whole blocks); a
    texture `of` needs q to be W, the axis its invocations run along, and from a buffer whose W
    is not a multiple of 4 the value is 2 (TRANSPOSE_GATHER): each input vec4 along W is
    gathered word by word (its rows do not start on vec4 words), the rest as for 1."""
    from texelflow.generated.layouts import LAYOUT_INFO, STORAGE_INFO

    a, b = p["transpose4"], p["of"]
    sizes = _whcn_of(facts, b)
    if _whcn_of(facts, a) != sizes:
        return 0
    ra, rb = facts.repr(a), facts.repr(b)
    ia, ib = LAYOUT_INFO[ra.layout], LAYOUT_INFO[rb.layout]
    q, pd = ia.packed_dim, ib.packed_dim
    if ia.family != "float" or ib.family != "float" or q == pd:
        return 0
    a_image, b_image = STORAGE_INFO[ra.storage].is_image, STORAGE_INFO[rb.storage].is_image
    if (not a_image and ia.buffer_block != 1) or (not b_image and ib.buffer_block != 1):
        return 0
    if b_image:
        if q != 0:
            return 0
        return 1 if a_image or sizes[0] % 4 == 0 else TRANSPOSE_GATHER
    return int(sizes[q] % 4 == 0 and sizes[pd] % 4 == 0)


@_spec_rule("transpose4_texels", 0, required=("of",), tensor_params=("transpose4_texels", "of"))
def _transpose4_texels(facts: SpecFacts, p: dict) -> int:
    """`transpose4`, and also a channels-packed texture to a width-packed texture of the same
    float sizes with C a multiple of 4: copy.glsl.j2 then reads 4 input texels along W once and
    writes the 4 output texels of 4 channels (4 output z slices from one input z slice; a row's
    last chunk may be partial: the `tail` shape class)."""
    from texelflow.generated.layouts import LAYOUT_INFO, STORAGE_INFO

    a, b = p["transpose4_texels"], p["of"]
    blocks = _transpose4(facts, {"transpose4": a, "of": b})
    if blocks:
        return blocks
    sizes = _whcn_of(facts, b)
    ra, rb = facts.repr(a), facts.repr(b)
    ia, ib = LAYOUT_INFO[ra.layout], LAYOUT_INFO[rb.layout]
    images = STORAGE_INFO[ra.storage].is_image and STORAGE_INFO[rb.storage].is_image
    return int(images and _whcn_of(facts, a) == sizes and ia.family == "float" and ib.family == "float"
               and ia.packed_dim == 2 and ib.packed_dim == 0 and sizes[2] % 4 == 0)
