"""cat: one dispatch per input writing its slab of `out` (see shaders/cat.glsl.j2), against torch."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from texelflow.runtime.vulkan.pipeline import find_variant
from texelflow.runtime.vulkan.program import Dispatch, Program
from texelflow.runtime.vulkan.tensor import VkTensor

from .harness import AXIS, close, rand, reprs, rid, whcn_dim

ANY = reprs("ANY_STORAGE")


def run_cat(device, xs: list[torch.Tensor], dim: int, r, dtype: str = "float32") -> np.ndarray:
    """The runtime's lowering: dispatch i binds out (read-write) and xs[i] as `tensors`."""
    variant = find_variant("cat", dtype=dtype, storage=AXIS[r[0]])
    rank = xs[0].dim()
    shape = list(xs[0].shape)
    shape[dim] = sum(x.shape[dim] for x in xs)
    out = VkTensor(device, shape, dtype, *r, label="out")
    ins = [VkTensor(device, x.shape, dtype, *r, label=f"tensors[{i}]") for i, x in enumerate(xs)]
    try:
        offset, got = 0, None
        for x, t in zip(xs, ins):
            scalars = {"dim": dim, "cat_dim": whcn_dim(dim, rank), "cat_offset": offset}
            # One Program per input: Program does not yet order a read-write binding after an
            # earlier one (it treats only `write` access as a hazard); one program with all
            # dispatches is the intended lowering once it does.
            prog = Program(device, [Dispatch(variant, {"out": out, "tensors": t}, scalars)], [t], [out])
            try:
                got = prog(x.numpy())[0]
            finally:
                prog.close()
            offset += x.shape[dim]
        return got
    finally:
        for t in [out, *ins]:
            t.close()


@pytest.mark.parametrize("r", ANY, ids=rid)
@pytest.mark.parametrize("dim", [0, 1, 2, 3])
def test_cat_4d_every_dim(device, r, dim):
    """Three inputs with sizes 3, 2, 5 along the concat dim: texels are shared along the packed dim."""
    base = [2, 3, 5, 7]
    xs = []
    for i, n in enumerate((3, 2, 5)):
        shape = list(base)
        shape[dim] = n
        xs.append(rand(*shape, seed=10 + i))
    close(run_cat(device, xs, dim, r), torch.cat(xs, dim), 0, 0, f"cat dim={dim} {rid(r)}")


@pytest.mark.parametrize("r", ANY, ids=rid)
@pytest.mark.parametrize("shapes,dim", [
    ([(3, 1), (3, 6), (3, 1)], -1), ([(1, 5, 7), (1, 5, 7)], 0), ([(7,), (1,), (5,)], 0),
    ([(1, 4, 3, 5), (1, 1, 3, 5), (1, 7, 3, 5)], -3),
])
def test_cat_ranks_and_negative_dims(device, r, shapes, dim):
    xs = [rand(*s, seed=20 + i) for i, s in enumerate(shapes)]
    close(run_cat(device, xs, dim, r), torch.cat(xs, dim), 0, 0, f"cat {shapes} dim={dim} {rid(r)}")


@pytest.mark.parametrize("r", [ANY[0], ANY[-1]], ids=rid)
def test_cat_int32(device, r):
    xs = [rand(2, 3, 5, seed=30, dtype=torch.int32), rand(2, 3, 2, seed=31, dtype=torch.int32)]
    close(run_cat(device, xs, -1, r, "int32"), torch.cat(xs, -1), 0, 0, f"cat int32 {rid(r)}")
