"""Quantized programs compiled and run on the Vulkan device (lavapipe in CI), against the same
quantized graph run in PyTorch. Each q8ta op matches PyTorch's reference exactly or within one
quantization step (docs/quantization.md: the accumulation order differs), so a program's
dequantized output may differ from PyTorch's by a few steps of its scale where a chain of ops
compounds a rounding that went the other way; nearly every element matches exactly."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import texelflow
from tests.graph.test_q8ta_fusion import (QDQ, AddRelu, AddShuffle, BroadcastAdd, ChainedLinears, ClampedActivations,
                                          ConvBlock, ConvPoolConv, ConvRelu,
                                          Float64Scales, FloatAddmm, Linear, MatMuls, PerTensorWeight, ShuffleAdd,
                                          TwoConvs, Uint8Weight, ViewBetweenLinears, r, tf_quantize, unfolded_quantize,
                                          x86_quantize)

MAX_STEPS = 2  # the most quantization steps of the output any element may differ by
MIN_EXACT = 0.95  # the least fraction of elements that must match exactly


class HardswishChain(nn.Module):
    """MobileNetV3's activation after its convs and linears: conv + hardswish (im2col), depthwise
    conv + hardswish, a mean, linear + hardswish; each fused op applies it before its quantize."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, padding=1)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.fc = nn.Linear(8, 12)

    def forward(self, x):
        y = F.hardswish(self.dw(F.hardswish(self.conv(x))))
        return F.hardswish(self.fc(y.mean((2, 3))))


class GeluMlp(nn.Module):
    """A transformer MLP (linear + gelu, linear) after a conv + gelu: the exact gelu inside the q8ta
    linear and conv, before their quantizes."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, padding=1)
        self.fc1, self.fc2 = nn.Linear(8, 32), nn.Linear(32, 8)

    def forward(self, x):
        y = F.gelu(self.conv(x)).flatten(2).transpose(1, 2)  # [1, 63, 8]: tokens
        return self.fc2(F.gelu(self.fc1(y)))


class Pipeline(nn.Module):
    """conv + relu (im2col), grouped conv, add + relu, pixel_shuffle, a view, two linears."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, groups=2)
        self.l1, self.l2 = nn.Linear(16, 32), nn.Linear(32, 16)

    def forward(self, x):
        a = torch.relu(self.conv(x))
        c = torch.relu(a + self.conv2(a))
        d = F.pixel_shuffle(c, 2)
        return self.l2(torch.relu(self.l1(d.reshape(-1, 16))))


def _output_scale(model, inputs) -> float | None:
    """The scale of the quantized tensor the (single) output dequantizes, None for a float output."""
    gm = model if isinstance(model, torch.fx.GraphModule) else torch.export.export(model, inputs).module()
    (out,) = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    if out.target == torch.ops.quantized_decomposed.dequantize_per_tensor.default:
        return float(out.args[1])
    return None


