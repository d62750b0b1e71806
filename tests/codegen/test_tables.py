"""The storage and dtype tables of layouts.yaml as generated/layouts.py renders them."""

from __future__ import annotations

from texelflow.generated.layouts import DTYPES, FAMILIES, STORAGE_AXIS, STORAGE_BY_AXIS, STORAGE_INFO, Storage
from texelflow.generated.variants import AXES, CHOICES, VARIANTS


def test_storage_table_names_every_axis_value_once():
    assert STORAGE_AXIS == {Storage.BUFFER: "buffer", Storage.TEXTURE_3D: "texture3d"}
    assert {v: k for k, v in STORAGE_AXIS.items()} == STORAGE_BY_AXIS
    storage_axes = {v for name, values in AXES.items() if name != "dtype" and name not in CHOICES for v in values}
    assert storage_axes <= set(STORAGE_BY_AXIS)
    tex = STORAGE_INFO[Storage.TEXTURE_3D]
    assert (tex.kind, tex.image_dims, tex.descriptor, tex.is_image) == ("image", 3, "STORAGE_IMAGE", True)
    buf = STORAGE_INFO[Storage.BUFFER]
    assert (buf.kind, buf.image_dims, buf.descriptor, buf.is_image) == ("buffer", None, "STORAGE_BUFFER", False)


def test_bindings_follow_the_storage_table():
    """Each tensor's own binding has its storage's descriptor; a buffer input a template reads
    through a texel view (contract texel_reads) has one more, a uniform texel buffer, after them."""
    for v in VARIANTS.values():
        own = [b for b in v.bindings if b.descriptor != "UNIFORM_TEXEL_BUFFER"]
        for b in own:
            assert b.descriptor == STORAGE_INFO[STORAGE_BY_AXIS[b.storage]].descriptor, (v.name, b)
        for b in v.bindings[len(own):]:
            assert b.descriptor == "UNIFORM_TEXEL_BUFFER" and b.storage == "buffer" and b.access == "read", (v.name, b)
            assert v.dtype in ("float32", "float16"), (v.name, b)


def test_dtypes_are_keyed_by_name_not_glsl_type():
    assert list(DTYPES) == ["float32", "float16", "int32", "int8", "bool"]
    f32, f16 = DTYPES["float32"], DTYPES["float16"]
    assert (f32.image_format, f16.image_format) == ("rgba32f", "rgba16f")  # both `float` family, no clash
    assert (f32.vec4, f16.vec4, DTYPES["int32"].vec4) == ("vec4", "f16vec4", "ivec4")
    assert DTYPES["int8"].image is None and DTYPES["int8"].features == ()  # packed 4 per int32 word
    assert DTYPES["int32"].vk_format == "R32G32B32A32_SINT"
    for name, info in DTYPES.items():
        assert info.name == name and name in FAMILIES[info.family]
