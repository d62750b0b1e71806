"""The generated variants run through the Vulkan layer: pipelines from reflection, numerics vs numpy."""
from __future__ import annotations

import numpy as np
import pytest

from texelflow.generated.layouts import LAYOUT_INFO, STORAGE_AXIS, Storage
from texelflow.generated.variants import VARIANTS
from texelflow.runtime.vulkan.errors import MissingVariantError, VulkanError
from texelflow.runtime.vulkan.pipeline import PipelineCache, find_variant
from texelflow.runtime.vulkan.program import Dispatch, Program
from texelflow.runtime.vulkan.tensor import VkTensor

from .helpers import random_array

FLOAT_LAYOUTS = [lay for lay, info in LAYOUT_INFO.items() if info.family == "float"]


def run(device, variant, tensors: dict, inputs: dict, output: str, scalars=None):
    prog = Program(device, [Dispatch(variant, tensors, scalars or {})], [tensors[n] for n in inputs],
                   [tensors[output]])
    try:
        return prog(*inputs.values())[0]
    finally:
        prog.close()
        for t in tensors.values():
            t.close()


def test_every_generated_variant_builds_a_pipeline(device):
    cache = PipelineCache.shared(device)
    for variant in VARIANTS.values():
        pipe = cache.get(variant)
        assert pipe.local_size == (64, 1, 1)


def test_missing_variant_names_what_exists():
    with pytest.raises(MissingVariantError) as info:
        find_variant("add", dtype="float64", storage="buffer")
    msg = str(info.value)
    assert "add" in msg and "float64" in msg and "float32" in msg  # lists the variants that do exist
    assert isinstance(info.value, VulkanError) and isinstance(info.value, KeyError)


@pytest.mark.parametrize("storage", [Storage.BUFFER, Storage.TEXTURE_3D], ids=lambda s: s.name)
@pytest.mark.parametrize("layout", FLOAT_LAYOUTS, ids=lambda x: x.name)
@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_add_matches_numpy(device, storage, layout, dtype):
    shape = (2, 5, 3, 7)
    variant = find_variant("add", dtype=dtype, storage=STORAGE_AXIS[storage])
    x, y = (random_array(shape, dtype, seed) // (1 if dtype == "float32" else 4) for seed in (1, 2))
    alpha = 1.5 if dtype == "float32" else 1
    ts = {n: VkTensor(device, shape, dtype, storage, layout, label=n) for n in ("out", "self", "other")}
    got = run(device, variant, ts, {"self": x, "other": y}, "out", {"alpha": alpha})
    np.testing.assert_allclose(got, x + alpha * y, rtol=1e-6)


@pytest.mark.parametrize("layout", FLOAT_LAYOUTS, ids=lambda x: x.name)
def test_add_broadcasts(device, layout):
    """`add` keeps self/other/out in one sync group (same layout); size-1 dims broadcast."""
    variant = find_variant("add", dtype="float32", storage="texture3d")
    x, y = random_array((2, 6, 5, 3), "float32", 3), random_array((1, 1, 5, 1), "float32", 4)
    ts = {n: VkTensor(device, a.shape, "float32", Storage.TEXTURE_3D, layout)
          for n, a in (("out", x), ("self", x), ("other", y))}
    got = run(device, variant, ts, {"self": x, "other": y}, "out", {"alpha": 1.0})
    np.testing.assert_allclose(got, x + y, rtol=1e-6)


REPRS = [(s, lay) for lay in FLOAT_LAYOUTS for s in (Storage.BUFFER, Storage.TEXTURE_3D)]


@pytest.mark.parametrize("src", REPRS, ids=lambda r: f"{r[0].name}-{r[1].name}")
def test_to_layout_between_every_float_representation(device, src):
    """Device-side transitions agree with host packing in both directions (all 36 pairs)."""
    shape = (2, 5, 3, 7)
    x = random_array(shape, "float32", 5)
    for dst in REPRS:
        variant = find_variant("to_layout", dtype="float32", in_storage=STORAGE_AXIS[src[0]],
                               out_storage=STORAGE_AXIS[dst[0]])
        ts = {"self": VkTensor(device, shape, "float32", *src), "out": VkTensor(device, shape, "float32", *dst)}
        got = run(device, variant, ts, {"self": x}, "out")
        np.testing.assert_array_equal(got, x, err_msg=f"{src} -> {dst}")


def test_to_layout_int8_between_packed_layouts(device):
    shape = (2, 5, 6, 7)
    x = random_array(shape, "int8", 6)
    int8 = [lay for lay, info in LAYOUT_INFO.items() if info.family == "int8x4"]
    variant = find_variant("to_layout", dtype="int8", in_storage="buffer", out_storage="buffer")
    for a in int8:
        for b in int8:
            ts = {"self": VkTensor(device, shape, "int8", Storage.BUFFER, a),
                  "out": VkTensor(device, shape, "int8", Storage.BUFFER, b)}
            np.testing.assert_array_equal(run(device, variant, ts, {"self": x}, "out"), x, err_msg=f"{a} -> {b}")
