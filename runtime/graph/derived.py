"""Recipes for derived constants: constants the program computes at load from other constants.

The fusion pass (fusion.py) folds, say, an inference batch norm into the conv before it by giving
the conv a new weight and bias, each a CONST Value whose `derive` names a recipe here and its
source constants. Nothing is computed at planning time and the user's model is never modified:
the program evaluates the recipe from the exported program's state when it prepacks.

A recipe takes its sources as float64 torch tensors (None for an absent optional source) and its
params as keywords, and returns the derived tensor; `evaluate` rounds it to the value's dtype.
"""

from __future__ import annotations

from typing import Callable

from .ir import Value

RECIPES: dict[str, Callable] = {}


def recipe(fn: Callable) -> Callable:
    RECIPES[fn.__name__] = fn
    return fn


def _bn_scale(bn_weight, running_var, eps: float):
    """gamma / sqrt(var + eps) per channel: the factor batch norm multiplies a channel by."""
    import torch

    scale = 1.0 / torch.sqrt(running_var + eps)
    return scale * bn_weight if bn_weight is not None else scale


@recipe
def bn_folded_conv_weight(weight, bn_weight, running_var, *, eps: float):
    """w' = w * gamma / sqrt(var + eps), per output channel (dim 0 of the conv weight)."""
    scale = _bn_scale(bn_weight, running_var, eps)
    return weight * scale.reshape((-1,) + (1,) * (weight.dim() - 1))


@recipe
def bn_folded_conv_bias(bias, bn_weight, bn_bias, running_mean, running_var, *, eps: float):
    """b' = (b - mean) * gamma / sqrt(var + eps) + beta (b = 0 when the conv has no bias)."""
    scale = _bn_scale(bn_weight, running_var, eps)
    out = (bias - running_mean if bias is not None else -running_mean) * scale
    return out + bn_bias if bn_bias is not None else out


@recipe
def bn_scale(bn_weight, running_var, *, eps: float, size: tuple):
    """An inference batch norm's per-channel factor gamma / sqrt(var + eps), computed in float32
    as torch's kernel does, shaped `size` ([C, 1, ..]: it broadcasts along dim 1 of the input)."""
    import torch

    scale = _bn_scale(None if bn_weight is None else bn_weight.to(torch.float32), running_var.to(torch.float32), eps)
    return scale.to(torch.float64).reshape(size)


@recipe
def bn_shift(bn_bias, bn_weight, running_mean, running_var, *, eps: float, size: tuple):
    """An inference batch norm's per-channel term beta - mean * scale (scale as bn_scale), in
    float32, shaped `size`."""
    import torch

    f32 = torch.float32
    scale = _bn_scale(None if bn_weight is None else bn_weight.to(f32), running_var.to(f32), eps)
    shift = -(running_mean.to(f32) * scale) if bn_bias is None else bn_bias.to(f32) - running_mean.to(f32) * scale
    return shift.to(torch.float64).reshape(size)


@recipe
def column_scaled_weight(weight, scale):
    """A linear weight [N, K] with row n (output column n) times scale[n] (scale of N elements,
    or one for every row): the mul by a constant after the linear, folded into it."""
    return weight * scale.reshape(-1, 1)


@recipe
def column_scaled_bias(bias, scale, *, n: int):
    """The linear's bias [N] times the same scale."""
    return (bias * scale.reshape(-1)).reshape(n)


@recipe
def reshaped(source, *, size: tuple):
    """The source with another shape, same elements (a conv1d weight [Cout, Cin/g, K] as the
    conv2d weight [Cout, Cin/g, K, 1])."""
    return source.reshape(size)


@recipe
def nhwc_conv_weight(source):
    """A conv weight [Cout, Cin, KH, KW] as conv2d_nhwc's [KH, KW, Cin, Cout4]: channels fastest,
    padded with zeros to a multiple of 4 (one aligned vec4 per 4 output channels)."""
    import torch.nn.functional as F

    return F.pad(source.permute(2, 3, 1, 0), (0, -source.shape[0] % 4)).contiguous()


@recipe
def permuted(source, *, rank_shape: tuple, dims: tuple):
    """The source broadcast-padded to `rank_shape` and permuted by `dims` (a [W, C] constant added
    to an NHWC tensor as the [1, C, 1, W] one the op reads once it computes in NCHW order:
    runtime/graph/permutes/regions.py)."""
    return source.reshape(rank_shape).permute(dims)


