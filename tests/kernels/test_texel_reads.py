"""Buffer inputs read through uniform texel buffers (contract `texel_reads`), and the storage-buffer
path beside them.

A template that lists an input in `texel_reads` gets, in each variant where that input is a
float32 / float16 buffer, a second binding of the same buffer as a `samplerBuffer` and the spec
constant `texel_reads`, which the runtime sets per device (program.texel_reads: on a CPU device
such as lavapipe, where a storage buffer is loaded lane by lane; TEXELFLOW_BUFFER_READS
overrides it). On lavapipe the generic kernel test (test_registry_ops.py) therefore runs the texel
path of these variants; here every float32 one runs its ops.yaml samples again with the
storage-buffer path forced, NaN and infinities injected where its template takes them, so both
paths stay tested against torch on this device.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from texelflow.generated.layouts import Layout, Storage
from texelflow.generated.ops import OPS
from texelflow.generated.samples import SAMPLES
from texelflow.generated.variants import VARIANTS
from texelflow.runtime.vulkan.program import TEXEL_DESCRIPTOR, TEXEL_READS, TEXEL_READS_ENV, Dispatch, texel_reads
from texelflow.runtime.vulkan.tensor import VkTensor

from .nodecheck import check_variant, combo_id, injected_specials, repr_combos, sample_case, template_of

TEXEL_VARIANTS = sorted(name for name, v in VARIANTS.items()
                        if v.dtype == "float32" and any(b.descriptor == TEXEL_DESCRIPTOR for b in v.bindings))


def _one_per_shape() -> list[str]:
    """One float32 variant per (template, bindings): the storage path's code differs by template
    and by which inputs are buffers, not by the op an elementwise template computes."""
    seen, picked = set(), []
    for name in TEXEL_VARIANTS:
        v = VARIANTS[name]
        key = (template_of(v.op), tuple((b.tensor, b.storage, b.descriptor) for b in v.bindings))
        if key not in seen:
            seen.add(key)
            picked.append(name)
    return picked


def _buffer_combo(vname):
    """The variant's first representation assignment (its texel inputs are buffers by construction)."""
    combos = repr_combos(OPS[VARIANTS[vname].op], VARIANTS[vname])
    assert combos, f"{vname}: no representation assignment"
    return combos[0]


def test_the_memory_bound_and_matmul_templates_take_texel_reads():
    """The templates that read buffers hardest on lavapipe carry the texel bindings."""
    templates = {template_of(VARIANTS[v].op) for v in TEXEL_VARIANTS}
    assert {"unary", "binary", "copy", "layer_norm", "linear_packed", "mm_tiled", "sdpa", "permute", "select"} <= templates
    for v in TEXEL_VARIANTS:  # only where the input is a buffer, after every tensor's own binding
        variant = VARIANTS[v]
        own = [b for b in variant.bindings if b.descriptor != TEXEL_DESCRIPTOR]
        for b in variant.bindings:
            if b.descriptor == TEXEL_DESCRIPTOR:
                assert b.storage == "buffer" and b.access == "read" and b.index >= len(own)
                assert any(o.tensor == b.tensor and o.descriptor == "STORAGE_BUFFER" for o in own)
        assert TEXEL_READS in {s.name for s in variant.spec_constants}
    texture = [v for v, variant in VARIANTS.items() if all(b.storage == "texture3d" for b in variant.bindings)
               and any(b.descriptor == TEXEL_DESCRIPTOR for b in variant.bindings)]
    assert not texture
    ints = [v for v, variant in VARIANTS.items() if variant.dtype not in ("float32", "float16")
            and any(b.descriptor == TEXEL_DESCRIPTOR for b in variant.bindings)]
    assert not ints, f"texel bindings on integer variants: {ints[:3]}"


