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


PUSH_RULES: dict[str, Rule] = {}
CHECK_RULES: dict[str, Rule] = {}


def _rule(table: dict, name: str, type_: str | None, required=(), optional=()):
    def register(fn):
        table[name] = Rule(name, tuple(required), tuple(optional), type_, fn, (fn.__doc__ or "").strip())
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
    """The int argument `dim_unfolded` (a torch dim of tensor `of`) is a WHCN dim of its own: the
    tensor has rank <= 4, or the dim is one of its last 3 (WHCN's N folds all the others)."""
    rank = len(node.shape(p["of"]))
    dim = node.value(p["dim_unfolded"])
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
