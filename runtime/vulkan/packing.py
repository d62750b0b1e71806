"""Host-side packing between contiguous NCHW arrays and the words/texels of a representation.

This is the host third of the contract in docs/memory-layouts.md (the other two are the GLSL
indexing helpers and layouts.yaml). Everything is vectorised numpy: pad, reshape, transpose; no
per-element Python loops. Layout facts come only from `texelflow.generated.layouts`, and every
size (padded sizes, extents, words) from `texelflow.shaders.geometry`.
"""
from __future__ import annotations

import math

import numpy as np

from texelflow.generated.layouts import DTYPES, LAYOUT_INFO, STORAGE_INFO, LayoutInfo
from texelflow.shaders.geometry import (MAX_TEXTURE_RANK, as_layout, as_storage, buffer_rest_dims, padded_sizes,
                                        texel_lanes, texture_extents, whcn_sizes)

# Host dtypes packing handles -> the numpy type of a stored lane: the host element itself (int8
# lanes are bytes of a word), except bool, stored as int32 0 / 1 (layouts.yaml) and read back as
# `lane != 0`, so what comes back is exactly a bool array. float16 lanes are IEEE halves, 2 bytes
# in a buffer, 8 bytes a texel in an rgba16f texture.
_NP_DTYPES = {"float32": np.float32, "float16": np.float16, "int32": np.int32, "int8": np.int8, "bool": np.int32}
# numpy axis of each WHCN dim in an (N, C, H, W) array
_AXIS = {0: 3, 1: 2, 2: 1, 3: 0}


def check_representation(shape, dtype: str, storage, layout) -> LayoutInfo:
    """Validate that (shape, dtype, storage, layout) is a representation; return the layout facts."""
    storage, layout = as_storage(storage), as_layout(layout)
    info = LAYOUT_INFO[layout]
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; known: {sorted(DTYPES)}")
    if dtype not in _NP_DTYPES:
        raise ValueError(f"no host packing for dtype {dtype} yet; packing handles {sorted(_NP_DTYPES)}")
    if DTYPES[dtype].family != info.family:
        raise ValueError(f"dtype {dtype} belongs to the {DTYPES[dtype].family} family, "
                         f"layout {layout.name} to the {info.family} family")
    if storage not in info.storages:
        raise ValueError(f"layout {layout.name} has no {storage.name} storage")
    if STORAGE_INFO[storage].is_image and len(tuple(shape)) > MAX_TEXTURE_RANK:
        raise ValueError(f"rank {len(tuple(shape))} tensors have no texture representation (buffers only)")
    return info


def _is_image(storage) -> bool:
    return STORAGE_INFO[as_storage(storage)].is_image


def _nchw(array: np.ndarray) -> np.ndarray:
    w, h, c, n = whcn_sizes(array.shape)
    return np.ascontiguousarray(array).reshape(n, c, h, w)


def _pad_to(a4: np.ndarray, sizes) -> np.ndarray:
    """Zero-pad an (N, C, H, W) array at the end of each axis to WHCN `sizes`."""
    want = (sizes[3], sizes[2], sizes[1], sizes[0])
    return np.pad(a4, [(0, t - have) for t, have in zip(want, a4.shape)])


def pack(array: np.ndarray, storage, layout) -> np.ndarray:
    """Pack a contiguous NCHW array into buffer words (1-D) or texels (z, y, x, 4)."""
    array = np.asarray(array)
    dtype = str(array.dtype)
    info = check_representation(array.shape, dtype, storage, layout)
    a4 = _nchw(array.astype(_NP_DTYPES[dtype], copy=False))
    if _is_image(storage):
        return _pack_texture(a4, info)
    return _pack_buffer(a4, info)