# ---- quantized weights (runtime/graph/quantized.py) -------------------------------------------------
# PT2E freezes weights as int8 constants with their scales and zero points; lowering makes the float
# weight a float op reads from them, and the q8ta fusion the int8 operands its ops take. The float64
# product of an integer and a float32 scale is exact, so rounding it to float32 gives torch's bits.
def _along(t, axis: int, dim: int):
    """A per-channel vector shaped to broadcast along `axis` of a `dim`-d tensor."""
    shape = [1] * dim
    shape[axis] = -1
    return t.reshape(shape)


def _as_float32(x: float) -> float:
    import torch

    return float(torch.tensor(x, dtype=torch.float32))


@recipe
def dequantized_per_channel(weight, scales, zero_points, *, axis: int, float_zero_points: bool = False):
    """(w - zero_points[c]) * scales[c] along `axis` (zero points 0 when absent). Integer zero
    points, or float ones (`float_zero_points`: per_channel_affine_float_qparams), as torch does."""
    zp = _along(zero_points, axis, weight.dim()) if zero_points is not None else 0.0
    return (weight - zp) * _along(scales, axis, weight.dim())


@recipe
def dequantized_per_tensor(weight, *, scale: float, zero_point: int):
    """(w - zero_point) * scale, the scale rounded to float32 as torch's float32 multiply does."""
    return (weight - zero_point) * _as_float32(scale)


@recipe
def quantized_per_channel(weight, scales, zero_points, *, axis: int, quant_min: int, quant_max: int,
                          scale_dtype: str = "float32"):
    """torchao's quantize_per_channel of a float weight: clamp(round(w * (1 / s[c])) + zp[c]), with
    1 / s computed in the scales' own dtype and the product in float32 (for float32 scales)."""
    import torch

    inv = 1.0 / scales.to(getattr(torch, scale_dtype))
    scaled = weight.to(torch.float32) * _along(inv, axis, weight.dim())
    zp = _along(zero_points, axis, weight.dim()) if zero_points is not None else 0.0
    return torch.clamp(torch.round(scaled).double() + zp, quant_min, quant_max)


@recipe
def quantized_per_tensor(weight, *, scale: float, zero_point: int, quant_min: int, quant_max: int):
    """torchao's quantize_per_tensor of a float weight: clamp(round(w * float32(1 / scale)) + zp)."""
    import torch

    scaled = weight.to(torch.float32) * _as_float32(1.0 / scale)
    return torch.clamp(torch.round(scaled).double() + zero_point, quant_min, quant_max)


@recipe
def filled(*, value: float, size: tuple):
    """A tensor of `size` holding `value` everywhere (a per-tensor weight scale for every channel)."""
    import torch

    return torch.full(tuple(size), float(value), dtype=torch.float64)


@recipe
def shifted(source, *, by: int):
    """source + by (uint8 weights and zero points as int8: by = -128)."""
    return source + by


@recipe
def transposed(source):
    """A 2-D source transposed (an mm weight [K, N] as the [N, K] weight q8ta_linear takes)."""
    return source.t()


def evaluate(v: Value, fetch: Callable):
    """The torch tensor of derived constant `v`; `fetch(source)` gives a plain constant's tensor
    (derived sources are evaluated recursively)."""
    import torch

    d = v.derive
    if d.recipe not in RECIPES:
        raise ValueError(f"constant '{v.name}' is derived by the unknown recipe '{d.recipe}'")
    sources = []
    for s in d.sources:
        if s is None:
            sources.append(None)
            continue
        t = evaluate(s, fetch) if s.derive is not None else fetch(s)
        sources.append(torch.as_tensor(t).detach().to(torch.float64))
    out = RECIPES[d.recipe](*sources, **dict(d.params))
    out = out.to(getattr(torch, v.dtype)).contiguous()
    if tuple(out.shape) != tuple(v.shape):
        raise ValueError(f"derived constant '{v.name}' ({d.describe()}) came out with shape "
                         f"{list(out.shape)}, not {list(v.shape)}")
    return out


from . import prepack_conv  # noqa: E402,F401  registers the specialised convs' prepack recipes
from . import prepack_matmul  # noqa: E402,F401  registers linear_packed's prepack recipe
