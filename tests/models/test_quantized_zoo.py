"""The model zoo quantized through `texelflow.quantize` (PT2E with texelflow.Quantizer) end to end:
zero CPU fallbacks, q8ta kernels doing the work, and the outputs of the quantized graph as PyTorch
runs it (the converted GraphModule: dequantize, float op, quantize). The models run at the reduced
sizes of test_zoo.py.

How close is close: errors are counted in steps of the output's quantization. A float op computed
on the device differs from torch's in the last bits, which may round a value at a quantization
boundary the other way, and later layers carry that step along. How far that goes is a property of
the model, measured here on the reference itself: the quantized graph run again with every float
op's result perturbed by 1e-6 relative noise. texelflow must stay within 2 steps of the reference
plus that sensitivity (ResNet-18 and ViT come out exact; the random-weight ConvNeXt's reference
moves by a mean of about 1 step under the noise, and texelflow's by the same).
"""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch

import texelflow
from texelflow.generated.ops import OPS
from texelflow.models import ZOO
from texelflow.runtime.graph.prepack_matmul import subgroup_facts
from texelflow.runtime.graph.quantized import int8_conv_form

from .test_zoo import SMALL_SIZES

CALIBRATION_BATCHES = 4
# op -> the q8ta kernels that must carry the model (at least one dispatch of each)
Q8TA_KERNELS = {
    "resnet18": {"q8ta_conv2d", "q8ta_conv2d_im2col", "q8ta_max_pool2d", "q8ta_add", "q8ta_linear_gemv"},
    "unet_decoder": {"q8ta_conv2d_im2col", "q8ta_max_pool2d", "q8ta_pixel_shuffle", "q8ta_add"},
    "mobilenet_v3_small": {"q8ta_conv2d", "q8ta_conv2d_im2col", "q8ta_add", "q8ta_linear_gemv"},
    "convnext_atto": {"q8ta_conv2d", "q8ta_linear", "q8ta_add"},
    "vit_tiny": {"q8ta_linear", "q8ta_add", "q8ta_linear_gemv"},
}


def quantized(name: str):
    model, inputs = ZOO[name](image_size=SMALL_SIZES[name])
    torch.manual_seed(1)
    calibration = [tuple(torch.randn_like(x) for x in inputs) for _ in range(CALIBRATION_BATCHES)]
    return texelflow.quantize(model, calibration), inputs


NOISE = 1e-6  # relative perturbation of float results: float32 kernels differ by about this much
QUANT_OPS = ("quantize_per_tensor", "dequantize_per_tensor", "dequantize_per_channel")


def output_step(qmodel) -> float:
    """The scale of the last dequantize of the quantized graph: one step of its output."""
    dq = [n for n in qmodel.graph.nodes if n.op == "call_function" and "dequantize_per_tensor" in str(n.target)]
    return float(dq[-1].args[1])


def with_float_noise(qmodel, seed: int = 0):
    """A copy of the quantized graph whose float ops (not quantize / dequantize) multiply their
    results by 1 + NOISE * randn: the reference as a float32 kernel of other rounding computes it."""
    noisy = copy.deepcopy(qmodel)
    gen = torch.Generator().manual_seed(seed)

    def perturbed(fn):
        def run(*args, **kwargs):
            out = fn(*args, **kwargs)
            if isinstance(out, torch.Tensor) and out.is_floating_point():
                return out * (1 + NOISE * torch.randn(out.shape, generator=gen))
            return out
        return run

    for node in noisy.graph.nodes:
        if node.op == "call_function" and not any(q in str(node.target) for q in QUANT_OPS):
            node.target = perturbed(node.target)
    noisy.recompile()
    return noisy


def error_in_steps(got, want, step):
    err = (got - want).abs() / step
    return err.max().item(), err.mean().item()


