"""layer_norm over the last dim, on every float representation, against torch."""
from __future__ import annotations

import pytest
import torch

from .harness import affine, close, rand, reprs, rid, run

ANY = reprs("ANY_STORAGE")  # the 6 float representations


@pytest.mark.parametrize("r", ANY, ids=rid)
@pytest.mark.parametrize("shape,has_weight,has_bias,eps", [
    ((2, 3, 5, 7), True, True, 1e-5), ((5, 3), False, True, 1e-3), ((1, 1, 9), True, False, 1e-5),
    ((3, 1), False, False, 1e-5),  # W = 1: every output is bias (here 0)
])
def test_layer_norm(device, r, shape, has_weight, has_bias, eps):
    x = rand(*shape, seed=1) * 3 + 1
    weight, bias, tensors, scalars = affine(shape[-1], has_weight, has_bias)
    want = torch.nn.functional.layer_norm(x, shape[-1:], weight, bias, eps)
    got = run(device, "layer_norm", {"input": (x, r)} | tensors, {"out": (want.shape, r)},
              scalars | {"eps": eps}, storage=r[0])["out"]
    close(got, want, 1e-4, 1e-4, f"layer_norm {shape} {rid(r)}")