def _case(name):
    """(model, inputs) of a named case; models quantized by a PT2E quantizer are built here."""
    x16 = r(1, 4, 8, 8, seed=11)
    cases = {
        "pipeline": lambda: (tf_quantize(Pipeline(), x16), (x16,)),
        "conv_general": lambda: (tf_quantize(ConvRelu(3, 8), r(1, 3, 9, 7, seed=12)), (r(1, 3, 9, 7, seed=12),)),
        "linear_gemv": lambda: (tf_quantize(Linear(40, 24, relu=True), r(1, 40, seed=13)), (r(1, 40, seed=13),)),
        "linear_tiled": lambda: (tf_quantize(Linear(40, 24), r(5, 40, seed=14)), (r(5, 40, seed=14),)),
        "addmm_mm": lambda: (tf_quantize(MatMuls(), r(4, 16, seed=15)), (r(4, 16, seed=15),)),
        "add_shuffle": lambda: (tf_quantize(AddShuffle(), r(1, 8, 4, 4, seed=16), r(1, 8, 4, 4, seed=17)),
                                (r(1, 8, 4, 4, seed=16), r(1, 8, 4, 4, seed=17))),
        "chained_linears": lambda: (ChainedLinears(), (r(4, 16, seed=18),)),
        "chained_linears_asymmetric": lambda: (ChainedLinears(symmetric=False), (r(4, 16, seed=18),)),
        "view_requantized": lambda: (ViewBetweenLinears(True), (r(8, 16, seed=19),)),
        "view": lambda: (ViewBetweenLinears(False), (r(8, 16, seed=19),)),
        "Q1": lambda: (AddRelu(), (r(1, 8, 16, 16, seed=1), r(1, 8, 16, 16, seed=2))),
        "Q3": lambda: (ShuffleAdd(), (r(1, 8, 8, 8, seed=3), r(1, 2, 16, 16, seed=4))),
        "Q4": lambda: (ConvBlock(), (r(1, 8, 16, 16, seed=5),)),
        "x86_uint8": lambda: (x86_quantize(TwoConvs(), r(1, 4, 8, 8, seed=20)), (r(1, 4, 8, 8, seed=20),)),
        "uint8_round_trip": lambda: (QDQ(0.03, 120, 0, 255, torch.uint8), (r(2, 3, 5, 7, seed=21),)),
        "float_addmm": lambda: (FloatAddmm(), (r(4, 16, seed=22),)),
        "uint8_weight": lambda: (Uint8Weight(), (r(4, 16, seed=23),)),
        "broadcast_add": lambda: (tf_quantize(BroadcastAdd(), r(1, 8, 5, 3, seed=24), r(1, 8, 1, 1, seed=25)),
                                  (r(1, 8, 5, 3, seed=24), r(1, 8, 1, 1, seed=25))),
        "per_tensor_weight": lambda: (PerTensorWeight(), (r(4, 16, seed=26),)),
        "float64_scales": lambda: (Float64Scales(), (r(4, 16, seed=27),)),
        "max_pool": lambda: (tf_quantize(ConvPoolConv(), r(2, 4, 9, 7, seed=30)), (r(2, 4, 9, 7, seed=30),)),
        "clamped_activations": lambda: (ClampedActivations(), (r(1, 8, 5, 6, seed=29) * 3,)),
        "unfolded_weights": lambda: (unfolded_quantize(Linear(16, 8), r(3, 16, seed=28)), (r(3, 16, seed=28),)),
        "hardswish": lambda: (tf_quantize(HardswishChain(), r(1, 4, 9, 7, seed=31) * 3), (r(1, 4, 9, 7, seed=31) * 3,)),
        "large_linear": lambda: (tf_quantize(Linear(384, 768, relu=True), r(64, 384, seed=33)), (r(64, 384, seed=33),)),
        "gelu_mlp": lambda: (tf_quantize(GeluMlp(), r(1, 4, 9, 7, seed=32) * 2), (r(1, 4, 9, 7, seed=32) * 2,)),
    }
    return cases[name]()


CASES = ["pipeline", "conv_general", "linear_gemv", "linear_tiled", "addmm_mm", "add_shuffle", "chained_linears",
         "chained_linears_asymmetric", "view_requantized", "view", "Q1", "Q3", "Q4", "x86_uint8", "uint8_round_trip",
         "float_addmm", "uint8_weight", "broadcast_add", "per_tensor_weight", "float64_scales", "unfolded_weights", "clamped_activations", "max_pool", "hardswish", "gelu_mlp", "large_linear"]


@pytest.mark.parametrize("conv_form", ["q8ta", "float"])
@pytest.mark.parametrize("name", CASES)
def test_quantized_program_matches_pytorch(name, conv_form, device, monkeypatch):
    """Both forms of a quantized conv chain (quantized.int8_conv_form): the q8ta kernels, and the
    float kernels between the chain's dequantize and quantize (lavapipe's default)."""
    monkeypatch.setenv("TEXELFLOW_INT8_CONV", conv_form)
    model, inputs = _case(name)
    with texelflow.compile(model, inputs, device=device) as prog:
        assert prog.plan.fallbacks == []
        got = prog(*inputs)
    with torch.no_grad():
        want = model(*inputs)
    assert got.shape == want.shape and got.dtype == want.dtype
    scale = _output_scale(model, inputs)
    if scale is None:  # a float op reads the last int8 tensor: its few off-by-one inputs move it a little
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
        return
    steps = ((got - want).abs() / scale).round()
    assert steps.max() <= MAX_STEPS, f"{int(steps.max())} steps of {scale} apart"
    assert (steps == 0).float().mean() >= MIN_EXACT, f"only {(steps == 0).float().mean():.1%} of elements exact"


def test_the_q8ta_ops_run_in_one_submit(device, monkeypatch):
    monkeypatch.setenv("TEXELFLOW_INT8_CONV", "q8ta")
    model, inputs = _case("pipeline")
    with texelflow.compile(model, inputs, device=device) as prog:
        assert prog.num_submits_per_call == 1
        kinds = set(prog.plan.dispatches)
    assert {"q8ta_conv2d_im2col", "q8ta_conv2d", "q8ta_add", "q8ta_pixel_shuffle", "q8ta_linear"} <= kinds


