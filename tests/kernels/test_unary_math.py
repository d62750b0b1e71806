"""The transcendental unary ops (exp, exp2, tanh, erf, erfc, sigmoid, silu, gelu in both modes) of
shaders/include/math.glslh, on lavapipe, against torch.

Two kinds of check: accuracy over a dense range against a float64 reference (the bounds below are
what the branch-free formulas are built for, a few float32 ulps), and torch's float32 results on
awkward shapes (sizes 1, 3, 5, 7, packed dims not a multiple of 4) with NaN, +-Inf, +-0, huge and
subnormal inputs, in every representation of every float32 and float16 variant.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from texelflow.generated.ops import OPS
from texelflow.generated.variants import VARIANTS

from .nodecheck import (assert_matches, build_node, check_variant, combo_id, explicit_case, repr_combos,
                        run_nodes)

F = torch.nn.functional
SQRT_2_OVER_PI = 0.7978845608028654

# (op, its scalar arguments): the cases, gelu in both modes
CASES = [("exp", {}), ("tanh", {}), ("erf", {}), ("erfc", {}), ("sigmoid", {}), ("silu", {}),
         ("gelu", {"approximate": "none"}), ("gelu", {"approximate": "tanh"}),
         ("sinh", {}), ("cosh", {}), ("asinh", {}), ("acosh", {}), ("atanh", {}), ("tan", {}),
         ("atan", {}), ("asin", {}), ("acos", {}), ("exp2", {})]


def _reference64(name: str, args: dict, x: torch.Tensor) -> torch.Tensor:
    """The exact function in float64, written where torch's float64 forms cancel (1 + erf(-6) is
    below float64's ulp of 1): gelu by erfc, gelu's tanh form as x sigmoid(2u)."""
    if name == "gelu" and args["approximate"] == "none":
        return 0.5 * x * torch.special.erfc(-x / 2 ** 0.5)
    if name == "gelu":
        return x * torch.sigmoid(2 * SQRT_2_OVER_PI * (x + 0.044715 * x ** 3))
    return {"exp": torch.exp, "exp2": torch.exp2, "tanh": torch.tanh, "erf": torch.erf, "erfc": torch.special.erfc, "sigmoid": torch.sigmoid, "silu": F.silu,
            "sinh": torch.sinh, "cosh": torch.cosh, "asinh": torch.asinh, "acosh": torch.acosh, "atanh": torch.atanh,
            "tan": torch.tan, "atan": torch.atan, "asin": torch.asin, "acos": torch.acos}[name](x)


# Largest relative error against float64 where |result| is a float32 normal above 1e-6 and |x| is
# within `span` (exp: everywhere it is finite). exp is its own polynomial (tf_exp, Cody-Waite); the
# activations use the device's exp, whose argument rounding grows as |x| does, so they are held
# to |x| <= 20, past which they saturate. gelu's negative tail (|result| down to 1e-6 near x = -4.5)
# carries the rounding of x^2 / 2 in exp's argument; torch's own float32 gelu cancels there (1 + erf
# near 1e-5) and is off by about 1e-2.
ACCURACY = {"exp": (5e-7, 88.7), "tanh": (5e-7, 20.0), "erf": (5e-7, 20.0), "erfc": (8e-7, 20.0), "sigmoid": (2e-6, 20.0),
            "silu": (2e-6, 20.0), "gelu": (4e-6, 20.0)}
# erfc (measured 6.0e-7): the product of two of texelflow's exps, each within 3e-7 (tf_erfc).
# The hyperbolic functions and tan (measured 1.0e-6, 4.8e-7, 4.0e-7, 1.2e-7, 6.7e-7, 2.0e-7): sinh and
# cosh up to where they overflow, asinh and acosh far past their switch to log(x) + ln 2 at 2^28,
# atanh on its whole domain, tan with its arguments reduced exactly (tf_sin / tf_cos).
ACCURACY.update({"sinh": (2e-6, 89.4), "cosh": (1e-6, 89.4), "asinh": (1e-6, 1e30), "acosh": (5e-7, 1e30),
                 "atanh": (1.5e-6, 1.0), "tan": (1e-6, 1e4)})
# Cephes' reductions and polynomials for atan, asin and acos (measured 1.6e-7, 2.5e-7, 1.4e-7).
ACCURACY.update({"atan": (5e-7, 1e30), "asin": (5e-7, 1.0), "acos": (5e-7, 1.0)})
# exp2: exp's polynomial on an exact reduction (tf_exp2), everywhere it is finite.
ACCURACY.update({"exp2": (5e-7, 127.9)})


def _dense(span: float) -> np.ndarray:
    """A dense grid over [-span, span], magnitudes from 1e-37 up, and the points around the
    formulas' switch points (tanh 0.55, erf 0.5, gelu 0.5 sqrt 2)."""
    mags = np.logspace(-37, np.log10(span), 4001)
    switches = np.concatenate([np.linspace(s - 1e-3, s + 1e-3, 201) for s in (0.5, 0.55, 0.7071067811865476)])
    x = np.concatenate([np.linspace(-span, span, 120001), mags, -mags, switches, -switches])
    x = np.concatenate([x, np.zeros(-x.size % 512)])  # rows of 512: within a texture's extents
    return x.astype(np.float32).reshape(-1, 512)


