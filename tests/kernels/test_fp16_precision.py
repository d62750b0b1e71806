"""precision="fp16": the precision pass on graphs built inline, and float16 programs on the device.

The pass (runtime/graph/precision.py) runs on a finished plan. A test-only copy of `relu` named
`relu_fp32_only` (no float16 variants, ever) stands for an op that has none, so these tests do
not change meaning when more ops gain float16 variants. Tolerances: docs/precision.md.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import texelflow
from texelflow.runtime.graph.plan import plan_graph
from texelflow.runtime.graph.precision import apply_precision, half_features, has_half_variants
from texelflow.runtime.program import CompiledProgram
from tests.graph.synthetic import GraphBuilder, variant_of

FP32_ONLY = variant_of("relu", "relu_fp32_only", "ANY_STORAGE")


def layer_norm(g: GraphBuilder, x, width: int, weight=None):
    w = weight if weight is not None else g.const([width])
    return g.node("layer_norm", [("input", x), ("normalized_shape", [width]), ("weight", w), ("bias", g.const([width]))])


def planned(graph, precision="fp16", features=None, prune=False):
    """Plan, then narrow; every float16-capable node by default (prune=False), so the structure
    tests see the casts a lone float16 node needs."""
    plan = plan_graph(graph, "greedy")
    return plan, apply_precision(plan, precision, features, prune=prune)


def compiled(model, inputs, device, prune=False):
    """A float16 program with every float16-capable node narrowed (compile prunes by default)."""
    plan = texelflow.plan(model, inputs, device=device)
    apply_precision(plan, "fp16", device.enabled_features, prune=prune)
    return CompiledProgram(plan, plan.exported, device)


def ops_in_order(graph) -> list[str]:
    return [n.op.name for n in graph.nodes]


def test_chain_gets_casts_only_where_float16_meets_float32():
    g = GraphBuilder()
    x = g.input([2, 5, 7])
    a = layer_norm(g, x, 7)
    b = g.unary(FP32_ONLY, a)
    c = layer_norm(g, b, 7)
    plan, report = planned(g.output(c))
    assert ops_in_order(plan.graph) == ["cast_to_float16", "layer_norm", "cast_to_float32", "relu_fp32_only",
                                        "cast_to_float16", "layer_norm"]
    assert report.used == "fp16" and report.num_casts == 3 and len(report.half_nodes) == 2
    assert report.single_ops == {"relu_fp32_only": 1}
    assert (x.dtype, a.dtype, b.dtype, c.dtype) == ("float32", "float16", "float32", "float16")
    assert all(v.dtype == "float16" for v in plan.graph.constants)  # weights and biases, stored narrow
    assert len(report.half_constants) == 4
    # the output is float16 on the device and float32 for the caller (converted after the download)
    assert plan.graph.outputs == [c] and plan.graph.input_host_dtypes[c.name] == "float32"
    # every node reads what it was planned to read: casts keep their input's representation
    for n in plan.graph.nodes:
        for slot, v in n.tensor_args():
            if v.role.value != "const":
                assert plan.assignment.values[v] == plan.assignment.slots[(n, slot)], (n.name, slot)
    assert "precision=fp16: 2 nodes in float16, 3 casts, 4 float16 constants" in plan.summary()


def test_one_cast_per_value_shared_by_its_readers():
    g = GraphBuilder()
    x = g.input([3, 8])
    a, b = layer_norm(g, x, 8), layer_norm(g, x, 8)  # two float16 readers of one float32 input
    c, d = g.unary(FP32_ONLY, a), g.unary(FP32_ONLY, a)  # two float32 readers of one float16 value
    plan, report = planned(g.output(b, c, d))
    assert [n.op.name for n in plan.graph.nodes].count("cast_to_float16") == 1
    assert [n.op.name for n in plan.graph.nodes].count("cast_to_float32") == 1
    assert report.num_casts == 2
    readers = [n for n in plan.graph.nodes if n.op.name == "relu_fp32_only"]
    assert readers[0].arg("self") is readers[1].arg("self") and readers[0].arg("self").dtype == "float32"


def test_a_constant_read_by_both_precisions_gets_a_float16_copy():
    g = GraphBuilder()
    x = g.input([4, 6])
    w = g.const([6])
    a = layer_norm(g, x, 6, weight=w)
    b = g.unary(FP32_ONLY, w)
    plan, report = planned(g.output(a, b))
    ln = next(n for n in plan.graph.nodes if n.op.name == "layer_norm")
    relu = next(n for n in plan.graph.nodes if n.op.name == "relu_fp32_only")
    half_w = ln.arg("weight")
    assert half_w is not w and half_w.dtype == "float16" and half_w.name == f"{w.name}_fp16"
    assert relu.arg("self") is w and w.dtype == "float32"
    assert half_w in plan.graph.constants and w.users == [relu] and half_w.users == [ln]


def test_regions_whose_casts_cost_more_than_they_save_stay_float32():
    """compile's default: a lone layer norm between float32 ops would need a cast in and a cast
    out of its whole tensor (12 bytes an element) to save 4; a chain of six saves more."""
    g = GraphBuilder()
    x = g.input([64, 32])
    lone = layer_norm(g, g.unary(FP32_ONLY, x), 32)
    y = g.unary(FP32_ONLY, lone)
    for _ in range(6):
        y = layer_norm(g, y, 32)
    plan, report = planned(g.output(g.unary(FP32_ONLY, y)), prune=True)
    assert lone.dtype == "float32" and report.pruned_ops == {"layer_norm": 1}
    assert len(report.half_nodes) == 6 and report.num_casts == 2 and y.dtype == "float16"
    assert "(casts would cost more than float16 saves): layer_norm x1" in report.summary()


def test_a_device_without_the_features_runs_float32_and_the_plan_says_why():
    g = GraphBuilder()
    c = layer_norm(g, g.input([2, 7]), 7)
    lacking = frozenset({"storageBuffer16BitAccess"})  # 16-bit storage, no float16 arithmetic
    plan, report = planned(g.output(c), features=lacking)
    assert report.used == "fp32" and report.num_casts == 0 and not report.half_nodes
    assert "shaderFloat16" in report.reason and "fp32 variants used" in report.summary()
    assert all(v.dtype == "float32" for v in plan.graph.values())
    assert not has_half_variants("layer_norm", lacking) and has_half_variants("layer_norm", half_features())


def test_fp32_is_a_no_op_and_a_bad_precision_is_one_clear_line():
    g = GraphBuilder()
    c = layer_norm(g, g.input([2, 7]), 7)
    plan, report = planned(g.output(c), precision="fp32")
    assert report.summary() == "precision=fp32" and ops_in_order(plan.graph) == ["layer_norm"]
    with pytest.raises(ValueError, match=r"^precision='bf16': expected one of 'fp32', 'fp16'$"):
        texelflow.plan(nn.ReLU(), (torch.zeros(2),), precision="bf16")


# ---- on the device -----------------------------------------------------------------------------------
class NormBlock(nn.Module):
    """Float16-capable ops (layer norm, softmax, pooling, permute, cat, mean) around ones that may
    not be (relu, add)."""

    def __init__(self, width: int = 12):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        with torch.no_grad():
            for ln in (self.ln1, self.ln2):
                ln.weight.uniform_(0.5, 1.5)
                ln.bias.uniform_(-0.5, 0.5)

    def forward(self, x):  # x: [N, C, H, W] with W == width
        y = self.ln1(x)
        p = F.max_pool2d(y, 2, ceil_mode=True)
        s = F.softmax(self.ln2(torch.relu(y) + y), dim=-1)
        t = torch.cat([s, y.permute(0, 1, 3, 2)[..., : s.shape[-1]]], dim=1)
        return t.mean(dim=(2, 3)), p


def test_fp16_program_matches_fp32_within_tolerance(device):
    torch.manual_seed(3)
    model, x = NormBlock().eval(), torch.randn(1, 5, 12, 12) * 2 + 0.5
    with compiled(model, (x,), device) as p16, texelflow.compile(model, (x,), device=device) as p32:
        report = p16.plan.precision
        assert report.used == "fp16" and report.half_nodes and report.num_casts >= 1
        variants = [v for _, v in p16.dispatch_variants]
        assert any("float16" in v for v in variants) and "cast_to_float16_float32" in " ".join(variants)
        got16, got32 = p16(x), p32(x)
    for a, b in zip(got16, got32):
        assert a.dtype == torch.float32 and a.shape == b.shape
        rel = ((a - b).abs().max() / b.abs().max()).item()
        assert rel < 5e-3, rel


@pytest.mark.parametrize("shape,op", [((1, 197, 384), "layer_norm"), ((1, 6, 197, 197), "softmax"),
                                      ((1, 64, 56, 56), "max_pool2d"), ((1, 512, 7, 7), "adaptive_avg_pool2d")])
def test_fp16_kernels_at_model_sizes(device, shape, op):
    """ViT-S/16 and ResNet-18 shapes: the float16 program against torch in float32 on the same
    float16-rounded inputs and weights, within one float16 rounding of the output (rtol 2e-3)."""
    modules = {
        "layer_norm": lambda: nn.LayerNorm(shape[-1]),
        "softmax": lambda: nn.Softmax(dim=-1),
        "max_pool2d": lambda: nn.MaxPool2d(3, 2, 1),
        "adaptive_avg_pool2d": lambda: nn.AdaptiveAvgPool2d(1),
    }
    torch.manual_seed(7)
    model = modules[op]().eval()
    with torch.no_grad():
        for prm in model.parameters():
            prm.copy_((torch.rand_like(prm) + 0.5).half().float())
    x = (torch.randn(shape) * 3).half().float()  # exactly representable: the input cast is exact
    with compiled(model, (x,), device) as prog:
        assert prog.plan.precision.half_nodes, prog.plan.summary()
        assert any(v.startswith(op) and "_float16_" in v for _, v in prog.dispatch_variants), prog.dispatch_variants
        got = prog(x)
    with torch.no_grad():
        want = model(x).half().float()  # torch's float32 answer, rounded as the kernel's store
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=2e-3, atol=1e-4)