def _pack_buffer(a4: np.ndarray, info: LayoutInfo) -> np.ndarray:
    p = padded_sizes(a4.shape, info.layout)
    P, O, B, Bo = info.packed_dim, info.outer_dim, info.buffer_block, info.outer_block
    r0, r1 = buffer_rest_dims(info.layout)
    e = _pad_to(a4, p).transpose(_AXIS[r1], _AXIS[r0], _AXIS[O], _AXIS[P])
    e = e.reshape(p[r1], p[r0], p[O] // Bo, Bo, p[P] // B, B)  # r1, r0, wo, lo, wp, lane
    order = (0, 1, 4, 2, 3, 5) if info.block_transposed else (0, 1, 2, 4, 3, 5)
    words = np.ascontiguousarray(e.transpose(order))
    if B == 1:
        return words.reshape(-1)
    return words.reshape(-1, B).view("<i4").reshape(-1).astype(np.int32, copy=False)


def _pack_texture(a4: np.ndarray, info: LayoutInfo) -> np.ndarray:
    s = _whcn_of(a4)
    P, lanes = info.packed_dim, texel_lanes(info.layout)
    p = list(s)
    p[P] = -(-s[P] // lanes) * lanes
    t = _pad_to(a4, p)
    ax = _AXIS[P]
    split = t.reshape(t.shape[:ax] + (p[P] // lanes, lanes) + t.shape[ax + 1:])  # 5-D, lane after ax
    texels = np.moveaxis(split, ax + 1, -1)  # (N, C', H', W', lanes)
    x, y, z = texture_extents(_shape_of(s), info.layout)
    return np.ascontiguousarray(texels).reshape(z, y, x, lanes)


def unpack(data: np.ndarray, shape, dtype: str, storage, layout) -> np.ndarray:
    """Inverse of `pack`: words or texels back to a contiguous array of `shape` and `dtype`."""
    shape = tuple(int(s) for s in shape)
    info = check_representation(shape, dtype, storage, layout)
    s = whcn_sizes(shape)
    if _is_image(storage):
        a4 = _unpack_texture(np.asarray(data), s, info, dtype)
    else:
        a4 = _unpack_buffer(np.asarray(data), s, info, dtype)
    out = np.ascontiguousarray(a4[: s[3], : s[2], : s[1], : s[0]]).reshape(shape)
    return out != 0 if dtype == "bool" else out


def _unpack_buffer(words: np.ndarray, s, info: LayoutInfo, dtype: str) -> np.ndarray:
    p = padded_sizes(_shape_of(s), info.layout)
    P, O, B, Bo = info.packed_dim, info.outer_dim, info.buffer_block, info.outer_block
    r0, r1 = buffer_rest_dims(info.layout)
    words = np.ascontiguousarray(words).reshape(-1)[: math.prod(p) // B]
    if B == 1:
        lanes = words.view(_NP_DTYPES[dtype])
    else:
        lanes = words.astype("<i4", copy=False).view(np.int8)
    if info.block_transposed:
        e = lanes.reshape(p[r1], p[r0], p[P] // B, p[O] // Bo, Bo, B).transpose(0, 1, 3, 4, 2, 5)
    else:
        e = lanes.reshape(p[r1], p[r0], p[O] // Bo, p[P] // B, Bo, B).transpose(0, 1, 2, 4, 3, 5)
    e = e.reshape(p[r1], p[r0], p[O], p[P])  # element order (r1, r0, O, P)
    inverse = np.argsort([_AXIS[r1], _AXIS[r0], _AXIS[O], _AXIS[P]])
    return e.transpose(inverse)


def _unpack_texture(texels: np.ndarray, s, info: LayoutInfo, dtype: str) -> np.ndarray:
    P, lanes = info.packed_dim, texel_lanes(info.layout)
    x, y, z = texture_extents(_shape_of(s), info.layout)
    t = np.ascontiguousarray(texels).reshape(-1)[: x * y * z * lanes].view(_NP_DTYPES[dtype])
    ez = z // s[3]
    t = t.reshape(s[3], ez, y, x, lanes)  # N, C', H', W', lane
    ax = _AXIS[P]
    t = np.moveaxis(t, -1, ax + 1)  # lane right after the packed axis
    shape = list(t.shape[:ax]) + [t.shape[ax] * lanes] + list(t.shape[ax + 2:])
    return t.reshape(shape)


def _whcn_of(a4: np.ndarray) -> tuple[int, int, int, int]:
    n, c, h, w = a4.shape
    return w, h, c, n


def _shape_of(s) -> tuple[int, int, int, int]:
    """NCHW shape of WHCN sizes."""
    return s[3], s[2], s[1], s[0]
