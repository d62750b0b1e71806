"""The generated variants go through the Vulkan layer: a pipeline from every variant's reflection,
and lookups that name what exists. Their numerics against torch: tests/kernels/test_registry_ops.py."""
from __future__ import annotations

import pytest

from texelflow.generated.ops import OPS
from texelflow.generated.variants import VARIANTS
from texelflow.runtime.vulkan.errors import MissingVariantError, VulkanError
from texelflow.runtime.vulkan.pipeline import PipelineCache, find_variant


def test_every_generated_variant_builds_a_pipeline(device):
    """Every variant's workgroup is the default 64 invocations, or the whole workgroup its grid
    gives one tile or unit (the GPU GEMMs: 256)."""
    cache = PipelineCache.shared(device)
    wide = set()
    for variant in VARIANTS.values():
        pipe = cache.get(variant)
        grid = OPS[variant.op].grid
        invocations = grid[-1] if grid[0] in ("cooperative", "per_tile") else 1
        assert pipe.local_size == (max(64, invocations), 1, 1), variant.name
        if invocations > 64:
            wide.add(variant.op)
    assert {"linear_wg", "mm_wg"} <= wide


def test_missing_variant_names_what_exists():
    with pytest.raises(MissingVariantError) as info:
        find_variant("add", dtype="float64", storage="buffer")
    msg = str(info.value)
    assert "add" in msg and "float64" in msg and "float32" in msg  # lists the variants that do exist
    assert isinstance(info.value, VulkanError) and isinstance(info.value, KeyError)
