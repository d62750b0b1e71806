"""Push-constant derivations too specific for the vocabulary of shaders/node_rules.py.

A hook is named by a declaration (`{hook: NAME}`) in ops.yaml or a template contract; `make gen`
refuses a declaration naming no hook here, and a hook here that no declaration names. Each hook
is a pure function of the node (see node_rules.NodeFacts) returning a value of its declared type.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from .node_rules import NodeFacts


@dataclass(frozen=True)
class Hook:
    name: str
    type: str  # int, float or ivec4
    fn: Callable


HOOKS: dict[str, Hook] = {}


def hook(type_: str):
    def register(fn):
        HOOKS[fn.__name__] = Hook(fn.__name__, type_, fn)
        return fn

    return register


@hook("ivec4")
def whcn_permutation(node: NodeFacts):
    """permute's `dims` in WHCN terms: out's WHCN dim d reads self's WHCN dim result[d]; lanes
    0-3 of _whcn_permutation8."""
    return tuple(_whcn_permutation8(node)[:4])


@hook("ivec4")
def reduce_whcn_lanes(node: NodeFacts):
    """A reduction over torch `dim` of `self` in WHCN terms: self's WHCN lane d takes its index
    from out's WHCN lane result[d], or is summed over (-1): a reduced dim, or a lane above the
    rank (size 1). `dim` None or [] reduces every dim, as torch does; `keepdim` keeps lanes."""
    rank = len(node.shape("self"))
    dims = node.value("dim")
    dims = [dims] if isinstance(dims, int) else dims
    reduced = {d % rank for d in dims} if dims and rank else set(range(rank))
    kept = [t for t in range(rank) if t not in reduced]
    out_rank = rank if node.value("keepdim") else len(kept)
    lanes = [-1, -1, -1, -1]
    for i, t in enumerate(kept):
        out_dim = t if node.value("keepdim") else i
        lanes[rank - 1 - t] = out_rank - 1 - out_dim
    return tuple(lanes)



@hook("int")
def batch_norm_lane(node: NodeFacts):
    """batch_norm's channel dim (torch dim 1) as a WHCN lane: its own for rank <= 4; rank > 4
    folds dims 0 .. rank-4 into N, so it is N's lane (3)."""
    return min(len(node.shape("input")) - 2, 3)


@hook("int")
def batch_norm_inner(node: NodeFacts):
    """What batch_norm divides its lane's index by before `% C`: 1 for rank <= 4, else the
    product of the dims folded into N after dim 1."""
    import math

    shape = node.shape("input")
    return math.prod(shape[2:len(shape) - 3]) if len(shape) > 4 else 1


@hook("int")
def matmul_vector_operands(node: NodeFacts):
    """torch.matmul's 1-D operands, which torch treats as a row (self) or a column (other) and drops
    from the result: bit 0 when `self` is 1-D, bit 1 when `other` is."""
    return int(len(node.shape("self")) == 1) | 2 * int(len(node.shape("other")) == 1)


# ---- shape ops: leading dims, permutations, slices, pads, resampling (shapes helper) ------------
LEAD_LANES = 4  # dims folded into WHCN's N that a shape kernel can unfold: rank <= 3 + 4 = 7


def _lead_sizes(shape) -> tuple[int, int, int, int]:
    """The sizes of the torch dims a rank > 3 tensor folds into WHCN's N, innermost first
    (torch dims r-4, r-5, ...), 1 beyond the rank: what a kernel needs to unfold N again."""
    lead = list(reversed(tuple(shape)[:-3]))
    return tuple(lead + [1] * (LEAD_LANES - len(lead)))[:LEAD_LANES]


@hook("ivec4")
def self_lead_sizes(node: NodeFacts):
    """`self`'s dims folded into N, innermost first (see _lead_sizes)."""
    return _lead_sizes(node.shape("self"))


@hook("ivec4")
def expand_runs(node: NodeFacts):
    """expand's broadcast runs (i1, p1, i2, p2) in torch's contiguous order (node_rules
    contiguous_runs); (1, 1, 1, 1) where they do not apply, a value the kernel then never reads
    (its shape class contiguous_runs is 0)."""
    from .node_rules import contiguous_runs

    return contiguous_runs(node.shape("self"), node.shape("out")) or (1, 1, 1, 1)


@hook("ivec4")
def out_lead_sizes(node: NodeFacts):
    """`out`'s dims folded into N, innermost first (see _lead_sizes)."""
    return _lead_sizes(node.shape("out"))


def _torch_permutation(node: NodeFacts) -> list[int]:
    """permute's `dims`, normalised (transpose and t reach permute through their decompositions)."""
    rank = len(node.shape("self"))
    return [d % rank for d in node.value("dims")] if rank else []


