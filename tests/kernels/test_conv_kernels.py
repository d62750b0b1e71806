"""The specialised convolution kernels the fusion pass chooses (runtime/graph/fusion.py step 6):
conv2d_pw (pointwise as a GEMM), conv2d_wino (Winograd F(2x2, 3x3)), the im2col form (conv_im2col,
linear_packed, permute_copy: other dense convs of at least 64 output channels), conv2d_gemm (any
other dense conv as an implicit GEMM) and conv2d_dw{3,5,7}_s1 / conv2d_dw{3,5}_s2 (depthwise, rows loaded
once), on their prepacked weights
(runtime/graph/prepack_conv.py). The generic registry test runs every sample of ops.yaml on the
kernels with random prepacked weights; here whole programs (fusion, prepack, kernel) are checked
against torch's conv2d on model-size and awkward shapes (outputs at least 4 wide or at most 3 tall: tall,
narrow ones keep the general kernel), with fused bias, batch norm and activations, and NaN / Inf propagation.

Tolerance (fp32, every kernel): |got - want| <= 1e-5 * max|want| + 1e-6. The pointwise kernel sums
the same products as torch in another order; Winograd adds the transforms' sums (its constants
are 1 and 1/2, exact in fp32), measured at 2-7e-7 of max|want| on ResNet-18's shapes.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import texelflow
from texelflow.runtime.graph.fusion import conv_kernel_class, fuse_patterns
from texelflow.runtime.graph.prepack_conv import (conv_im2col_reference, conv_im2col_weight_kn, winograd_f2_planes,
                                                  winograd_f2_weight)

# these tests name the register-tiled GEMMs and specialised convs: keep them on a GPU too (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("register_tiles")

REL = 1e-5


IM2COL = ["conv_im2col", "linear_packed", "permute_copy"]  # a dense conv's im2col form, in order
WINO4 = ["conv2d_wino4_input", "linear_packed", "conv2d_wino4_output"]  # Winograd F(4x4, 3x3), in order
# F(4x4, 3x3)'s transforms (coefficients up to 25 on the input, 64 on the output) round about ten
# times more than the direct sum: its outputs are compared within this, relative to the largest
REL_WINO4 = 1e-4


def _ops(plan) -> list[str]:
    return [n.op.name for n in plan.graph.device_nodes()]


def _expected(op) -> list[str]:
    return list(op) if isinstance(op, (list, tuple)) else [op]


def _close(got, want, rel=REL):
    tol = rel * float(want.abs().max()) + 1e-6
    err = float((got - want).abs().max())
    assert err <= tol, f"max error {err:.3g} > {tol:.3g}"


# ---- the choice, at plan time, from the conv's parameters (no device) ----------------------------------
@pytest.mark.parametrize("layer, op", [
    (nn.Conv2d(8, 12, 1), "conv2d_pw"),
    (nn.Conv2d(5, 7, 1, bias=False), "conv2d_pw"),
    (nn.Conv2d(8, 12, 1, stride=2), "conv2d_gemm"),           # strided: implicit GEMM
    (nn.Conv2d(8, 12, 1, padding=1), "conv2d_gemm"),          # padded 1x1
    (nn.Conv2d(8, 12, 3, padding=1), "conv2d_wino"),
    (nn.Conv2d(3, 5, 3), "conv2d_wino"),                      # no padding
    (nn.Conv2d(8, 12, 3, padding=1, stride=2), "conv2d_gemm"),
    (nn.Conv2d(8, 12, 3, padding=2, dilation=2), "conv2d_gemm"),
    (nn.Conv2d(8, 12, 3, padding=1, groups=2), "conv2d"),    # grouped: the general kernel
    (nn.Conv2d(8, 8, 3, padding=1, groups=8), "conv2d_dw3_s1"),
    (nn.Conv2d(8, 8, 5, padding=2, groups=8), "conv2d_dw5_s1"),
    (nn.Conv2d(8, 8, 3, padding=1, stride=2, groups=8), "conv2d_dw3_s2"),
    (nn.Conv2d(8, 8, 5, padding=2, stride=2, groups=8), "conv2d_dw5_s2"),
    (nn.Conv2d(8, 8, 3, padding=1, stride=(1, 2), groups=8), "conv2d_dw"),  # other strides: general
    (nn.Conv2d(8, 8, 3, padding=1, stride=3, groups=8), "conv2d_dw"),
    (nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=8), "conv2d_dw"),
    (nn.Conv2d(8, 8, 7, padding=3, groups=8), "conv2d_dw7_s1"),
    (nn.Conv2d(8, 8, 7, padding=3, stride=2, groups=8), "conv2d_dw"),  # no 7x7 stride-2 kernel
    (nn.Conv2d(8, 12, 5, padding=2), "conv2d_gemm"),
    (nn.Conv2d(3, 64, 7, stride=2, padding=3), IM2COL),      # 64 output channels or more: im2col + GEMM
    (nn.Conv2d(8, 72, 3, stride=2, padding=1), IM2COL),
    (nn.Conv2d(8, 65, 5, padding=2), IM2COL),
    (nn.Conv2d(3, 63, 7, stride=2, padding=3), "conv2d_gemm"),
    (nn.Conv2d(8, 72, 3, padding=1), "conv2d_wino"),          # classes before it keep their kernel
    (nn.Conv2d(64, 64, 3, padding=1), WINO4),                # 64 channels in and out: F(4x4) as a GEMM
    (nn.Conv2d(130, 256, 3), WINO4),
    (nn.Conv2d(64, 60, 3, padding=1), "conv2d_wino_runs"),    # fewer: the fused F(2x2) kernel
    (nn.Conv2d(48, 128, 3, padding=1), "conv2d_wino_runs"),
    (nn.Conv2d(8, 72, 3, padding=1, groups=2), "conv2d"),
])
def test_kernel_is_chosen_from_the_conv_parameters(layer, op):
    plan = texelflow.plan(layer.eval(), (torch.randn(1, layer.in_channels, 9, 9),))
    assert _ops(plan) == _expected(op)


def test_im2col_form_takes_the_activation_and_keeps_the_output():
    """The GEMM applies the conv's fused activation at its store; the permute writes the conv's own
    output value (its users and the graph's outputs untouched); the weight is prepacked [K4 * 4, N16 * 16]."""
    model = nn.Sequential(nn.Conv2d(3, 68, 7, stride=2, padding=3), nn.BatchNorm2d(68), nn.ReLU()).eval()
    plan = texelflow.plan(model, (torch.randn(1, 3, 21, 19),))
    im2col, gemm, permute = plan.graph.device_nodes()
    assert [n.op.name for n in (im2col, gemm, permute)] == IM2COL
    assert im2col.outputs[0][1].shape == (1, 11, 10, 3 * 49) and gemm.arg("input") is im2col.outputs[0][1]
    assert gemm.value("activation") == "relu" and gemm.arg("weight").shape == (148, 80)
    assert any("batch norm" in f for f in gemm.fused) and list(permute.value("dims")) == [0, 3, 1, 2]
    assert permute.outputs[0][1] in plan.graph.outputs and permute.outputs[0][1].shape == (1, 68, 11, 10)


def test_im2col_form_needs_the_shuffle_kernels():
    """Where the device cannot run linear_packed (subgroups of 4: no 8-lane shuffle groups), a
    dense conv stays on conv2d_gemm."""
    from texelflow.runtime.graph.importer import export_program
    from texelflow.runtime.graph.lowering import lower
    from texelflow.runtime.graph.prepack_matmul import SubgroupFacts

    model = nn.Conv2d(3, 64, 7, stride=2, padding=3).eval()
    for facts, want in ((SubgroupFacts(4, True), ["conv2d_gemm"]), (SubgroupFacts(8, True), IM2COL)):
        graph = lower(export_program(model, (torch.randn(1, 3, 15, 15),)))
        fuse_patterns(graph, subgroup=facts)
        assert [n.op.name for n in graph.device_nodes()] == want


@pytest.mark.parametrize("facts, want", [(None, WINO4), ((8, True), WINO4), ((16, True), WINO4),
                                         ((4, True), ["conv2d_wino"]), ((8, False), ["conv2d_wino"])])
def test_winograd4_needs_the_gemms_shuffles(facts, want):
    """F(4x4)'s products run on linear_packed, whose groups of 8 lanes share rows by
    subgroupShuffle: where subgroups do not hold them the conv keeps the fused F(2x2) kernel."""
    from texelflow.runtime.graph.importer import export_program
    from texelflow.runtime.graph.lowering import lower
    from texelflow.runtime.graph.prepack_matmul import SubgroupFacts

    model = nn.Conv2d(128, 128, 3, padding=1).eval()
    graph = lower(export_program(model, (torch.randn(1, 128, 9, 9),)))
    fuse_patterns(graph, subgroup=SubgroupFacts(*facts) if facts else None)
    assert [n.op.name for n in graph.device_nodes()] == want
    if want == WINO4:  # the transformed weight: one [Cin4 * 4, Cout16 * 16] matrix per position
        gemm = graph.device_nodes()[1]
        assert gemm.arg("weight").shape == (36, 128, 128) and gemm.arg("input").shape == (36, 16, 128)


def test_winograd4_keeps_its_intermediates_bounded():
    """F(4x4)'s transformed input and products are 2.25 times the input and output: past
    WINO4_MAX_BYTES (a large image) the conv keeps the fused F(2x2) kernel, which needs none."""
    from texelflow.runtime.graph.fusion import WINO4_MAX_BYTES

    layer = nn.Conv2d(64, 64, 3, padding=1).eval()
    side = 4 * int((WINO4_MAX_BYTES / (36 * 64 * 4)) ** 0.5) + 4  # just past the bound in 4x4 tiles
    for size, want in ((56, WINO4), (side, ["conv2d_wino_runs"])):
        plan = texelflow.plan(layer, (torch.randn(1, 64, size, size),))
        assert _ops(plan) == want, size


@pytest.mark.parametrize("cout, facts, want, why", [
    (64, None, "conv2d_wino_runs", None),
    (60, (8, True), "conv2d_wino_runs", None),
    (64, (4, True), "conv2d_wino", "subgroup size 4 is not a multiple of 8"),
    (64, (8, False), "conv2d_wino", "no subgroupShuffle in compute shaders"),
    (48, (8, True), "conv2d_wino", "48 output channels leave runs of 8 lanes idle"),
    (12, None, "conv2d_wino", "12 output channels leave runs of 8 lanes idle"),
])
def test_winograd_runs_need_shuffles_and_full_runs(cout, facts, want, why):
    """conv2d_wino_runs shares each input window over 8 lanes with subgroupShuffle, 8 output
    blocks a run: the fusion pass takes it where subgroups hold runs of 8 lanes with shuffle and
    the blocks fill the runs (fills_runs), else conv2d_wino, and the note says why."""
    from texelflow.runtime.graph.importer import export_program
    from texelflow.runtime.graph.lowering import lower
    from texelflow.runtime.graph.prepack_matmul import SubgroupFacts

    model = nn.Conv2d(8, cout, 3, padding=1).eval()
    graph = lower(export_program(model, (torch.randn(1, 8, 9, 9),)))
    fuse_patterns(graph, subgroup=SubgroupFacts(*facts) if facts else None)
    (node,) = graph.device_nodes()
    assert node.op.name == want
    notes = [f for f in node.fused if "not conv2d_wino_runs" in f]
    assert notes == ([f"conv2d_wino kernel (from conv2d), not conv2d_wino_runs: {why}"] if why else [])


@pytest.mark.parametrize("channels, full", [(1, False), (8, False), (12, False), (24, False), (48, False),
                                            (60, True), (64, True), (96, True), (100, False), (128, True),
                                            (512, True), (1000, True)])
def test_fills_runs_where_at_most_one_lane_in_8_idles(channels, full):
    """60 channels are 15 blocks (one lane idle in 16), 48 are 12 (4 in 16), 8 are 2 (6 in 8)."""
    from texelflow.runtime.graph.fusion import fills_runs

    assert fills_runs(channels) is full


def test_im2col_columns_times_the_prepacked_weight_is_the_conv():
    """k runs (ky, kx, ci) (with Cin % 4 == 0 a texel of the column matrix is one input texel);
    the prepacked weight's rows follow, so the GEMM is the conv, whatever Cin."""
    for cin in (3, 8):
        w = torch.randn(5, cin, 3, 2, dtype=torch.float64)
        x = torch.randn(2, cin, 6, 7, dtype=torch.float64)
        cols = conv_im2col_reference(x, (3, 2), (2, 1), (1, 0), (1, 1))
        packed = conv_im2col_weight_kn(w)
        got = cols @ packed[:cols.shape[-1], :5]
        want = torch.nn.functional.conv2d(x, w, stride=(2, 1), padding=(1, 0)).permute(0, 2, 3, 1)
        assert packed.shape == (-(-cin * 6 // 4) * 4, 16) and torch.allclose(got, want)


def test_narrow_outputs_stay_on_the_general_kernel():
    """The specialised kernels tile along W; a tall output narrower than 4 (conv1d as [N, C, L, 1])
    fits the general kernel's 4 x 8 tiles better. (ops.yaml samples cover narrow shapes on the
    specialised kernels; a 1 x 1 output, squeeze-excitation's, takes them.)"""
    model = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.Conv2d(8, 8, 1), nn.Conv1d(8, 8, 3))
    plan = texelflow.plan(nn.Sequential(*model[:2]).eval(), (torch.randn(1, 4, 9, 3),))
    assert _ops(plan) == ["conv2d", "conv2d"]
    plan = texelflow.plan(model[2].eval(), (torch.randn(1, 8, 20),))
    assert [n.op.name for n in plan.graph.device_nodes() if n.op.name.startswith("conv")] == ["conv2d"]
    plan = texelflow.plan(nn.Conv2d(16, 8, 1).eval(), (torch.randn(1, 16, 1, 1),))
    assert _ops(plan) == ["conv2d_pw"]


@pytest.mark.parametrize("act, op, name", [
    (nn.ReLU(), "conv2d_pw_act", "relu"), (nn.Hardswish(), "conv2d_pw_act", "hardswish"),
    (nn.Hardsigmoid(), "conv2d_pw_act", "hardsigmoid"),  # MobileNetV3's squeeze-excite gate
])
def test_pointwise_takes_the_fused_activation(act, op, name):
    model = nn.Sequential(nn.Conv2d(6, 10, 1), nn.BatchNorm2d(10), act).eval()
    plan = texelflow.plan(model, (torch.randn(1, 6, 5, 5),))
    (node,) = plan.graph.device_nodes()
    assert node.op.name == op and node.value("activation") == name and node.value("out_channels") == 10
    assert node.arg("weight").shape == (8, 12)  # [Cin4 * 4, Cout4 * 4]
    assert any("batch norm" in f for f in node.fused) and any("conv2d_pw_act kernel" in f for f in node.fused)


def test_winograd_takes_relu6_and_padding():
    model = nn.Sequential(nn.Conv2d(6, 10, 3, padding=(2, 0)), nn.ReLU6()).eval()
    plan = texelflow.plan(model, (torch.randn(1, 6, 7, 9),))
    (node,) = plan.graph.device_nodes()
    assert node.op.name == "conv2d_wino" and node.value("activation") == "hardtanh"
    assert (node.value("act_min"), node.value("act_max")) == (0.0, 6.0)
    assert list(node.value("padding")) == [2, 0] and node.arg("weight").shape == (3, 2, 256)  # [Cout4, Cin4, 256]


def test_choice_can_be_left_off():
    from texelflow.runtime.graph.importer import export_program
    from texelflow.runtime.graph.lowering import lower

    model = nn.Sequential(nn.Conv2d(4, 8, 1), nn.Conv2d(8, 8, 3, padding=1)).eval()
    graph = lower(export_program(model, (torch.randn(1, 4, 6, 6),)))
    fuse_patterns(graph, choose_kernels=False)
    assert [n.op.name for n in graph.device_nodes()] == ["conv2d", "conv2d"]
    assert [conv_kernel_class(n) for n in graph.device_nodes()] == ["pointwise", "winograd"]


def test_winograd_weight_transform_is_g_g_gt():
    w = torch.randn(5, 3, 3, 3, dtype=torch.float64)
    packed = winograd_f2_weight(w)
    assert packed.shape == (2, 1, 256)  # [Cout4, Cin4, 16 positions x 4 input x 4 output channels]
    u = winograd_f2_planes(packed)
    assert u.shape == (16, 4, 8) and not u[:, 3:].any() and not u[:, :, 5:].any()  # zero padding
    g = torch.tensor([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], dtype=torch.float64)
    want = (g @ w @ g.t()).permute(2, 3, 1, 0).reshape(16, 3, 5)
    assert torch.equal(u[:, :3, :5], want)
    # element 16 p + 4 q + l of row (blk, b) is U[p][4 b + q][4 blk + l]: one texel, 4 output channels
    assert torch.equal(packed[1, 0, 16 * 5 + 4 * 2: 16 * 5 + 4 * 2 + 4], u[5, 2, 4:8])


# ---- whole programs against torch (device) -------------------------------------------------------------
CASES = [  # (layer(s), input shape, the op expected)
    (lambda: nn.Conv2d(64, 64, 3, padding=1), (1, 64, 56, 56), WINO4),                # ResNet-18 layer1
    (lambda: nn.Conv2d(48, 64, 3, padding=1), (1, 48, 28, 28), "conv2d_wino_runs"),
    (lambda: nn.Sequential(nn.Conv2d(128, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU()),
     (2, 128, 14, 14), WINO4),                                                          # ResNet-18 layer3
    # F(4x4) on awkward shapes: channels not a multiple of 4, sizes 1 / 3 / 5 / 7, batch 3, no
    # padding, wide padding, tiles past the image (7 = 4 + 3), activations at the store
    (lambda: nn.Conv2d(130, 129, 3, padding=1), (1, 130, 7, 5), WINO4),
    (lambda: nn.Sequential(nn.Conv2d(131, 133, 3, bias=False), nn.Hardswish()), (3, 131, 5, 7), WINO4),
    (lambda: nn.Sequential(nn.Conv2d(128, 128, 3, padding=(2, 0)), nn.GELU()), (1, 128, 1, 3), WINO4),
    (lambda: nn.Sequential(nn.Conv2d(256, 128, 3, padding=1), nn.ReLU6()), (2, 256, 3, 1), WINO4),
    (lambda: nn.Conv2d(96, 24, 1), (1, 96, 28, 28), "conv2d_pw"),                     # MobileNetV3
    (lambda: nn.Sequential(nn.Conv2d(16, 72, 1), nn.ReLU6()), (1, 16, 56, 56), "conv2d_pw_act"),
    (lambda: nn.Sequential(nn.Conv2d(576, 130, 1), nn.Hardswish()), (1, 576, 7, 7), "conv2d_pw_act"),
    # awkward: sizes 1 / 3 / 5 / 7, channels not a multiple of 4, batch 2, no bias, padding
    (lambda: nn.Conv2d(3, 5, 3, padding=1), (2, 3, 7, 5), "conv2d_wino"),
    (lambda: nn.Conv2d(5, 7, 3, bias=False), (2, 5, 3, 7), "conv2d_wino"),
    (lambda: nn.Sequential(nn.Conv2d(7, 3, 3, padding=(0, 2)), nn.SiLU()), (1, 7, 5, 3), "conv2d_wino"),
    (lambda: nn.Conv2d(1, 3, 3, padding=1), (1, 1, 1, 5), "conv2d_wino"),  # (1 -> 1 is depthwise)
    (lambda: nn.Sequential(nn.Conv2d(9, 6, 3, padding=1), nn.GELU()), (1, 9, 17, 11), "conv2d_wino"),
    (lambda: nn.Conv2d(5, 60, 3, padding=(1, 0)), (2, 5, 3, 7), "conv2d_wino_runs"),  # a lane idle in 16
    (lambda: nn.Conv2d(5, 3, 1, bias=False), (2, 5, 3, 7), "conv2d_pw"),
    (lambda: nn.Conv2d(257, 9, 1), (2, 257, 7, 9), "conv2d_pw"),  # shape class deep: two output blocks a tile
    (lambda: nn.Sequential(nn.Conv2d(1, 7, 1), nn.Hardtanh(-1.0, 1.5)), (1, 1, 5, 7), "conv2d_pw_act"),
    (lambda: nn.Sequential(nn.Conv2d(13, 1, 1), nn.SiLU()), (2, 13, 1, 5), "conv2d_pw_act"),
    (lambda: nn.Sequential(nn.Conv2d(9, 6, 1), nn.Hardsigmoid()), (1, 9, 3, 5), "conv2d_pw_act"),
    (lambda: nn.Sequential(nn.Conv2d(96, 96, 3, padding=1, groups=96), nn.BatchNorm2d(96), nn.ReLU()),
     (1, 96, 28, 28), "conv2d_dw3_s1"),                                                 # MobileNetV3
    (lambda: nn.Sequential(nn.Conv2d(240, 240, 5, padding=2, groups=240), nn.Hardswish()), (1, 240, 14, 14),
     "conv2d_dw5_s1"),
    (lambda: nn.Conv2d(7, 7, 3, groups=7), (2, 7, 3, 7), "conv2d_dw3_s1"),
    (lambda: nn.Conv2d(3, 3, 5, padding=(1, 2), groups=3, bias=False), (1, 3, 7, 5), "conv2d_dw5_s1"),
    (lambda: nn.Conv2d(5, 5, 3, padding=1, groups=5), (2, 5, 1, 5), "conv2d_dw3_s1"),
    (lambda: nn.Conv2d(40, 40, 7, padding=3, groups=40), (1, 40, 14, 14), "conv2d_dw7_s1"),         # ConvNeXt
    (lambda: nn.Sequential(nn.Conv2d(5, 5, 7, padding=(3, 1), groups=5), nn.GELU()), (2, 5, 3, 9), "conv2d_dw7_s1"),
    (lambda: nn.Sequential(nn.Conv2d(72, 72, 3, stride=2, padding=1, groups=72), nn.BatchNorm2d(72), nn.ReLU()),
     (1, 72, 56, 56), "conv2d_dw3_s2"),                                                 # MobileNetV3
    (lambda: nn.Sequential(nn.Conv2d(96, 96, 5, stride=2, padding=2, groups=96), nn.Hardswish()), (1, 96, 28, 28),
     "conv2d_dw5_s2"),
    (lambda: nn.Conv2d(5, 5, 3, stride=2, groups=5), (2, 5, 7, 9), "conv2d_dw3_s2"),     # no padding, odd sizes
    (lambda: nn.Conv2d(3, 3, 5, stride=2, padding=(2, 1), groups=3, bias=False), (1, 3, 5, 13), "conv2d_dw5_s2"),
    (lambda: nn.Conv2d(7, 7, 3, stride=2, padding=1, groups=7), (1, 7, 1, 9), "conv2d_dw3_s2"),
    (lambda: nn.Sequential(nn.Conv2d(3, 64, 7, stride=2, padding=3), nn.BatchNorm2d(64), nn.ReLU()),
     (1, 3, 224, 224), IM2COL),                                                         # ResNet-18 stem
    (lambda: nn.Conv2d(64, 128, 3, stride=2, padding=1), (1, 64, 56, 56), IM2COL),
    (lambda: nn.Conv2d(64, 128, 1, stride=2, bias=False), (2, 64, 28, 28), IM2COL),
    (lambda: nn.Conv2d(3, 384, 16, stride=16), (1, 3, 48, 64), IM2COL),                 # ViT patch embedding
    (lambda: nn.Sequential(nn.Conv2d(5, 65, 3, stride=2), nn.Hardswish()), (2, 5, 7, 9), IM2COL),
    (lambda: nn.Sequential(nn.Conv2d(12, 69, (5, 3), stride=(1, 2), padding=(2, 1), dilation=(1, 2)), nn.GELU()),
     (1, 12, 9, 11), IM2COL),
    (lambda: nn.Conv2d(7, 64, 2, stride=3, padding=(1, 0), bias=False), (1, 7, 5, 13), IM2COL),
    (lambda: nn.Conv2d(4, 68, 3, stride=2, padding=1), (1, 4, 1, 7), IM2COL),
    (lambda: nn.Sequential(nn.Conv2d(5, 7, (5, 3), stride=(1, 2), padding=(2, 1), dilation=(1, 2)), nn.SiLU()),
     (2, 5, 9, 11), "conv2d_gemm"),
    (lambda: nn.Conv2d(7, 3, 2, stride=3, padding=(1, 0)), (1, 7, 5, 13), "conv2d_gemm"),
    (lambda: nn.Conv2d(1, 5, 3, stride=2, padding=1), (1, 1, 1, 9), "conv2d_gemm"),
]


@pytest.mark.parametrize("make, shape, op", CASES, ids=[f"{_expected(c[2])[0]}-{'x'.join(map(str, c[1]))}" for c in CASES])
def test_matches_torch(device, make, shape, op):
    torch.manual_seed(0)
    model = make().eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-1, 1), m.running_var.uniform_(0.5, 2), m.weight.uniform_(0.5, 2)
    x = torch.rand(shape) * 20 - 10  # values up to ~10
    with torch.no_grad():
        want = model(x)
    with texelflow.compile(model, (x,), device=device) as prog:
        assert _ops(prog.plan) == _expected(op)
        _close(prog(x), want, REL_WINO4 if op == WINO4 else REL)


@pytest.mark.parametrize("layer", [nn.Conv2d(6, 5, 1), nn.Conv2d(6, 5, 3, padding=1),
                                   nn.Conv2d(6, 6, 5, padding=2, groups=6), nn.Conv2d(6, 6, 7, padding=3, groups=6),
                                   nn.Conv2d(6, 6, 3, stride=2, padding=1, groups=6),
                                   nn.Conv2d(6, 6, 5, stride=2, padding=2, groups=6),
                                   nn.Conv2d(6, 5, 3, stride=2, padding=1), nn.Conv2d(6, 72, 3, stride=2, padding=1),
                                   nn.Conv2d(8, 72, 3, stride=2, padding=1)],
                         ids=["pointwise", "winograd", "depthwise", "depthwise7", "depthwise3s2", "depthwise5s2", "gemm",
                              "im2col", "im2col_cin8"])
def test_nan_reaches_exactly_the_outputs_whose_window_holds_it(device, layer):
    torch.manual_seed(1)
    layer = layer.eval()
    x = torch.randn(2, layer.in_channels, 9, 7)
    x[0, 2, 4, 3] = float("nan")
    x[1, 5, 0, 6] = float("nan")  # at a corner: the padded windows
    with torch.no_grad():
        want = layer(x)
    with texelflow.compile(layer, (x,), device=device) as prog:
        got = prog(x)
    assert torch.equal(got.isnan(), want.isnan()) and want.isnan().any()
    finite = ~want.isnan()
    _close(got[finite], want[finite])


def test_pointwise_infinities_as_torch(device):
    layer = nn.Conv2d(4, 6, 1).eval()
    x = torch.randn(1, 4, 3, 5)
    x[0, 1, 1, 2], x[0, 3, 2, 4], x[0, 0, 2, 4] = float("inf"), float("-inf"), float("inf")  # +inf - inf: NaN
    with torch.no_grad():
        want = layer(x)
    with texelflow.compile(layer, (x,), device=device) as prog:
        got = prog(x)
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf())
    assert torch.equal(got[want.isinf()], want[want.isinf()])


WINO_SPECIALS = [  # (layer, input shape, indices that get NaN, +Inf, -Inf in turn)
    # tile corners and edges (tiles start at even output rows / columns), several channels
    (nn.Conv2d(6, 5, 3, padding=1), (1, 6, 9, 11),
     [(0, 0, 0, 0), (0, 1, 3, 3), (0, 5, 4, 7), (0, 2, 8, 10), (0, 3, 5, 2), (0, 4, 6, 9)]),
    # no padding: Infs on the border rows / columns that only edge windows read
    (nn.Conv2d(7, 3, 3), (2, 7, 7, 9), [(0, 6, 6, 8), (1, 0, 0, 8), (1, 3, 6, 0), (0, 2, 3, 2)]),
    # wide padding: windows past the border, one channel in, odd sizes
    (nn.Sequential(nn.Conv2d(1, 7, 3, padding=(2, 1)), nn.ReLU()), (1, 1, 5, 7),
     [(0, 0, 4, 6), (0, 0, 0, 1), (0, 0, 2, 0)]),
    # +Inf and -Inf in one window (NaN in torch too) and Infs alone in other windows
    (nn.Conv2d(5, 9, 3, padding=1), (1, 5, 5, 9), [(0, 1, 0, 8), (0, 0, 2, 4), (0, 4, 2, 5), (0, 3, 4, 1)]),
    # 60 output channels: conv2d_wino_runs, its runs of 8 lanes sharing each window, one lane idle in 16
    (nn.Conv2d(6, 60, 3, padding=1), (2, 6, 7, 9), [(0, 0, 0, 0), (1, 5, 6, 8), (0, 3, 3, 4), (1, 2, 0, 5)]),
    # 128 channels: F(4x4) (4x4 tiles start at multiples of 4), corners, tile edges, both images
    (nn.Conv2d(128, 130, 3, padding=1), (2, 128, 9, 7),
     [(0, 0, 0, 0), (1, 127, 8, 6), (0, 5, 3, 4), (1, 64, 4, 3), (0, 9, 7, 0), (1, 3, 0, 5)]),
    (nn.Sequential(nn.Conv2d(129, 128, 3), nn.ReLU()), (1, 129, 6, 11), [(0, 1, 5, 10), (0, 128, 0, 0), (0, 7, 2, 4)]),
]


@pytest.mark.parametrize("layer, shape, where", WINO_SPECIALS, ids=[f"wino-{i}" for i in range(len(WINO_SPECIALS))])
def test_winograd_infinities_and_nan_as_torch(device, layer, shape, where):
    """An Inf must not become NaN in its tile's other outputs (the transforms' Inf - Inf): the
    outputs that come out NaN are recomputed directly, so NaN positions, Inf positions and signs
    equal torch's and the finite outputs stay within the tolerance."""
    torch.manual_seed(len(where))
    layer = layer.eval()
    x = torch.randn(shape) * 3
    for i, idx in enumerate(where):
        x[idx] = (float("nan"), float("inf"), float("-inf"))[i % 3]
    with torch.no_grad():
        want = layer(x)
    with texelflow.compile(layer, (x,), device=device) as prog:
        ops = _ops(prog.plan)
        assert set(ops) & {"conv2d_wino", "conv2d_wino_runs", "conv2d_wino4_output"}
        got = prog(x)
    assert want.isinf().any() and want.isnan().any() and want.isfinite().any()
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.isinf(), want.isinf()) and torch.equal(got[want.isinf()], want[want.isinf()])
    fin = want.isfinite()
    _close(got[fin], want[fin], REL_WINO4 if ops == WINO4 else REL)
