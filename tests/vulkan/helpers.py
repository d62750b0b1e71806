"""Test helpers shared by the Vulkan tests (representations, random arrays)."""
from __future__ import annotations

import numpy as np

from texelflow.generated.layouts import LAYOUT_INFO


def representations():
    """Every (storage, layout, dtype) the contract defines."""
    out = []
    for layout, info in sorted(LAYOUT_INFO.items()):
        dtypes = ["float32", "int32"] if info.family == "float" else ["int8"]
        for storage in sorted(info.storages):
            out.extend((storage, layout, dt) for dt in dtypes)
    return out


def random_array(shape, dtype: str, seed: int) -> np.ndarray:
    """Values that catch lane mix-ups: distinct, signed, and full-range for int8."""
    rng = np.random.default_rng(seed)
    if dtype == "float32":
        return rng.standard_normal(shape).astype(np.float32)
    if dtype == "int32":
        return rng.integers(-2**31, 2**31 - 1, size=shape, dtype=np.int64).astype(np.int32)
    return rng.integers(-128, 128, size=shape, dtype=np.int64).astype(np.int8)
