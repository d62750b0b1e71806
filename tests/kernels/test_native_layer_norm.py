"""native_layer_norm (out, mean, rstd) over the last dim, on every float representation, against torch."""
from __future__ import annotations

import pytest
import torch

from .harness import affine, close, rand, reprs, rid, run

ANY = reprs("ANY_STORAGE")


@pytest.mark.parametrize("r", ANY, ids=rid)
@pytest.mark.parametrize("shape,has_weight,has_bias", [
    ((3, 5, 7), True, True), ((2, 3, 6, 5), False, False), ((1, 5, 1, 9), True, False), ((6,), False, True),
])
def test_native_layer_norm(device, r, shape, has_weight, has_bias):
    x = rand(*shape, seed=4) * 2 - 1
    weight, bias, tensors, scalars = affine(shape[-1], has_weight, has_bias)
    out, mean, rstd = torch.ops.aten.native_layer_norm.default(x, list(shape[-1:]), weight, bias, 1e-5)
    got = run(device, "native_layer_norm", {"input": (x, r)} | tensors,
              {"out": (out.shape, r), "mean": (mean.shape, r), "rstd": (rstd.shape, r)},
              scalars | {"eps": 1e-5}, storage=r[0])
    close(got["out"], out, 1e-4, 1e-4, f"out {shape} {rid(r)}")
    close(got["mean"], mean, 1e-4, 1e-5, f"mean {shape} {rid(r)}")
    close(got["rstd"], rstd, 1e-4, 1e-4, f"rstd {shape} {rid(r)}")
