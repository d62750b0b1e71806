"""Value ranges of integer tensors, so that int64 values computed in the graph run in int32.

torch computes integer arithmetic in int64: a cumsum or sum of int32 or bool, `ids.long() + 1`,
`mask.long()`. The device has no int64. Lowering records, for every integer or bool value it
lowers, the interval its elements lie in (`graph.int_ranges`), from:
- a bool: 0 .. 1 (comparisons, masks);
- a constant: its data's least and greatest element; a number beside a tensor: itself;
- a narrowed or int32 input: int32's whole range (the call checks int64 inputs fit int32; nothing
  more is known, so `ids + 1` may overflow and stays int64, on the CPU);
- a node of the rules below: from its inputs' intervals (interval arithmetic).
A node whose torch result is int64 runs on the device in int32 (`narrow_bounded`) when its op is
exact in int32 wherever the result fits (sums, differences and products of integers, negations,
magnitudes and clamps, integer divisions by a number, bitwise ops and right shifts, running sums
and sums, Python's remainder, choices and moves of values) and its interval lies inside int32:
every partial result of those ops lies inside the interval too, so no step wraps. The result is
held narrowed, as an int64 input is (narrowing.py): the host widens it where a CPU node reads it
or it is returned. RoBERTa's position ids (`cumsum(ids.ne(pad).int()) * mask + pad`) run so.
"""

from __future__ import annotations

import math

from .ir import Node, PlanGraph, Role, Value
from .narrowing import MOVE_OPS, MOVE_TEMPLATES, NARROWED_INPUT_DTYPES, NARROWED_RANGES

INT_DTYPES = frozenset({"int32", "int64", "int8", "uint8", "int16", "bool"})
FULL = {"int32": NARROWED_RANGES["int32"], "int8": (-128, 127), "uint8": (0, 255), "int16": (-2**15, 2**15 - 1),
        "bool": (0, 1)}


def value_range(graph: PlanGraph, v: Value, data=None) -> tuple[int, int] | None:
    """The interval of `v`'s elements, or None when nothing bounds it (an int64 the device never
    held). `data`: the constant's torch tensor, when the caller has it."""
    if v.dtype == "bool":
        return (0, 1)
    known = graph.int_ranges.get(v.name)
    if known is not None:
        return known
    if v.literal is not None and isinstance(v.literal, (int, float)):
        x = int(v.literal) if float(v.literal).is_integer() else None
        return None if x is None else (x, x)
    if data is not None and getattr(data, "numel", lambda: 0)() and not data.dtype.is_floating_point:
        return (int(data.min()), int(data.max()))
    return FULL.get(v.dtype)  # an int32 (or narrowed int64) value: its device dtype's range


