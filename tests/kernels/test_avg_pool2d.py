"""avg_pool2d (channels-packed textures) against torch."""
from __future__ import annotations

import pytest
import torch

from .harness import close, pool_push, rand, reprs, rid, run

CP_TEX = reprs("CHANNELS_PACKED_TEXTURE")


# (input, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)
AVG_CASES = [
    ((1, 5, 7, 7), [3], [2], [1], False, True, None),
    ((2, 3, 5, 7), [3], [2], [1], True, False, None),
    ((1, 6, 7, 5), [3, 2], [2, 1], [1, 0], True, True, None),
    ((1, 3, 5, 5), [2], [], [0], False, True, 3),
    ((1, 4, 16, 16), [1], [], [0], False, True, None),  # acceptance G2 / B64: kernel 1
    ((1, 5, 6, 6), [3], [3], [1], True, True, None),
]


@pytest.mark.parametrize("r", CP_TEX, ids=rid)
@pytest.mark.parametrize("case", AVG_CASES, ids=str)
def test_avg_pool2d(device, r, case):
    shape, kernel, stride, padding, ceil_mode, count_include_pad, divisor = case
    x = rand(*shape, seed=5)
    want = torch.ops.aten.avg_pool2d.default(x, kernel, stride, padding, ceil_mode, count_include_pad, divisor)
    scalars = pool_push(kernel, stride, padding) | {
        "ceil_mode": int(ceil_mode), "count_include_pad": int(count_include_pad), "divisor_override": divisor or 0}
    got = run(device, "avg_pool2d", {"self": (x, r)}, {"out": (want.shape, r)}, scalars, storage=r[0])["out"]
    close(got, want, 1e-5, 1e-6, f"avg_pool2d {case}")
