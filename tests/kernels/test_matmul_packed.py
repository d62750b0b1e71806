"""The tiled matmul family (issue 13): linear_packed, linear_packed_gemv and mm_tiled (mm, bmm)
against torch, through texelflow.compile as a model runs them (textures and buffers), at awkward
sizes (1, 3, 5, 7, 13; N and K off the 4 / 16 grid; batch dims), with NaN and inf, and at the
model sizes of the acceptance line once (ViT-S/16's linears, 1024^3). The generic
test_registry_ops.py runs every variant on its ops.yaml samples besides.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import texelflow
from texelflow.runtime.graph.prepack_matmul import linear_packed_reference, linear_weight_kn
from texelflow.runtime.vulkan.pipeline import find_variant
from texelflow.runtime.vulkan.program import Dispatch, Program
from texelflow.runtime.vulkan.tensor import VkTensor

# these tests name the register-tiled GEMMs and specialised convs: keep them on a GPU too (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("register_tiles")

BUFFERS_ONLY = (0, 0, 0)  # texture limits no tensor fits: every representation is a buffer
SIZES = (1, 3, 5, 7, 13)


class Linear(torch.nn.Module):
    def __init__(self, k: int, n: int, bias: bool):
        super().__init__()
        self.fc = torch.nn.Linear(k, n, bias=bias)

    def forward(self, x):
        return self.fc(x)


class MatMul(torch.nn.Module):
    def __init__(self, op):
        super().__init__()
        self.op = op

    def forward(self, a, b):
        return self.op(a, b)


def run(model, inputs, storage: str):
    limits = BUFFERS_ONLY if storage == "buffer" else None
    with texelflow.compile(model, inputs, texture_limits=limits) as prog:
        got = prog(*inputs)
        return got, prog.plan
    

def assert_close(got, want, rtol=1e-4, atol=1e-4):
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol, equal_nan=True)


@pytest.mark.parametrize("storage", ["texture3d", "buffer"])
@pytest.mark.parametrize("m,k,n", [(m, k, n) for m in SIZES for k in (1, 5, 13) for n in (3, 7, 13)]
                         + [(9, 16, 130), (2, 12, 20), (17, 64, 33)])
def test_linear_packed_awkward_sizes(m, k, n, storage):
    torch.manual_seed(m * 100 + k * 10 + n)
    model = Linear(k, n, bias=(m + k + n) % 2 == 0).eval()
    x = torch.randn(m, k)
    got, plan = run(model, (x,), storage)
    want_op = "linear_packed_gemv" if m == 1 else "linear_packed"
    assert plan.dispatches[want_op] == 1, plan.dispatches
    assert all(r.startswith("BUFFER") for r in plan.reprs.values()) == (storage == "buffer")
    with torch.no_grad():
        assert_close(got, model(x))


@pytest.mark.parametrize("storage", ["texture3d", "buffer"])
@pytest.mark.parametrize("shape", [(2, 3, 5), (1, 1, 7), (2, 1, 3, 13), (3, 4)])
def test_linear_packed_batch_dims(shape, storage):
    torch.manual_seed(len(shape))
    model = Linear(shape[-1], 11, bias=True).eval()
    x = torch.randn(*shape)
    got, _ = run(model, (x,), storage)
    with torch.no_grad():
        assert_close(got, model(x))


@pytest.mark.parametrize("storage", ["texture3d", "buffer"])
@pytest.mark.parametrize("m", [1, 5])
def test_linear_packed_nan_inf_propagate_as_torch(m, storage):
    torch.manual_seed(1)
    model = Linear(7, 13, bias=True).eval()
    x = torch.randn(m, 7)
    x[0, 1] = float("nan")
    x[-1, 6] = float("inf")
    x[m // 2, 3] = float("-inf")
    got, _ = run(model, (x,), storage)
    with torch.no_grad():
        want = model(x)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    assert_close(got, want)


@pytest.mark.parametrize("storage", ["texture3d", "buffer"])
@pytest.mark.parametrize("m,k,n", [(13, 9, 64), (37, 21, 70), (8, 4, 13)])
def test_linear_packed_tiles_with_bias_relu_and_specials(m, k, n, storage):
    """The column blocks (4 columns a lane in textures, 8 in buffers) with a group's last lanes
    past N (70 and 13 columns) or none (64: ResNet's stem GEMM), K off the 4 grid, rows past a
    group of 8, a fused relu, NaN and Inf."""
    torch.manual_seed(m + k)
    model = torch.nn.Sequential(torch.nn.Linear(k, n), torch.nn.ReLU()).eval()
    x = torch.randn(m, k)
    x[1, 0], x[-1, k - 1], x[m // 2, k // 2] = float("nan"), float("inf"), float("-inf")
    got, plan = run(model, (x,), storage)
    assert plan.dispatches["linear_packed"] == 1, plan.dispatches
    with torch.no_grad():
        want = model(x)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    assert_close(got, want)


def test_run_time_weight_is_not_prepacked():
    """A weight computed at run time cannot be prepacked: lowering decomposes such a linear (mm of
    the transposed weight: the tiled kernel, reading the weight's rows as they are, bmm_nt)."""
    class Dyn(torch.nn.Module):
        def forward(self, x, w):
            return F.linear(x, w)

    x, w = torch.randn(5, 7), torch.randn(3, 7)
    got, plan = run(Dyn(), (x, w), "texture3d")
    assert plan.dispatches["bmm_nt"] == 1 and "linear_packed" not in plan.dispatches, plan.dispatches
    assert "permute_copy" not in plan.dispatches, plan.dispatches
    assert_close(got, F.linear(x, w))


def test_prepacked_weight_layout():
    w = torch.randn(5, 7, dtype=torch.float64)
    p = linear_weight_kn(w)
    assert tuple(p.shape) == (8, 16)
    assert torch.equal(p[:7, :5], w.t()) and not p[7:].any() and not p[:, 5:].any()
    x = torch.randn(3, 7, dtype=torch.float64)
    torch.testing.assert_close(linear_packed_reference(x, p, None, 5), x @ w.t())


@pytest.mark.parametrize("storage", ["texture3d", "buffer"])
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (3, 5, 7), (7, 13, 5), (13, 7, 3), (5, 3, 13), (33, 12, 40),
                                   (9, 8, 130), (37, 20, 36)])