def test_the_device_decides_and_the_environment_overrides(device, monkeypatch):
    monkeypatch.delenv(TEXEL_READS_ENV, raising=False)
    cpu = SimpleNamespace(device_type="cpu", max_texel_buffer_elements=1 << 27)
    gpu = SimpleNamespace(device_type="discrete", max_texel_buffer_elements=1 << 27)
    assert texel_reads(cpu) and not texel_reads(gpu) and not texel_reads(None)
    assert texel_reads(device.limits) == (device.limits.device_type == "cpu")
    monkeypatch.setenv(TEXEL_READS_ENV, "texel")
    assert texel_reads(gpu)
    assert not texel_reads(SimpleNamespace(device_type="cpu", max_texel_buffer_elements=0))  # no support
    monkeypatch.setenv(TEXEL_READS_ENV, "storage")
    assert not texel_reads(cpu)
    monkeypatch.setenv(TEXEL_READS_ENV, "fast")
    with pytest.raises(ValueError, match=f"^{TEXEL_READS_ENV}='fast': expected one of auto, texel, storage$"):
        texel_reads(cpu)


def test_a_tensor_past_the_texel_limit_keeps_the_storage_path(device, monkeypatch):
    """maxTexelBufferElements counts vec4 texels: a float32 buffer of 4n + 1 elements needs n + 1."""
    monkeypatch.setenv(TEXEL_READS_ENV, "texel")
    small = SimpleNamespace(**{**device.limits.__dict__, "device_type": "cpu", "max_texel_buffer_elements": 4})
    fits = VkTensor(device, (16,), "float32", Storage.BUFFER, Layout.WIDTH_PACKED)
    past = VkTensor(device, (17,), "float32", Storage.BUFFER, Layout.WIDTH_PACKED)
    try:
        assert texel_reads(small, [fits]) and not texel_reads(small, [past])
        variant = VARIANTS["relu_float32_buffer"]  # bindings: out, self, self as texels
        assert Dispatch(variant, {"out": fits, "self": past}).specialization([fits, past, past], small)[TEXEL_READS] == 0
        assert Dispatch(variant, {"out": past, "self": fits}).specialization([past, fits, fits], small)[TEXEL_READS] == 1
    finally:
        fits.close(), past.close()


def test_a_texel_view_covers_a_partial_last_word(device):
    """A buffer of 4n + 1 floats is read through texel n as well: the buffer holds whole 16 bytes."""
    from texelflow.runtime.vulkan.program import Program

    x = VkTensor(device, (5,), "float32", Storage.BUFFER, Layout.WIDTH_PACKED, label="self")
    y = VkTensor(device, (5,), "float32", Storage.BUFFER, Layout.WIDTH_PACKED, label="out")
    prog = None
    try:
        values = np.array([1.0, -2.0, np.nan, np.inf, -7.5], np.float32)
        x.upload(values)
        d = Dispatch(VARIANTS["neg_float32_buffer"], {"out": y, "self": x})
        assert d.specialization([y, x, x], device.limits)[TEXEL_READS] == int(texel_reads(device.limits))
        prog = Program(device, [d])
        prog()
        np.testing.assert_array_equal(y.download(), -values)
    finally:
        if prog is not None:
            prog.close()
        x.close(), y.close()


@pytest.mark.parametrize("vname", _one_per_shape())
def test_storage_buffer_path_matches_torch(device, monkeypatch, vname):
    """The variant with TEXELFLOW_BUFFER_READS=storage: every sample of its op, NaN and
    infinities injected where its template takes them (the texel path: test_registry_ops)."""
    monkeypatch.setenv(TEXEL_READS_ENV, "storage")
    op = OPS[VARIANTS[vname].op]
    specials = injected_specials(op.name, "float32")  # (less nodecheck.NOT_INJECTED's: gelu(+inf), ...)
    cases = [sample_case(op.name, "float32", index, values) for index in range(len(SAMPLES[op.name]))
             for values in (((), specials) if specials else ((),))]
    combo = _buffer_combo(vname)
    failures = check_variant(device, vname, combo, cases)
    assert not failures, f"{vname} {combo_id(op, combo)}: {len(failures)} failures:\n\n" + \
        "\n\n".join(msg for _, msg in failures)
