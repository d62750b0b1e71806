"""Weight prepack recipes of the specialised convolution kernels, and their torch references.

The fusion pass (fusion.py, step 6) gives a conv it takes to conv2d_pw, conv2d_wino, conv2d_gemm
or conv2d_dw{3,5}_s1 a derived weight (derived.py's recipe mechanism): torch's [Cout, Cin, KH, KW]
rearranged once, at load, into the order the kernel reads (a WIDTH_PACKED texture: one texel load
feeds 4 output channels), so that no kernel pays for index math or a transform per call. Each
recipe gets float64 sources; the program rounds the result to float32 (Winograd's transform is
thus exact up to that one rounding).
"""

from __future__ import annotations

from .derived import recipe


def padded4(n: int) -> int:
    """n rounded up to a whole number of texels (4 channels)."""
    return -(-n // 4) * 4


def hw_pair(v) -> tuple[int, int]:
    """A conv's int[2] argument (padding, stride, kernel_size) as (h, w): one number, alone or in a
    list, means both."""
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return (int(v[0]), int(v[-1]))


@recipe
def pointwise_conv_weight(source):
    """A 1x1 conv weight [Cout, Cin, 1, 1] as conv2d_pw's [Cin4 * 4, Cout4 * 4]: row ci holds input
    channel ci's weights for every output channel; padded rows and columns are zero."""
    import torch.nn.functional as F

    cout, cin = source.shape[:2]
    w = source.reshape(cout, cin).t()
    return F.pad(w, (0, padded4(cout) - cout, 0, padded4(cin) - cin)).contiguous()


@recipe
def conv_gemm_weight(source):
    """A dense conv weight [Cout, Cin, KH, KW] as conv2d_gemm's [KH * KW, Cin4 * 4, Cout4 * 4]:
    plane KW ky + kx, row ci holds that tap's weights of input channel ci for every output
    channel; padded rows and columns are zero."""
    import torch.nn.functional as F

    cout, cin, kh, kw = source.shape
    w = source.permute(2, 3, 1, 0).reshape(kh * kw, cin, cout)
    return F.pad(w, (0, padded4(cout) - cout, 0, padded4(cin) - cin)).contiguous()


@recipe
def depthwise_conv_weight(source):
    """A depthwise conv weight [C, 1, KH, KW] as conv2d_dw{K}_s1's [KH * KW, C4 * 4]: row
    KW ky + kx holds that tap's weight for every channel; padded columns are zero."""
    import torch.nn.functional as F

    c, _, kh, kw = source.shape
    return F.pad(source.reshape(c, kh * kw).t(), (0, padded4(c) - c)).contiguous()


@recipe
def conv_im2col_weight_kn(source):
    """A dense conv weight [Cout, Cin, KH, KW] as the GEMM weight of its im2col form (the fusion
    pass's im2col kernel: conv_im2col, then linear_packed): flattened to [Cout, K] in conv_im2col's
    order of k, (ky, kx, ci), then as linear_packed's [K4 * 4, N16 * 16]
    (prepack_matmul.linear_weight_kn)."""
    from .prepack_matmul import linear_weight_kn

    return linear_weight_kn(source.permute(0, 2, 3, 1).reshape(source.shape[0], -1))


# Winograd F(2x2, 3x3) (Lavin & Gray): Y = A^T [(G g G^T) (.) (B^T d B)] A
WINO_G = ((1.0, 0.0, 0.0), (0.5, 0.5, 0.5), (0.5, -0.5, 0.5), (0.0, 0.0, 1.0))
WINO_BT = ((1.0, 0.0, -1.0, 0.0), (0.0, 1.0, 1.0, 0.0), (0.0, -1.0, 1.0, 0.0), (0.0, 1.0, 0.0, -1.0))
WINO_AT = ((1.0, 1.0, 1.0, 0.0), (0.0, 1.0, -1.0, -1.0))


@recipe
def winograd_f2_weight(source):
    """A 3x3 conv weight [Cout, Cin, 3, 3] transformed to G g G^T and laid out as conv2d_wino's
    [Cout4, Cin4, 256]: row (blk, b) holds output channels 4 blk .. 4 blk + 3 against input channels
    4 b .. 4 b + 3, element 16 p + 4 q + l = U[p][4 b + q][4 blk + l] for position p = 4 row +
    column of the 4x4 transform. One step of the kernel's loop over input blocks reads its 64
    texels side by side (one 1 KiB row), where the earlier [16, Cin4 * 4, Cout4 * 4] scattered them
    over 16 planes: ResNet-18's 512-channel layers ran at 0.7x the FLOP rate of its 64-channel ones.
    Padded channels are zero. Computed in float64, rounded to float32 once."""
    import torch
    import torch.nn.functional as F

    cout, cin = source.shape[:2]
    g = torch.tensor(WINO_G, dtype=source.dtype)
    u = g @ source @ g.t()  # [Cout, Cin, 4, 4]
    u = F.pad(u.reshape(cout, cin, 16), (0, 0, 0, padded4(cin) - cin, 0, padded4(cout) - cout))
    u = u.reshape(padded4(cout) // 4, 4, padded4(cin) // 4, 4, 16)  # [blk, l, b, q, p]
    return u.permute(0, 2, 4, 3, 1).reshape(padded4(cout) // 4, padded4(cin) // 4, 256).contiguous()


# Winograd F(4x4, 3x3) (Lavin & Gray's points 0, +-1, +-2): the same formula on 6x6 windows
WINO4_G = ((1 / 4, 0.0, 0.0), (-1 / 6, -1 / 6, -1 / 6), (-1 / 6, 1 / 6, -1 / 6), (1 / 24, 1 / 12, 1 / 6),
           (1 / 24, -1 / 12, 1 / 6), (0.0, 0.0, 1.0))
WINO4_BT = ((4.0, 0.0, -5.0, 0.0, 1.0, 0.0), (0.0, -4.0, -4.0, 1.0, 1.0, 0.0), (0.0, 4.0, -4.0, -1.0, 1.0, 0.0),
            (0.0, -2.0, -1.0, 2.0, 1.0, 0.0), (0.0, 2.0, -1.0, -2.0, 1.0, 0.0), (0.0, 4.0, 0.0, -5.0, 0.0, 1.0))
WINO4_AT = ((1.0, 1.0, 1.0, 1.0, 1.0, 0.0), (0.0, 1.0, -1.0, 2.0, -2.0, 0.0), (0.0, 1.0, 1.0, 4.0, 4.0, 0.0),
            (0.0, 1.0, -1.0, 8.0, -8.0, 1.0))


@recipe
def winograd_f4_weight(source):
    """A 3x3 conv weight [Cout, Cin, 3, 3] transformed to U = G g G^T of F(4x4, 3x3), as the batched
    linear_packed weight [36, Cin4 * 4, Cout16 * 16] of the fusion pass's Winograd F(4x4) form
    (conv2d_wino4_input, linear_packed, conv2d_wino4_output): matrix p = 6 i + j is position
    (i, j)'s [Cout, Cin] in linear_weight_kn's layout. Computed in float64, rounded to float32 once."""
    import torch

    from .prepack_matmul import linear_weight_kn

    cout, cin = source.shape[:2]
    g = torch.tensor(WINO4_G, dtype=source.dtype)
    u = (g @ source @ g.t()).reshape(cout, cin, 36)
    return torch.stack([linear_weight_kn(u[:, :, p]) for p in range(36)]).contiguous()


def wino4_tiles(h: int, w: int, padding) -> tuple[int, int, int, int]:
    """(OH, OW, tile rows, tile columns) of a 3x3 stride-1 conv over an h x w input with `padding`
    (pad_h, pad_w), in F(4x4, 3x3)'s 4x4 output tiles."""
    ph, pw = hw_pair(padding)
    oh, ow = h + 2 * ph - 2, w + 2 * pw - 2
    return oh, ow, -(-oh // 4), -(-ow // 4)


def winograd_f2_planes(packed):
    """conv2d_wino's prepacked weight [Cout4, Cin4, 256] as U [16, Cin4 * 4, Cout4 * 4] (plane p =
    4 row + column of the transform, row ci, column co): the layout the references read."""
    cout4, cin4 = packed.shape[:2]
    u = packed.reshape(cout4, cin4, 16, 4, 4)  # [blk, b, p, q, l]
    return u.permute(2, 1, 3, 0, 4).reshape(16, 4 * cin4, 4 * cout4)


# ---- torch references (the kernel tests' and the generic registry test's) ---------------------------
def conv2d_pw_reference(input, weight, bias=None, out_channels=1, activation="none", act_min=0.0, act_max=0.0,
                        **round_trip):
    """What conv2d_pw / conv2d_pw_act compute: the 1x1 convolution whose weight is the prepacked
    [Cin4 * 4, Cout4 * 4] one's first Cin rows and `out_channels` columns, then the activation,
    then a folded round trip (rt_scale, rt_zero_point, rt_min, rt_max: fusion.round_trip_reference)."""
    from .fusion import conv2d_act_reference, round_trip_reference

    cin = input.shape[1]
    w = weight[:cin, :out_channels].t().reshape(out_channels, cin, 1, 1)
    return round_trip_reference(conv2d_act_reference(input, w, bias, activation=activation, act_min=act_min,
                                                     act_max=act_max), **round_trip)


def conv2d_pw_scaled_reference(input, in_scale, weight, bias=None, out_channels=1):
    """What conv2d_pw_scaled computes: conv2d_pw_reference of input * in_scale (a squeeze-excite
    gate [N or 1, Cin, 1, 1]), the product rounded as torch's mul rounds it."""
    return conv2d_pw_reference(input * in_scale, weight, bias, out_channels)


def conv2d_gemm_reference(input, weight, bias=None, kernel_size=(1, 1), stride=(1, 1), padding=(0, 0), dilation=(1, 1),
                          out_channels=1, activation="none", act_min=0.0, act_max=0.0):
    """What conv2d_gemm computes: the convolution whose weight is the prepacked
    [KH * KW, Cin4 * 4, Cout4 * 4] one's first Cin rows and `out_channels` columns."""
    from .fusion import conv2d_act_reference

    cin = input.shape[1]
    kh, kw = hw_pair(kernel_size)
    w = weight[:, :cin, :out_channels].reshape(kh, kw, cin, out_channels).permute(3, 2, 0, 1)
    return conv2d_act_reference(input, w, bias, tuple(stride), tuple(padding), tuple(dilation), 1, activation,
                                act_min, act_max)


def conv_im2col_reference(input, kernel_size=(1, 1), stride=(1, 1), padding=(0, 0), dilation=(1, 1)):
    """What conv_im2col computes: torch's unfold (zeros outside the input) as [N, OH, OW, K], k in
    (ky, kx, ci) order."""
    import torch.nn.functional as F

    n, cin, h, w = input.shape
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = (tuple(kernel_size), tuple(stride), tuple(padding), tuple(dilation))
    oh, ow = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    cols = F.unfold(input, (kh, kw), dilation=(dh, dw), padding=(ph, pw), stride=(sh, sw))  # [N, Cin KH KW, L]
    cols = cols.reshape(n, cin, kh * kw, oh, ow).transpose(1, 2)
    return cols.reshape(n, -1, oh, ow).permute(0, 2, 3, 1).contiguous()


def conv2d_dw_s1_reference(input, weight, bias=None, padding=(0, 0), activation="none", act_min=0.0,
                           act_max=0.0, **round_trip):
    """What conv2d_dw3_s1 / _dw5_s1 / _dw7_s1 compute: the stride-1 K x K depthwise convolution whose
    weight is the prepacked [K * K, C4 * 4] one's first C columns, then the activation, then a
    folded round trip (fusion.round_trip_reference)."""
    return _depthwise_reference(input, weight, bias, 1, padding, activation, act_min, act_max, round_trip)


def conv2d_dw_s1_nhwc_reference(input, weight, bias=None, padding=(0, 0), activation="none", act_min=0.0,
                                act_max=0.0, **round_trip):
    """What conv2d_dw3_s1_nhwc / _dw5_s1_nhwc / _dw7_s1_nhwc compute: conv2d_dw_s1_reference on
    [N, H, W, C] in and out."""
    out = _depthwise_reference(input.permute(0, 3, 1, 2), weight, bias, 1, padding, activation, act_min, act_max,
                               round_trip)
    return out.permute(0, 2, 3, 1).contiguous()


def conv2d_dw_s2_reference(input, weight, bias=None, padding=(0, 0), activation="none", act_min=0.0,
                           act_max=0.0, **round_trip):
    """What conv2d_dw3_s2 / _dw5_s2 compute: as conv2d_dw_s1_reference, at stride 2."""
    return _depthwise_reference(input, weight, bias, 2, padding, activation, act_min, act_max, round_trip)


def _depthwise_reference(input, weight, bias, stride: int, padding, activation, act_min, act_max, round_trip):
    from .fusion import conv2d_act_reference, round_trip_reference

    c, k = input.shape[1], round(weight.shape[0] ** 0.5)
    w = weight[:, :c].t().reshape(c, 1, k, k)
    return round_trip_reference(conv2d_act_reference(input, w, bias, stride=(stride, stride), padding=tuple(padding),
                                                     groups=c, activation=activation, act_min=act_min,
                                                     act_max=act_max), **round_trip)


def _bias_activation(y, bias, activation, act_min, act_max):
    """y [N, C, H, W] plus bias (None: none), then the activation: the end of the Winograd
    references, in y's dtype."""
    import torch

    from .fusion import conv2d_act_reference

    if bias is not None:
        y = y + bias.to(y.dtype).reshape(1, -1, 1, 1)
    ident = torch.ones(y.shape[1], 1, 1, 1, dtype=y.dtype)
    return conv2d_act_reference(y, ident, None, groups=y.shape[1], activation=activation, act_min=act_min,
                                act_max=act_max)


def conv2d_wino4_input_reference(input, padding=(0, 0)):
    """What conv2d_wino4_input computes: B^T d B of every 6x6 window (F(4x4, 3x3)) as [36, T, Cin],
    tiles numbered row-major per image, in float64."""
    import torch
    import torch.nn.functional as F

    x = input.double()
    n, cin, h, w = x.shape
    ph, pw = hw_pair(padding)
    _, _, th, tw = wino4_tiles(h, w, padding)
    x = F.pad(x, (pw, 4 * tw + 2 - w - pw, ph, 4 * th + 2 - h - ph))
    d = x.unfold(2, 6, 4).unfold(3, 6, 4)  # [N, Cin, th, tw, 6, 6]
    bt = torch.tensor(WINO4_BT, dtype=x.dtype)
    v = bt @ d @ bt.t()
    return v.permute(4, 5, 0, 2, 3, 1).reshape(36, n * th * tw, cin).to(input.dtype)


def conv2d_wino4_output_reference(m, input, weight, bias=None, padding=(0, 0), out_channels=1, activation="none",
                                  act_min=0.0, act_max=0.0):
    """What conv2d_wino4_output computes: A^T m A per tile and output channel (m [36, T, Cout] in
    conv2d_wino4_input's tile order; rows past the last tile ignored) plus bias, then the
    activation; an output whose tile sums to NaN is the direct convolution of `input` by the
    weight that `weight` (conv_gemm_weight's [9, Cin4 * 4, Cout4 * 4]) holds. In float64."""
    import torch

    n, _, h, w = input.shape
    oh, ow, th, tw = wino4_tiles(h, w, padding)
    at = torch.tensor(WINO4_AT, dtype=torch.float64)
    mm = m.double()[:, :n * th * tw, :out_channels].reshape(6, 6, n, th, tw, out_channels).permute(2, 5, 3, 4, 0, 1)
    y = at @ mm @ at.t()  # [N, Cout, th, tw, 4, 4]
    nan_tile = torch.isnan((y + (0.0 if bias is None else bias.double().reshape(1, -1, 1, 1, 1, 1))).sum((-1, -2)))
    y = y.permute(0, 1, 2, 4, 3, 5).reshape(n, out_channels, 4 * th, 4 * tw)[:, :, :oh, :ow]
    direct = conv2d_gemm_reference(input.double(), weight.double(), None, (3, 3), (1, 1), hw_pair(padding), (1, 1),
                                   out_channels)
    redo = nan_tile.repeat_interleave(4, 2).repeat_interleave(4, 3)[:, :, :oh, :ow]
    y = torch.where(redo, direct, y)
    return _bias_activation(y, bias, activation, act_min, act_max).to(input.dtype)


def conv2d_wino_reference(input, weight, bias=None, padding=(0, 0), out_channels=1, activation="none", act_min=0.0,
                          act_max=0.0, **round_trip):
    """What conv2d_wino computes, for any prepacked weight [Cout4, Cin4, 256] (U, see
    winograd_f2_weight; the generic test draws it at random, so this is Winograd's formula, not
    F.conv2d): per 2x2 output tile, A^T [sum_ci (B^T d B) (.) U] A, plus bias, then the activation,
    in float64; then a folded round trip (fusion.round_trip_reference) on the result in input's dtype."""
    import torch
    import torch.nn.functional as F

    x = input.double()
    n, cin, h, w = x.shape
    ph, pw = hw_pair(padding)
    oh, ow = h + 2 * ph - 2, w + 2 * pw - 2
    th, tw = -(-oh // 2), -(-ow // 2)
    # the input from (-ph, -pw), zero-padded to the 2 t + 2 rows and columns the tiles read
    x = F.pad(x, (pw, 2 * tw + 2 - w - pw, ph, 2 * th + 2 - h - ph))
    d = x.unfold(2, 4, 2).unfold(3, 4, 2)  # [N, Cin, th, tw, 4, 4]
    bt, at = torch.tensor(WINO_BT, dtype=x.dtype), torch.tensor(WINO_AT, dtype=x.dtype)
    v = bt @ d @ bt.t()
    u = winograd_f2_planes(weight.double())[:, :cin, :out_channels].reshape(4, 4, cin, out_channels)
    m = torch.einsum("ncyxab,abco->noyxab", v, u)
    y = at @ m @ at.t()  # [N, Cout, th, tw, 2, 2]
    y = y.permute(0, 1, 2, 4, 3, 5).reshape(n, out_channels, 2 * th, 2 * tw)[:, :, :oh, :ow]
    from .fusion import round_trip_reference  # (a folded round trip: on the float32 result, as the kernel)

    return round_trip_reference(_bias_activation(y, bias, activation, act_min, act_max).to(input.dtype), **round_trip)