def test_mm_tiled_awkward_sizes(m, k, n, storage):
    torch.manual_seed(m + k + n)
    a, b = torch.randn(m, k), torch.randn(k, n)
    got, plan = run(MatMul(torch.mm), (a, b), storage)
    assert plan.dispatches["mm"] == 1
    assert_close(got, a @ b)


@pytest.mark.parametrize("storage", ["texture3d", "buffer"])
@pytest.mark.parametrize("bsz,m,k,n", [(2, 3, 5, 7), (3, 13, 7, 1), (1, 1, 13, 5), (2, 33, 12, 40)])
def test_bmm_tiled_awkward_sizes(bsz, m, k, n, storage):
    torch.manual_seed(bsz + m + k + n)
    a, b = torch.randn(bsz, m, k), torch.randn(bsz, k, n)
    got, plan = run(MatMul(torch.bmm), (a, b), storage)
    assert plan.dispatches["bmm"] == 1
    assert_close(got, torch.bmm(a, b))


@pytest.mark.parametrize("storage", ["texture3d", "buffer"])
def test_mm_tiled_nan_inf_propagate_as_torch(storage):
    torch.manual_seed(2)
    a, b = torch.randn(9, 7), torch.randn(7, 18)
    a[2, 3] = float("nan")
    b[6, 5] = float("inf")
    a[8, 0] = float("-inf")
    got, _ = run(MatMul(torch.mm), (a, b), storage)
    want = a @ b
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    assert_close(got, want)


# ---- model sizes, once: each variant dispatched directly, as the runtime launches it -------------
def _dispatch_and_check(device, variant, arrays, scalars, units, spec, want, storages):
    tensors = {}
    try:
        for name, arr in arrays.items():
            t = VkTensor(device, arr.shape, "float32", storages[name], "WIDTH_PACKED")
            t.upload(arr)
            tensors[name] = t
        tensors["out"] = VkTensor(device, want.shape, "float32", storages["out"], "WIDTH_PACKED")
        prog = Program(device, [Dispatch(variant, tensors, scalars, units=units, spec=spec)])
        try:
            prog()
        finally:
            prog.close()
        got = tensors["out"].download()
        err = np.abs(got - want).max() / np.abs(want).max()
        assert err < 1e-5, f"{variant.name}: relative error {err:.2e}"
    finally:
        for t in tensors.values():
            t.close()


@pytest.mark.parametrize("storage", ["buffer", "texture3d"])
@pytest.mark.parametrize("m,k,n", [(197, 384, 1152), (197, 384, 384), (197, 384, 1536), (197, 1536, 384)])
def test_linear_packed_vit_s_shapes(device, m, k, n, storage):
    rng = np.random.default_rng(k + n)
    x = rng.standard_normal((m, k), dtype=np.float32)
    w = rng.standard_normal((n, k), dtype=np.float32) * 0.05
    b = rng.standard_normal(n, dtype=np.float32)
    packed = linear_weight_kn(torch.from_numpy(w).double()).float().numpy()
    wst = "texture3d" if storage == "buffer" else "buffer"  # both weight storages across the two runs
    variant = find_variant("linear_packed", dtype="float32", storage=storage, weight_storage=wst)
    _dispatch_and_check(device, variant, {"input": x, "weight": packed, "bias": b},
                        {"has_bias": 1, "activation": 0, "act_min": 0.0, "act_max": 0.0},
                        -(-n // 16) * -(-m // 8), {"k_ragged": 0, "n_ragged": 0}, x @ w.T + b,
                        {"input": storage, "out": storage, "weight": wst, "bias": "buffer"})


@pytest.mark.parametrize("storage", ["buffer", "texture3d"])
def test_mm_tiled_1024(device, storage):
    rng = np.random.default_rng(1024)
    a = rng.standard_normal((1024, 1024), dtype=np.float32)
    b = rng.standard_normal((1024, 1024), dtype=np.float32)
    variant = find_variant("mm", dtype="float32", storage=storage)
    _dispatch_and_check(device, variant, {"self": a, "mat2": b}, {}, 64 * 128, {"k_ragged": 0, "n_ragged": 0},
                        a @ b, {"self": storage, "mat2": storage, "out": storage})
