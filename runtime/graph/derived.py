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
def reshaped(source, *, size: tuple):
    """The source with another shape, same elements (a conv1d weight [Cout, Cin/g, K] as the
    conv2d weight [Cout, Cin/g, K, 1])."""
    return source.reshape(size)


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
