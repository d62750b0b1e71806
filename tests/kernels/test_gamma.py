"""lgamma and digamma (tf_lgamma, tf_digamma in shaders/include/math.glslh) against float64.

The registry test runs both ops' samples in every variant and representation, NaN and Inf
injected; here the accuracy over their whole range, judged against torch's float64 functions,
and their special values against torch's float32 ones. The error bound is relative to the sizes
of the terms the formula adds (the result itself; for a negative x the reflection's
lgamma(1 - x) or digamma(1 - x); for digamma the log(x + 10) its steps up to 10 cancel): near a
zero of either function no float32 formula keeps a relative error, torch's own included.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from texelflow.generated.ops import OPS
from texelflow.generated.variants import VARIANTS

from .nodecheck import build_node, explicit_case, repr_combos, run_nodes

FUNCS = {"lgamma": torch.lgamma, "digamma": torch.digamma}
# bound on |got - exact| / (|exact| + |f(1 - x)| for x < 0), and on |got - exact| where |exact| < 1e-30
ACCURACY = {"lgamma": 2e-6, "digamma": 2e-6}


def _grid() -> np.ndarray:
    mags = np.logspace(-30, 30, 6001)
    x = np.concatenate([mags, np.linspace(0, 40, 80001), np.linspace(-40, 0, 80001),
                        np.linspace(0.9, 1.1, 2001), np.linspace(1.9, 2.1, 2001), -np.logspace(-30, 1, 2001)])
    x = x.astype(np.float32)
    x = x[np.isfinite(x) & ~((x < 0) & (x == np.round(x)))]  # the negative integers are poles
    x = np.concatenate([x, np.ones(-x.size % 512, np.float32)])
    return x.reshape(-1, 512)


def _run(device, name: str, x: np.ndarray, storage_index: int = 0) -> np.ndarray:
    op = OPS[name]
    vname = next(v for v in op.variants if VARIANTS[v].dtype == "float32" and
                 ("buffer" in v) == (storage_index == 0))
    combo = repr_combos(op, VARIANTS[vname])[0]
    case = explicit_case(op, {"self": tuple(x.shape)}, {"self": x}, name)
    node, arrays = build_node(op, "float32", case)
    [[out]] = run_nodes(device, [(node, arrays)], combo, "float32", expect_variant=vname)
    return out.got


@pytest.mark.parametrize("storage", [0, 1], ids=["buffer", "texture"])
@pytest.mark.parametrize("name", sorted(FUNCS))
def test_accuracy_against_float64(device, name, storage):
    x = _grid()
    got = _run(device, name, x, storage).astype(np.float64)
    x64 = torch.from_numpy(x).double()
    exact = FUNCS[name](x64).numpy()
    scale = np.abs(exact) + np.where(x < 0, np.abs(FUNCS[name](1 - x64).numpy()), 0.0)
    if name == "digamma":  # its steps up to 10 add 1 / x's, which log(x) then cancels: terms of log(x + 10)
        scale = scale + np.log(np.abs(x.astype(np.float64)) + 10.0)
    finite = np.isfinite(exact)
    err = np.abs(got - exact)[finite] / np.maximum(scale[finite], 1e-30)
    worst = int(np.argmax(err))
    assert err.max() <= ACCURACY[name], (f"{name}: error {err.max():.3g} of the terms' size at x = "
                                         f"{x[finite][worst]!r} (got {got[finite][worst]!r}, exact {exact[finite][worst]!r})")
    assert np.array_equal(np.isinf(got), np.isinf(exact)) and not np.isnan(got).any()


SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, 2.0, 3.0, 0.5, -0.5, -1.0, -2.0, -3.0, -7.0, -1e20,
                     1e-38, -1e-38, 1e-30, -1e-30, 1e20, 1e30, 3e38, 10.0, 8.5, 1.5, 2.5, -2.5, -0.25, 1.4616321],
                    dtype=np.float32)


@pytest.mark.parametrize("name", sorted(FUNCS))
def test_special_values_as_torch(device, name):
    """Poles, signed zeros, infinities, NaN, the ends of float32 and the formulas' switch points."""
    got = _run(device, name, SPECIALS.reshape(1, -1))[0]
    want = FUNCS[name](torch.from_numpy(SPECIALS)).numpy()
    both_nan = np.isnan(got) & np.isnan(want)
    assert np.array_equal(np.isnan(got), np.isnan(want)), (SPECIALS[np.isnan(got) != np.isnan(want)], got, want)
    same_inf = np.isinf(want) == np.isinf(got)
    assert same_inf.all() and np.array_equal(np.sign(got[np.isinf(got)]), np.sign(want[np.isinf(want)])), (got, want)
    close = np.isclose(got, want, rtol=2e-6, atol=1e-6) | both_nan | (np.isinf(got) & (got == want))
    assert close.all(), list(zip(SPECIALS[~close], got[~close], want[~close]))
