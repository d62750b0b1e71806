"""bench/kernels.py's machinery on tiny kernels: runners build kernels the way models run them,
check them against torch, and measure() turns alternated samples into fractions of the ceilings;
a kernel whose output is wrong becomes a row that says so, never a figure."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def kernels():
    """bench/kernels.py as a module (it puts bench/ on sys.path for its own imports)."""
    spec = importlib.util.spec_from_file_location("bench_kernels", BENCH / "kernels.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def configs(device, kernels):
    from ceilings import CopyConfig

    return {"buffer": [CopyConfig("buffer", 2, 64)], "texture3d": [CopyConfig("texture3d", 1, 64)]}


def _repr(storage, layout):
    from texelflow.generated.layouts import Layout, Storage
    from texelflow.runtime.graph.repr import TensorRepr

    return TensorRepr(getattr(Storage, storage), getattr(Layout, layout))


def test_node_runner_moves_an_awkward_tensor_between_storages(device, kernels):
    x = np.random.default_rng(0).standard_normal((1, 5, 3, 7), dtype=np.float32)
    reprs = {"self": _repr("BUFFER", "WIDTH_PACKED"), "out": _repr("TEXTURE_3D", "CHANNELS_PACKED")}
    runner = kernels.NodeRunner(device, "to_layout", {"self": x}, x.shape, reprs, x)  # checks the output
    try:
        assert runner.sample() > 0
        assert runner.storages == ["buffer", "texture3d"]
        assert "to_layout_float32_buffer_texture3d" in runner.ran and "buf WP -> tex CP" in runner.ran
    finally:
        runner.close()


def test_measure_gives_fractions_of_the_ceilings(device, kernels, configs):
    shape = (1, 3, 5, 7)

    def relu(device):
        return kernels.CompiledRunner(device, kernels._module(torch.relu), (torch.randn(shape),), True, (0, 0))

    row = kernels.measure(device, kernels.Case("relu", "1x3x5x7", relu, 2 * 4 * 105), 2, 1.0, configs)
    assert row.error == ""
    assert row.storages == ["buffer"] and "relu_float32_buffer" in row.ran
    assert row.seconds > 0 and row.ceiling_gbps > 0 and row.fraction > 0 and row.best_fraction > 0

    def linear(device):
        return kernels.CompiledRunner(device, torch.nn.Linear(7, 5), (torch.randn(3, 7),), False, (1e-4, 1e-4))

    case = kernels.Case("linear", "3x7 @ 7x5", linear, 4 * (21 + 35 + 5 + 15), flops=2 * 3 * 7 * 5)
    row = kernels.measure(device, case, 2, 1.0, configs)
    assert row.error == ""
    assert row.fma_gflops > 0 and row.fraction > 0 and row.bound_seconds > 0 and row.of_bound > 0


def test_fma_probes_match_the_kernels_work(device, kernels):
    shortest = (1 << 12) * 16 * kernels.FMA_CHAINS * 4 * 2  # the least that fills lavapipe
    for flops in (2 * 3 * 7 * 5, 14_000_000, 58_000_000, 2 * 1024 ** 3):
        invocations, steps = kernels.fma_size_for(device, flops)
        work = invocations * steps * kernels.FMA_CHAINS * 4 * 2
        assert invocations >= 1 << 12 and steps >= 16
        assert work == shortest if flops < shortest else 0.9 <= work / flops <= 1.1


def test_a_wrong_output_is_a_row_that_says_so(device, kernels, configs):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    same = {"self": _repr("BUFFER", "WIDTH_PACKED"), "out": _repr("BUFFER", "WIDTH_PACKED")}

    def wrong(device):
        return kernels.NodeRunner(device, "clone", {"self": x}, x.shape, same, x + 1)

    row = kernels.measure(device, kernels.Case("clone", "3x4", wrong, 96), 2, 1.0, configs)
    assert "clone moved elements wrongly" in row.error and "\n" not in row.error
    assert row.seconds == 0
