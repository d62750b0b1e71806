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


# float32 values whose float16 rounding is easy to get wrong: ties at several exponents (to even,
# up and down), ties in float16's subnormal range, the overflow threshold 65520 and its neighbours,
# float32 subnormals and huge values, signed zeros, NaN and the infinities.
_TIES = [m * 2.0 ** e for e in (-24, -20, -14, -8, 0, 5, 11, 15) for m in (1 + 2 ** -11, 1 + 3 * 2 ** -11)]
ROUNDING = np.array([*_TIES, *(-t for t in _TIES), 3 * 2.0 ** -25, 2.0 ** -25, 2.0 ** -26, 65504.0, 65519.996,
                     65520.0, -65520.0, 65536.0, 1e30, -1e30, 1e-40, -1e-40, 0.0, -0.0, np.nan, np.inf, -np.inf,
                     6099.0, -6099.0, 3623.0, 2.5, -2.5, 0.1, 1 / 3], dtype=np.float32)


@pytest.mark.parametrize("vname", ["cast_to_float16_float32_buffer", "cast_to_float16_float32_texture3d"])
def test_float16_stores_round_to_nearest_even_whatever_the_device_converts(device, vname):
    """Every float16 store rounds in the shader (tf_to_float16): the result equals numpy's
    astype(float16) bit for bit, NaN for NaN; NVIDIA's own conversion rounds toward zero."""
    from .nodecheck import build_node, explicit_case, flush_subnormals, repr_combos, run_nodes
    from texelflow.generated.ops import OPS
    from texelflow.generated.variants import VARIANTS

    op = OPS["cast_to_float16"]
    x = ROUNDING
    if ("DenormPreserve", 32) not in device.limits.float_modes:  # a flushing device reads them as zeros
        x = flush_subnormals(x)
    case = explicit_case(op, {"self": x.shape}, {"self": x}, "float16 rounding")
    for combo in repr_combos(op, VARIANTS[vname]):
        node, arrays = build_node(op, "float32", case)
        [[out]] = run_nodes(device, [(node, arrays)], combo, "float32", expect_variant=vname)
        with np.errstate(over="ignore"):
            want = x.astype(np.float16)  # numpy rounds to nearest even, to Inf from 65520
        assert out.got.dtype == np.float16, out.got.dtype
        got = out.got
        same = (got.view(np.uint16) == want.view(np.uint16)) | (np.isnan(got) & np.isnan(want))
        assert same.all(), f"{vname} {combo}: at {x[~same].tolist()} got {got[~same].tolist()}, want {want[~same].tolist()}"
        # the cases differ from rounding toward zero (what NVIDIA's conversion gives)
        toward_zero = np.where(np.abs(want.astype(np.float32)) > np.abs(x), np.nextafter(want, np.float16(0)), want)
        assert (toward_zero.view(np.uint16) != want.view(np.uint16)).sum() >= 10
