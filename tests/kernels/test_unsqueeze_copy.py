"""unsqueeze_copy: an identity view on the copy template, every representation incl. int8."""
from __future__ import annotations

import pytest
import torch

from texelflow.generated.ops import OPS

from .harness import close, rand, reprs, rid, run

REPRS = [(r, "float32") for r in reprs("ANY_STORAGE")] + [(r, "int32") for r in reprs("ANY_STORAGE")[:2]]
REPRS += [(r, "int8") for r in reprs("ANY_STORAGE_INCL_PACKED_INT8", "int8x4")]
DTYPES = {"float32": torch.float32, "int32": torch.int32, "int8": torch.int8}
CASES = [("squeeze_copy", (1, 3, 1, 5), lambda x: x.squeeze((0, 2)), {}),
         ("squeeze_copy", (2, 1, 7), lambda x: x.squeeze(1), {}),
         ("unsqueeze_copy", (3, 5), lambda x: x.unsqueeze(1), {"dim": 1}),
         ("unsqueeze_copy", (2, 3, 6), lambda x: x.unsqueeze(-1), {"dim": -1})]


def test_unsqueeze_copy_is_an_identity_op():
    for name in ("unsqueeze_copy",):
        assert OPS[name].is_identity and OPS[name].sync == (("self", "out"),)
        assert {a.repset for a in OPS[name].args if a.repset} == {"ANY_STORAGE_INCL_PACKED_INT8"}


@pytest.mark.parametrize("rd", REPRS, ids=lambda rd: f"{rid(rd[0])}-{rd[1]}")
def test_unsqueeze_copy(device, rd):
    r, dtype = rd
    for op, shape, fn, scalars in CASES:
        x = rand(*shape, seed=1, dtype=DTYPES[dtype])
        want = fn(x).contiguous()
        got = run(device, op, {"self": (x, r)}, {"out": (want.shape, r)}, scalars, storage=r[0], dtype=dtype)["out"]
        close(got, want, 0, 0, f"{op} {shape} {rid(r)} {dtype}")
