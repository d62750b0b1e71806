"""q8ta_linear and q8ta_linear_gemv at the sizes of real models (issue 11).

test_registry_ops runs the registry's samples (awkward small shapes). These run a ViT-like
projection (M=64, K=384, N=96, and K off the 4-grid with both zero points) on the tiled kernel and
an ImageNet classifier head (K=512, N=1000) on the GEMV kernel, in each representation their
repsets allow, against PyTorch's reference (tests/kernels/q8ta_reference.py): >= 99% of the
outputs equal, none more than one quantization step away, padding zero, and few outputs saturated
(so that the comparison means something). On one row, both kernels give the same words; on every
model shape the int_dot variants (plain, dot4x8: OpSDot) give the same words, and the variant a
device gets follows its features (docs/quantization.md "Integer dot products").
"""
from __future__ import annotations

import numpy as np
import pytest

from texelflow.generated.layouts import Layout, Storage
from texelflow.generated.ops import OPS
from texelflow.runtime.graph.repr import TensorRepr
from texelflow.runtime.lower_dispatch import node_dispatches, select_variant

from .q8ta_cases import CONTIGUOUS, assert_close_to_reference, run_q8ta_case
from .nodecheck import build_node, explicit_case

BUFFER_4H4W = TensorRepr(Storage.BUFFER, Layout.PACKED_INT8_4H4W)
BUFFER_4W = TensorRepr(Storage.BUFFER, Layout.PACKED_INT8_4W)
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


def run_case(device, op_name: str, case, input_repr: TensorRepr, out_repr: TensorRepr, int_dot: str = "plain"):
    """The kernel's Output for the case, with `input` and `out` in the given representations, on
    its int_dot variant `int_dot` (plain: int32 lane products; dot4x8: OpSDot) where it has one."""
    return run_q8ta_case(device, op_name, case, {**PARAMS, "input": input_repr, "out": out_repr}, int_dot)


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


DOT = "shaderIntegerDotProduct"  # the device feature the int_dot = dot4x8 variants require


def needs_dot_products(device) -> None:
    if DOT not in device.enabled_features:
        pytest.skip(f"{device.limits.name} has no {DOT}: only the plain variants run here")


@pytest.mark.parametrize("op_name,name", [("q8ta_linear", n) for n in sorted(TILED_CASES)]
                         + [("q8ta_linear_gemv", n) for n in sorted(GEMV_CASES)])
def test_dot_products_give_the_plain_words(device, op_name, name):
    """OpSDot sums x * w and takes the zero points off after the loop (K counting only real lanes,
    K off the 4-grid in the k-off-grid cases); the plain kernel subtracts them per lane: the same
    integers, so the same words, padding included."""
    needs_dot_products(device)
    shapes = TILED_CASES if op_name == "q8ta_linear" else GEMV_CASES
    case = linear_case(op_name, seed=len(name), **shapes[name])
    reprs = (BUFFER_4H4W, BUFFER_4H4W) if op_name == "q8ta_linear" else (BUFFER_4W, BUFFER_4W)
    plain, dot = (run_case(device, op_name, case, *reprs, int_dot=v) for v in ("plain", "dot4x8"))
    np.testing.assert_array_equal(dot.got, plain.got)
    np.testing.assert_array_equal(dot.raw, plain.raw)


@pytest.mark.parametrize("op_name,storages", [
    ("q8ta_linear", {"out": Storage.BUFFER, "input": Storage.BUFFER}),
    ("q8ta_linear_gemv", {"out": Storage.BUFFER, "input": Storage.BUFFER}),
])
def test_variant_selection_follows_the_device_features(op_name, storages):
    """A device without the feature gets the plain variant; one with it gets dot4x8 where it
    accelerates dot products (the feature among its preferred ones), and plain where it only
    emulates them (lavapipe: Device.preferred_features leaves the feature out)."""
    def chosen(features, preferred=None):
        return dict(select_variant(op_name, "int8", storages, features, preferred).axes)["int_dot"]

    assert chosen(frozenset()) == "plain"
    assert chosen(frozenset({"shaderFloat16"})) == "plain"
    assert chosen(frozenset({DOT})) == "dot4x8"
    assert chosen(frozenset({DOT}), preferred=frozenset({DOT})) == "dot4x8"
    assert chosen(frozenset({DOT}), preferred=frozenset()) == "plain"
    assert chosen(None) == "dot4x8"  # no device: every variant is a candidate, ops.yaml's order decides


def test_device_runs_the_variant_it_prefers(device):
    """The real device's choice: dot4x8 only where the feature is enabled and not emulated."""
    storages = {"out": Storage.BUFFER, "input": Storage.BUFFER}
    got = select_variant("q8ta_linear", "int8", storages, device.enabled_features, device.preferred_features)
    fast = DOT in device.enabled_features and DOT not in device.limits.emulated_features
    assert dict(got.axes)["int_dot"] == ("dot4x8" if fast else "plain"), got.name


def test_compiled_program_runs_the_preferred_variant(device):
    """Through texelflow.compile: every q8ta_linear dispatch is the variant the device prefers
    (CompiledProgram.dispatch_variants names it), and the program's result is the same either way."""
    import torch

    import texelflow

    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16)).eval()
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(0))
    qmodel = texelflow.quantize(model, [(x,)])
    fast = DOT in device.enabled_features and DOT not in device.limits.emulated_features
    with texelflow.compile(qmodel, (x,), device=device) as prog:
        chosen = [name for _, name in prog.dispatch_variants if name.startswith("q8ta_linear")]
        got = prog(x)
    assert chosen == [f"q8ta_linear_int8_buffer_{'dot4x8' if fast else 'plain'}"] * 2, prog.dispatch_variants
    (out,) = next(n for n in qmodel.graph.nodes if n.op == "output").args[0]
    step = float(out.args[1])  # the scale of the int8 output the graph dequantizes
    np.testing.assert_allclose(np.asarray(got), qmodel(x).numpy(), rtol=0, atol=1.01 * step)
