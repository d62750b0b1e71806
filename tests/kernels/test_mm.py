"""mm (both operands dynamic, width-packed, synced with out) against torch."""
from __future__ import annotations

import pytest
import torch

from .harness import close, rand, reprs, rid, run

CONTIGUOUS = reprs("CONTIGUOUS_ANY")  # WP buffer and WP texture


@pytest.mark.parametrize("r", CONTIGUOUS, ids=rid)
@pytest.mark.parametrize("m,k,n", [(5, 7, 3), (1, 3, 5), (3, 1, 7), (6, 9, 1)])
def test_mm(device, r, m, k, n):
    a, b = rand(m, k, seed=4), rand(k, n, seed=5)
    want = torch.mm(a, b)
    got = run(device, "mm", {"self": (a, r), "mat2": (b, r)}, {"out": (want.shape, r)}, storage=r[0])["out"]
    close(got, want, 1e-4, 1e-5, f"mm {m}x{k}x{n} {rid(r)}")