def _run(device, vname: str, combo: dict, args: dict, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    op = OPS[VARIANTS[vname].op]
    case = explicit_case(op, {"self": tuple(x.shape), **args}, {"self": x}, f"{args}")
    node, arrays = build_node(op, VARIANTS[vname].dtype, case)
    [[out]] = run_nodes(device, [(node, arrays)], combo, VARIANTS[vname].dtype, expect_variant=vname)
    return out.got, case.want[0]


def _variants(name: str, dtype: str) -> list[tuple[str, dict]]:
    return [(v, combo) for v in OPS[name].variants if VARIANTS[v].dtype == dtype
            for combo in repr_combos(OPS[name], VARIANTS[v])]


ACCURACY_CASES = [(name, args, v, combo) for name, args in CASES
                  for v, combo in _variants(name, "float32")[:1] + _variants(name, "float32")[-1:]]


@pytest.mark.parametrize("name,args,vname,combo", ACCURACY_CASES,
                         ids=[f"{v}-{combo_id(OPS[n], c)}-{a.get('approximate', '')}" for n, a, v, c in ACCURACY_CASES])
def test_accuracy_against_float64(device, name, args, vname, combo):
    bound, span = ACCURACY[name]
    x = _dense(span)
    got, torch32 = _run(device, vname, combo, args, x)
    ref = _reference64(name, args, torch.from_numpy(x).double()).numpy()
    judged = (np.abs(ref) >= 1e-6) & (np.abs(ref) < 3.4e38)
    rel = np.abs(got.astype(np.float64) - ref)[judged] / np.abs(ref[judged])
    worst = int(np.argmax(rel))
    assert rel.max() <= bound, (f"{vname} {args}: relative error {rel.max():.3g} > {bound:g} at x = "
                                f"{x[judged][worst]!r} (got {got[judged][worst]!r}, exact {ref[judged][worst]!r})")
    # the small side: where the result is below 1e-6, an absolute error far below float32 ulps of 1
    tiny = np.abs(ref) < 1e-6
    err = np.abs(got[tiny] - ref[tiny])
    assert not tiny.any() or err.max() <= 1e-11, (  # (cosh has no such results)
        f"{vname} {args}: absolute error {err.max():.3g} at x = {x[tiny][np.argmax(err)]!r}")
    assert np.isfinite(got[np.isfinite(torch32)]).all(), f"{vname} {args}: non-finite where torch is finite"


SPECIALS = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e30, -1e30, 88.8, -88.8, 100.0, -100.0, 20.0, -20.0,
                     1e-40, -1e-40, 1e-20, -1e-20, 0.5, -0.5, 0.55, -0.55, 3.92, -3.92, 6.0, -9.0],
                    dtype=np.float32)
