"""permute_copy on every float representation (push constant `permute_dims` in WHCN terms)."""
from __future__ import annotations

import itertools

import pytest
import torch

from .harness import close, permute_dims_whcn, rand, reprs, rid, run

ANY = reprs("ANY_STORAGE")
PERMS_4D = [(0, 2, 3, 1), (0, 3, 1, 2), (3, 1, 0, 2), (1, 0, 3, 2), (2, 3, 0, 1), (0, 1, 2, 3)]


def test_permute_dims_convention():
    assert permute_dims_whcn([0, 2, 3, 1], 4) == (2, 0, 1, 3)  # NCHW -> NHWC
    assert permute_dims_whcn([1, 0], 2) == (1, 0, 2, 3)
    assert permute_dims_whcn([-1, 0, 1], 3) == (1, 2, 0, 3)
    for dims in itertools.permutations(range(4)):  # a permutation of 0..3 in WHCN too
        assert sorted(permute_dims_whcn(dims, 4)) == [0, 1, 2, 3]


@pytest.mark.parametrize("r", ANY, ids=rid)
def test_permute_4d(device, r):
    x = rand(2, 3, 5, 7, seed=1)
    for dims in PERMS_4D:
        want = x.permute(dims).contiguous()
        got = run(device, "permute_copy", {"self": (x, r)}, {"out": (want.shape, r)},
                  {"permute_dims": permute_dims_whcn(dims, 4)}, storage=r[0])["out"]
        close(got, want, 0, 0, f"permute {dims} {rid(r)}")


@pytest.mark.parametrize("r", ANY, ids=rid)
@pytest.mark.parametrize("shape,dims", [((3, 5, 6), (2, 0, 1)), ((5, 7), (1, 0)), ((1, 6, 1, 5), (3, 2, 1, -4))])
def test_permute_lower_rank(device, r, shape, dims):
    x = rand(*shape, seed=2)
    want = x.permute(dims).contiguous()
    got = run(device, "permute_copy", {"self": (x, r)}, {"out": (want.shape, r)},
              {"permute_dims": permute_dims_whcn(dims, len(shape))}, storage=r[0])["out"]
    close(got, want, 0, 0, f"permute {shape} {dims} {rid(r)}")


@pytest.mark.parametrize("r", [ANY[0], ANY[-1]], ids=rid)
def test_permute_int32(device, r):
    x = rand(3, 2, 5, 7, seed=3, dtype=torch.int32)
    want = x.permute(0, 2, 3, 1).contiguous()
    got = run(device, "permute_copy", {"self": (x, r)}, {"out": (want.shape, r)},
              {"permute_dims": permute_dims_whcn((0, 2, 3, 1), 4)}, storage=r[0], dtype="int32")["out"]
    close(got, want, 0, 0, f"permute int32 {rid(r)}")
