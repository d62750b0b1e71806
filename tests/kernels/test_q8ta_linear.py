"""q8ta_linear and q8ta_linear_gemv at the sizes of real models (issue 11).

test_registry_ops runs the registry's samples (awkward small shapes). These run a ViT-like
projection (M=64, K=384, N=96, and K off the 4-grid with both zero points) on the tiled kernel and
an ImageNet classifier head (K=512, N=1000) on the GEMV kernel, in each representation their
repsets allow, against PyTorch's reference (tests/kernels/q8ta_reference.py): >= 99% of the
outputs equal, none more than one quantization step away, padding zero, and few outputs saturated
(so that the comparison means something). On one row, both kernels give the same words.
"""
from __future__ import annotations

import numpy as np
import pytest

from texelflow.generated.layouts import Layout, Storage
from texelflow.generated.ops import OPS
from texelflow.runtime.graph.repr import TensorRepr
from texelflow.runtime.lower_dispatch import node_dispatches

from .nodecheck import assert_padding_zero, build_node, explicit_case, run_nodes

BUFFER_4H4W = TensorRepr(Storage.BUFFER, Layout.PACKED_INT8_4H4W)
BUFFER_4W = TensorRepr(Storage.BUFFER, Layout.PACKED_INT8_4W)
CONTIGUOUS = TensorRepr(Storage.BUFFER, Layout.WIDTH_PACKED)
PARAMS = {"weight": BUFFER_4H4W, "weight_scales": CONTIGUOUS, "weight_zero_points": CONTIGUOUS, "bias": CONTIGUOUS}


def linear_case(op_name: str, input_shape, n: int, *, seed: int, weight_zp=False, bias=True, input_zp=-5,
                out_zp=3, activation="none", quant_range=(-128, 127)):
    """A case with int8 input and weights over their whole range, per-channel scales in
    [0.002, 0.02] and an out_scale that keeps the outputs spread over the int8 range."""
    rng = np.random.default_rng(seed)
    k = input_shape[-1]
    inputs = {"input": rng.integers(-128, 128, input_shape).astype(np.int8),
              "weight": rng.integers(-127, 128, (n, k)).astype(np.int8),
              "weight_scales": rng.uniform(0.002, 0.02, n).astype(np.float32)}
    sample = {"input": list(input_shape), "weight": [n, k], "weight_scales": [n], "weight_zero_points": None,
              "bias": None, "input_scale": 0.05, "input_zero_point": input_zp,
              "out_scale": 0.075 * float(np.sqrt(k)), "out_zero_point": out_zp,
              "quant_min": quant_range[0], "quant_max": quant_range[1], "activation": activation}
    if weight_zp:
        inputs["weight_zero_points"] = rng.integers(-6, 7, n).astype(np.int32)
        sample["weight_zero_points"] = [n]
    if bias:
        inputs["bias"] = rng.uniform(-4.0, 4.0, n).astype(np.float32)
        sample["bias"] = [n]
    return explicit_case(OPS[op_name], sample, inputs, f"{op_name} {input_shape} x [{n}, {k}]")


def run_case(device, op_name: str, case, input_repr: TensorRepr, out_repr: TensorRepr):
    """The kernel's Output for the case, with `input` and `out` in the given representations."""
    node, arrays = build_node(OPS[op_name], "int8", case)
    [[out]] = run_nodes(device, [(node, arrays)], {**PARAMS, "input": input_repr, "out": out_repr}, "int8",
                        expect_variant=f"{op_name}_int8_buffer")
    return out


