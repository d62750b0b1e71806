"""erfinv (tf_erfinv in shaders/include/math.glslh) against float64, in buffers and textures.

The registry test runs its samples in every variant and representation, NaN and Inf injected;
here the accuracy over (-1, 1), dense near 0 and near +-1 (down to 1 - 2^-24, where the tail's
sqrt(-log(1 - |x|)) matters), and the special values against torch's float32 erfinv.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from .test_gamma import _run

BOUND = 1e-6  # relative, where |erfinv(x)| >= 1e-30 (measured: see bench/RESULTS.md)


def _grid() -> np.ndarray:
    edge = 1.0 - np.logspace(-7.2, -0.5, 20001)
    x = np.concatenate([np.linspace(-1, 1, 200001)[1:-1], edge, -edge, np.logspace(-30, 0, 4001)[:-1],
                        np.linspace(0.69, 0.71, 2001), np.float32(1) - np.float32(2.0 ** -24) * np.arange(1, 64)])
    x = x.astype(np.float32)
    x = x[np.abs(x) < 1]
    x = np.concatenate([x, np.zeros(-x.size % 512, np.float32)])
    return x.reshape(-1, 512)


@pytest.mark.parametrize("storage", [0, 1], ids=["buffer", "texture"])
def test_accuracy_against_float64(device, storage):
    x = _grid()
    got = _run(device, "erfinv", x, storage).astype(np.float64)
    exact = torch.erfinv(torch.from_numpy(x).double()).numpy()
    judged = np.abs(exact) >= 1e-30
    rel = np.abs(got - exact)[judged] / np.abs(exact[judged])
    worst = int(np.argmax(rel))
    assert rel.max() <= BOUND, (f"relative error {rel.max():.3g} at x = {x[judged][worst]!r} "
                                f"(got {got[judged][worst]!r}, exact {exact[judged][worst]!r})")
    assert np.isfinite(got).all()


def test_special_values_as_torch(device):
    x = np.array([0.0, -0.0, 1.0, -1.0, 1.5, -2.0, np.inf, -np.inf, np.nan, 0.7, -0.7, 0.5, 1e-30, -1e-30,
                  np.float32(1) - np.float32(2.0 ** -24), -(np.float32(1) - np.float32(2.0 ** -24))], dtype=np.float32)
    got = _run(device, "erfinv", x.reshape(1, -1))[0]
    want = torch.erfinv(torch.from_numpy(x)).numpy()
    assert np.array_equal(np.isnan(got), np.isnan(want)), (got, want)
    assert np.array_equal(got[np.isinf(want)], want[np.isinf(want)]), (got, want)
    assert np.array_equal(np.signbit(got[:2]), [False, True])
    finite = np.isfinite(want)
    assert np.allclose(got[finite], want[finite], rtol=1e-6, atol=0), (got, want)
