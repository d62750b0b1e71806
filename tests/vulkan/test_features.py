"""Device features: variants carry the features their dtype requires, and lookup never hands out a
variant the device cannot run."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from texelflow.codegen.layouts_schema import KNOWN_FEATURES
from texelflow.generated import variants as gv
from texelflow.generated.layouts import DEVICE_FEATURES, DTYPES
from texelflow.generated.ops import OPS
from texelflow.runtime.vulkan.device import FEATURE_SOURCES
from texelflow.runtime.vulkan.errors import MissingFeatureError, UnsupportedError
from texelflow.runtime.vulkan.pipeline import check_features, find_variant

FP16 = DTYPES["float16"].features


@pytest.fixture
def fp16_add(monkeypatch):
    """A float16 `add` variant in the generated table (add has no float16 variant of its own yet)."""
    base = gv.VARIANTS["add_float32_buffer"]
    v = dataclasses.replace(base, name="add_float16_buffer", dtype="float16", source="add_float16_buffer.comp",
                            axes=(("dtype", "float16"), ("storage", "buffer")), features=FP16)
    monkeypatch.setitem(gv.VARIANTS, v.name, v)
    monkeypatch.setitem(gv._BY_AXES, (v.op, v.axes), v.name)
    return v


def fake_device(features) -> SimpleNamespace:
    return SimpleNamespace(enabled_features=frozenset(features),
                           limits=SimpleNamespace(name="fake GPU", features=frozenset(features)))


def test_variants_carry_their_dtypes_features():
    assert FP16 == ("shaderFloat16", "storageBuffer16BitAccess")
    for v in gv.VARIANTS.values():  # plus those of its choice axis values (int_dot: dot4x8)
        chosen = {f for axis, value in v.axes if axis in gv.CHOICES for f in gv.CHOICES[axis][value]}
        # every bound tensor's dtype counts: cast_to_float16's float32 variant writes float16
        dtypes = {OPS[v.op].tensor_dtype(b.tensor, v.dtype) for b in v.bindings} | {v.dtype}
        assert v.features == tuple(sorted({f for d in dtypes for f in DTYPES[d].features} | chosen)), v.name
    # ops.yaml variant_axes and each op's dtypes decide which dtypes get variants: float16 ones
    # (precision="fp16", docs/precision.md) need both float16 features, bool ones none.
    half = [v for v in gv.VARIANTS.values() if v.dtype == "float16"]
    assert half and all(set(FP16) <= set(v.features) for v in half)
    assert set(FP16) <= set(gv.VARIANTS["cast_to_float16_float32_buffer"].features)
    assert any(v.dtype == "bool" for v in gv.VARIANTS.values())


def test_fp16_variant_is_never_chosen_without_shader_float16(fp16_add):
    lacking = {"storageBuffer16BitAccess"}  # a device with 16-bit storage but no fp16 arithmetic
    with pytest.raises(KeyError, match="needs device features shaderFloat16, which the device lacks"):
        gv.find_variant("add", dtype="float16", storage="buffer", device_features=lacking)
    assert fp16_add not in gv.variants_of("add", device_features=lacking)
    assert gv.VARIANTS["add_float32_buffer"] in gv.variants_of("add", device_features=lacking)
    with pytest.raises(MissingFeatureError, match="add_float16_buffer needs device features shaderFloat16") as err:
        find_variant("add", device=fake_device(lacking), dtype="float16", storage="buffer")
    assert isinstance(err.value, UnsupportedError)
    with pytest.raises(MissingFeatureError):
        check_features(fp16_add, fake_device(()))
    # A device with both features gets it; without a device the lookup does not filter.
    assert gv.find_variant("add", dtype="float16", storage="buffer", device_features=FP16) is fp16_add
    assert find_variant("add", device=fake_device(FP16), dtype="float16", storage="buffer") is fp16_add
    assert gv.find_variant("add", dtype="float16", storage="buffer") is fp16_add
    assert gv.missing_features(fp16_add, lacking) == ("shaderFloat16",)


def test_float32_variants_need_no_feature(device):
    v = find_variant("add", device=device, dtype="float32", storage="texture3d")
    assert v.features == ()
    check_features(v, device)


def test_device_reads_every_feature_a_dtype_may_name(device):
    assert set(KNOWN_FEATURES) == set(FEATURE_SOURCES)
    assert set(DEVICE_FEATURES) <= set(FEATURE_SOURCES)
    assert device.limits.features <= set(FEATURE_SOURCES)
    assert device.enabled_features == device.limits.features & set(DEVICE_FEATURES + gv.VARIANT_FEATURES)
    assert device.preferred_features == device.enabled_features - device.limits.emulated_features
    assert device.limits.shader_float16 == ("shaderFloat16" in device.limits.features)
