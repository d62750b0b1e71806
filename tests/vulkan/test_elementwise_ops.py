"""Every generated variant of the binary and unary elementwise ops against PyTorch eager.

Awkward shapes (sizes 1, 3, 5, 7, channels not a multiple of 4, ranks 0-4 and one rank-5 buffer
case), broadcasting for binary ops, in every representation the op's repset allows. Inputs and
output share one representation (the sync group), as the planner guarantees. Outputs are also
checked raw: padding lanes of textures must stay zero whatever OP(0) is.
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch

from texelflow.generated.layouts import Storage
from texelflow.generated.variants import VARIANTS
from texelflow.runtime.vulkan.pipeline import find_variant

from .opcheck import DISPATCHED, FLOAT_REPRS, STORAGE_AXIS, Case, check_padding, repr_id, run_cases

FLT_MAX = 3.4028234663852886e38
BINARY_OPS = ("add", "sub", "mul", "div", "pow", "minimum", "maximum")
UNARY_OPS = ("abs", "clamp", "exp", "gelu", "hardswish", "neg", "relu", "sigmoid", "sqrt", "tanh")

# (self shape, other shape): same shapes (the fast path), broadcasting both ways, 0-d operands.
BINARY_SHAPES = [
    ((2, 3, 5, 7), (2, 3, 5, 7)),
    ((7,), (7,)),
    ((3, 1, 7), (5, 1)),
    ((5, 1), (3, 1, 7)),
    ((1, 3, 1, 5), (2, 1, 7, 1)),
    ((2, 5, 3, 7), (5, 3, 1)),
    ((3, 5), ()),
    ((), (2, 1, 3)),
    ((1,), (3,)),
]
BINARY_SHAPES_HIGHDIM = [((2, 1, 3, 2, 5), (2, 1, 3, 2, 5)), ((2, 2, 3, 1, 5), (3, 2, 1))]  # buffers only
UNARY_SHAPES = [(), (1,), (7,), (3, 5), (1, 3, 5), (2, 5, 3, 7), (5, 1, 6, 3)]
UNARY_SHAPES_HIGHDIM = [(2, 1, 3, 2, 5)]


def _rng(*key) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))  # stable across processes


# ---- binary ------------------------------------------------------------------------------------
def _normal(rng, shape, dtype):
    if dtype == "int32":
        return rng.integers(-1000, 1001, size=shape).astype(np.int32)
    return (rng.standard_normal(shape) * 2).astype(np.float32)


def _nonzero(rng, shape, dtype):
    return (rng.choice([-1.0, 1.0], size=shape) * rng.uniform(0.25, 4.0, size=shape)).astype(np.float32)


def _pos_base(rng, shape, dtype):
    return rng.uniform(0.05, 4.0, size=shape).astype(np.float32)


def _any_exponent(rng, shape, dtype):
    return rng.uniform(-2.5, 2.5, size=shape).astype(np.float32)


def _signed_base(rng, shape, dtype):
    return (rng.choice([-1.0, 1.0], size=shape) * rng.uniform(0.25, 3.0, size=shape)).astype(np.float32)


def _int_exponent(rng, shape, dtype):
    return rng.integers(-3, 4, size=shape).astype(np.float32)


# name -> (op, dtype, self generator, other generator, scalars, torch reference)
BINARY_CASES = {
    "add-f32": ("add", "float32", _normal, _normal, {"alpha": 1.5}, lambda x, y: torch.add(x, y, alpha=1.5)),
    "add-i32": ("add", "int32", _normal, _normal, {"alpha": 2}, lambda x, y: torch.add(x, y, alpha=2)),
    "sub-f32": ("sub", "float32", _normal, _normal, {"alpha": 1.0}, lambda x, y: torch.sub(x, y)),
    "sub-i32": ("sub", "int32", _normal, _normal, {"alpha": 3}, lambda x, y: torch.sub(x, y, alpha=3)),
    "mul-f32": ("mul", "float32", _normal, _normal, {}, torch.mul),
    "mul-i32": ("mul", "int32", _normal, _normal, {}, torch.mul),
    "div-f32": ("div", "float32", _normal, _nonzero, {}, torch.div),
    "pow-f32": ("pow", "float32", _pos_base, _any_exponent, {}, torch.pow),
    "pow-negbase-f32": ("pow", "float32", _signed_base, _int_exponent, {}, torch.pow),
    "minimum-f32": ("minimum", "float32", _normal, _normal, {}, torch.minimum),
    "minimum-i32": ("minimum", "int32", _normal, _normal, {}, torch.minimum),
    "maximum-f32": ("maximum", "float32", _normal, _normal, {}, torch.maximum),
    "maximum-i32": ("maximum", "int32", _normal, _normal, {}, torch.maximum),
}


def _assert_close(got, want, dtype, what, rtol=1e-5, atol=1e-6):
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    if dtype == "float32":
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


@pytest.mark.parametrize("rep", FLOAT_REPRS, ids=repr_id)
@pytest.mark.parametrize("name", list(BINARY_CASES))
def test_binary_matches_torch(device, name, rep):
    op, dtype, gen_a, gen_b, scalars, ref = BINARY_CASES[name]
    storage, layout = rep
    variant = find_variant(op, dtype=dtype, storage=STORAGE_AXIS[storage])
    shapes = BINARY_SHAPES + (BINARY_SHAPES_HIGHDIM if storage == Storage.BUFFER else [])
    names = [b.tensor for b in sorted(variant.bindings, key=lambda b: b.index) if b.access == "read"]  # self, other/exponent
    cases, wants = [], []
    for sa, sb in shapes:
        rng = _rng(name, sa, sb)
        a, b = np.asarray(gen_a(rng, sa, dtype)), np.asarray(gen_b(rng, sb, dtype))
        want = ref(torch.from_numpy(a), torch.from_numpy(b)).numpy()
        cases.append(Case({names[0]: a, names[1]: b}, want.shape, scalars))
        wants.append(want)
    for (sa, sb), res, want in zip(shapes, run_cases(device, variant, cases, storage, layout, dtype), wants):
        what = f"{variant.name} {repr_id(rep)} {sa} with {sb}"
        _assert_close(res.got, want, dtype, what)
        check_padding(res, what)


# ---- unary -------------------------------------------------------------------------------------
def _spread(rng, shape):
    return (rng.standard_normal(shape) * 4).astype(np.float32)


def _tf_gelu_ref(approximate):
    return lambda x: torch.nn.functional.gelu(x, approximate=approximate)


# name -> (op, input generator, scalars, torch reference, exact)
UNARY_CASES = {
    "abs": ("abs", _spread, {}, torch.abs, True),
    "clamp-min": ("clamp", _spread, {"min": -0.5, "max": FLT_MAX}, lambda x: torch.clamp(x, min=-0.5), True),
    "clamp-max": ("clamp", _spread, {"min": -FLT_MAX, "max": 0.75}, lambda x: torch.clamp(x, max=0.75), True),
    "clamp-both": ("clamp", _spread, {"min": 0.25, "max": 0.75}, lambda x: torch.clamp(x, 0.25, 0.75), True),
    "clamp-neither": ("clamp", _spread, {"min": -FLT_MAX, "max": FLT_MAX}, lambda x: x.clone(), True),
    "exp": ("exp", _spread, {}, torch.exp, False),
    "gelu-none": ("gelu", _spread, {"approximate": 0}, _tf_gelu_ref("none"), False),
    "gelu-tanh": ("gelu", _spread, {"approximate": 1}, _tf_gelu_ref("tanh"), False),
    "hardswish": ("hardswish", _spread, {}, torch.nn.functional.hardswish, False),
    "neg": ("neg", _spread, {}, torch.neg, True),
    "relu": ("relu", _spread, {}, torch.relu, True),
    "sigmoid": ("sigmoid", _spread, {}, torch.sigmoid, False),
    "sqrt": ("sqrt", lambda rng, s: np.abs(_spread(rng, s)), {}, torch.sqrt, False),
    "tanh": ("tanh", lambda rng, s: _spread(rng, s) * 2, {}, torch.tanh, False),
}


@pytest.mark.parametrize("rep", FLOAT_REPRS, ids=repr_id)
@pytest.mark.parametrize("name", list(UNARY_CASES))
def test_unary_matches_torch(device, name, rep):
    op, gen, scalars, ref, exact = UNARY_CASES[name]
    storage, layout = rep
    variant = find_variant(op, dtype="float32", storage=STORAGE_AXIS[storage])
    shapes = UNARY_SHAPES + (UNARY_SHAPES_HIGHDIM if storage == Storage.BUFFER else [])
    cases, wants = [], []
    for shape in shapes:
        x = np.array(gen(_rng(name, shape), shape), dtype=np.float32)
        if shape:
            x.reshape(-1)[0] = 0.0  # OP(0) on a real element (padding lanes must not get it)
        cases.append(Case({"self": x}, x.shape, scalars))
        wants.append(ref(torch.from_numpy(x)).numpy())
    for shape, res, want in zip(shapes, run_cases(device, variant, cases, storage, layout, "float32"), wants):
        what = f"{variant.name} ({name}) {repr_id(rep)} {shape}"
        if exact:
            np.testing.assert_array_equal(res.got, want, err_msg=what)
        else:
            _assert_close(res.got, want, "float32", what)
        check_padding(res, what)


# ---- coverage ----------------------------------------------------------------------------------
def _required() -> set[str]:
    return {n for n, v in VARIANTS.items() if v.op in BINARY_OPS + UNARY_OPS}


def test_cases_cover_every_elementwise_variant():
    """The case tables name every generated variant of these ops (checked without a device)."""
    planned = {find_variant(op, dtype=dt, storage=STORAGE_AXIS[s])
               .name for op, dt, *_ in BINARY_CASES.values() for s, _ in FLOAT_REPRS}
    planned |= {find_variant(c[0], dtype="float32", storage=STORAGE_AXIS[s]).name
                for c in UNARY_CASES.values() for s, _ in FLOAT_REPRS}
    assert _required() - planned == set()
    assert {c[0] for c in BINARY_CASES.values()} == set(BINARY_OPS)
    assert {c[0] for c in UNARY_CASES.values()} == set(UNARY_OPS)


def test_every_elementwise_variant_was_dispatched(request):
    """Runs last in this module: every variant of these ops went through the device above."""
    mine = [i for i in request.session.items if i.module is request.module and i is not request.node]
    expected = len(BINARY_CASES) * len(FLOAT_REPRS) + len(UNARY_CASES) * len(FLOAT_REPRS) + 1
    if len(mine) != expected:
        pytest.skip("only part of this module was selected")
    assert _required() - DISPATCHED == set()
