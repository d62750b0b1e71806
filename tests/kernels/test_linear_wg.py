"""linear_wg and mm_wg, the workgroup-tiled GEMMs a GPU takes (shaders/_gemm_wg.glsl.j2): which
devices choose them (runtime/graph/prepack_matmul.py gemm_tiles), and their numbers against torch,
run here on lavapipe with TEXELFLOW_GEMM=workgroup: awkward sizes (1, 3, 5, 7, 13; K and N off the
4 / 16 / 64 grids; several 64 x 64 blocks; batch dims), NaN and Inf, fused activations, float16,
the im2col GEMM of a dense conv, mm and bmm. Also a GPU's other workgroup forms: split K
(linear_wg_splitk + linear_splitk_sum), the one-row GEMV (linear_gemv_wg) and the global
average pool (global_avg_pool_wg). The generic test_registry_ops.py runs every variant on its
ops.yaml samples besides.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import texelflow
from texelflow.runtime.graph.fusion import CONV_ENV, fuse_patterns
from texelflow.runtime.graph.importer import export_program
from texelflow.runtime.graph.lowering import lower
from texelflow.runtime.graph.prepack_matmul import (GEMM_ENV, SPLITK_ENV, SPLITK_MIN_STEPS, SubgroupFacts, gemm_tiles,
                                                     split_count, splitk_texels, subgroup_facts)

BUFFERS_ONLY = (0, 0, 0)  # texture limits no tensor fits: every representation is a buffer
GPU = SubgroupFacts(32, True, "discrete")
CPU = SubgroupFacts(8, True, "cpu")


@pytest.fixture
def workgroup_tiles(monkeypatch):
    monkeypatch.setenv(GEMM_ENV, "workgroup")


def _ops(model, inputs, facts):
    graph = fuse_patterns(lower(export_program(model, inputs)), subgroup=facts)
    return graph.device_nodes()


# ---- the choice (planner only: no device) ---------------------------------------------------------------
@pytest.mark.parametrize("facts,want", [
    (GPU, "linear_wg"), (SubgroupFacts(64, True, "integrated"), "linear_wg"),
    (SubgroupFacts(32, True, "virtual"), "linear_wg"),
    (SubgroupFacts(4, True, "integrated"), "linear_wg"),  # subgroups too small to shuffle: it shuffles nothing
    (SubgroupFacts(32, True, "discrete", 256), "linear_wg"),
    (SubgroupFacts(16, True, "integrated", 128), "linear_packed"),  # workgroups too small for the tiles
    (CPU, "linear_packed"), (SubgroupFacts(8, True, "other"), "linear_packed"), (None, "linear_packed"),
])
def test_gpus_take_workgroup_tiles(facts, want, monkeypatch):
    monkeypatch.delenv(GEMM_ENV, raising=False)
    nodes = _ops(nn.Linear(7, 5), [torch.randn(3, 7)], facts)
    assert [n.op.name for n in nodes] == [want]
    assert any(want in note and "weight prepacked" in note for note in nodes[0].fused), nodes[0].fused
    # one row takes a GEMV kernel: K shared by 64 invocations where GEMMs take workgroup tiles
    gemv = "linear_gemv_wg" if want == "linear_wg" else "linear_packed_gemv"
    assert [n.op.name for n in _ops(nn.Linear(7, 5), [torch.randn(1, 7)], facts)] == [gemv]


def test_environment_overrides_the_device(monkeypatch):
    monkeypatch.setenv(GEMM_ENV, "workgroup")
    assert gemm_tiles(CPU) == ("workgroup", f"{GEMM_ENV}=workgroup")
    assert [n.op.name for n in _ops(nn.Linear(7, 5), [torch.randn(3, 7)], CPU)] == ["linear_wg"]
    monkeypatch.setenv(GEMM_ENV, "Register")
    assert [n.op.name for n in _ops(nn.Linear(7, 5), [torch.randn(3, 7)], GPU)] == ["linear_packed"]
    monkeypatch.setenv(GEMM_ENV, "auto")
    assert gemm_tiles(GPU) == ("workgroup", "a discrete GPU")
    assert gemm_tiles(CPU) == ("register", "a cpu device")
    assert gemm_tiles(SubgroupFacts(16, True, "integrated", 128)) == (
        "register", "an integrated GPU with 128 invocations per workgroup (workgroup tiles need 256)")
    monkeypatch.setenv(GEMM_ENV, "workgroup")
    with pytest.raises(ValueError, match=r"TEXELFLOW_GEMM=workgroup: this device runs at most 128 invocations per "
                                         r"workgroup; workgroup tiles need 256"):
        _ops(nn.Linear(7, 5), [torch.randn(3, 7)], SubgroupFacts(16, True, "integrated", 128))
    monkeypatch.setenv(GEMM_ENV, "shared")
    with pytest.raises(ValueError, match=r"TEXELFLOW_GEMM='shared': expected one of auto, workgroup, register"):
        _ops(nn.Tanh(), [torch.randn(3, 7)], GPU)  # refused even where no linear would read it


def test_gpu_activation_fusion_and_im2col(monkeypatch):
    """On a GPU the fused activation and the im2col GEMM of a dense conv take linear_wg too."""
    monkeypatch.delenv(GEMM_ENV, raising=False)
    mlp = nn.Sequential(nn.Linear(8, 16), nn.GELU())
    nodes = _ops(mlp, [torch.randn(5, 8)], GPU)
    assert [n.op.name for n in nodes] == ["linear_wg"] and nodes[0].value("activation") == "gelu"
    stem = nn.Conv2d(3, 64, 7, stride=2, padding=3)
    names = [n.op.name for n in _ops(stem, [torch.randn(1, 3, 16, 16)], GPU)]
    assert names == ["conv_im2col", "linear_wg_splitk", "linear_splitk_sum", "permute_copy"]  # 1 block: split K
    assert [n.op.name for n in _ops(stem, [torch.randn(1, 3, 16, 16)], CPU)][1] == "linear_packed"


@pytest.mark.parametrize("conv,want_cpu", [
    (nn.Conv2d(5, 7, 3, padding=1), "conv2d_wino"),  # Winograd class, 7 channels
    (nn.Conv2d(6, 13, 1), "conv2d_pw"),  # pointwise class
    (nn.Conv2d(4, 6, 5, padding=2), "conv2d_gemm"),  # dense class, under IM2COL_MIN_COUT channels
])
def test_gpu_convs_take_the_im2col_gemm(conv, want_cpu, monkeypatch):
    """Where GEMMs take workgroup tiles every groups=1 conv takes conv_im2col + linear_wg, its note
    saying why; TEXELFLOW_CONV=specialised keeps the specialised kernels, =im2col forces the form on
    a CPU device too; depthwise convs keep theirs."""
    monkeypatch.delenv(GEMM_ENV, raising=False)
    monkeypatch.delenv(CONV_ENV, raising=False)
    x = [torch.randn(1, conv.in_channels, 9, 9)]
    nodes = _ops(conv, x, GPU)
    assert [n.op.name for n in nodes] == ["conv_im2col", "linear_wg", "permute_copy"]
    if want_cpu != "conv2d_gemm":
        assert any("im2col form: GEMMs take workgroup tiles" in note for note in nodes[1].fused), nodes[1].fused
    assert [n.op.name for n in _ops(conv, x, CPU)] == [want_cpu]
    monkeypatch.setenv(CONV_ENV, "specialised")
    assert [n.op.name for n in _ops(conv, x, GPU)] == [want_cpu]
    monkeypatch.setenv(CONV_ENV, "im2col")
    nodes = _ops(conv, x, CPU)
    assert [n.op.name for n in nodes] == ["conv_im2col", "linear_packed", "permute_copy"]
    depthwise = nn.Conv2d(8, 8, 3, padding=1, groups=8)
    assert [n.op.name for n in _ops(depthwise, [torch.randn(1, 8, 9, 9)], GPU)] == ["conv2d_dw3_s1"]
    monkeypatch.setenv(CONV_ENV, "winograd")
    with pytest.raises(ValueError, match=r"TEXELFLOW_CONV='winograd': expected one of auto, im2col, specialised"):
        _ops(conv, x, GPU)


def test_lavapipe_keeps_register_tiles(device, monkeypatch):
    monkeypatch.delenv(GEMM_ENV, raising=False)
    facts = subgroup_facts(device.limits)
    assert facts.device_type == device.limits.device_type
    if device.limits.device_type != "cpu":
        pytest.skip(f"not a CPU device: {device.limits.name}")
    assert [n.op.name for n in _ops(nn.Linear(7, 5), [torch.randn(3, 7)], facts)] == ["linear_packed"]


# ---- numbers against torch, on this device --------------------------------------------------------------
def run(model, inputs, storage: str, precision: str = "fp32"):
    limits = BUFFERS_ONLY if storage == "buffer" else None
    with texelflow.compile(model, inputs, texture_limits=limits, precision=precision) as prog:
        return prog(*inputs), prog.plan


def assert_close(got, want, rtol=1e-4, atol=1e-4):
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol, equal_nan=True)


@pytest.mark.parametrize("storage", ["texture3d", "buffer"])
@pytest.mark.parametrize("m,k,n", [(3, 1, 7), (5, 13, 3), (7, 5, 13), (13, 7, 1), (2, 16, 16),
                                   (65, 17, 67), (130, 36, 129), (64, 64, 64)])
def test_awkward_sizes(m, k, n, storage, workgroup_tiles):
    torch.manual_seed(m * 1000 + k * 10 + n)
    model = nn.Linear(k, n, bias=(m + k + n) % 2 == 0).eval()
    x = torch.randn(m, k)
    got, plan = run(model, (x,), storage)
    assert plan.dispatches["linear_wg"] == 1, plan.dispatches
    assert all(r.startswith("BUFFER") for r in plan.reprs.values()) == (storage == "buffer")
    with torch.no_grad():
        assert_close(got, model(x))


@pytest.mark.parametrize("storage", ["texture3d", "buffer"])
@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 1, 3, 13), (3, 33, 9)])
def test_batch_dims(shape, storage, workgroup_tiles):
    """Rows are every dim but the last, flattened: blocks of 64 rows cross the batch dims."""
    torch.manual_seed(len(shape) + shape[-1])
    model = nn.Linear(shape[-1], 70, bias=True).eval()
    x = torch.randn(*shape)
    got, plan = run(model, (x,), storage)
    assert plan.dispatches["linear_wg"] == 1, plan.dispatches
    with torch.no_grad():
        assert_close(got, model(x))


@pytest.mark.parametrize("storage", ["texture3d", "buffer"])
def test_nan_inf_propagate_as_torch(storage, workgroup_tiles):
    torch.manual_seed(2)
    model = nn.Linear(21, 70, bias=True).eval()
    x = torch.randn(67, 21)
    x[0, 1] = float("nan")
    x[66, 20] = float("inf")
    x[33, 3] = float("-inf")
    got, _ = run(model, (x,), storage)
    with torch.no_grad():
        want = model(x)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    assert_close(got, want)


@pytest.mark.parametrize("act", [nn.ReLU(), nn.ReLU6(), nn.Hardswish(), nn.SiLU(), nn.GELU(), nn.GELU("tanh")],
                         ids=lambda a: type(a).__name__ + getattr(a, "approximate", ""))
def test_fused_activations(act, workgroup_tiles):
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(19, 37), act).eval()
    x = torch.randn(70, 19) * 3
    got, plan = run(model, (x,), "texture3d")
    assert plan.dispatches == {"linear_wg": 1}, plan.dispatches
    with torch.no_grad():
        assert_close(got, model(x))


@pytest.mark.parametrize("k,n,rows,kernel", [(45, 66, 70, "linear_wg"), (500, 40, 9, "linear_wg_splitk")])
def test_float16(k, n, rows, kernel, workgroup_tiles, monkeypatch):
    """float16 storage, float32 accumulation, one rounding at the store (docs/precision.md); split
    K's float16 slices, summed in float32, within the same tolerance."""
    monkeypatch.delenv(SPLITK_ENV, raising=False)
    torch.manual_seed(4)
    model = nn.Linear(k, n, bias=True).eval()
    x = torch.randn(rows, k)
    got, plan = run(model, (x,), "texture3d", precision="fp16")
    assert plan.dispatches[kernel] == 1, plan.dispatches
    with torch.no_grad():
        want = model(x)
    assert_close(got, want, rtol=2e-3, atol=2e-3 * float(want.abs().max()))


