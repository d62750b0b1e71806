"""linear (width-packed activations, contiguous-buffer weight and bias) against torch."""
from __future__ import annotations

import pytest
import torch

from .harness import BUF_WP, DUMMY, close, rand, reprs, rid, run

CONTIGUOUS = reprs("CONTIGUOUS_ANY")  # WP buffer and WP texture


@pytest.mark.parametrize("r", CONTIGUOUS, ids=rid)
@pytest.mark.parametrize("shape,n,bias", [((5, 7), 3, True), ((1, 3, 7), 5, False), ((2, 3, 1, 5), 7, True),
                                          ((7,), 1, True), ((3, 5, 9), 6, False)])
def test_linear(device, r, shape, n, bias):
    x, w, b = rand(*shape, seed=1), rand(n, shape[-1], seed=2), rand(n, seed=3)
    want = torch.nn.functional.linear(x, w, b if bias else None)
    got = run(device, "linear", {"input": (x, r), "weight": (w, BUF_WP), "bias": (b if bias else DUMMY, BUF_WP)},
              {"out": (want.shape, r)}, {"has_bias": int(bias)}, storage=r[0])["out"]
    close(got, want, 1e-4, 1e-5, f"linear {shape}x{n} bias={bias} {rid(r)}")
