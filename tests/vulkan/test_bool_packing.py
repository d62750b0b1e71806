"""Bool tensors on the host and on the device: layouts.yaml stores a bool as an int32 0 / 1 lane
(buffer word or texel channel, rgba32i textures), and what comes back is exactly the bool array."""
from __future__ import annotations

import numpy as np
import pytest

from texelflow.generated.layouts import DTYPES, LAYOUT_INFO, Layout, Storage
from texelflow.runtime.vulkan import packing
from texelflow.runtime.vulkan.tensor import VkTensor

from .test_packing import reference_pack

FLOAT_FAMILY = [(s, l) for l in Layout if LAYOUT_INFO[l].family == "float" for s in LAYOUT_INFO[l].storages]
SHAPES = [(), (1,), (7,), (3, 5), (2, 3, 5, 7), (2, 1, 3, 2, 5)]


def _bools(shape, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2, size=shape).astype(bool)


def test_layouts_store_bool_as_int32_lanes():
    b = DTYPES["bool"]
    assert (b.family, b.lane_bytes, b.glsl) == ("float", 4, "int")


# rank > 4 has no texture representation
CASES = [(s, l, shape) for s, l in FLOAT_FAMILY for shape in SHAPES if s == Storage.BUFFER or len(shape) <= 4]


@pytest.mark.parametrize("storage,layout,shape", CASES, ids=[f"{s.name}-{l.name}-{list(x)}" for s, l, x in CASES])
def test_bool_packs_as_int32_zero_one_and_roundtrips(storage, layout, shape):
    a = _bools(shape)
    packed = packing.pack(a, storage, layout)
    assert packed.dtype == np.int32
    np.testing.assert_array_equal(packed, reference_pack(a.astype(np.int32), storage, layout))
    back = packing.unpack(packed, shape, "bool", storage, layout)
    assert back.dtype == np.bool_ and back.shape == shape
    np.testing.assert_array_equal(back, a)


@pytest.mark.parametrize("storage,layout", FLOAT_FAMILY, ids=lambda x: x.name)
def test_bool_tensor_uploads_and_downloads(device, storage, layout):
    a = _bools((2, 3, 5, 7), seed=1)
    t = VkTensor(device, a.shape, "bool", storage, layout, label="mask")
    try:
        t.upload(a)
        back = t.download()
    finally:
        t.close()
    assert back.dtype == np.bool_
    np.testing.assert_array_equal(back, a)