def _number(x) -> int | None:
    """An integer argument (a Python int, or a float with an integer value), else None."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return int(x) if float(x).is_integer() else None


def _add(a, b):
    return (a[0] + b[0], a[1] + b[1])


def _scale(a, k: int):
    return (min(a[0] * k, a[1] * k), max(a[0] * k, a[1] * k))


def _mul(a, b):
    products = [x * y for x in a for y in b]
    return (min(products), max(products))


def _union(*rs):
    return (min(r[0] for r in rs), max(r[1] for r in rs))


def _sum_of(r, count: int):
    """Every partial sum of up to `count` elements of r (0 for none)."""
    return (min(0, r[0], r[0] * count), max(0, r[1], r[1] * count))


def _reduced_count(node: Node, src: Value) -> int:
    dims = node.arg("dim")
    if dims is None or dims == [] or src.shape == ():
        return max(src.numel, 1)
    dims = [dims] if isinstance(dims, int) else dims
    return math.prod(src.shape[d % len(src.shape)] for d in dims)


def node_range(graph: PlanGraph, node: Node, ranges: dict) -> tuple[int, int] | None:
    """The interval of `node`'s one integer output from its inputs' (`ranges`: arg name -> interval,
    a list for a tensor list), or None when no rule bounds it."""
    op = node.op
    if op is None:
        return None
    name = op.name
    r = ranges.get
    alpha = _number(node.arg("alpha", 1))
    if name in ("add", "sub", "rsub") and r("self") and r("other") and alpha is not None:
        a, b = (r("self"), r("other")) if name != "rsub" else (r("other"), r("self"))
        return _add(a, _scale(b, alpha if name == "add" else -alpha))
    scalar = _number(node.arg("other"))
    if name in ("add_scalar", "sub_scalar", "rsub_scalar") and r("self") and scalar is not None and alpha is not None:
        step = (scalar * alpha, scalar * alpha)
        if name == "add_scalar":
            return _add(r("self"), step)
        if name == "sub_scalar":
            return _add(r("self"), _scale(step, -1))
        return _add(step, _scale(r("self"), -1))
    if name == "mul" and r("self") and r("other"):
        return _mul(r("self"), r("other"))
    if name == "mul_scalar" and r("self") and scalar is not None:
        return _scale(r("self"), scalar)
    if name == "neg" and r("self"):
        return _scale(r("self"), -1)
    if name == "abs" and r("self"):
        lo, hi = r("self")
        return (0 if lo <= 0 <= hi else min(abs(lo), abs(hi)), max(abs(lo), abs(hi)))
    if name == "clamp" and r("self"):
        lo, hi = (_number(node.arg(k)) if node.arg(k) is not None else None for k in ("min", "max"))
        if (node.arg("min") is not None and lo is None) or (node.arg("max") is not None and hi is None):
            return None  # a fractional bound: torch computes in float
        a, b = r("self")
        a, b = (max(a, lo), max(b, lo)) if lo is not None else (a, b)
        return (min(a, hi), min(b, hi)) if hi is not None else (a, b)
    if name in ("bitwise_and", "bitwise_or", "bitwise_xor") and r("self") and r("other"):
        (a, b), (c, d) = r("self"), r("other")
        if name == "bitwise_and" and (a >= 0 or c >= 0):  # a mask that is not negative bounds it
            return (0, min(x for x, lo in ((b, a), (d, c)) if lo >= 0))
        bits = max(abs(v) for v in (a, b, c, d)).bit_length()  # two's complement of so many bits
        return (-(1 << bits) if min(a, c) < 0 else 0, (1 << bits) - 1)
    if name == "bitwise_right_shift" and r("self") and r("other") and r("other")[0] >= 0:
        a, b = r("self")
        return (min(a, 0), max(b, 0))
    if name == "div_mode_scalar" and r("self") and scalar:
        floor = node.arg("rounding_mode") == "floor"
        qs = [x // scalar if floor else int(x / scalar) for x in r("self")]
        return (min(qs), max(qs))
    if name == "remainder_scalar" and scalar:  # Python's remainder: the sign of the divisor
        return (0, scalar - 1) if scalar > 0 else (scalar + 1, 0)
    if name == "cumsum" and r("self"):
        src = node.arg("self")
        return _sum_of(r("self"), src.shape[node.arg("dim") % len(src.shape)] if src.shape else 1)
    if name == "sum" and r("self"):
        return _sum_of(r("self"), _reduced_count(node, node.arg("self")))
    if name == "arg_extreme":  # a position along dim, whatever the values
        src = node.arg("self")
        return (0, max(src.shape[node.arg("dim") % len(src.shape)] - 1, 0) if src.shape else 0)
    if name in ("where_scalar_other", "where_scalar_self"):
        kept = r("self") if name == "where_scalar_other" else r("other")
        number = _number(node.arg("other" if name == "where_scalar_other" else "self"))
        return _union(kept, (number, number)) if kept and number is not None else None
    if name in MOVE_OPS or op.is_identity or op.template in MOVE_TEMPLATES:
        moved = [x for k, x in ranges.items() if name not in MOVE_OPS or k in MOVE_OPS[name]]
        flat = [y for x in moved for y in (x if isinstance(x, list) else [x])]
        return _union(*flat) if flat and all(flat) else None
    return None


# Ops exact in int32 wherever their result (and so, for these, every partial result) fits int32.
EXACT_IN_INT32 = frozenset({"add", "sub", "rsub", "add_scalar", "sub_scalar", "rsub_scalar", "mul", "mul_scalar",
                            "neg", "abs", "clamp", "div_mode_scalar", "remainder_scalar", "bitwise_and",
                            "bitwise_or", "bitwise_xor", "bitwise_right_shift", "cumsum", "sum", "where_scalar_other",
                            "where_scalar_self"}) | frozenset(MOVE_OPS)


def record(graph: PlanGraph, node: Node, constant_data) -> None:
    """Record the interval of `node`'s integer output (a device node, before `narrow_bounded`) in
    `graph.int_ranges`. `constant_data(v)`: a constant's torch tensor or None."""
    if len(node.outputs) != 1 or node.outputs[0][1].dtype not in INT_DTYPES or node.outputs[0][1].dtype == "bool":
        return
    ranges: dict = {}
    for k, v in node.args:
        if isinstance(v, Value):
            ranges[k] = _range_of(graph, v, constant_data)
        elif isinstance(v, (list, tuple)) and v and all(isinstance(x, Value) for x in v):
            ranges[k] = [_range_of(graph, x, constant_data) for x in v]
    got = node_range(graph, node, ranges)
    if got is not None:
        graph.int_ranges[node.outputs[0][1].name] = got


