"""float16 tensors on the device: host packing round trips bit for bit in every float
representation (2-byte buffer lanes, rgba16f texels), special values included."""
from __future__ import annotations

import numpy as np
import pytest

from texelflow.generated.layouts import LAYOUT_INFO, Storage
from texelflow.runtime.vulkan.tensor import VkTensor
from texelflow.shaders import geometry

FLOAT_REPRS = [(s, l) for l, info in sorted(LAYOUT_INFO.items()) if info.family == "float" for s in sorted(info.storages)]
SHAPES = [(1,), (7,), (3, 5), (1, 3, 5), (2, 5, 3, 7), (3, 6, 1, 5), (2, 1, 3, 2, 5)]
SPECIALS = np.array([np.nan, np.inf, -np.inf, -0.0, 6e-8, -6.1e-5, 65504.0, -65504.0], dtype=np.float16)


def halves(shape, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal(shape) * 100).astype(np.float16)
    flat = a.reshape(-1)
    flat[: min(flat.size, SPECIALS.size)] = SPECIALS[: flat.size]
    return a


@pytest.mark.parametrize("storage,layout", FLOAT_REPRS, ids=lambda x: x.name)
def test_float16_round_trips_bit_for_bit(device, storage, layout):
    for i, shape in enumerate(SHAPES):
        if storage is Storage.TEXTURE_3D and len(shape) > 4:
            continue
        a = halves(shape, i)
        t = VkTensor(device, shape, "float16", storage, layout)
        try:
            assert t.nbytes == geometry.nbytes(shape, "float32", storage, layout) // 2  # 2 bytes a lane
            t.upload(a)
            back = t.download()
            raw = t.download_raw().view(np.int16)
            padding = t.pack(np.ones(shape, np.float16)).view(np.int16) == 0
        finally:
            t.close()
        assert back.dtype == np.float16 and back.shape == shape
        np.testing.assert_array_equal(back.view(np.int16), a.view(np.int16), err_msg=f"{shape}")
        assert not raw[padding].any(), f"{shape}: padding lanes are not zero"
