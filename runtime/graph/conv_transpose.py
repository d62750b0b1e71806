"""Transposed convolutions as a stride-1 conv2d of their output phases and phase_shuffle, or as
conv_transpose2d_tiles where the phases differ (fusion step 0d).

conv_transpose2d's own kernel computes one output element per invocation and walks every tap,
testing which land on an input position: a U-Net's 2 x 2 stride-2 up-convolution ran at about
2 GFLOP/s on lavapipe, where the tiled conv2d kernels reach tens. Split the output by phase
instead: output row y = q * s + r (r < s, the row's phase) only meets the taps ky whose position
ky * d is congruent to y + pad modulo s, and it meets them at input rows q + m for a fixed set of
offsets m. So every phase is an ordinary stride-1 correlation of the input, and all sh * sw
phases are one conv2d with sh * sw times the output channels:

    t   = conv2d(input, Wp, bp, stride 1, padding P, dilation dc, groups)   [N, Cout*sh*sw, Qh, Qw]
    out = phase_shuffle(t, stride, crop, size, groups)                       [N, Cout, Hout, Wout]

phase_shuffle (ops.yaml) interleaves the phases and crops in one pass; a group's phases are
whole runs of its channels, so on channels-packed textures (Cout / groups a multiple of 4) it
moves whole texels. Wp holds, at output channel ((gi * sh + rh) * sw + rw) * Cout/g + co, phase
(rh, rw)'s taps of group gi's channel co at their window slots (zero where the phase has none);
bp repeats the bias once per phase. Both are derived constants computed at load (derived.py), so
the weight must be a constant. Along each dim the interleaved rows may start `o` rows (o < s)
before out's first row: o is chosen so the window M is smallest (k4 s2 p1, a DCGAN's: M = 2 and
a one-row crop, against M = 3 and none), a window that needs no crop winning ties. Along a
stride-1 dim the window keeps the dilation (dc = d, M = k taps, flipped); along a strided one
dc = 1 and the dilation's holes are zero taps.

The conv2d then takes the specialised kernel its parameters allow (fusion step 6): a 2 x 2
stride-2 up-convolution becomes a pointwise GEMM, a stride-1 3 x 3 a Winograd conv.

Only a window every slot of which is a real tap of every phase is taken: k a multiple of s along
each strided dim (k = s: a U-Net's up-convolution; k 4 s 2: a DCGAN's), any stride-1 dim. Where
phases have different numbers of taps (k 3 s 2), one window for all of them would multiply a
zero tap by an input element that torch's answer never reads, and 0 x Inf is NaN where torch has
a number. Such a node (groups 1) takes conv_transpose2d_tiles instead (`tiles_chain`): tiles of 8
output pixels of one phase x 8 output channels, each walking its phase's own taps. A grouped one
of uneven phases, one whose weight is not a constant, and one a piece of which cannot run on the
device keep the transposed conv's own kernel. A transposed conv of more input channels than that
kernel may loop over was already split by lowering (own_decompositions.conv_transpose_split);
each slice is rewritten here on its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from texelflow.generated.ops import OPS

from .derived import recipe
from .ir import Node, PlanGraph, Role, Value
from .lowering import partition_reason
from .prepack_conv import hw_pair


@dataclass(frozen=True)
class DimPlan:
    """One spatial dim of the rewrite: the conv2d's window, padding and dilation, the shuffled
    length, and the crop that takes it to out's length."""

    stride: int  # s: phases along this dim
    window: int  # M: conv2d kernel size along this dim
    padding: int  # P: conv2d padding (both sides)
    dilation: int  # dc: conv2d dilation
    rows: int  # Qc: conv2d output length (the shuffled length is rows * stride)
    crop_lo: int  # shuffled rows before out's first
    crop_hi: int  # shuffled rows after out's last
    taps: tuple  # taps[r][j]: the transposed conv's kernel index for phase r, window slot j, or -1


