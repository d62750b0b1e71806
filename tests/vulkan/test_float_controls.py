"""Float-controls modes (runtime/vulkan/float_controls.py): added to real generated SPIR-V, valid
for spirv-val, declared once per entry point and width, and asked of every device that has them."""
from __future__ import annotations

import shutil
import struct
import subprocess

import pytest

from texelflow.generated.variants import VARIANTS
from texelflow.runtime.vulkan.float_controls import (DEVICE_EXTENSION, EXTENSION, MODES, supported_modes,
                                                     with_float_modes)
from texelflow.runtime.vulkan.pipeline import generated_spirv

EVERY_MODE = frozenset((name, w) for name in MODES for w in (16, 32, 64))


def _words(code: bytes) -> list[int]:
    return list(struct.unpack(f"<{len(code) // 4}I", code))


def _instructions(code: bytes) -> list[tuple[int, list[int]]]:
    words, i, out = _words(code), 5, []
    while i < len(words):
        count = words[i] >> 16
        out.append((words[i] & 0xFFFF, words[i + 1:i + count]))
        i += count
    return out


def _modes(code: bytes) -> list[tuple[int, int]]:
    """(execution mode, width) of each float-controls OpExecutionMode, in order, repeats kept."""
    ids = {m for m, _ in MODES.values()}
    return [(ops[1], ops[2]) for op, ops in _instructions(code) if op == 16 and ops[1] in ids]


def _capabilities(code: bytes) -> list[int]:
    return [ops[0] for op, ops in _instructions(code) if op == 17]


def _validate(code: bytes, tmp_path) -> None:
    assert shutil.which("spirv-val"), "spirv-val (spirv-tools) is needed: `make test` installs it"
    path = tmp_path / "module.spv"
    path.write_bytes(code)
    run = subprocess.run(["spirv-val", "--target-env", "vulkan1.1", str(path)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def _variant(dtype: str):
    return next(v for name, v in sorted(VARIANTS.items()) if v.op == "relu" and v.dtype == dtype)


def _float16_arithmetic_module() -> bytes:
    """A generated module with float16 arithmetic types (capability Float16)."""
    for _, v in sorted(VARIANTS.items()):
        if v.dtype == "float16":
            code = generated_spirv(v)
            if 9 in _capabilities(code):
                return code
    raise AssertionError("no float16 variant declares Float16")


@pytest.mark.parametrize("module, widths", [
    (lambda: generated_spirv(_variant("float32")), {32}),
    (lambda: generated_spirv(_variant("float16")), {16, 32}),  # converts to float16 storage
    (_float16_arithmetic_module, {16, 32})], ids=["float32", "float16-storage", "float16-arithmetic"])
def test_modes_are_declared_for_the_widths_the_module_computes_in(module, widths, tmp_path):
    code = module()
    patched = with_float_modes(code, EVERY_MODE)
    _validate(patched, tmp_path)
    assert sorted(_modes(patched)) == sorted((m, w) for m, _ in MODES.values() for w in widths)
    caps = _capabilities(patched)
    assert all(caps.count(cap) == 1 for _, cap in MODES.values())
    exts = [struct.pack(f"<{len(ops)}I", *ops).split(b"\0")[0].decode()
            for op, ops in _instructions(patched) if op == 10]
    assert exts.count(EXTENSION) == 1
    # everything the module had is still there, in order
    before = _instructions(code)
    assert [i for i in _instructions(patched) if i in before] == before


def test_patching_is_idempotent_and_a_no_op_without_modes():
    code = generated_spirv(_variant("float32"))
    assert with_float_modes(code, frozenset()) == code
    once = with_float_modes(code, EVERY_MODE)
    assert with_float_modes(once, EVERY_MODE) == once
    only = with_float_modes(code, frozenset({("SignedZeroInfNanPreserve", 32)}))
    assert _modes(only) == [(MODES["SignedZeroInfNanPreserve"][0], 32)]


def test_a_module_that_is_not_spirv_is_left_to_the_validity_check():
    for junk in (b"", b"\x00" * 19, b"\x00" * 21, b"\x01\x02\x03\x04" * 8):
        assert with_float_modes(junk, EVERY_MODE) == junk
    code = generated_spirv(_variant("float32"))
    first = struct.unpack("<I", code[20:24])[0] & 0xFFFF  # the first instruction's opcode
    for count in (0, 0xFFFF):  # a word count of 0; one running past the end
        broken = code[:20] + struct.pack("<I", (count << 16) | first) + code[24:]
        assert with_float_modes(broken, EVERY_MODE) == broken


def test_supported_modes_read_the_properties_struct():
    class Props:
        shaderSignedZeroInfNanPreserveFloat32 = 1
        shaderSignedZeroInfNanPreserveFloat16 = 0
        shaderDenormPreserveFloat32 = 1

    assert supported_modes(Props()) == {("SignedZeroInfNanPreserve", 32), ("DenormPreserve", 32)}


def test_the_device_declares_what_it_supports(device):
    """A device listing VK_KHR_shader_float_controls reports its modes, and lavapipe, NVIDIA and the
    other Vulkan 1.2 drivers all keep NaN and Inf on request at 32 bits: the mode is then on."""
    vk = device.vk
    listed = {e.extensionName for e in vk.vkEnumerateDeviceExtensionProperties(device.physical, None)}
    if DEVICE_EXTENSION in listed:
        assert ("SignedZeroInfNanPreserve", 32) in device.limits.float_modes
    else:
        assert device.limits.float_modes == frozenset()


def test_no_generated_module_computes_in_float64():
    """float_controls.py leaves the devices' 16/64-bit mode dependence unread on this ground."""
    assert not [name for name, v in sorted(VARIANTS.items()) if 10 in _capabilities(generated_spirv(v))]
