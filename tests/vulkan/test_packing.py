"""Host packing against a literal, element-by-element reading of docs/memory-layouts.md."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from texelflow.generated.layouts import LAYOUT_INFO, Layout, Storage
from texelflow.runtime.vulkan import packing
from texelflow.shaders import geometry

from .helpers import random_array, representations

DIMS = st.sampled_from([1, 2, 3, 5, 7, 8])
NP = {"float32": np.float32, "int32": np.int32, "int8": np.int8}


def reference_pack(a: np.ndarray, storage, layout) -> np.ndarray:
    """The contract's formulas, one element at a time (slow; small shapes only)."""
    info = LAYOUT_INFO[layout]
    s = geometry.whcn_sizes(a.shape)
    a4 = a.reshape(s[3], s[2], s[1], s[0])
    P = info.packed_dim
    if storage == Storage.TEXTURE_3D:
        e = list(s[:3])
        e[P] = math.ceil(s[P] / 4)
        out = np.zeros((e[2] * s[3], e[1], e[0], 4), a.dtype)
        for n, c, h, w in np.ndindex(a4.shape):
            i = [w, h, c, n]
            t = list(i[:3])
            t[P] //= 4
            out[t[2] + n * e[2], t[1], t[0], i[P] % 4] = a4[n, c, h, w]
        return out
    B, O, Bo = info.buffer_block, info.outer_dim, info.outer_block
    p = list(s)
    p[P] = math.ceil(p[P] / B) * B
    p[O] = math.ceil(p[O] / Bo) * Bo
    r0, r1 = [d for d in range(4) if d not in (P, O)]
    lanes = np.zeros(math.prod(p), a.dtype)  # B lanes per word
    for n, c, h, w in np.ndindex(a4.shape):
        i = [w, h, c, n]
        wp, wo, lo = i[P] // B, i[O] // Bo, i[O] % Bo
        if info.block_transposed:
            block = ((i[r1] * p[r0] + i[r0]) * (p[P] // B) + wp) * (p[O] // Bo) + wo
        else:
            block = ((i[r1] * p[r0] + i[r0]) * (p[O] // Bo) + wo) * (p[P] // B) + wp
        lanes[(block * Bo + lo) * B + i[P] % B] = a4[n, c, h, w]
    return lanes.view("<i4").astype(np.int32) if B == 4 else lanes


@pytest.mark.parametrize("storage,layout,dtype", representations(), ids=lambda x: getattr(x, "name", x))
@settings(max_examples=12, deadline=None)
@given(shape=st.lists(DIMS, min_size=0, max_size=4), seed=st.integers(0, 2**16))
def test_pack_matches_contract_and_roundtrips(storage, layout, dtype, shape, seed):
    a = random_array(tuple(shape), dtype, seed)
    packed = packing.pack(a, storage, layout)
    np.testing.assert_array_equal(packed, reference_pack(a, storage, layout))
    back = packing.unpack(packed, a.shape, dtype, storage, layout)
    assert back.dtype == a.dtype and back.shape == a.shape
    np.testing.assert_array_equal(back, a)


@pytest.mark.parametrize("layout", list(Layout), ids=lambda x: x.name)
def test_rank5_buffer_folds_leading_dims_into_n(layout):
    dtype = "int8" if LAYOUT_INFO[layout].family == "int8x4" else "float32"
    a = random_array((2, 3, 5, 3, 7), dtype, 1)
    folded = a.reshape(6, 5, 3, 7)
    np.testing.assert_array_equal(packing.pack(a, Storage.BUFFER, layout),
                                  packing.pack(folded, Storage.BUFFER, layout))
    np.testing.assert_array_equal(packing.unpack(packing.pack(a, Storage.BUFFER, layout), a.shape, dtype,
                                                 Storage.BUFFER, layout), a)


def test_float_buffers_are_the_familiar_dim_orders():
    a = random_array((2, 3, 5, 7), "float32", 2)
    np.testing.assert_array_equal(packing.pack(a, "BUFFER", "WIDTH_PACKED"), a.reshape(-1))
    np.testing.assert_array_equal(packing.pack(a, "BUFFER", "HEIGHT_PACKED"), a.transpose(0, 1, 3, 2).reshape(-1))
    np.testing.assert_array_equal(packing.pack(a, "BUFFER", "CHANNELS_PACKED"), a.transpose(0, 2, 3, 1).reshape(-1))


def test_texture_extents_and_padding_lanes_are_zero():
    a = np.ones((2, 5, 3, 7), np.float32)  # N=2, C=5 -> ceil(5/4)=2 channel texels per batch
    assert geometry.texture_extents(a.shape, Layout.CHANNELS_PACKED) == (7, 3, 4)
    t = packing.pack(a, Storage.TEXTURE_3D, Layout.CHANNELS_PACKED)
    assert t.shape == (4, 3, 7, 4)
    assert t.sum() == a.size  # every padding lane is zero


def test_invalid_representations_are_refused():
    with pytest.raises(ValueError, match="family"):
        packing.pack(np.zeros((4,), np.float32), Storage.BUFFER, Layout.PACKED_INT8_4W)
    with pytest.raises(ValueError, match="no TEXTURE_3D"):
        packing.pack(np.zeros((4,), np.int8), Storage.TEXTURE_3D, Layout.PACKED_INT8_4W)
    with pytest.raises(ValueError, match="rank 5"):
        packing.pack(np.zeros((1, 1, 1, 1, 1), np.float32), Storage.TEXTURE_3D, Layout.WIDTH_PACKED)


@pytest.mark.parametrize("storage,layout,dtype", representations(), ids=lambda x: getattr(x, "name", x))
def test_geometry_sizes_match_the_packed_data(storage, layout, dtype):
    """shaders/geometry.py's sizes are the sizes of what packing produces (one math for both)."""
    for shape in [(), (5,), (3, 7), (5, 3, 7), (2, 5, 3, 7), (3, 2, 5, 3, 6)]:
        if storage == Storage.TEXTURE_3D and len(shape) > geometry.MAX_TEXTURE_RANK:
            assert not geometry.fits_texture(shape, layout, (1 << 20,) * 3)
            continue
        packed = packing.pack(random_array(shape, dtype, 0), storage, layout)
        assert packed.nbytes == geometry.nbytes(shape, dtype, storage, layout), shape
        units = packed.shape[0] * packed.shape[1] * packed.shape[2] if packed.ndim == 4 else packed.size
        assert units == geometry.units(shape, storage, layout), shape
        if storage == Storage.BUFFER:
            assert packed.size == geometry.buffer_words(shape, layout)
        else:
            assert packed.shape[:3][::-1] == geometry.texture_extents(shape, layout)


def test_whcn_numbering():
    assert geometry.whcn_sizes((2, 3, 4, 5, 6)) == (6, 5, 4, 6)
    assert [geometry.whcn_dim(d, 4) for d in (0, 1, 2, 3, -1)] == [3, 2, 1, 0, 0]
    assert geometry.whcn_dim(0, 0) == 0
    assert geometry.permute_dims_whcn([0, 2, 3, 1], 4) == (2, 0, 1, 3)  # NCHW -> NHWC
    assert geometry.as_storage("texture3d") == geometry.as_storage("TEXTURE_3D") == Storage.TEXTURE_3D