def test_im2col_conv_and_a_vit_linear(workgroup_tiles):
    """A dense conv's GEMM (ResNet's stem, 64 channels) and one ViT-S/16 linear at full size."""
    torch.manual_seed(5)
    stem = nn.Conv2d(3, 64, 7, stride=2, padding=3).eval()
    x = torch.randn(1, 3, 30, 30)
    got, plan = run(stem, (x,), "texture3d")
    assert plan.dispatches["linear_wg_splitk"] == 1, plan.dispatches  # 4 blocks of 64 x 64: 2 slices along K
    with torch.no_grad():
        assert_close(got, stem(x), rtol=1e-4, atol=2e-4)
    qkv = nn.Linear(384, 1152).eval()
    x = torch.randn(1, 197, 384)
    got, _ = run(qkv, (x,), "texture3d")
    with torch.no_grad():
        assert_close(got, qkv(x), rtol=1e-4, atol=2e-4)


@pytest.mark.parametrize("cin,cout,k,size", [(3, 5, 3, 7), (7, 1, 3, 5), (5, 13, 1, 3), (13, 3, 1, 1)])
def test_gpu_form_convs_against_torch(cin, cout, k, size, workgroup_tiles):
    """Winograd- and pointwise-class convs with awkward channels and sizes in the im2col form a GPU
    gives them, NaN and Inf included."""
    torch.manual_seed(cin * 100 + cout * 10 + k)
    conv = nn.Sequential(nn.Conv2d(cin, cout, k, padding=k // 2), nn.ReLU()).eval()
    x = torch.randn(1, cin, size, size)
    x[0, 0, 0, 0] = float("nan")
    x[0, -1, -1, -1] = float("inf")
    got, plan = run(conv, (x,), "texture3d")
    if size == 1 and k == 1:  # a pointwise conv of one output pixel: a GEMV on channels-packed texels
        assert plan.dispatches == {"conv2d_pw_gemv_wg": 1}, plan.dispatches
    else:
        gemm = "linear_gemv_wg" if size == 1 else "linear_wg"  # one output pixel: one row
        assert plan.dispatches[gemm] == 1 and plan.dispatches["conv_im2col"] == 1, plan.dispatches
    with torch.no_grad():
        assert_close(got, conv(x))


# ---- linear_gemv_wg: one row on a GPU -------------------------------------------------------------------
@pytest.mark.parametrize("storage", ["texture3d", "buffer"])
@pytest.mark.parametrize("k,n,act", [(1, 1, None), (5, 7, nn.ReLU()), (13, 130, nn.Hardswish()), (577, 144, None),
                                     (576, 1000, nn.GELU()), (64, 3, nn.SiLU())], ids=str)
def test_gemv_wg_against_torch(k, n, act, storage, workgroup_tiles):
    """K of 1 to 577 (under, at and past 2 x 64 texels: several per invocation), N off the 4 / 16
    grids, bias or none, fused activations, NaN and Inf."""
    torch.manual_seed(k * 10 + n)
    layers = [nn.Linear(k, n, bias=n % 2 == 0)] + ([act] if act is not None else [])
    model = nn.Sequential(*layers).eval()
    x = torch.randn(1, k) * 2
    x[0, 0] = float("nan") if k > 3 else x[0, 0]
    if k > 5 and not isinstance(act, nn.GELU):  # torch's exact gelu of +Inf is NaN or +Inf by size
        x[0, -1] = float("inf")
    got, plan = run(model, (x,), storage)
    assert plan.dispatches == {"linear_gemv_wg": 1}, plan.dispatches
    with torch.no_grad():
        want = model(x)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    assert_close(got, want)


def test_gemv_wg_float16_and_a_squeeze_excite_block(workgroup_tiles):
    """MobileNetV3's squeeze-excite: a global pool, then two 1 x 1 convs of one pixel each, which
    take conv2d_pw_gemv_wg on channels-packed textures; and the same in float16 storage."""
    torch.manual_seed(7)

    class SqueezeExcite(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Conv2d(96, 24, 1), nn.Conv2d(24, 96, 1)

        def forward(self, x):
            s = torch.nn.functional.adaptive_avg_pool2d(x, 1)
            return x * torch.nn.functional.hardsigmoid(self.fc2(torch.relu(self.fc1(s))))

    model, x = SqueezeExcite().eval(), torch.randn(1, 96, 7, 7)
    got, plan = run(model, (x,), "texture3d")
    assert plan.dispatches["conv2d_pw_gemv_wg"] == 2 and plan.dispatches["global_avg_pool_wg"] == 1, plan.dispatches
    assert not plan.transitions, plan.transitions  # channels-packed throughout: no im2col row, no views
    with torch.no_grad():
        want = model(x)
    assert_close(got, want)
    got, plan = run(model, (x,), "texture3d", precision="fp16")
    assert plan.dispatches["conv2d_pw_gemv_wg"] == 2, plan.dispatches
    assert_close(got, want, rtol=2e-3, atol=2e-3 * float(want.abs().max()))


@pytest.mark.parametrize("cin,cout,batch,act", [(2, 1, 1, None), (5, 7, 2, nn.ReLU()), (13, 130, 1, nn.Hardswish()),
                                               (577, 24, 3, nn.ReLU6()), (96, 576, 1, nn.GELU())], ids=str)
def test_one_pixel_pointwise_conv_against_torch(cin, cout, batch, act, workgroup_tiles):
    """conv2d_pw_gemv_wg: channels off the multiple of 4 (padding lanes in and out), Cin past
    2 x 64 texels, a batch, bias or none, fused activations, NaN and Inf. (One channel in and out
    is a depthwise conv, which keeps its own form.)"""
    torch.manual_seed(cin + cout)
    conv = nn.Conv2d(cin, cout, 1, bias=cout % 2 == 0)
    model = nn.Sequential(conv, act).eval() if act is not None else conv.eval()
    x = torch.randn(batch, cin, 1, 1) * 2
    x[0, 0, 0, 0] = float("nan")
    if cin > 3 and not isinstance(act, nn.GELU):  # torch's exact gelu of +Inf is NaN or +Inf by size
        x[-1, -1, 0, 0] = float("inf")
    got, plan = run(model, (x,), "texture3d")
    assert plan.dispatches == {"conv2d_pw_gemv_wg": 1}, plan.dispatches
    with torch.no_grad():
        want = model(x)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    assert_close(got, want)


# ---- global_avg_pool_wg: a GPU's global average pool ----------------------------------------------------
class GlobalPool(nn.Module):
    def __init__(self, size=1):
        super().__init__()
        self.size = size

    def forward(self, x):
        return torch.nn.functional.adaptive_avg_pool2d(x, self.size) * 2


def test_gpus_take_the_cooperative_global_pool(monkeypatch):
    monkeypatch.delenv(GEMM_ENV, raising=False)
    x = [torch.randn(1, 5, 7, 7)]
    names = [n.op.name for n in _ops(GlobalPool(), x, GPU)]
    assert names == ["global_avg_pool_wg", "mul"], names
    assert [n.op.name for n in _ops(GlobalPool(), x, CPU)] == ["adaptive_avg_pool2d", "mul"]
    # an output other than 1 x 1 keeps adaptive_pool2d everywhere
    assert [n.op.name for n in _ops(GlobalPool(2), x, GPU)] == ["adaptive_avg_pool2d", "mul"]


@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (1, 3, 7, 7), (2, 5, 1, 9), (1, 13, 57, 3), (3, 8, 8)], ids=str)
def test_global_pool_against_torch(shape, workgroup_tiles):
    """Channels off the multiple of 4 (padding lanes), H x W under, at and past 64 positions
    (several per invocation), a batch of 2, rank 3, NaN and Inf."""
    torch.manual_seed(sum(shape))
    x = torch.randn(*shape)
    x.view(-1)[0] = float("nan")
    if x.numel() > 2:
        x.view(-1)[-1] = float("inf")
    got, plan = run(GlobalPool(), (x,), "texture3d")
    assert plan.dispatches["global_avg_pool_wg"] == 1, plan.dispatches
    want = GlobalPool()(x)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    assert_close(got, want, rtol=1e-5, atol=1e-5)


# ---- split K: linear_wg_splitk + linear_splitk_sum -------------------------------------------------------
@pytest.mark.parametrize("rows,k,n,want", [
    (49, 4608, 512, 16),  # ResNet-18's 7 x 7 stage as im2col: 8 blocks
    (196, 2304, 256, 8),  # its 14 x 14 stage: 16 blocks
    (3136, 576, 64, 3),  # its 56 x 56 stage: 49 blocks
    (197, 1536, 384, 6),  # ViT-S/16's fc2: 24 blocks
    (197, 384, 1152, 2),  # its qkv: 72 blocks
    (1024, 1024, 1024, 1),  # 256 blocks: enough
    (5, 60, 7, 1),  # K too short for 2 slices of 4 steps
    (3, 1000, 129, 13),  # 15 slices asked, 13 of 20 texels cover K4 = 250: none empty
    (100000, 4096, 64, 1),  # the slices would pass SPLITK_MAX_BYTES
])
def test_split_count(rows, k, n, want):
    s = split_count(rows, k, n)
    assert s == want
    if s > 1:  # no slice empty, each at least SPLITK_MIN_STEPS steps of 16
        k4, ks4 = -(-k // 4), splitk_texels(-(-k // 4), s)
        assert (s - 1) * ks4 < k4 <= s * ks4 and ks4 >= 4 * SPLITK_MIN_STEPS


@pytest.mark.parametrize("storage", ["texture3d", "buffer"])
@pytest.mark.parametrize("shape,n,act", [((5, 300), 7, None), ((70, 257), 67, nn.GELU()), ((3, 1000), 129, nn.ReLU()),
                                         ((2, 33, 301), 70, nn.Hardswish())], ids=str)
def test_split_k_against_torch(shape, n, act, storage, workgroup_tiles, monkeypatch):
    """Awkward K and N (off the 4 / 16 / 64 grids), batch dims, bias or none, fused activations,
    NaN and Inf: the slices' sum is torch's product."""
    monkeypatch.delenv(SPLITK_ENV, raising=False)
    torch.manual_seed(shape[-1] + n)
    layers = [nn.Linear(shape[-1], n, bias=n % 2 == 1)] + ([act] if act is not None else [])
    model = nn.Sequential(*layers).eval()
    x = torch.randn(*shape) * 2
    x.view(-1, shape[-1])[0, 3] = float("nan")
    if not isinstance(act, nn.GELU):  # torch's exact gelu of +Inf is NaN or +Inf by the tensor's size
        x.view(-1, shape[-1])[-1, -1] = float("inf")
    got, plan = run(model, (x,), storage)
    assert plan.dispatches == {"linear_wg_splitk": 1, "linear_splitk_sum": 1}, plan.dispatches
    part = next(node for node in plan.graph.device_nodes() if node.op.name == "linear_wg_splitk")
    assert any("split along K into" in note for note in part.fused), part.fused
    with torch.no_grad():
        want = model(x)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    assert_close(got, want)


def test_split_k_is_a_gpu_choice_and_can_be_turned_off(monkeypatch):
    monkeypatch.delenv(GEMM_ENV, raising=False)
    monkeypatch.delenv(SPLITK_ENV, raising=False)
    model, x = nn.Linear(300, 7), [torch.randn(5, 300)]
    assert [n.op.name for n in _ops(model, x, GPU)] == ["linear_wg_splitk", "linear_splitk_sum"]
    assert [n.op.name for n in _ops(model, x, CPU)] == ["linear_packed"]  # register tiles are never split
    monkeypatch.setenv(SPLITK_ENV, "off")
    assert [n.op.name for n in _ops(model, x, GPU)] == ["linear_wg"]
    monkeypatch.setenv(SPLITK_ENV, "never")
    with pytest.raises(ValueError, match=r"TEXELFLOW_SPLITK='never': expected one of auto, off"):
        _ops(model, x, GPU)


# ---- mm_wg: mm and bmm on a GPU -------------------------------------------------------------------------
class MatMul(nn.Module):
    def __init__(self, op):
        super().__init__()
        self.op = op

    def forward(self, a, b):
        return self.op(a, b)


def test_gpus_take_mm_wg(monkeypatch):
    monkeypatch.delenv(GEMM_ENV, raising=False)
    a, b = torch.randn(3, 5), torch.randn(5, 4)
    for facts, want in ((GPU, "mm_wg"), (SubgroupFacts(4, True, "integrated"), "mm_wg"), (CPU, "mm"),
                        (SubgroupFacts(4, True, "cpu"), "matmul"), (None, "mm")):
        nodes = _ops(MatMul(torch.mm), [a, b], facts)
        assert [n.op.name for n in nodes] == [want], facts
    (node,) = _ops(MatMul(torch.bmm), [torch.randn(2, 3, 5), torch.randn(2, 5, 4)], GPU)
    assert node.op.name == "mm_wg" and "mm_wg kernel (from bmm): workgroup tiles, a discrete GPU" in node.fused


@pytest.mark.parametrize("storage", ["texture3d", "buffer"])
@pytest.mark.parametrize("shape", [(1, 1, 1), (3, 5, 7), (7, 13, 5), (13, 7, 3), (65, 17, 67), (64, 64, 64),
                                   (2, 3, 5, 7), (3, 70, 9, 66), (2, 1, 13, 5)])
def test_mm_wg_awkward_sizes(shape, storage, workgroup_tiles):
    """(m, k, n): mm; (b, m, k, n): bmm."""
    torch.manual_seed(sum(shape))
    *batch, m, k, n = shape
    a, b = torch.randn(*batch, m, k), torch.randn(*batch, k, n)
    op = torch.bmm if batch else torch.mm
    got, plan = run(MatMul(op), (a, b), storage)
    assert plan.dispatches["mm_wg"] == 1, plan.dispatches
    assert_close(got, op(a, b))


@pytest.mark.parametrize("storage", ["texture3d", "buffer"])
def test_mm_wg_nan_inf_propagate_as_torch(storage, workgroup_tiles):
    torch.manual_seed(6)
    a, b = torch.randn(2, 67, 21), torch.randn(2, 21, 70)
    a[0, 0, 1] = float("nan")
    a[1, 66, 20] = float("inf")
    b[1, 3, 69] = float("-inf")
    got, _ = run(MatMul(torch.bmm), (a, b), storage)
    want = torch.bmm(a, b)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    assert_close(got, want)


def test_notes_name_each_nodes_own_kernel(monkeypatch):
    """A linear before an mm in one graph: each node's note gives its own kernel and reason."""
    monkeypatch.delenv(GEMM_ENV, raising=False)

    class LinearThenMm(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(5, 5)

        def forward(self, x, y):
            return torch.mm(self.fc(x[:1]), y)

    nodes = {n.op.name: n for n in _ops(LinearThenMm(), [torch.randn(3, 5), torch.randn(5, 4)], GPU)}
    assert any("linear_gemv_wg kernel (one row, workgroup tiles: a discrete GPU)" in note
               for note in nodes["linear_gemv_wg"].fused), nodes["linear_gemv_wg"].fused
    assert "mm_wg kernel (from mm): workgroup tiles, a discrete GPU" in nodes["mm_wg"].fused


def test_matmul_flops_count_the_reduction():
    """The cost model's FLOP term sees mm / bmm in either tiling as products (2 * outputs * K)."""
    from texelflow.runtime.graph.costs import node_flops

    for facts in (GPU, CPU):
        (node,) = _ops(MatMul(torch.bmm), [torch.randn(2, 3, 5), torch.randn(2, 5, 4)], facts)
        assert node_flops(node) == 2 * 2 * 3 * 4 * 5, node.op.name


# ---- the choice by a measured cost table ----------------------------------------------------------------
def _table(fast: str, slow: str):
    """A cost table in which op `fast` takes 1 us and `slow` 1 ms, in every representation."""
    from texelflow.runtime.graph.costs import Coeffs, CostModel

    entries = {}
    for r in ("TEXTURE_3D/WIDTH_PACKED", "BUFFER/WIDTH_PACKED"):
        entries[(fast, r)] = Coeffs(1e-6, 0.0, 0.0)
        entries[(slow, r)] = Coeffs(1e-3, 0.0, 0.0)
    return CostModel("table", "a test device", entries)


def _priced_ops(model, inputs, facts, costs):
    graph = fuse_patterns(lower(export_program(model, inputs)), subgroup=facts, costs=costs)
    return graph.device_nodes()


@pytest.mark.parametrize("facts", [GPU, CPU, None])
def test_a_measured_table_chooses_the_tiling_per_node(facts, monkeypatch):
    monkeypatch.delenv(GEMM_ENV, raising=False)
    x = torch.randn(20, 32)
    for fast, slow in (("linear_wg", "linear_packed"), ("linear_packed", "linear_wg")):
        (node,) = _priced_ops(nn.Linear(32, 48), [x], facts, _table(fast, slow))
        assert node.op.name == fast
        assert any(f"{fast} kernel (cost table: 1 us predicted, {slow} 1000 us)" in note for note in node.fused), node.fused
    a, b = torch.randn(2, 20, 32), torch.randn(2, 32, 24)
    for fast, slow in (("mm_wg", "bmm"), ("bmm", "mm_wg")):
        (node,) = _priced_ops(MatMul(torch.bmm), [a, b], facts, _table(fast, slow))
        assert node.op.name == fast and any("cost table" in note for note in node.fused), node.fused


def test_a_table_without_both_tilings_leaves_the_choice_to_the_device(monkeypatch):
    """A table measured before linear_wg existed (or where one kernel failed) has no entry for it."""
    from texelflow.runtime.graph.costs import Coeffs, CostModel

    monkeypatch.delenv(GEMM_ENV, raising=False)
    old = CostModel("table", "old", {("linear_packed", "TEXTURE_3D/WIDTH_PACKED"): Coeffs(1e-3, 0.0, 0.0)})
    for facts, want in ((GPU, "linear_wg"), (CPU, "linear_packed")):
        (node,) = _priced_ops(nn.Linear(32, 48), [torch.randn(20, 32)], facts, old)
        assert node.op.name == want
    (node,) = _priced_ops(nn.Linear(32, 48), [torch.randn(20, 32)], GPU, CostModel.estimate())
    assert node.op.name == "linear_wg"  # the built-in estimate prices every kernel alike: no choice by it


def test_forcing_beats_the_table(monkeypatch):
    monkeypatch.setenv(GEMM_ENV, "register")
    (node,) = _priced_ops(nn.Linear(32, 48), [torch.randn(20, 32)], GPU, _table("linear_wg", "linear_packed"))
    assert node.op.name == "linear_packed"