def _whcn_permutation8(node: NodeFacts) -> list[int]:
    """Out's WHCN lane d (lanes 3.. are the leading dims, innermost first) reads self's lane
    result[d]: r - 1 - dims[r - 1 - d] below the rank, d itself above it."""
    dims = _torch_permutation(node)
    rank = len(dims)
    return [rank - 1 - dims[rank - 1 - d] if d < rank else d for d in range(8)]


@hook("ivec4")
def whcn_permutation_hi(node: NodeFacts):
    """Lanes 4-7 of the permutation of whcn_permutation (the leading dims of rank > 4 tensors)."""
    return tuple(_whcn_permutation8(node)[4:])


@hook("int")
def slice_start(node: NodeFacts):
    """slice's first index, as torch clamps it: None is 0, negative counts from the end, and the
    result lies in [0, size] of the sliced dim."""
    size = node.shape("self")[node.value("dim") % len(node.shape("self"))]
    start = node.value("start")
    start = 0 if start is None else start + size if start < 0 else start
    return min(max(start, 0), size)


@hook("int")
def select_index(node: NodeFacts):
    """select's `index`, counted from 0 (a negative index counts from the end)."""
    return node.value("index") % node.shape("self")[node.value("dim") % len(node.shape("self"))]


def _pad_before(node: NodeFacts) -> list[int]:
    """constant_pad_nd's padding before each WHCN lane (lane k: torch dim r-1-k), 8 lanes."""
    pad = list(node.value("pad"))
    return [pad[2 * k] if 2 * k < len(pad) else 0 for k in range(8)]


@hook("ivec4")
def pad_before_lo(node: NodeFacts):
    """Elements padded before W, H, C and the innermost leading dim (negative: cropped)."""
    return tuple(_pad_before(node)[:4])


@hook("ivec4")
def pad_before_hi(node: NodeFacts):
    """Elements padded before the leading dims 2-5 (see pad_before_lo)."""
    return tuple(_pad_before(node)[4:])


def _f32(x: float) -> float:
    """x rounded to float32, as torch computes its scales."""
    import struct

    return struct.unpack("f", struct.pack("f", x))[0]


def _upsample_scale(node: NodeFacts, axis: int) -> float:
    """torch's float32 source-index scale for upsampling along H (axis 0) or W (axis 1): with
    align_corners (in-1)/(out-1), else 1/scale_factor when the node gives one, else in/out.
    Nearest copies when out == in and halves when out == 2 in, whatever the scale factor.
    Quotients are rounded to float32 from double, which equals float32 division (53 >= 2*24+2)."""
    size_in = node.shape("input")[2 + axis]
    size_out = node.shape("out")[2 + axis]
    factors = node.value("scale_factors")
    align = node.value("align_corners")
    if align is None:  # nearest
        if size_out == size_in:
            return 1.0
        if size_out == 2 * size_in:
            return 0.5
    if align:
        return _f32((size_in - 1) / (size_out - 1)) if size_out > 1 else 0.0
    if factors and factors[axis] and factors[axis] > 0:
        return _f32(1.0 / factors[axis])
    return _f32(size_in / size_out)


@hook("float")
def upsample_scale_h(node: NodeFacts):
    """Source rows per output row (see _upsample_scale)."""
    return _upsample_scale(node, 0)


@hook("float")
def upsample_scale_w(node: NodeFacts):
    """Source columns per output column (see _upsample_scale)."""
    return _upsample_scale(node, 1)


@hook("int")
def channel_whcn_dim(node: NodeFacts):
    """The WHCN lane of torch dim 1 (channels) of `input`: 2 for NCHW, 1 for NCL, 0 for NC."""
    from .node_rules import whcn

    return whcn(1, len(node.shape("input")))


@hook("float")
def sdpa_scale(node: NodeFacts):
    """scaled_dot_product_attention's `scale`, torch's default 1 / sqrt(E) when None (E: query's
    last dim)."""
    import math

    scale = node.value("scale")
    return float(scale) if scale is not None else 1.0 / math.sqrt(node.shape("query")[-1])


@hook("ivec4")
def roll_whcn_shifts(node: NodeFacts):
    """roll's `shifts` per WHCN lane of `self`, each in [0, size): out[i] = self[i - shift]."""
    from .node_rules import whcn

    shape = node.shape("self")
    lanes = [0, 0, 0, 0]
    for shift, dim in zip(node.value("shifts"), node.value("dims")):
        lane = whcn(dim, len(shape))
        lanes[lane] = (lanes[lane] + shift) % max(shape[dim % len(shape)], 1)
    return tuple(lanes)


@hook("ivec4")
def pad_left_top(node: NodeFacts):
    """(left, top, 0, 0) of a reflection / replication pad's torch `padding`: [left, right] (1-D)
    or [left, right, top, bottom] (2-D); the right and bottom pads only size `out`."""
    padding = list(node.value("padding"))
    return (padding[0], padding[2] if len(padding) > 2 else 0, 0, 0)


