"""Every zoo model with precision="fp16": it compiles, runs, and stays within tolerance of the same
model's float32 program (docs/precision.md).

Tolerance, on random inputs: the same top-1 class (per pixel for the U-Net decoder, at least 99%
of pixels), and max|fp16 - fp32| / max|fp32| <= 1e-2 (each stored float16 value carries a relative
rounding of at most 2**-11, over tens of layers). The convolutional models run at reduced input
sizes, as in test_zoo.py.
"""

from __future__ import annotations

import pytest
import torch

import texelflow
from texelflow.models import ZOO
from texelflow.runtime.graph.importer import export_program
from texelflow.runtime.graph.precision import apply_precision
from texelflow.runtime.program import CompiledProgram

SMALL_SIZES = {"vit_tiny": 32, "resnet18": 64, "mobilenet_v3_small": 96, "convnext_atto": 64, "unet_decoder": 64}
REL_TOLERANCE = 1e-2
PIXEL_AGREEMENT = 0.99


def fp16_program(ep, device, every_node: bool):
    """compile(precision="fp16") as users get it, or with every float16-capable node narrowed
    (no region left float32 for its casts' cost), which runs the most float16 kernels."""
    if not every_node:
        return texelflow.compile(ep, device=device, precision="fp16")
    plan = texelflow.plan(ep, device=device)
    apply_precision(plan, "fp16", device.enabled_features, prune=False)
    return CompiledProgram(plan, plan.exported, device)


@pytest.mark.parametrize("every_node", [False, True], ids=["compile", "every-node"])
@pytest.mark.parametrize("name", sorted(SMALL_SIZES))
def test_zoo_model_in_fp16_stays_close_to_fp32(name, every_node, device):
    model, inputs = ZOO[name](image_size=SMALL_SIZES[name])
    ep = export_program(model, inputs)
    with fp16_program(ep, device, every_node) as p16, texelflow.compile(ep, device=device) as p32:
        report = p16.plan.precision
        assert report.used == "fp16", report.summary()
        assert p16.plan.fallbacks == []
        # every float16 value meets a float32 reader through a cast: the count is the plan's
        assert report.num_casts == sum(1 for n in p16.plan.graph.nodes if n.op and n.op.name.startswith("cast_to_"))
        print(f"{name}: {report.summary()}")
        for seed in range(3):
            torch.manual_seed(seed)
            x = tuple(torch.randn_like(t) for t in inputs)
            got, want = p16(*x), p32(*x)
            assert got.dtype == torch.float32 and got.shape == want.shape
            rel = ((got - want).abs().max() / want.abs().max()).item()
            assert rel <= REL_TOLERANCE, f"{name} seed {seed}: relative error {rel:.3g} > {REL_TOLERANCE}"
            agree = (got.argmax(1) == want.argmax(1)).float().mean().item()
            if got.dim() == 2:
                assert agree == 1.0, f"{name} seed {seed}: top-1 differs from fp32"
            else:
                assert agree >= PIXEL_AGREEMENT, f"{name} seed {seed}: per-pixel top-1 agrees on {agree:.3f}"


def test_fp16_on_a_device_without_the_features_runs_fp32(device):
    """The plan says why; the program is the float32 one (no casts, no float16 tensor)."""
    model, inputs = ZOO["vit_tiny"]()
    plan = texelflow.plan(model, inputs)
    report = apply_precision(plan, "fp16", features=device.enabled_features - {"shaderFloat16"})
    assert report.used == "fp32" and "lacks shaderFloat16" in plan.summary()
    assert all(v.dtype != "float16" for v in plan.graph.values())