def assert_close_to_reference(case, out, what: str) -> None:
    want = case.want[0].astype(np.int64)
    got = out.got.astype(np.int64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    diff = np.abs(got - want)
    exact = float(np.mean(diff == 0))
    lo, hi = case.sample["quant_min"], case.sample["quant_max"]
    relu = case.sample["activation"] == "relu"  # the zero point then holds every negative result
    saturated = float(np.mean((want == hi) | ((want == lo) & (not relu or lo != case.sample["out_zero_point"]))))
    print(f"{what}: {exact:.2%} exact, max |diff| {diff.max()}, {saturated:.2%} saturated")
    assert diff.max() <= 1, f"{what}: {int(np.sum(diff > 1))} outputs more than one step from the reference"
    assert exact >= 0.99, f"{what}: only {exact:.2%} of the outputs equal the reference"
    assert saturated < 0.05, f"{what}: {saturated:.2%} of the reference saturates; the case tests too little"
    assert_padding_zero(out, what)


TILED_CASES = {
    "vit-proj": dict(input_shape=(64, 384), n=96),
    "vit-proj-zero-points-relu": dict(input_shape=(1, 64, 384), n=96, weight_zp=True, input_zp=17, out_zp=-60,
                                      activation="relu", quant_range=(-100, 120)),
    "k-off-grid-zero-points": dict(input_shape=(2, 33, 383), n=97, weight_zp=True, bias=False, input_zp=-21),
}


@pytest.mark.parametrize("name", sorted(TILED_CASES))
def test_tiled_model_shapes(device, name):
    case = linear_case("q8ta_linear", seed=len(name), **TILED_CASES[name])
    out = run_case(device, "q8ta_linear", case, BUFFER_4H4W, BUFFER_4H4W)
    assert_close_to_reference(case, out, f"q8ta_linear {name}")


GEMV_CASES = {
    "classifier-head": dict(input_shape=(1, 512), n=1000),
    "classifier-head-zero-points-relu": dict(input_shape=(512,), n=1000, weight_zp=True, input_zp=40,
                                             out_zp=-128, activation="relu"),
    "k-off-grid": dict(input_shape=(1, 1, 509), n=251, weight_zp=True, input_zp=-33, bias=False),
}


@pytest.mark.parametrize("out_repr", [BUFFER_4W, BUFFER_4H4W], ids=["out-4W", "out-4H4W"])
@pytest.mark.parametrize("name", sorted(GEMV_CASES))
def test_gemv_model_shapes(device, name, out_repr):
    case = linear_case("q8ta_linear_gemv", seed=len(name), **GEMV_CASES[name])
    out = run_case(device, "q8ta_linear_gemv", case, BUFFER_4W, out_repr)
    assert_close_to_reference(case, out, f"q8ta_linear_gemv {name}")


@pytest.mark.parametrize("shape,n", [((1, 512), 1000), ((1, 1, 70), 13), ((3,), 1)])
def test_gemv_equals_tiled_on_one_row(device, shape, n):
    """Both kernels sum the same integers and requantize with the same code: the same words."""
    cases = {op: linear_case(op, shape, n, seed=7, weight_zp=True, input_zp=9)
             for op in ("q8ta_linear", "q8ta_linear_gemv")}
    tiled = run_case(device, "q8ta_linear", cases["q8ta_linear"], BUFFER_4H4W, BUFFER_4H4W)
    gemv = run_case(device, "q8ta_linear_gemv", cases["q8ta_linear_gemv"], BUFFER_4W, BUFFER_4H4W)
    np.testing.assert_array_equal(gemv.got, tiled.got)
    np.testing.assert_array_equal(gemv.raw, tiled.raw)  # padding rows and lanes too


def test_zero_point_outside_int8_is_refused():
    """An out-of-range integer parameter cannot be packed into the kernel's int8 lanes: a clear error
    naming the argument, never a wrapped value."""
    case = linear_case("q8ta_linear", (4, 8), 4, seed=1)
    case.sample["input_zero_point"] = 200
    node, _ = build_node(OPS["q8ta_linear"], "int8", case)
    with pytest.raises(ValueError, match="input_zero_point 200 is outside int8"):
        node_dispatches(node, {**PARAMS, "input": BUFFER_4H4W, "out": BUFFER_4H4W}, "int8")


@pytest.mark.parametrize("out_repr", [BUFFER_4W, BUFFER_4H4W], ids=["out-4W", "out-4H4W"])
def test_gemv_on_several_rows(device, out_repr):
    """The fusion pass gives the GEMV kernel one row, but each output word reads its own row, so
    more rows (and batches) are still right, only slower than the tiled kernel."""
    case = linear_case("q8ta_linear_gemv", (2, 5, 70), 13, seed=3, weight_zp=True, input_zp=-4)
    out = run_case(device, "q8ta_linear_gemv", case, BUFFER_4W, out_repr)
    assert_close_to_reference(case, out, "q8ta_linear_gemv on 2 x 5 rows")