def test_hardswish_runs_inside_the_q8ta_convs_and_linears(device, monkeypatch):
    """No hardswish dispatch and no quantize between a conv or linear and its hardswish: q8ta form,
    and in float form one float conv + hardswish (conv2d_pw_act / dw) before each quantize."""
    model, inputs = _case("hardswish")
    monkeypatch.setenv("TEXELFLOW_INT8_CONV", "q8ta")
    with texelflow.compile(model, inputs, device=device) as prog:
        kinds = prog.plan.dispatches
        fused = {row[1]: row[4] for row in prog.plan.rows() if row[1].startswith("q8ta_")}
    assert "hardswish" not in kinds, kinds
    assert set(fused) == {"q8ta_conv2d_im2col", "q8ta_conv2d", "q8ta_linear_gemv"}, fused
    assert all("hardswish '" in notes for notes in fused.values()), fused
    monkeypatch.setenv("TEXELFLOW_INT8_CONV", "float")
    with texelflow.compile(model, inputs, device=device) as prog:
        kinds = prog.plan.dispatches
    assert "hardswish" not in kinds and "q8ta_conv2d" not in kinds, kinds


def test_a_large_linear_takes_the_device_s_form(device, monkeypatch):
    """In the float form a linear of at least FLOAT_LINEAR_MACS multiply-adds runs on the float
    GEMM between its dequantize and quantize; a smaller one keeps q8ta_linear."""
    from texelflow.runtime.graph.quantized import FLOAT_LINEAR_MACS

    assert 64 * 384 * 768 >= FLOAT_LINEAR_MACS > 5 * 40 * 24
    monkeypatch.setenv("TEXELFLOW_INT8_CONV", "float")
    for name, form in (("large_linear", "linear_packed"), ("linear_tiled", "q8ta_linear")):
        model, inputs = _case(name)
        plan = texelflow.plan(model, inputs)
        assert plan.dispatches[form] == 1, (name, plan.dispatches)
        if form == "linear_packed":
            (row,) = [row for row in plan.rows() if row[1] == "linear_packed"]
            assert "kept in float between dequantize and quantize, not q8ta_linear" in row[4]


def test_gelu_runs_inside_the_q8ta_linears(device, monkeypatch):
    monkeypatch.setenv("TEXELFLOW_INT8_CONV", "q8ta")
    model, inputs = _case("gelu_mlp")
    with texelflow.compile(model, inputs, device=device) as prog:
        kinds = prog.plan.dispatches
        fused = [row[4] for row in prog.plan.rows() if row[1] in ("q8ta_linear", "q8ta_conv2d_im2col")]
    assert "gelu" not in kinds and kinds["q8ta_linear"] == 2, kinds
    assert sum("gelu '" in notes for notes in fused) == 2, fused


class DequantizeTo(nn.Module):
    """uint8 quantize -> dequantize to `dtype`: the quantize runs shifted to int8 on Vulkan; a
    float64 dequantize (no float64 kernel) runs on the CPU, where it must read the shifted values
    as such; with a bfloat16 one the pair runs on Vulkan in float32, rounded
    (runtime/graph/bfloat16.py)."""

    def __init__(self, dtype):
        super().__init__()
        self.dtype = dtype

    def forward(self, x):
        y = torch.ops.quantized_decomposed.quantize_per_tensor.default(x, 0.03, 120, 0, 255, torch.uint8)
        return torch.ops.quantized_decomposed.dequantize_per_tensor.default(y, 0.03, 120, 0, 255, torch.uint8,
                                                                            out_dtype=self.dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=["float64", "bfloat16"])
def test_a_shifted_uint8_tensor_read_by_another_dtype(device, dtype):
    model, x = DequantizeTo(dtype), r(3, 4, 5, seed=29)
    with texelflow.compile(model, (x,), device=device) as prog:
        if dtype == torch.float64:
            assert [name for name, _ in prog.plan.fallbacks] == ["dequantize_per_tensor"]
            (quant,) = [n for n in prog.plan.graph.device_nodes() if n.op.name == "quantize_per_tensor"]
            assert quant.outputs[0][1].dtype == "int8"
        else:  # the pair is one round trip on the device, rounded to bfloat16
            assert prog.plan.fallbacks == []
        got = prog(x)
    assert got.dtype == dtype and torch.equal(got, model(x))
