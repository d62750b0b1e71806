"""squeeze_copy and unsqueeze_copy: identity views on the copy template, on every representation
incl. packed int8."""
from __future__ import annotations

import pytest
import torch

from texelflow.generated.ops import OPS

from .harness import close, rand, reprs, rid, run

DTYPES = {"float32": torch.float32, "int32": torch.int32, "int8": torch.int8}
REPRS = [(r, "float32") for r in reprs("ANY_STORAGE")] + [(r, "int32") for r in reprs("ANY_STORAGE")[::5]]
REPRS += [(r, "int8") for r in reprs("ANY_STORAGE_INCL_PACKED_INT8", "int8x4")]
CASES = {
    "squeeze_copy": [
        ((1, 3, 1, 5), lambda x: x.squeeze((0, 2)), {}),
        ((2, 1, 7), lambda x: x.squeeze(1), {}),
        ((1, 6, 1, 1), lambda x: x.squeeze(), {}),
    ],
    "unsqueeze_copy": [
        ((3, 5), lambda x: x.unsqueeze(1), {"dim": 1}),
        ((2, 3, 6), lambda x: x.unsqueeze(-1), {"dim": -1}),
        ((7,), lambda x: x.unsqueeze(0), {"dim": 0}),
    ],
}


@pytest.mark.parametrize("op", sorted(CASES))
def test_is_an_identity_op(op):
    assert OPS[op].is_identity and OPS[op].sync == (("self", "out"),)
    assert {a.repset for a in OPS[op].args if a.repset} == {"ANY_STORAGE_INCL_PACKED_INT8"}


@pytest.mark.parametrize("rd", REPRS, ids=lambda rd: f"{rid(rd[0])}-{rd[1]}")
@pytest.mark.parametrize("op", sorted(CASES))
def test_matches_torch(device, op, rd):
    r, dtype = rd
    for shape, fn, scalars in CASES[op]:
        x = rand(*shape, seed=1, dtype=DTYPES[dtype])
        want = fn(x).contiguous()
        got = run(device, op, {"self": (x, r)}, {"out": (want.shape, r)}, scalars, storage=r[0],
                  dtype=dtype)["out"]
        close(got, want, 0, 0, f"{op} {shape} {rid(r)} {dtype}")
