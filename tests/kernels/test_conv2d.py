"""conv2d (channels-packed textures; prepacked weight, optional bias) against torch."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from .harness import BUF_WP, DUMMY, close, conv_push, rand, reprs, rid, run

CP_TEX = reprs("CHANNELS_PACKED_TEXTURE")


# (input NCHW, Cout, kernel (KH, KW), stride, padding, dilation, groups, bias)
CONV_CASES = [
    ((1, 3, 7, 5), 5, (3, 3), [1, 1], [1, 1], [1, 1], 1, True),
    ((2, 5, 7, 7), 7, (3, 3), [2, 2], [1, 1], [1, 1], 1, False),
    ((1, 6, 5, 7), 9, (2, 3), [2, 1], [1, 0], [2, 1], 3, True),   # groups, asymmetric everything
    ((1, 7, 5, 5), 7, (3, 3), [1, 1], [2, 2], [2, 2], 7, True),   # depthwise, dilated
    ((3, 4, 3, 1), 1, (1, 1), [1, 1], [0, 0], [1, 1], 1, True),   # 1x1, W = 1, Cout = 1
    ((1, 4, 16, 16), 8, (3, 3), [1, 1], [1, 1], [1, 1], 1, True),  # acceptance A1's conv
]


@pytest.mark.parametrize("r", CP_TEX, ids=rid)
@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: "x".join(map(str, c[0])) + f"-g{c[6]}")
def test_conv2d(device, r, case):
    shape, cout, (kh, kw), stride, padding, dilation, groups, bias = case
    x = rand(*shape, seed=1)
    w = rand(cout, shape[1] // groups, kh, kw, seed=2)
    b = rand(cout, seed=3)
    want = F.conv2d(x, w, b if bias else None, stride, padding, dilation, groups)
    scalars = conv_push(stride, padding, dilation, groups, bias)
    got = run(device, "conv2d", {"input": (x, r), "weight": (w, BUF_WP), "bias": (b if bias else DUMMY, BUF_WP)},
              {"out": (want.shape, r)}, scalars, storage=r[0])["out"]
    close(got, want, 1e-4, 1e-4, f"conv2d {case}")
