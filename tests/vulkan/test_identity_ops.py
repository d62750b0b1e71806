"""Every generated variant of the identity ops (alias_copy, clone, clone_dim_order, view_copy).

Each runs in every representation its repset allows (3 float layouts x buffer/texture for float32
and int32, the 4 PACKED_INT8 buffer layouts for int8), input and output in the same one, and must
reproduce PyTorch exactly, padding included (checked on the raw words / texels). view_copy also
reshapes for real, e.g. [2, 3, 5, 7] -> [6, 35], in the same representation.
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch

from texelflow.generated.layouts import Storage
from texelflow.generated.variants import VARIANTS
from texelflow.runtime.vulkan.pipeline import find_variant

from .helpers import random_array
from .opcheck import DISPATCHED, FLOAT_REPRS, INT8_REPRS, STORAGE_AXIS, Case, check_padding, repr_id, run_cases

IDENTITY_OPS = ("alias_copy", "clone", "clone_dim_order", "view_copy")
SHAPES = [(), (1,), (7,), (3, 5), (1, 3, 5), (2, 3, 5, 7), (2, 5, 6, 3)]
SHAPES_HIGHDIM = [(2, 1, 3, 2, 5)]  # buffers only
RESHAPES = [  # view_copy: (input shape, output shape)
    ((2, 3, 5, 7), (6, 35)),
    ((6, 35), (2, 3, 5, 7)),
    ((3, 5, 7), (105,)),
    ((105,), (7, 3, 5)),
    ((2, 3, 5, 7), (7, 2, 15)),
    ((5, 1, 3), (3, 5)),
    ((1,), ()),
    ((), (1, 1)),
]
RESHAPES_HIGHDIM = [((2, 3, 5, 7), (2, 1, 3, 5, 7)), ((2, 1, 3, 2, 5), (6, 10))]
REPS = [(r, dt) for r in FLOAT_REPRS for dt in ("float32", "int32")] + [(r, "int8") for r in INT8_REPRS]

TORCH = {
    "alias_copy": lambda x: torch.ops.aten.alias_copy.default(x),
    "clone": lambda x: torch.clone(x),
    "clone_dim_order": lambda x: torch.clone(x),  # dim_order_ops._clone_dim_order: same values
}


def _rng_seed(*key) -> int:
    return zlib.crc32(repr(key).encode())


@pytest.mark.parametrize("rep,dtype", REPS, ids=lambda p: repr_id(p) if isinstance(p, tuple) else p)
@pytest.mark.parametrize("op", IDENTITY_OPS)
def test_identity_op_is_exact(device, op, rep, dtype):
    storage, layout = rep
    variant = find_variant(op, dtype=dtype, storage=STORAGE_AXIS[storage])
    high = storage == Storage.BUFFER
    if op == "view_copy":
        pairs = [(s, s) for s in SHAPES] + RESHAPES + (RESHAPES_HIGHDIM if high else [])
    else:
        pairs = [(s, s) for s in SHAPES + (SHAPES_HIGHDIM if high else [])]
    cases, wants = [], []
    for sin, sout in pairs:
        x = np.asarray(random_array(sin, dtype, _rng_seed(op, dtype, sin, sout)))
        t = torch.from_numpy(x.copy())
        want = (t.reshape(sout) if op == "view_copy" else TORCH[op](t)).numpy()
        cases.append(Case({"self": x}, sout, {}))
        wants.append(want)
    for (sin, sout), res, want in zip(pairs, run_cases(device, variant, cases, storage, layout, dtype), wants):
        what = f"{variant.name} {repr_id(rep)} {sin} -> {sout}"
        assert res.got.shape == want.shape, what
        np.testing.assert_array_equal(res.got, want, err_msg=what)
        check_padding(res, what)


def _required() -> set[str]:
    return {n for n, v in VARIANTS.items() if v.op in IDENTITY_OPS}


def test_cases_cover_every_identity_variant():
    planned = {find_variant(op, dtype=dt, storage=STORAGE_AXIS[r[0]]).name for op in IDENTITY_OPS for r, dt in REPS}
    assert _required() - planned == set()


def test_every_identity_variant_was_dispatched(request):
    """Runs last in this module: every variant of these ops went through the device above."""
    mine = [i for i in request.session.items if i.module is request.module and i is not request.node]
    if len(mine) != len(IDENTITY_OPS) * len(REPS) + 1:
        pytest.skip("only part of this module was selected")
    assert _required() - {n for n in DISPATCHED if VARIANTS[n].op in IDENTITY_OPS} == set()
