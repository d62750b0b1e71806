"""The int8 elementwise kernels on inputs the generic kernel test does not draw.

test_registry_ops runs every sample of quantize_per_tensor, dequantize_per_tensor, q8ta_add,
q8ta_relu and q8ta_pixel_shuffle in every representation their repsets allow. These add: a
quantize -> dequantize round trip on the device through each PACKED_INT8 layout (one program, the
int8 tensor never leaves the device); quantization at exact rounding ties, +-Inf, huge values and
NaN; every int8 value dequantized; and larger q8ta_add / q8ta_relu / q8ta_pixel_shuffle cases with
inputs and output in different layouts of one packed-dim family, where the share of elements equal
to PyTorch's reference (tests/kernels/q8ta_reference.py) is reported and must be >= 99%, with no
element more than one quantization step away (docs/quantization.md).
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from texelflow.generated.layouts import Layout, Storage
from texelflow.generated.ops import OPS
from texelflow.runtime.graph.repr import TensorRepr
from texelflow.runtime.lower_dispatch import node_dispatches
from texelflow.runtime.vulkan.program import Dispatch, Program
from texelflow.runtime.vulkan.tensor import VkTensor

from .nodecheck import assert_matches, assert_padding_zero, build_node, explicit_case, run_nodes


def _int8(layout: Layout) -> TensorRepr:
    return TensorRepr(Storage.BUFFER, layout)


INT8_LAYOUTS = [Layout.PACKED_INT8_4W4C, Layout.PACKED_INT8_4H4W, Layout.PACKED_INT8_4W, Layout.PACKED_INT8_4C1W]
CHANNELS_FAMILY = [Layout.PACKED_INT8_4W4C, Layout.PACKED_INT8_4C1W]
WIDTH_FAMILY = [Layout.PACKED_INT8_4H4W, Layout.PACKED_INT8_4W]
FLOAT_REPRS = [TensorRepr(Storage.BUFFER, Layout.WIDTH_PACKED), TensorRepr(Storage.TEXTURE_3D, Layout.CHANNELS_PACKED),
               TensorRepr(Storage.TEXTURE_3D, Layout.HEIGHT_PACKED), TensorRepr(Storage.BUFFER, Layout.CHANNELS_PACKED)]
INF = float("inf")


def _name(r) -> str:
    r = r if isinstance(r, TensorRepr) else _int8(r)
    return f"{r.storage.name}-{r.layout.name}"


def _qargs(scale, zero_point, quant_min=-128, quant_max=127) -> dict:
    return {"scale": scale, "zero_point": zero_point, "quant_min": quant_min, "quant_max": quant_max, "dtype": "int8"}


def _run_one(device, op_name: str, sample: dict, inputs: dict, reprs: dict, dtype: str):
    """Run one node of `op_name` on the device; (torch's output, the kernel's Output)."""
    op = OPS[op_name]
    case = explicit_case(op, sample, inputs, f"{op_name} {reprs}")
    node, arrays = build_node(op, dtype, case)
    [[out]] = run_nodes(device, [(node, arrays)], reprs, dtype)
    return case.want[0], out


# ---- quantize and dequantize ---------------------------------------------------------------------
# (2, 8, 4, 12): no padding lanes, every size a multiple of 4 (quantize's word and block paths);
# (1, 4, 5, 6) and (1, 8, 8, 5): blocks of 4 x 4 with padding lanes and padding words in out
ROUND_TRIP_SHAPES = [(2, 5, 7, 3), (2, 8, 4, 12), (1, 4, 5, 6), (1, 8, 8, 5)]


@pytest.mark.parametrize("shape", ROUND_TRIP_SHAPES, ids=str)
@pytest.mark.parametrize("int8_layout", INT8_LAYOUTS, ids=_name)
@pytest.mark.parametrize("float_repr", FLOAT_REPRS, ids=_name)
def test_round_trip_through_each_layout(device, float_repr, int8_layout, shape):
    """float -> int8 (in the layout) -> float in one program, each node with the shape classes
    the runtime gives it: each dispatch matches torchao bit for bit, and a value inside the
    range comes back within half a step of where it started."""
    rng = np.random.default_rng(11)
    scale, zero_point = 0.037, -9
    x = rng.uniform(-4.0, 4.0, size=shape).astype(np.float32)
    quantize, dequantize = OPS["quantize_per_tensor"], OPS["dequantize_per_tensor"]
    qcase = explicit_case(quantize, {"input": shape, **_qargs(scale, zero_point)}, {"input": x}, "quantize")
    dcase = explicit_case(dequantize, {"input": shape, **_qargs(scale, zero_point)}, {"input": qcase.want[0]},
                          "dequantize")
    qnode, _ = build_node(quantize, "float32", qcase)
    dnode, _ = build_node(dequantize, "float32", dcase)
    int8_repr = _int8(int8_layout)
    x_t = VkTensor(device, shape, "float32", float_repr.storage, float_repr.layout, label="x")
    q_t = VkTensor(device, shape, "int8", int8_repr.storage, int8_repr.layout, label="q")
    y_t = VkTensor(device, shape, "float32", float_repr.storage, float_repr.layout, label="y")
    try:
        dispatches = []
        for node, bound in ((qnode, {"input": x_t, "out": q_t}), (dnode, {"input": q_t, "out": y_t})):
            reprs = {name: TensorRepr(t.storage, t.layout) for name, t in bound.items()}
            [spec] = node_dispatches(node, reprs, "float32")
            dispatches.append(Dispatch(spec.variant, bound, spec.scalars, label=spec.label, units=spec.units,
                                       spec=spec.spec))
        prog = Program(device, dispatches, [x_t], [q_t, y_t], timestamps=False)
        try:
            q_got, y_got = prog(x)
        finally:
            prog.close()
    finally:
        for t in (x_t, q_t, y_t):
            t.close()
    what = f"round trip {_name(float_repr)} -> {_name(int8_repr)}"
    assert_matches(q_got, qcase.want[0], "quantize_per_tensor", f"{what}: quantize")
    assert_matches(y_got, dcase.want[0], "dequantize_per_tensor", f"{what}: dequantize")
    inside = (q_got > -128) & (q_got < 127)
    assert inside.mean() > 0.9, f"{what}: the test's values should mostly lie inside the range"
    assert np.all(np.abs(y_got - x)[inside] <= scale / 2 * (1 + 1e-5)), f"{what}: more than half a step away"


WIDTH_REPRS = [TensorRepr(Storage.BUFFER, Layout.WIDTH_PACKED), TensorRepr(Storage.TEXTURE_3D, Layout.WIDTH_PACKED)]


@pytest.mark.parametrize("whole", [False, True], ids=["611-wide", "612-wide"])
@pytest.mark.parametrize("float_repr", WIDTH_REPRS, ids=_name)
@pytest.mark.parametrize("int8_layout", INT8_LAYOUTS, ids=_name)
@pytest.mark.parametrize("quant_range", [(-128, 127), (-127, 127), (-100, 90)], ids=str)
def test_quantize_ties_infinities_and_huge_values(device, int8_layout, quant_range, float_repr, whole):
    """Exact halves round to even, +-Inf and +-1e30 clamp to the range's ends, -0.0 gives the zero
    point: all as torchao gives them, element by element (611 wide) and 4 lanes at once (612)."""
    scale, zero_point = 0.5, 3
    halves = np.arange(-300, 301, dtype=np.float32) * 0.25  # x / scale = k / 2: every other one a tie
    extra = np.array([0.125] if whole else [], dtype=np.float32)
    extremes = np.array([INF, -INF, 1e30, -1e30, -0.0, 0.0, 1e-40, -1e-40, 63.75, -64.25], dtype=np.float32)
    x = np.concatenate([halves, extra, extremes]).reshape(1, 1, 1, -1)
    want, out = _run_one(device, "quantize_per_tensor", {"input": x.shape, **_qargs(scale, zero_point, *quant_range)},
                         {"input": x}, {"input": float_repr, "out": _int8(int8_layout)}, "float32")
    what = f"quantize {quant_range} {_name(float_repr)} -> {_name(int8_layout)}"
    assert_matches(out.got, want, "quantize_per_tensor", what)
    assert_padding_zero(out, what)
    assert out.got.reshape(-1)[-10] == quant_range[1] and out.got.reshape(-1)[-9] == quant_range[0]


@pytest.mark.parametrize("width", [5, 8], ids=["element-path", "word-path"])
def test_quantize_nan_gives_the_zero_point(device, width):
    """torch's result for NaN is undefined (a float -> int cast); the kernel's is zero_point."""
    x = np.array([[np.nan, 1.0, -np.nan, 2.0, np.nan, 1.0, np.nan, 2.0][:width]], dtype=np.float32)
    for zero_point in (-7, 0, 90):
        _, out = _run_one(device, "quantize_per_tensor", {"input": x.shape, **_qargs(0.25, zero_point, -100, 90)},
                          {"input": x}, {"input": FLOAT_REPRS[0], "out": _int8(Layout.PACKED_INT8_4W)}, "float32")
        one, two = min(zero_point + 4, 90), min(zero_point + 8, 90)
        want = np.array([[zero_point, one, zero_point, two, zero_point, one, zero_point, two][:width]])
        np.testing.assert_array_equal(out.got, want, err_msg=f"zero_point {zero_point}")


@pytest.mark.parametrize("float_repr", FLOAT_REPRS, ids=_name)
@pytest.mark.parametrize("quant_range", [(-128, 127), (-100, 90)], ids=str)
def test_quantize_dequantize_is_the_pair_bit_for_bit(device, float_repr, quant_range):
    """quantize_dequantize (the fusion's dq(q(x)), one float pass) gives torchao's quantize then
    dequantize bit for bit at exact rounding ties, +-Inf, +-1e30, -0.0 and tiny values, in each
    float representation; NaN, whose int8 value torch leaves undefined, gives 0 (the zero point)."""
    scale, zero_point = 0.5, 3
    halves = np.arange(-300, 301, dtype=np.float32) * 0.25  # x / scale = k / 2: every other one a tie
    extremes = np.array([INF, -INF, 1e30, -1e30, -0.0, 0.0, 1e-40, -1e-40, 63.75, -64.25], dtype=np.float32)
    x = np.concatenate([halves, extremes]).reshape(1, 1, 1, -1)
    sample = {"self": x.shape, "scale": scale, "zero_point": zero_point, "quant_min": quant_range[0],
              "quant_max": quant_range[1]}
    want, out = _run_one(device, "quantize_dequantize", sample, {"self": x},
                         {"self": float_repr, "out": float_repr}, "float32")
    np.testing.assert_array_equal(out.got.view(np.uint32), want.view(np.uint32), err_msg=_name(float_repr))
    assert out.got.reshape(-1)[-10] == (quant_range[1] - zero_point) * scale
    nan = np.array([[np.nan, 1.0, -np.nan, 2.0, np.nan]], dtype=np.float32)
    sample["self"] = nan.shape
    _, out = _run_one(device, "quantize_dequantize", sample, {"self": nan},
                      {"self": float_repr, "out": float_repr}, "float32")
    np.testing.assert_array_equal(out.got, [[0.0, 1.0, 0.0, 2.0, 0.0]], err_msg=f"NaN in {_name(float_repr)}")


@pytest.mark.parametrize("int8_layout", INT8_LAYOUTS, ids=_name)
@pytest.mark.parametrize("float_repr", FLOAT_REPRS, ids=_name)
def test_dequantize_every_int8_value(device, int8_layout, float_repr):
    """All 256 int8 values, for a few scales and zero points, bit for bit as torchao."""
    q = np.arange(-128, 128, dtype=np.int8).reshape(2, 4, 8, 4)
    for scale, zero_point in ((0.05, -3), (0.37, 0), (2.5, 127), (1e-3, -128)):
        want, out = _run_one(device, "dequantize_per_tensor", {"input": q.shape, **_qargs(scale, zero_point)},
                             {"input": q}, {"input": _int8(int8_layout), "out": float_repr}, "float32")
        assert_matches(out.got, want, "dequantize_per_tensor", f"dequantize {scale} {zero_point} in "
                       f"{_name(int8_layout)} -> {_name(float_repr)}")
        assert_padding_zero(out, f"dequantize into {_name(float_repr)}")


# ---- q8ta ops in mixed layouts -------------------------------------------------------------------
def _check_steps(got: np.ndarray, want: np.ndarray, what: str) -> float:
    """Within one quantization step everywhere and >= 99% exact; returns the exact share."""
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    diff = np.abs(got.astype(np.int64) - want.astype(np.int64))
    exact = float((diff == 0).mean())
    print(f"{what}: {exact:.2%} of {diff.size} elements exact, max |diff| {diff.max()}")
    assert diff.max() <= 1, f"{what}: max |diff| {diff.max()} > 1 step"
    assert exact >= 0.99, f"{what}: only {exact:.2%} exact"
    return exact


def _family_combos(names: tuple[str, ...]):
    """Every assignment of one family's layouts to the slots `names`."""
    for family in (CHANNELS_FAMILY, WIDTH_FAMILY):
        for picked in itertools.product(family, repeat=len(names)):
            yield {n: _int8(layout) for n, layout in zip(names, picked)}


def _combo_id(combo: dict) -> str:
    return ",".join(f"{n}={_name(r).split('_')[-1]}" for n, r in combo.items())


ADD_COMBOS = list(_family_combos(("self", "other", "out")))
ADD_CASES = [
    # (self shape, other shape, arguments)
    ((2, 13, 9, 11), (2, 13, 9, 11), dict(self_scale=0.05, self_zero_point=-3, other_scale=0.037, other_zero_point=7,
                                          out_scale=0.061, out_zero_point=2)),
    ((1, 13, 9, 11), (1, 13, 1, 1), dict(self_scale=0.37, self_zero_point=0, other_scale=0.05, other_zero_point=-128,
                                         out_scale=0.4, out_zero_point=-1, quant_min=-127, quant_max=127,
                                         activation="relu")),
    ((3, 5, 7), (7,), dict(self_scale=0.02, self_zero_point=11, other_scale=0.03, other_zero_point=-11,
                           out_scale=0.05, out_zero_point=0, quant_min=-100, quant_max=90, alpha=-0.75)),
    # no lanes past the sizes in any layout (shape class padded 0): the word path without an index
    ((2, 8, 4, 12), (2, 8, 4, 12), dict(self_scale=0.05, self_zero_point=-3, other_scale=0.037, other_zero_point=7,
                                        out_scale=0.061, out_zero_point=2, activation="relu")),
]


@pytest.mark.parametrize("combo", ADD_COMBOS, ids=_combo_id)
@pytest.mark.parametrize("index", range(len(ADD_CASES)))
def test_q8ta_add_mixed_layouts(device, combo, index):
    self_shape, other_shape, args = ADD_CASES[index]
    rng = np.random.default_rng(index)
    inputs = {"self": rng.integers(-128, 128, size=self_shape, dtype=np.int8),
              "other": rng.integers(-128, 128, size=other_shape, dtype=np.int8)}
    sample = {"self": self_shape, "other": other_shape, **args}
    want, out = _run_one(device, "q8ta_add", sample, inputs, combo, "int8")
    what = f"q8ta_add {self_shape} + {other_shape} {_combo_id(combo)}"
    _check_steps(out.got, want, what)
    assert_padding_zero(out, what)


@pytest.mark.parametrize("combo", list(_family_combos(("self", "out"))), ids=_combo_id)
@pytest.mark.parametrize("shape", [(2, 7, 6, 13), (1, 8, 4, 8)], ids=str)
def test_q8ta_relu_mixed_layouts(device, combo, shape):
    q = np.random.default_rng(5).integers(-128, 128, size=shape, dtype=np.int8)
    sample = {"self": shape, "self_scale": 0.05, "self_zero_point": -20, "out_scale": 0.03, "out_zero_point": -128}
    want, out = _run_one(device, "q8ta_relu", sample, {"self": q}, combo, "int8")
    what = f"q8ta_relu {shape} {_combo_id(combo)}"
    _check_steps(out.got, want, what)
    assert_padding_zero(out, what)


PIXEL_SHUFFLE_COMBOS = [{"self": _int8(a), "out": _int8(b)} for a, b in itertools.product(CHANNELS_FAMILY, repeat=2)]


@pytest.mark.parametrize("combo", PIXEL_SHUFFLE_COMBOS, ids=_combo_id)
@pytest.mark.parametrize("requantize", [False, True], ids=["same-quantization", "requantize"])
def test_q8ta_pixel_shuffle_mixed_layouts(device, combo, requantize):
    """With self's quantization for out, every element is moved exactly (clamped to the range)."""
    shape = (2, 36, 5, 7)
    q = np.random.default_rng(7).integers(-128, 128, size=shape, dtype=np.int8)
    out_q = {"out_scale": 0.09, "out_zero_point": 4} if requantize else {"out_scale": 0.05, "out_zero_point": -3}
    sample = {"self": shape, "upscale_factor": 3, "self_scale": 0.05, "self_zero_point": -3, **out_q,
              "quant_min": -127, "quant_max": 120}
    want, out = _run_one(device, "q8ta_pixel_shuffle", sample, {"self": q}, combo, "int8")
    what = f"q8ta_pixel_shuffle {shape} {_combo_id(combo)} {out_q}"
    exact = _check_steps(out.got, want, what)
    assert_padding_zero(out, what)
    if not requantize:
        assert exact == 1.0, f"{what}: a pure move must be exact"