SHAPES = [(1,), (3,), (5, 7), (1, 3, 5, 7), (7, 5, 3), (2, 1, 3, 2, 5)]


def _awkward(shape, seed: int, dtype: str) -> np.ndarray:
    """Normal values times 4, with the specials spread over the tensor (torch's exact gelu gives NaN
    or +inf at +inf by the tensor's size: +inf is left out of its cases, see test_registry_ops)."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(int(np.prod(shape))) * 4).astype(np.float32)
    k = min(x.size, SPECIALS.size)
    x[rng.permutation(x.size)[:k]] = rng.permutation(SPECIALS)[:k]
    if dtype == "float16":  # float16 inputs are what a float16 tensor can hold (1e30: +-inf)
        with np.errstate(over="ignore"):
            x = x.astype(np.float16).astype(np.float32)
    return x.reshape(shape)


SHAPE_CASES = [(name, args, v, combo) for name, args in CASES for dtype in ("float32", "float16")
               for v, combo in _variants(name, dtype)]


@pytest.mark.parametrize("name,args,vname,combo", SHAPE_CASES,
                         ids=[f"{v}-{combo_id(OPS[n], c)}-{a.get('approximate', '')}" for n, a, v, c in SHAPE_CASES])
def test_awkward_shapes_and_specials(device, name, args, vname, combo):
    op, dtype = OPS[name], VARIANTS[vname].dtype
    cases = []
    for i, shape in enumerate(SHAPES):
        x = _awkward(shape, i, dtype)
        if name == "gelu" and args["approximate"] == "none":
            x[x == np.inf] = 1e30
        if name in ("sinh", "cosh"):  # torch's float32 sinh / cosh of 88.8 are inf in its vectorised
            x[np.abs(x) == np.float32(88.8)] = 100.0  # loop, finite (as these) in its scalar tail
        cases.append(explicit_case(op, {"self": shape, **args}, {"self": x}, f"{shape} {args}"))
    failures = check_variant(device, vname, combo, cases)
    assert not failures, "\n".join(msg for _, msg in failures[:3])


def test_exp2_of_integers_is_exact_down_to_subnormals(device):
    """2^k for every integer k from -149 (float32's smallest subnormal) to 128 (+inf), and the
    halves between them, as torch gives them: integers exactly, the rest within the accuracy bound."""
    ks = np.arange(-149, 129, dtype=np.float32)
    for x in (ks, ks + np.float32(0.5)):
        row = np.concatenate([x, np.zeros(-x.size % 4, np.float32)])[None]
        for vname, combo in _variants("exp2", "float32"):
            got, want = _run(device, vname, combo, {}, row)
            if x is ks:
                assert np.array_equal(got, want), (vname, got[got != want][:4], want[got != want][:4])
            else:
                ok = np.isclose(got, want, rtol=5e-7, atol=0) | (np.abs(want) < 1.2e-38)  # subnormals: 1 ulp is 1.4e-45
                assert ok.all(), (vname, x[~ok[0, :x.size]][:4])


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_limits_and_signed_zeros(device, approximate):
    """gelu's limits as torch's: -inf gives NaN (-inf times 0), +inf +inf in the tanh form, huge
    negatives -0.0, and -0.0 and subnormals keep their sign."""
    x = np.array([-np.inf, -1e30, -100.0, -0.0, 0.0, 1e-40, -1e-40, 1e30, np.nan]
                 + ([np.inf] if approximate == "tanh" else []), dtype=np.float32)
    [(vname, combo)] = _variants("gelu", "float32")[:1]
    got, want = _run(device, vname, combo, {"approximate": approximate}, x)
    assert_matches(got, want, "gelu", f"{vname} gelu({approximate}) on {x.tolist()}")
    assert np.isnan(got[0]) and np.isnan(got[-1] if approximate == "none" else got[-2])
    assert np.array_equal(np.signbit(got[1:5]), [True, True, True, False]), f"signs of {got[1:5]}"
    if approximate == "tanh":
        assert got[-1] == np.inf
