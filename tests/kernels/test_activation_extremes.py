"""Activations at the extremes: NaN, +-Inf, huge magnitudes, values where exp() overflows, signed
zeros, against torch, in every float32 variant and representation.

test_registry_ops injects NaN and +-Inf into uniform samples; these inputs add what it never
draws: -0.0 (whose sign torch keeps through relu, clamp, hardtanh, silu, ...), 1e30, +-88.8 and
+-100 (exp overflows float32), and a denormal. Values must match torch within the op's
tolerance (nodecheck.TOLERANCES), and a zero must have torch's sign (either sign where torch's
SIMD loop and its scalar tail disagree). A device that cannot preserve float32 subnormals (no
DenormPreserve for 32 bits, runtime/vulkan/float_controls.py: NVIDIA's) may instead give torch's
answer for the inputs with subnormals flushed to zero, its own subnormal outputs read as zeros.
"""
from __future__ import annotations

import numpy as np
import pytest

from texelflow.generated.ops import OPS
from texelflow.generated.variants import VARIANTS

from .nodecheck import (assert_matches, build_node, combo_id, explicit_case, flush_subnormals, repr_combos,
                        run_nodes, torch_reference)

INF = float("inf")
EXTREMES = np.array([np.nan, INF, -INF, -0.0, 0.0, 1e30, -1e30, 100.0, -100.0, 88.8, -88.8, 20.0, -20.0,
                     3.0, -3.0, 1e-3, -1e-3, 0.5, -0.5, 0.25, -0.49, 6.0, -6.0, 1e-40, -1e-40], dtype=np.float32)

# op -> scalar arguments of each case (torch's defaults when empty)
OPS_ARGS = {
    "silu": [{}],
    "hardsigmoid": [{}],
    "hardswish": [{}],
    "hardtanh": [{}, {"min_val": 0.0, "max_val": 6.0}],
    "relu6": [{}],
    "relu": [{}],
    "rsqrt": [{}],
    "reciprocal": [{}],
    "sigmoid": [{}],
    "tanh": [{}],
    "erf": [{}],
    "leaky_relu": [{}, {"negative_slope": 0.2}],
    "gelu": [{"approximate": "none"}, {"approximate": "tanh"}],
    "clamp": [{"min": 0.0, "max": 6.0}],
}
# torch's exact gelu gives NaN or +Inf at +Inf depending on the tensor's size (see test_registry_ops).
DROP = {("gelu", "none"): (INF,)}


def _inputs(op_name: str, args: dict) -> np.ndarray:
    x = EXTREMES
    for value in DROP.get((op_name, args.get("approximate")), ()):
        x = x[x != value]
    return x.copy()


CASES = [(vname, combo, i) for name, argsets in OPS_ARGS.items() for vname in OPS[name].variants
         if VARIANTS[vname].dtype == "float32" for combo in repr_combos(OPS[name], VARIANTS[vname])
         for i in range(len(argsets))]


@pytest.mark.parametrize("vname,combo,i", CASES,
                         ids=[f"{v}-{combo_id(OPS[VARIANTS[v].op], c)}-{i}" for v, c, i in CASES])
def test_activation_extremes(device, vname, combo, i):
    op = OPS[VARIANTS[vname].op]
    args = OPS_ARGS[op.name][i]
    x = _inputs(op.name, args)
    sample = {"self": tuple(x.shape), **args}
    case = explicit_case(op, sample, {"self": x}, f"extremes {args}")
    node, arrays = build_node(op, "float32", case)
    [[out]] = run_nodes(device, [(node, arrays)], combo, "float32", expect_variant=vname)
    want, got = case.want[0], out.got
    what = f"{vname} {combo_id(op, combo)} {args} on {x.tolist()}"
    try:
        assert_matches(got, want, op.name, what)
    except AssertionError:
        if ("DenormPreserve", 32) in device.limits.float_modes:
            raise
        x = flush_subnormals(x)
        want = explicit_case(op, sample, {"self": x}, f"extremes {args}, subnormals flushed").want[0]
        got = flush_subnormals(got)
        assert_matches(got, want, op.name, f"{what} (subnormals flushed: the device may flush them)")
    zeros = (want == 0) & (got == 0)
    alone = _torch_one_by_one(op, args, x)
    wrong_sign = zeros & (np.signbit(want) != np.signbit(got)) & (np.signbit(alone) != np.signbit(got))
    assert not wrong_sign.any(), (f"{what}: zero of the wrong sign at inputs {x[wrong_sign].tolist()} "
                                  f"(torch: {want[wrong_sign].tolist()})")


def _torch_one_by_one(op, args: dict, x: np.ndarray) -> np.ndarray:
    """torch's result for each element as a tensor of its own. torch's SIMD loop and its scalar
    tail can give a zero different signs (exact gelu at x <= -20: +0.0 in AVX2 lanes, -0.0 in the
    tail), so which one an element gets depends on its position and the CPU; a zero of either sign
    is then torch's answer."""
    return np.array([torch_reference(op, {"self": (1,), **args}, {"self": x[i:i + 1]})[0][0]
                     for i in range(len(x))], dtype=np.float32)
