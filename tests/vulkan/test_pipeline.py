"""Reflection-driven pieces: specialization, push constants, workgroup split, lifetime packing."""
from __future__ import annotations

import struct

import pytest

from texelflow.runtime.vulkan.errors import UnsupportedError
from texelflow.runtime.vulkan.lifetime import Interval, plan_offsets
from texelflow.runtime.vulkan.pipeline import (PipelineCache, local_size, pack_push_constants, spec_values,
                                               workgroups)

from .kernels import add_scalar


def test_spec_values_follow_reflection_names():
    variant, _ = add_scalar("buffer")
    spec = spec_values(variant, {"local_size_x": 128, "self_layout": 2})
    assert spec == {0: 128, 1: 1, 2: 1, 3: 0, 4: 2}
    assert local_size(variant, spec) == (128, 1, 1)
    with pytest.raises(ValueError, match="no specialization constants \\['bogus'\\]"):
        spec_values(variant, {"bogus": 1})


def test_push_constants_are_packed_at_reflected_offsets():
    variant, _ = add_scalar("buffer")
    raw = pack_push_constants(variant, {"out_sizes": (7, 5, 3, 2), "self_sizes": (1, 2, 3, 4),
                                        "units": 210, "alpha": 0.5})
    assert len(raw) == 40
    assert struct.unpack_from("<4i4iif", raw) == (7, 5, 3, 2, 1, 2, 3, 4, 210, 0.5)
    with pytest.raises(ValueError, match="needs push constants \\['alpha'\\]"):
        pack_push_constants(variant, {"out_sizes": (1,) * 4, "self_sizes": (1,) * 4, "units": 1})


def test_workgroups_split_over_x_and_y():
    assert workgroups(1, 64, (65535, 65535, 65535)) == (1, 1, 1)
    assert workgroups(64 * 65535 + 1, 64, (65535, 65535, 65535)) == (65535, 2, 1)
    gx, gy, _ = workgroups(10**9, 64, (65535, 65535, 65535))
    assert gx * gy * 64 >= 10**9 and gx <= 65535
    with pytest.raises(UnsupportedError):
        workgroups(10**9, 1, (100, 100, 100))


def test_pipelines_are_cached_and_cache_data_persists(device, tmp_path):
    variant, spirv = add_scalar("buffer")
    cache = PipelineCache(device, path=tmp_path / "cache.bin")
    try:
        a = cache.get(variant, {"local_size_x": 32}, spirv=spirv)
        assert cache.get(variant, {"local_size_x": 32}, spirv=spirv) is a
        assert cache.get(variant, {"local_size_x": 64}, spirv=spirv) is not a
        assert len(cache) == 2
        with pytest.raises(UnsupportedError, match="workgroup size"):
            cache.get(variant, {"local_size_x": device.limits.max_workgroup_invocations + 1}, spirv=spirv)
        cache.save()
    finally:
        cache.close()
    assert (tmp_path / "cache.bin").stat().st_size > 0
    reloaded = PipelineCache(device, path=tmp_path / "cache.bin")  # initial data accepted by the driver
    reloaded.get(variant, spirv=spirv)
    reloaded.close()


def test_lifetime_plan_reuses_disjoint_lifetimes():
    chain = [Interval(100, 16, i, i + 1) for i in range(10)]  # each live for two steps
    offsets, total = plan_offsets(chain)
    assert total == 112 + 100  # two slots: 0 and 112 (100 rounded up to the alignment)
    for i in range(9):
        assert offsets[i] != offsets[i + 1]


def test_lifetime_plan_never_overlaps_live_tensors():
    items = [Interval(s, 64, f, f + d) for s, f, d in
             [(300, 0, 5), (100, 1, 1), (200, 2, 3), (50, 3, 0), (400, 4, 2), (100, 6, 1), (10, 0, 9)]]
    offsets, total = plan_offsets(items)
    for i, a in enumerate(items):
        assert offsets[i] % 64 == 0 and offsets[i] + a.size <= total
        for j, b in enumerate(items[:i]):
            live_together = a.first <= b.last and b.first <= a.last
            disjoint = offsets[i] + a.size <= offsets[j] or offsets[j] + b.size <= offsets[i]
            assert not live_together or disjoint
    assert total < sum(it.size for it in items) + 64 * len(items)
