"""max_pool2d (channels-packed textures) against torch."""
from __future__ import annotations

import pytest
import torch

from .harness import close, pool_push, rand, reprs, rid, run

CP_TEX = reprs("CHANNELS_PACKED_TEXTURE")


# (input, kernel, stride, padding, dilation, ceil_mode)
MAX_CASES = [
    ((1, 5, 7, 7), [3], [2], [1], [1], False),
    ((2, 3, 5, 7), [2, 2], [2, 2], [0], [1], True),
    ((1, 7, 7, 5), [3, 2], [2, 1], [1, 1], [2, 1], True),
    ((1, 4, 16, 16), [1], [], [0], [1], False),   # acceptance A3 / E2: kernel 1, empty stride
    ((1, 3, 6, 6), [3], [3], [1], [1], True),
]


@pytest.mark.parametrize("r", CP_TEX, ids=rid)
@pytest.mark.parametrize("case", MAX_CASES, ids=str)
def test_max_pool2d(device, r, case):
    shape, kernel, stride, padding, dilation, ceil_mode = case
    x = rand(*shape, seed=4)
    want = torch.ops.aten.max_pool2d.default(x, kernel, stride, padding, dilation, ceil_mode)
    scalars = pool_push(kernel, stride, padding, dilation) | {"ceil_mode": int(ceil_mode)}
    got = run(device, "max_pool2d", {"self": (x, r)}, {"out": (want.shape, r)}, scalars, storage=r[0])["out"]
    close(got, want, 0, 0, f"max_pool2d {case}")