def assert_close_to_the_quantized_graph(got, qmodel, inputs) -> None:
    """`got` within 2 output steps of the quantized graph's answer, plus what 1e-6 float noise
    moves the graph itself (the module docstring)."""
    want = qmodel(*inputs)
    step = output_step(qmodel)
    worst, mean = error_in_steps(got, want, step)
    noise_worst, noise_mean = error_in_steps(with_float_noise(qmodel)(*inputs), want, step)
    assert worst <= 2 + noise_worst, f"max error {worst:.2f} steps (the reference under float noise: {noise_worst:.2f})"
    assert mean <= 0.1 + 1.5 * noise_mean, f"mean error {mean:.3f} steps (the reference under float noise: {noise_mean:.3f})"


def identity_dispatches(dispatches: Counter) -> dict:
    """Dispatches of identity ops (views, clones) and of the planner's transitions."""
    return {op: n for op, n in dispatches.items() if op == "to_layout" or (op in OPS and OPS[op].is_identity)}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(Q8TA_KERNELS))
def test_quantized_zoo_model_runs_on_the_device_and_matches_the_quantized_graph(name, device, monkeypatch):
    """The q8ta kernels forced (TEXELFLOW_INT8_CONV=q8ta): on a CPU device the convs would
    otherwise run on the float kernels (test_quantized_convs_take_the_device_s_form)."""
    monkeypatch.setenv("TEXELFLOW_INT8_CONV", "q8ta")
    qmodel, inputs = quantized(name)
    with texelflow.compile(qmodel, inputs, device=device) as prog:
        plan = prog.plan
        assert plan.fallbacks == [], f"runs on the CPU: {plan.fallbacks[:5]}"
        missing = Q8TA_KERNELS[name] - set(plan.dispatches)
        assert not missing, f"{name}: no dispatch of {sorted(missing)}: {plan.dispatches}"
        got = prog(*inputs)
    assert_close_to_the_quantized_graph(got, qmodel, inputs)


def test_quantized_decoder_dispatches_no_clone_around_its_pixel_shuffles():
    """The RefineNet-style decoder: both pixel shuffles fuse with their quantize / dequantize into
    q8ta_pixel_shuffle, fed by a q8ta conv in the same packed-dim family, so no identity clone or
    transition is dispatched anywhere in the program (the reference backend dispatched 3)."""
    qmodel, inputs = quantized("unet_decoder")
    plan = texelflow.plan(qmodel, inputs)
    assert plan.fallbacks == []
    assert plan.dispatches["q8ta_pixel_shuffle"] == 2, plan.dispatches
    assert "pixel_shuffle" not in plan.dispatches
    assert identity_dispatches(plan.dispatches) == {}, plan.dispatches
    assert plan.num_transitions == 0
    shuffles = [n for n in plan.graph.nodes if n.op is not None and n.op.name == "q8ta_pixel_shuffle"]
    for node in shuffles:
        producer = node.arg("self").producer
        assert producer.op.name.startswith("q8ta_conv2d"), producer


@pytest.mark.slow
def test_quantized_convs_take_the_device_s_form(device, monkeypatch):
    """Unforced, a quantized ResNet-18 takes the device's conv form (quantized.int8_conv_form):
    on lavapipe (no accelerated int8 dot products) every conv runs on the float kernels between
    its dequantize and quantize, and says so in the plan, while the adds, the max pool and the
    classifier stay in int8; the output still matches the quantized graph as closely."""
    monkeypatch.delenv("TEXELFLOW_INT8_CONV", raising=False)
    form, why = int8_conv_form(subgroup_facts(device.limits))
    qmodel, inputs = quantized("resnet18")
    with texelflow.compile(qmodel, inputs, device=device) as prog:
        plan = prog.plan
        got = prog(*inputs)
    assert plan.fallbacks == []
    q8ta_convs = {op for op in plan.dispatches if op.startswith("q8ta_conv2d")}
    assert {"q8ta_add", "q8ta_max_pool2d", "q8ta_linear_gemv"} <= set(plan.dispatches), plan.dispatches
    if form == "float":
        assert q8ta_convs == set(), plan.dispatches
        kept = [n for n in plan.graph.nodes if any("kept in float" in f for f in n.fused)]
        assert len(kept) == 20 and all(why in "; ".join(n.fused) for n in kept), [n.fused for n in kept]
    else:
        assert q8ta_convs, plan.dispatches
    assert_close_to_the_quantized_graph(got, qmodel, inputs)
