"""q8ta_conv2d (general sliding-window kernel) and q8ta_conv2d_im2col at the sizes of real models
(issue 11).

test_registry_ops runs the registry's samples (awkward small shapes). These run ResNet-like
convolutions (3x3 with padding, a stride-2 3x3, a 1x1 stride-2 downsample, a 512-channel layer
whose sums over more than 512 input channels cross the kernels' float-to-int flush) against
PyTorch's reference (tests/kernels/q8ta_reference.py): >= 99% of the outputs equal, none more than
one quantization step away, padding zero, and few outputs saturated (so that the comparison means
something). On the same conv both kernels sum the same integers and requantize with the same code,
so they must give the same words; so must im2col's int_dot variants (plain, dot4x8: OpSDot).
"""
from __future__ import annotations

import numpy as np
import pytest

from texelflow.generated.layouts import Layout, Storage
from texelflow.generated.ops import OPS
from texelflow.runtime.graph.repr import TensorRepr
from texelflow.runtime.lower_dispatch import node_dispatches

from .q8ta_cases import CONTIGUOUS, assert_close_to_reference, run_q8ta_case
from .nodecheck import build_node, explicit_case, sample_problem

BUFFER_4W4C = TensorRepr(Storage.BUFFER, Layout.PACKED_INT8_4W4C)
BUFFER_4C1W = TensorRepr(Storage.BUFFER, Layout.PACKED_INT8_4C1W)
PARAMS = {"weight": BUFFER_4C1W, "weight_scales": CONTIGUOUS, "weight_zero_points": CONTIGUOUS, "bias": CONTIGUOUS}
KERNELS = ("q8ta_conv2d", "q8ta_conv2d_im2col")


def conv_case(op_name: str, input_shape, cout: int, kernel=(3, 3), *, seed: int, stride=(1, 1), padding=(0, 0),
              dilation=(1, 1), groups=1, weight_zp=False, bias=True, input_zp=-5, out_zp=3, activation="none",
              quant_range=(-128, 127)):
    """A case with int8 input and weights over their whole range, per-channel scales in
    [0.004, 0.02] and an out_scale that keeps the outputs spread over the int8 range."""
    rng = np.random.default_rng(seed)
    cin_g = input_shape[1] // groups
    wshape = (cout, cin_g, *kernel)
    inputs = {"input": rng.integers(-128, 128, input_shape).astype(np.int8),
              "weight": rng.integers(-127, 128, wshape).astype(np.int8),
              "weight_scales": rng.uniform(0.004, 0.02, cout).astype(np.float32)}
    taps = cin_g * kernel[0] * kernel[1]
    sample = {"input": list(input_shape), "weight": list(wshape), "weight_scales": [cout], "weight_zero_points": None,
              "bias": None, "stride": list(stride), "padding": list(padding), "dilation": list(dilation),
              "groups": groups, "input_scale": 0.05, "input_zero_point": input_zp,
              "out_scale": 0.07 * float(np.sqrt(taps)), "out_zero_point": out_zp,
              "quant_min": quant_range[0], "quant_max": quant_range[1], "activation": activation}
    if weight_zp:
        inputs["weight_zero_points"] = rng.integers(-6, 7, cout).astype(np.int32)
        sample["weight_zero_points"] = [cout]
    if bias:
        inputs["bias"] = rng.uniform(-4.0, 4.0, cout).astype(np.float32)
        sample["bias"] = [cout]
    return explicit_case(OPS[op_name], sample, inputs, f"{op_name} {list(input_shape)} * {list(wshape)}")


def run_case(device, op_name: str, case, input_repr: TensorRepr, out_repr: TensorRepr, int_dot: str = "plain"):
    """The kernel's Output for the case, with `input` and `out` in the given representations, on
    its int_dot variant `int_dot` (plain: int32 lane products; dot4x8: OpSDot) where it has one."""
    return run_q8ta_case(device, op_name, case, {**PARAMS, "input": input_repr, "out": out_repr}, int_dot)


# ResNet-18's conv shapes at 28 x 28 (layer2) and 7 x 7 (layer4); every one qualifies for im2col.
RESNET_CASES = {
    "3x3-pad1": dict(input_shape=(1, 64, 28, 28), cout=64, padding=(1, 1)),
    "3x3-stride2": dict(input_shape=(1, 64, 28, 28), cout=128, stride=(2, 2), padding=(1, 1), weight_zp=True,
                        input_zp=17),
    "1x1-downsample": dict(input_shape=(1, 64, 28, 28), cout=128, kernel=(1, 1), stride=(2, 2), bias=False),
    "3x3-relu-batch2": dict(input_shape=(2, 32, 14, 14), cout=48, padding=(1, 1), activation="relu",
                            out_zp=-128, input_zp=-30),
    "layer4-3x3": dict(input_shape=(1, 512, 7, 7), cout=64, padding=(1, 1), weight_zp=True, input_zp=9,
                       quant_range=(-127, 127)),
    "640-channels": dict(input_shape=(1, 640, 5, 5), cout=12, padding=(1, 1), input_zp=-60),  # > 512 products per tap
}


@pytest.mark.parametrize("op_name", KERNELS)
@pytest.mark.parametrize("name", sorted(RESNET_CASES))
def test_resnet_shapes(device, name, op_name):
    case = conv_case(op_name, seed=len(name), **RESNET_CASES[name])
    out = run_case(device, op_name, case, BUFFER_4W4C, BUFFER_4W4C)
    assert_close_to_reference(case, out, f"{op_name} {name}")