def plan_dim(length: int, out_length: int, kernel: int, stride: int, padding: int, dilation: int) -> DimPlan | None:
    """The phase window along one dim (see the module docstring): the one of fewest zero taps,
    then the narrowest, then one that needs no crop; None if no phase meets a tap."""
    if stride == 1:  # one phase: conv2d with the dilation kept, the kernel flipped
        base = dilation * (kernel - 1) - padding  # conv2d padding whose first row is out's first
        # rows = length + 2 pad - d (k - 1), starting pad - base rows before out's: output_padding
        # may ask for rows past the last tap, which a wider padding reaches (their crop is cut)
        pad = max(0, base, out_length - length + padding)
        rows = length + 2 * pad - dilation * (kernel - 1)
        lo = pad - base
        return DimPlan(1, kernel, pad, dilation, rows, lo, rows - lo - out_length,
                       (tuple(kernel - 1 - j for j in range(kernel)),))
    span = dilation * (kernel - 1) + 1  # tap positions t = ky * d in [0, span)
    best = None
    for start in range(stride):  # o: shuffled rows before out's first
        offsets = {}  # (phase, m) -> tap index, for m = input row offset
        for r in range(stride):
            e = r - start + padding
            for m in range(-((span - 1 - e) // stride) if e < span else 0, e // stride + 1):
                t = e - m * stride
                if 0 <= t < span and t % dilation == 0:
                    offsets[(r, m)] = t // dilation
        if not offsets:
            continue
        m_lo = min(m for _, m in offsets)
        m_hi = max(m for _, m in offsets)
        needed = -(-(start + out_length) // stride)  # conv2d rows out needs
        pad = max(0, -m_lo, needed - length + m_hi)
        window = m_hi + pad + 1  # slots j = m + pad for m in [-pad, m_hi]
        rows = length + pad - m_hi
        taps = tuple(tuple(offsets.get((r, j - pad), -1) for j in range(window)) for r in range(stride))
        plan = DimPlan(stride, window, pad, 1, rows, start, rows * stride - start - out_length, taps)
        holes = sum(t < 0 for row in taps for t in row)  # zero taps (the caller refuses them)
        key = (holes, window, plan.crop_lo + plan.crop_hi > 0, rows)
        if best is None or key < best[0]:
            best = (key, plan)
    return None if best is None else best[1]


@recipe
def conv_transpose_phase_weight(source, *, groups: int, taps_h: tuple, taps_w: tuple):
    """A transposed conv weight [Cin, Cout/g, KH, KW] (or [Cin, Cout/g, K]) as the phase conv2d's
    [Cout * sh * sw, Cin/g, MH, MW]: output channel ((gi * sh + rh) * sw + rw) * Cout/g + co of
    group gi holds phase (rh, rw)'s taps of its output channel co at their window slots, zero
    where the phase has none (a group's channels stay together, as conv2d's groups need)."""
    import torch

    if source.dim() == 3:  # a 1-D one's [Cin, Cout/g, K]: its length runs along H
        source = source.unsqueeze(-1)
    cin, cout_g, _, _ = source.shape
    cin_g = cin // groups
    sh, sw, mh, mw = len(taps_h), len(taps_w), len(taps_h[0]), len(taps_w[0])
    # [g, cin_g, cout_g, KH, KW] -> [g, cout_g, cin_g, KH, KW]: a group's output channels first
    w = source.reshape(groups, cin_g, cout_g, *source.shape[2:]).transpose(1, 2)
    out = torch.zeros(groups, sh, sw, cout_g, cin_g, mh, mw, dtype=source.dtype)
    for rh, row_h in enumerate(taps_h):
        for rw, row_w in enumerate(taps_w):
            for jh, kh in enumerate(row_h):
                for jw, kw in enumerate(row_w):
                    if kh >= 0 and kw >= 0:
                        out[:, rh, rw, :, :, jh, jw] = w[:, :, :, kh, kw]
    return out.reshape(groups * sh * sw * cout_g, cin_g, mh, mw)


@recipe
def phase_bias(source, *, groups: int, phases: int):
    """A bias [Cout] as the phase conv2d's [Cout * phases]: each group's entries repeated once
    per phase, in the channel order of conv_transpose_phase_weight."""
    return source.reshape(groups, 1, -1).expand(groups, phases, -1).reshape(-1)


@recipe
def conv_transpose_tiles_weight(source):
    """A transposed conv weight [Cin, Cout, KH, KW] (groups 1; [Cin, Cout, K] for a 1-D one) as
    conv_transpose2d_tiles' [KH * KW * Cin4 * 4, Cout4 * 4]: row (ky * KW + kx) * Cin4 * 4 + ci
    holds input channel ci's weights at tap (ky, kx) for every output channel; padding rows and
    columns are zero."""
    import torch.nn.functional as F

    if source.dim() == 3:
        source = source.unsqueeze(-1)
    cin, cout, kh, kw = source.shape
    rows = F.pad(source.permute(2, 3, 0, 1), (0, -cout % 4, 0, -cin % 4))  # [KH, KW, Cin4 * 4, Cout4 * 4]
    return rows.reshape(-1, rows.shape[-1]).contiguous()


def conv_transpose2d_tiles_reference(input, weight, bias=None, stride=(1, 1), padding=(0, 0), output_padding=(0, 0),
                                     dilation=(1, 1), kernel=(1, 1), out_channels=1):
    """What conv_transpose2d_tiles computes, in torch: the prepacked weight unpacked, then
    torch's transposed conv."""
    import torch.nn.functional as F

    cin = input.shape[1]
    kh, kw = kernel
    w = weight.reshape(kh, kw, -1, weight.shape[-1])[:, :, :cin, :out_channels].permute(2, 3, 0, 1)
    return F.conv_transpose2d(input, w, bias, list(stride), list(padding), list(output_padding), 1, list(dilation))


@dataclass(frozen=True)
class Transposed:
    """A transposed conv node's facts, 1-D ones as 2-D over [N, C, L, 1] (pairs are (h, w))."""

    x: Value
    weight: Value
    bias: Value | None
    out: Value
    one_d: bool
    groups: int
    stride: tuple[int, int]
    padding: tuple[int, int]
    output_padding: tuple[int, int]
    dilation: tuple[int, int]
    kernel: tuple[int, int]
    in_hw: tuple[int, int]
    out_hw: tuple[int, int]


def transposed_conv(node: Node) -> Transposed | None:
    """The facts of conv_transpose2d / conv_transpose1d `node`, or None where neither rewrite
    applies: a weight that is not a float constant, a bias that is not a tensor, another rank."""
    x, w, b = node.arg("input"), node.arg("weight"), node.arg("bias")
    one_d = node.op.name == "conv_transpose1d"
    if not isinstance(w, Value) or w.role is not Role.CONST or w.dtype not in ("float32", "float16") \
            or not isinstance(x, Value) or len(x.shape) != (3 if one_d else 4) \
            or (b is not None and not isinstance(b, Value)):
        return None
    out = node.outputs[0][1]
    pairs = [_pair(node.value(a), one_d, fill) for a, fill in
             (("stride", 1), ("padding", 0), ("output_padding", 0), ("dilation", 1))]
    tail = (1,) if one_d else ()
    return Transposed(x, w, b, out, one_d, node.value("groups") or 1, *pairs, tuple(w.shape[2:]) + tail,
                      tuple(x.shape[2:]) + tail, tuple(out.shape[2:]) + tail)


def _chain(graph: PlanGraph, node: Node, t: Transposed, limits: Sequence[int], build, derived: list,
           note: str) -> list[Node] | None:
    """The nodes `build(src, new)` makes from the 4-D input `src` (a 1-D conv's between views
    to [N, C, L, 1] and back), the last taking `node`'s output; None (the `derived` constants
    dropped) where one cannot run on the device. `new(suffix, target, op, args, shape)` makes a
    node of one output."""
    name, dtype = node.name, t.out.dtype

    def new(suffix, target, op_name, args, shape):
        m = Node(f"{name}/{suffix}", target, OPS[op_name], args, [])
        m.outputs = [("out", Value(f"{name}/{suffix}", tuple(shape), dtype, Role.NODE, producer=m))]
        return m

    chain: list[Node] = []
    src = t.x
    if t.one_d:
        shape = tuple(t.x.shape[:2]) + t.in_hw
        chain.append(new("as_2d", "aten.view.default", "view_copy", [("self", t.x), ("size", list(shape))], shape))
        src = chain[-1].outputs[0][1]
    chain += build(src, new)
    if t.one_d:
        chain.append(new("as_1d", "aten.view.default", "view_copy",
                         [("self", chain[-1].outputs[0][1]), ("size", list(t.out.shape))], t.out.shape))
    last = chain[-1]
    chain[-1] = Node(name, last.target, last.op, last.args, [("out", t.out)])
    if any(partition_reason(m, limits) for m in chain):
        for c in derived:
            graph.constants.remove(c)
        return None
    chain[-1].fused = node.fused + [note]
    return chain


def tiles_chain(graph: PlanGraph, node: Node, limits: Sequence[int]) -> list[Node] | None:
    """conv_transpose2d / conv_transpose1d `node` (groups 1, a float constant weight) as
    conv_transpose2d_tiles, or None where it does not apply or cannot run on the device."""
    t = transposed_conv(node)
    if t is None or t.groups != 1:
        return None
    n, cin = t.x.shape[:2]
    cout = t.out.shape[1]
    rows = t.kernel[0] * t.kernel[1] * -(-cin // 4) * 4
    wd = graph.add_derived(f"{t.weight.name}_tiles", (rows, -(-cout // 4) * 4), t.weight.dtype,
                           "conv_transpose_tiles_weight", (t.weight,))

    def build(src, new):
        args = [("input", src), ("weight", wd), ("bias", t.bias), ("stride", list(t.stride)),
                ("padding", list(t.padding)), ("output_padding", list(t.output_padding)),
                ("dilation", list(t.dilation)), ("kernel", list(t.kernel)), ("out_channels", cout)]
        return [new("tiles", "texelflow.conv_transpose2d_tiles.default", "conv_transpose2d_tiles", args,
                    (n, cout) + t.out_hw)]

    return _chain(graph, node, t, limits, build, [wd],
                  f"{node.op.name} in tiles of one phase (its phases meet different numbers of taps)")


def phase_shuffle_reference(self, stride=(1, 1), crop=(0, 0), size=(1, 1), groups=1):
    """What phase_shuffle computes, in torch: the phases interleaved, then cropped."""
    n, c, qh, qw = self.shape
    sh, sw = stride
    cout_g = c // (sh * sw * groups)
    full = self.reshape(n, groups, sh, sw, cout_g, qh, qw).permute(0, 1, 4, 5, 2, 6, 3)
    full = full.reshape(n, groups * cout_g, qh * sh, qw * sw)
    return full[:, :, crop[0]:crop[0] + size[0], crop[1]:crop[1] + size[1]].contiguous()


def phase_conv_chain(graph: PlanGraph, node: Node, limits: Sequence[int]) -> list[Node] | None:
    """conv_transpose2d / conv_transpose1d `node` as the module docstring's phase conv2d and
    phase_shuffle, or None where it does not apply: a weight that is not a float constant, a
    window with a zero tap, or a piece that cannot run on the device."""
    t = transposed_conv(node)
    if t is None:
        return None
    dims = [plan_dim(t.in_hw[i], t.out_hw[i], t.kernel[i], t.stride[i], t.padding[i], t.dilation[i]) for i in range(2)]
    if None in dims or any(k < 0 for d in dims for row in d.taps for k in row):  # a zero tap: 0 x Inf (docstring)
        return None
    hp, wp = dims
    n, cin = t.x.shape[:2]
    cout, groups, phases = t.out.shape[1], t.groups, hp.stride * wp.stride
    w, b = t.weight, t.bias
    wd = graph.add_derived(f"{w.name}_phases", (cout * phases, cin // groups, hp.window, wp.window), w.dtype,
                           "conv_transpose_phase_weight", (w,), groups=groups, taps_h=hp.taps, taps_w=wp.taps)
    derived = [wd]
    bd = b
    if b is not None and phases > 1:
        bd = graph.add_derived(f"{b.name}_phases", (cout * phases,), b.dtype, "phase_bias", (b,), groups=groups,
                               phases=phases)
        derived.append(bd)

    def build(src, new):
        conv_args = [("input", src), ("weight", wd), ("bias", bd), ("stride", [1, 1]),
                     ("padding", [hp.padding, wp.padding]), ("dilation", [hp.dilation, wp.dilation]),
                     ("groups", groups)]
        nodes = [new("phases", "aten.conv2d.default", "conv2d", conv_args, (n, cout * phases, hp.rows, wp.rows))]
        if phases > 1 or hp.crop_lo or hp.crop_hi or wp.crop_lo or wp.crop_hi:
            nodes.append(new("shuffle", "texelflow.phase_shuffle.default", "phase_shuffle",
                             [("self", nodes[-1].outputs[0][1]), ("stride", [hp.stride, wp.stride]),
                              ("crop", [hp.crop_lo, wp.crop_lo]), ("size", list(t.out_hw)), ("groups", groups)],
                             (n, cout) + t.out_hw))
        return nodes

    how = "pointwise" if hp.window * wp.window == 1 else f"{hp.window}x{wp.window}"
    return _chain(graph, node, t, limits, build, derived,
                  f"{node.op.name} as a {how} stride-1 conv2d of {phases} phase(s) and phase_shuffle")


def _pair(v, one_d: bool, fill: int) -> tuple[int, int]:
    """A conv argument as (h, w) (prepack_conv.hw_pair); a 1-D conv's runs along H, its w is
    `fill` (1 for stride and dilation, 0 for padding)."""
    if v is None or (isinstance(v, (list, tuple)) and not v):
        v = fill
    h, w = hw_pair(v)
    return (h, fill) if one_d else (h, w)
