"""Tensor geometry: the sizes of every representation of a tensor, computed in one place.

WHCN sizes, padded buffer sizes, buffer words and dim order, texture extents, dispatch units and
device bytes of a (shape, storage, layout[, dtype]), as docs/memory-layouts.md defines them, plus
the WHCN numbering of torch dims that dispatches push as constants. runtime.graph (texture limits
while planning), runtime.vulkan (allocation, packing, dispatch) and the tests all call these
functions, so the host has this math exactly once; `shaders/include/indexing.glslh` is its GLSL
twin on the device.

Why hand-written, and why here: it is pure arithmetic over the generated tables
(`texelflow.generated.layouts`: packed dims, blocks, storage kinds, dtype lane sizes), with nothing
to specialise per layout, so rendering it from a template would only hide plain Python from
readers and linters. It sits in the shaders package beside indexing.glslh, the other half of the
same contract, and like generated/ it is below both runtime layers: runtime.graph and
runtime.vulkan each import it and never each other. It needs only the standard library and the
generated tables (no numpy, no torch, no device).
"""
from __future__ import annotations

import math
from typing import Sequence

from texelflow.generated.layouts import (
    DTYPES,
    LAYOUT_INFO,
    PACKED_DIM_INFO,
    STORAGE_BY_AXIS,
    STORAGE_INFO,
    Layout,
    Storage,
)
from texelflow.shaders.node_rules import whcn as whcn_dim  # noqa: F401  (one definition, shared with the push rules)

MAX_TEXTURE_RANK = 4  # rank 5+ tensors live only in buffers (leading dims folded into N)


def as_storage(storage: Storage | str | int) -> Storage:
    """A Storage from itself, its id, its enum name ("TEXTURE_3D") or its axis name ("texture3d")."""
    if isinstance(storage, str):
        return STORAGE_BY_AXIS[storage] if storage in STORAGE_BY_AXIS else Storage[storage.upper()]
    return Storage(storage)


def as_layout(layout: Layout | str | int) -> Layout:
    return Layout[layout] if isinstance(layout, str) else Layout(layout)


# ---- WHCN numbering ----------------------------------------------------------------------------
def whcn_sizes(shape: Sequence[int]) -> tuple[int, int, int, int]:
    """(W, H, C, N) of an NCHW shape; missing dims are 1 and dims before C fold into N."""
    dims = tuple(int(d) for d in shape)
    padded = (1,) * max(0, 4 - len(dims)) + dims
    return padded[-1], padded[-2], padded[-3], math.prod(padded[:-3])


def permute_dims_whcn(dims: Sequence[int], rank: int) -> tuple[int, int, int, int]:
    """torch permute `dims` of a rank-`rank` tensor in WHCN terms: output WHCN dim d reads input
    WHCN dim result[d] (r - 1 - dims[r - 1 - d] for d < r, d itself above the rank)."""
    dims = [d % rank for d in dims] if rank else []
    return tuple(rank - 1 - dims[rank - 1 - d] if d < rank else d for d in range(4))


# ---- buffers -----------------------------------------------------------------------------------
def padded_sizes(shape: Sequence[int], layout) -> tuple[int, int, int, int]:
    """WHCN sizes of a buffer with the packed dim and outer dim rounded up to their blocks."""
    info = LAYOUT_INFO[as_layout(layout)]
    p = list(whcn_sizes(shape))
    p[info.packed_dim] = -(-p[info.packed_dim] // info.buffer_block) * info.buffer_block
    p[info.outer_dim] = -(-p[info.outer_dim] // info.outer_block) * info.outer_block
    return tuple(p)


def buffer_words(shape: Sequence[int], layout) -> int:
    """Number of buffer elements of a layout's block: one per element for the float family,
    one 32-bit word per `buffer_block` int8 lanes for int8x4."""
    info = LAYOUT_INFO[as_layout(layout)]
    return math.prod(padded_sizes(shape, layout)) // info.buffer_block


def buffer_rest_dims(layout) -> tuple[int, int]:
    """(r0, r1): the two dims that are neither packed nor outer, faster first (WHCN order)."""
    info = LAYOUT_INFO[as_layout(layout)]
    r0, r1 = (d for d in range(4) if d not in (info.packed_dim, info.outer_dim))
    return r0, r1


# ---- textures ----------------------------------------------------------------------------------
def texel_lanes(layout, storage=Storage.TEXTURE_3D) -> int:
    """Elements per texel of `layout` in an image storage (its block in layouts.yaml)."""
    storage, layout = as_storage(storage), as_layout(layout)
    pdi = PACKED_DIM_INFO.get((storage, layout))
    if pdi is None or not STORAGE_INFO[storage].is_image:
        raise ValueError(f"layout {layout.name} has no {storage.name} representation")
    return pdi.block


def texture_extents(shape: Sequence[int], layout, storage=Storage.TEXTURE_3D) -> tuple[int, int, int]:
    """(x, y, z) texel extents of a 3-D texture: packed axis divided by its block, batches on z."""
    block = texel_lanes(layout, storage)
    info = LAYOUT_INFO[as_layout(layout)]
    s = whcn_sizes(shape)
    e = list(s[:3])
    e[info.packed_dim] = -(-s[info.packed_dim] // block)
    return e[0], e[1], e[2] * s[3]


def fits_texture(shape: Sequence[int], layout, limits: Sequence[int], storage=Storage.TEXTURE_3D) -> bool:
    """Whether the tensor has this texture representation under the (x, y, z) extent limits."""
    if len(tuple(shape)) > MAX_TEXTURE_RANK:
        return False
    return all(e <= m for e, m in zip(texture_extents(shape, layout, storage), limits))


# ---- any storage -------------------------------------------------------------------------------
def units(shape: Sequence[int], storage, layout) -> int:
    """Output units a shader processes, one invocation each: texels of an image, words of a buffer."""
    if STORAGE_INFO[as_storage(storage)].is_image:
        return math.prod(texture_extents(shape, layout, storage))
    return buffer_words(shape, layout)


def nbytes(shape: Sequence[int], dtype: str, storage, layout) -> int:
    """Device bytes of the representation, padding included (lane size from the dtype table)."""
    lane = DTYPES[dtype].lane_bytes
    if STORAGE_INFO[as_storage(storage)].is_image:
        return math.prod(texture_extents(shape, layout, storage)) * texel_lanes(layout, storage) * lane
    return math.prod(padded_sizes(shape, layout)) * lane
