"""Graphs from torchao's other PT2E quantizers, as users convert them: each plans with no CPU
fallback, runs, and gives the converted graph's answer.

- EmbeddingQuantizer: weight-only uint8 embeddings with per_channel_affine_float_qparams, whose
  zero points are floats (-min / scale per row), dequantized as torch does;
- ArmInductorQuantizer, static and dynamic;
- ComposableQuantizer of the embedding quantizer and XNNPACK's static config.
(X86InductorQuantizer: tests/graph/test_q8ta_fusion.py; dynamic configs:
test_dynamic_quantization.py.)
"""

from __future__ import annotations

import os
import warnings

import pytest
import torch
import torch.nn as nn

import texelflow
from texelflow.runtime.errors import QuantizationError
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

TOLERANCE = 1e-5  # of the output's largest value: float sums in another order than torch's


class EmbeddingModel(nn.Module):
    """Token embeddings into a linear, beside a small conv branch."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.proj = nn.Linear(16, 8)
        self.conv = nn.Conv2d(3, 8, 3)

    def forward(self, ids, image):
        return self.proj(self.embed(ids)).mean(1) + self.conv(image).mean((2, 3))


def _embedding():
    from torchao.quantization.pt2e.quantizer.embedding_quantizer import EmbeddingQuantizer

    return EmbeddingQuantizer()


def _arm(dynamic: bool):
    import torchao.quantization.pt2e.quantizer.arm_inductor_quantizer as arm

    return arm.ArmInductorQuantizer().set_global(arm.get_default_arm_inductor_quantization_config(is_dynamic=dynamic))


def _composable():
    from torchao.quantization.pt2e.quantizer.composable_quantizer import ComposableQuantizer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "XNNPACKQuantizer is deprecated"
        from torchao.testing.pt2e._xnnpack_quantizer import XNNPACKQuantizer, get_symmetric_quantization_config

        return ComposableQuantizer([_embedding(), XNNPACKQuantizer().set_global(get_symmetric_quantization_config())])


QUANTIZERS = {"embedding": _embedding, "arm_static": lambda: _arm(False), "arm_dynamic": lambda: _arm(True),
              "composable": _composable}


def _converted(name):
    torch.manual_seed(0)
    model = EmbeddingModel().eval()
    inputs = (torch.randint(0, 50, (2, 5)), torch.randn(1, 3, 9, 9))
    prepared = prepare_pt2e(torch.export.export(model, inputs).module(), QUANTIZERS[name]())
    prepared(*inputs)
    return convert_pt2e(prepared), inputs


@pytest.mark.parametrize("name", sorted(QUANTIZERS))
def test_other_quantizers_graphs_run_whole_and_match(name, device):
    converted, inputs = _converted(name)
    with texelflow.compile(converted, inputs, device=device) as prog:
        assert prog.plan.fallbacks == [], prog.plan.fallbacks
        got = prog(*inputs)
    with torch.no_grad():
        want = converted(*inputs)
    assert (got - want).abs().max() <= TOLERANCE * want.abs().max()


def test_float_zero_points_dequantize_as_torch_and_stay_float(device, tmp_path):
    """The embedding's uint8 rows are dequantized at prepack with their float zero points (the
    recipe torch's dequantize_per_channel computes), never taken as an int8 operand; the program
    saves and loads."""
    converted, inputs = _converted("embedding")
    plan = texelflow.plan(converted, inputs)
    weights = [v for v in plan.graph.constants if v.derive is not None and v.derive.recipe == "dequantized_per_channel"]
    assert weights and all(dict(v.derive.params).get("float_zero_points") for v in weights)
    assert not any(n.op is not None and n.op.name.startswith("q8ta") for n in plan.graph.nodes)
    with texelflow.compile(converted, inputs, device=device) as prog:
        got = prog(*inputs)
        path = os.fspath(tmp_path / "embedding.tflow")
        prog.save(path)
    with texelflow.load(path) as loaded:
        assert torch.equal(loaded(*inputs), got)


def test_non_finite_float_zero_points_are_refused_naming_the_node():
    converted, inputs = _converted("embedding")
    for node in converted.graph.nodes:
        if node.target == torch.ops.quantized_decomposed.dequantize_per_channel.default:
            zero_points = getattr(converted, node.args[2].target)
            zero_points[0] = float("inf")
            break
    with pytest.raises(QuantizationError, match="zero_points must be finite"):
        texelflow.plan(converted, inputs)