# ---- quantized int8 (docs/quantization.md) -------------------------------------------------------
@hook("float")
def reciprocal_scale(node: NodeFacts):
    """quantize's `1 / scale` computed in double and rounded to float32, as torchao multiplies by it."""
    return _f32(1.0 / node.value("scale"))


@hook("float")
def reciprocal_rt_scale(node: NodeFacts):
    """A folded round trip's `1 / rt_scale`, rounded to float32 like quantize's (reciprocal_scale);
    0 when the node has none."""
    scale = node.value("rt_scale") or 0.0
    return _f32(1.0 / scale) if scale > 0.0 else 0.0


@hook("int")
def round_trip_qparams(node: NodeFacts):
    """A folded round trip's zero point, quant_min and quant_max as int8 lanes 0, 1, 2 of one word
    (lane j in bits 8j .. 8j + 7): the conv kernels' push constants hold 128 bytes. The fusion
    folds only int8 parameters."""
    lanes = [node.value("rt_zero_point"), node.value("rt_min"), node.value("rt_max")]  # (schema defaults: 0, -128, 127)
    assert all(-128 <= v <= 127 for v in lanes), lanes
    word = sum((v & 255) << (8 * j) for j, v in enumerate(lanes))
    return word - (1 << 32) if word >= 1 << 31 else word


@hook("float")
def reciprocal_out_scale(node: NodeFacts):
    """A q8ta op's `1 / out_scale`, rounded to float32 like quantize's (reciprocal_scale)."""
    return _f32(1.0 / node.value("out_scale"))


@hook("int")
def q8ta_linear_int8_params(node: NodeFacts):
    """A q8ta linear's integer parameters as the four int8 lanes of one word (lane j in bits 8j ..
    8j+7), since push constants hold 128 bytes and the op's six tensor sizes take 96: input_zero_point,
    out_zero_point, the lowest output (quant_min; max(quant_min, out_zero_point) with relu, as relu
    then quantize equals clamping at the zero point) and quant_max."""
    low = node.value("quant_min")
    if node.value("activation") == "relu":
        low = max(low, node.value("out_zero_point"))
    lanes = {"input_zero_point": node.value("input_zero_point"), "out_zero_point": node.value("out_zero_point"),
             "quant_min": low, "quant_max": node.value("quant_max")}
    word = 0
    for j, (name, v) in enumerate(lanes.items()):
        if not -128 <= v <= 127:
            raise ValueError(f"node {getattr(node, 'name', '?')}: {name} {v} is outside int8's [-128, 127]")
        word |= (v & 0xFF) << (8 * j)
    return word - (1 << 32) if word >= 1 << 31 else word


def _q8ta_conv_bytes(node: NodeFacts, pairs: list[tuple[str, int]]) -> int:
    """(name, value) pairs as the unsigned bytes of one int, pair j in bits 8j .. 8j+7."""
    word = 0
    for j, (name, v) in enumerate(pairs):
        if not 0 <= v <= 255:
            raise ValueError(f"node {getattr(node, 'name', '?')}: {name} {v} is outside the q8ta conv2d kernels' [0, 255]")
        word |= v << (8 * j)
    return word - (1 << 32) if word >= 1 << 31 else word


@hook("int")
def q8ta_conv_stride_pad(node: NodeFacts):
    """A q8ta conv2d's (stride_w, stride_h, pad_w, pad_h) as the bytes of one int: the op's six
    tensor sizes take 96 of the 128 push-constant bytes, leaving no room for an ivec4."""
    from .node_rules import pair_wh

    sw, sh = pair_wh(node.value("stride"), (1, 1))
    pw, ph = pair_wh(node.value("padding"), (0, 0))
    return _q8ta_conv_bytes(node, [("stride_w", sw), ("stride_h", sh), ("pad_w", pw), ("pad_h", ph)])


Q8TA_ACTIVATIONS = ("none", "relu", "hardswish", "gelu")  # the q8ta convs' `activation` values, in ops.yaml's order


@hook("int")
def q8ta_conv_dilation_act(node: NodeFacts):
    """A q8ta conv2d's (dilation_w, dilation_h, activation) as the low bytes of one int (see
    q8ta_conv_stride_pad); the activation as its index in the op's values [none, relu, hardswish, gelu]."""
    from .node_rules import pair_wh

    dw, dh = pair_wh(node.value("dilation"), (1, 1))
    act = node.value("activation")
    if act not in Q8TA_ACTIVATIONS:
        raise ValueError(f"node {getattr(node, 'name', '?')}: activation {act!r} is not one of {', '.join(Q8TA_ACTIVATIONS)}")
    return _q8ta_conv_bytes(node, [("dilation_w", dw), ("dilation_h", dh), ("activation", Q8TA_ACTIVATIONS.index(act))])