def _range_of(graph: PlanGraph, v: Value, constant_data):
    if v.name in graph.int_ranges or v.dtype == "bool" or v.literal is not None:
        return value_range(graph, v)
    return value_range(graph, v, constant_data(v) if v.role is Role.CONST else None)


def narrow_bounded(graph: PlanGraph, node: Node) -> bool:
    """Run `node`, whose torch result is int64, in int32 where its recorded interval fits int32 and
    its op is exact there (EXACT_IN_INT32), every tensor it reads held in int32 or bool on the
    device: its output is held narrowed (the host's dtype int64). An int64 number beside it
    (`+ padding_idx`, lowered as a one-element literal) becomes int32. True when it did."""
    out = node.outputs[0][1] if len(node.outputs) == 1 else None
    if out is None or node.op is None or node.op.name not in EXACT_IN_INT32:
        return False
    narrow = NARROWED_INPUT_DTYPES.get(out.dtype)
    bounds = graph.int_ranges.get(out.name)
    if narrow is None or bounds is None or not (FULL[narrow][0] <= bounds[0] and bounds[1] <= FULL[narrow][1]):
        return False
    read = [v for _, v in node.tensor_args()]
    literals = [v for v in read if v.dtype == out.dtype and v.literal is not None]
    if any(v.dtype not in (narrow, "bool") for v in read if v not in literals):
        return False
    for v in literals:
        v.dtype = narrow
    graph.input_host_dtypes[out.name] = out.dtype
    out.dtype = narrow
    return True


def unbounded_note(graph: PlanGraph, node: Node) -> str | None:
    """Why `node`, an int64 computation of an op exact in int32, still runs on the CPU: its
    interval is not inside int32 (an int64 input's values are known only to fit int32)."""
    out = node.outputs[0][1] if len(node.outputs) == 1 else None
    if out is None or node.op is None or node.op.name not in EXACT_IN_INT32 or out.dtype not in NARROWED_INPUT_DTYPES:
        return None
    bounds = graph.int_ranges.get(out.name)
    if bounds is None:
        return (f"the device computes {out.dtype} in int32 only where lowering bounds the values, "
                "and nothing bounds these")
    narrow = NARROWED_INPUT_DTYPES[out.dtype]
    if FULL[narrow][0] <= bounds[0] and bounds[1] <= FULL[narrow][1]:
        wide = next((v for _, v in node.tensor_args() if v.dtype not in (narrow, "bool") and v.literal is None), None)
        if wide is not None:  # the values fit, but an operand is an int64 the device does not hold
            return (f"the device computes {out.dtype} in int32 only from tensors it holds in int32, and "
                    f"'{wide.name}' is {wide.dtype} (a buffer or a value no rule narrows)")
    return (f"the device computes {out.dtype} in int32 only where lowering bounds the values: these lie in "
            f"{bounds[0]} .. {bounds[1]}, past int32")
