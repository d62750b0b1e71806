"""squeeze_copy: an identity view on the copy template, on every representation incl. packed int8."""
from __future__ import annotations

import pytest
import torch

from texelflow.generated.ops import OPS

from .harness import close, rand, reprs, rid, run

DTYPES = {"float32": torch.float32, "int32": torch.int32, "int8": torch.int8}
REPRS = [(r, "float32") for r in reprs("ANY_STORAGE")] + [(r, "int32") for r in reprs("ANY_STORAGE")[::5]]
REPRS += [(r, "int8") for r in reprs("ANY_STORAGE_INCL_PACKED_INT8", "int8x4")]
CASES = [
    ((1, 3, 1, 5), lambda x: x.squeeze((0, 2)), {}),
    ((2, 1, 7), lambda x: x.squeeze(1), {}),
    ((1, 6, 1, 1), lambda x: x.squeeze(), {}),
]


def test_squeeze_copy_is_an_identity_op():
    assert OPS["squeeze_copy"].is_identity and OPS["squeeze_copy"].sync == (("self", "out"),)
    assert {a.repset for a in OPS["squeeze_copy"].args if a.repset} == {"ANY_STORAGE_INCL_PACKED_INT8"}


@pytest.mark.parametrize("rd", REPRS, ids=lambda rd: f"{rid(rd[0])}-{rd[1]}")
def test_squeeze_copy(device, rd):
    r, dtype = rd
    for shape, fn, scalars in CASES:
        x = rand(*shape, seed=1, dtype=DTYPES[dtype])
        want = fn(x).contiguous()
        got = run(device, "squeeze_copy", {"self": (x, r)}, {"out": (want.shape, r)}, scalars, storage=r[0],
                  dtype=dtype)["out"]
        close(got, want, 0, 0, f"squeeze_copy {shape} {rid(r)} {dtype}")