@pytest.mark.parametrize("op_name", KERNELS)
@pytest.mark.parametrize("input_repr,out_repr", [(BUFFER_4C1W, BUFFER_4C1W), (BUFFER_4W4C, BUFFER_4C1W),
                                                 (BUFFER_4C1W, BUFFER_4W4C)], ids=["4C1W", "4W4C-to-4C1W", "4C1W-to-4W4C"])
def test_layouts_of_the_channels_packed_family(device, op_name, input_repr, out_repr):
    """An odd width (4W4C pads it), Cout off the 4-grid and dilation, in every layout pairing."""
    case = conv_case(op_name, (2, 24, 13, 11), 21, seed=3, stride=(1, 2), padding=(2, 1), dilation=(2, 1),
                     weight_zp=True, input_zp=40, out_zp=-7)
    out = run_case(device, op_name, case, input_repr, out_repr)
    assert_close_to_reference(case, out, f"{op_name} {input_repr.layout.name} -> {out_repr.layout.name}")


GROUPED_CASES = {
    "depthwise-3x3-stride2": dict(input_shape=(1, 96, 28, 28), cout=96, groups=96, stride=(2, 2), padding=(1, 1)),
    "depthwise-5x5-zero-points": dict(input_shape=(2, 30, 9, 9), cout=30, kernel=(5, 5), groups=30, padding=(2, 2),
                                      weight_zp=True, input_zp=25),
    "resnext-groups-32": dict(input_shape=(1, 128, 14, 14), cout=128, groups=32, padding=(1, 1)),
    "groups-3-odd-channels": dict(input_shape=(1, 15, 10, 10), cout=9, groups=3, padding=(1, 1), activation="relu"),
}


@pytest.mark.parametrize("name", sorted(GROUPED_CASES))
def test_grouped_on_the_general_kernel(device, name):
    case = conv_case("q8ta_conv2d", seed=len(name), **GROUPED_CASES[name])
    out = run_case(device, "q8ta_conv2d", case, BUFFER_4W4C, BUFFER_4W4C)
    assert_close_to_reference(case, out, f"q8ta_conv2d {name}")


@pytest.mark.parametrize("name", ["3x3-pad1", "3x3-stride2", "640-channels"])
def test_general_and_im2col_agree(device, name):
    """Both kernels sum the same integers and requantize with the same code: the same words."""
    cases = {op: conv_case(op, seed=11, **RESNET_CASES[name]) for op in KERNELS}
    general = run_case(device, "q8ta_conv2d", cases["q8ta_conv2d"], BUFFER_4W4C, BUFFER_4W4C)
    im2col = run_case(device, "q8ta_conv2d_im2col", cases["q8ta_conv2d_im2col"], BUFFER_4W4C, BUFFER_4W4C)
    np.testing.assert_array_equal(im2col.got, general.got)
    np.testing.assert_array_equal(im2col.raw, general.raw)  # padding words and lanes too


@pytest.mark.parametrize("changes,reason", [
    (dict(input_shape=(1, 8, 5, 5), cout=8, groups=2), "groups=2 is not implemented"),
    (dict(input_shape=(1, 6, 5, 5), cout=8), "dim 1 of 'input' is 6, not a multiple of 4"),
])
def test_im2col_refuses_what_it_does_not_implement(changes, reason):
    """groups != 1 or Cin % 4 != 0 send an im2col node to the CPU with its reason (the fusion
    pass never makes one; the general kernel takes them)."""
    op = OPS["q8ta_conv2d_im2col"]
    node, _ = build_node(op, "int8", conv_case("q8ta_conv2d_im2col", seed=1, **changes))
    assert reason in (sample_problem(op, node) or "")


def test_stride_over_a_byte_goes_to_the_cpu():
    """Stride, padding and dilation travel as bytes: a larger one fails the node's check (its
    reason names the argument), and the push derivation itself refuses it, never wrapping it."""
    case = conv_case("q8ta_conv2d", (1, 4, 5, 300), 4, kernel=(1, 1), seed=1, stride=(1, 256))
    op = OPS["q8ta_conv2d"]
    node, _ = build_node(op, "int8", case)
    assert "stride=[1, 256] is over 255" in (sample_problem(op, node) or "")
    with pytest.raises(ValueError, match="stride_w 256 is outside"):
        node_dispatches(node, {**PARAMS, "input": BUFFER_4W4C, "out": BUFFER_4W4C}, "int8")


@pytest.mark.parametrize("name", ["3x3-pad1", "3x3-stride2", "1x1-downsample", "layer4-3x3", "640-channels"])
def test_im2col_dot_products_give_the_plain_words(device, name):
    """The im2col kernel with OpSDot (zero points expanded after the loop, padding taps reading
    x_zp) against its plain variant (float sums of (x - x_zp) * w'): the same words."""
    if "shaderIntegerDotProduct" not in device.enabled_features:
        pytest.skip(f"{device.limits.name} has no shaderIntegerDotProduct: only the plain variant runs here")
    case = conv_case("q8ta_conv2d_im2col", seed=5, **RESNET_CASES[name])
    plain, dot = (run_case(device, "q8ta_conv2d_im2col", case, BUFFER_4W4C, BUFFER_4C1W, int_dot=v)
                  for v in ("plain", "dot4x8"))
    np.testing.assert_array_equal(dot.got, plain.got)
    np.testing.assert_array_equal(dot.raw, plain.raw)
