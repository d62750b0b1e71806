"""addmm (width-packed mat1 and out; self and mat2 prepacked contiguous buffers) against torch."""
from __future__ import annotations

import pytest
import torch

from .harness import BUF_WP, close, rand, reprs, rid, run

CONTIGUOUS = reprs("CONTIGUOUS_ANY")  # WP buffer and WP texture


@pytest.mark.parametrize("r", CONTIGUOUS, ids=rid)
@pytest.mark.parametrize("m,k,n,bias_shape,beta,alpha", [
    (5, 7, 3, "n", 1.0, 1.0), (1, 3, 5, "1n", 0.5, -2.0), (3, 5, 7, "mn", 1.0, 1.5), (7, 2, 5, "m1", 2.0, 1.0),
    (3, 5, 6, "n", 0.0, 1.5),  # beta == 0: self is ignored, NaN included
])
def test_addmm(device, r, m, k, n, bias_shape, beta, alpha):
    a, b = rand(m, k, seed=6), rand(k, n, seed=7)
    shape = {"n": (n,), "1n": (1, n), "mn": (m, n), "m1": (m, 1)}[bias_shape]
    s = rand(*shape, seed=8)
    if beta == 0.0:
        s[..., 0] = float("nan")
    want = torch.addmm(s, a, b, beta=beta, alpha=alpha)
    got = run(device, "addmm", {"self": (s, BUF_WP), "mat1": (a, r), "mat2": (b, BUF_WP)},
              {"out": (want.shape, r)}, {"beta": beta, "alpha": alpha}, storage=r[0])["out"]
    close(got, want, 1e-4, 1e-5, f"addmm {m}x{k}x{n} self{shape} {rid(r)}")
