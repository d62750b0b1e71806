"""torch's float semantics on every device: SPIR-V float-controls modes added at module creation.

Vulkan lets a driver assume that no float is NaN, Inf or -0.0, and lets it flush subnormals to zero,
unless the shader declares the execution modes SignedZeroInfNanPreserve and DenormPreserve
(SPV_KHR_float_controls, VK_KHR_shader_float_controls). lavapipe keeps IEEE behaviour either way.
NVIDIA's driver does not: without the modes it folds `isnan()` to false, so relu(NaN), clamp(NaN)
and a convolution over a NaN came out finite, and rsqrt of a subnormal came out inf. torch keeps
NaN, Inf, the sign of zero and (on the CPU and CUDA alike) subnormals, and rounds to nearest even.
So every module gets the modes the device supports (SignedZeroInfNanPreserve, DenormPreserve,
RoundingModeRTE), for each float width the module uses. What is left to the device, as measured on
an H100 (driver 580): it reports DenormPreserve for float16 only, so float32 subnormals are flushed
to zero; and it still converts float32 to float16 toward zero with RoundingModeRTE declared, which
is why float16 stores round in the shader (`tf_to_float16`, docs/precision.md).

A device may tie the modes of 16- and 64-bit floats together (`denormBehaviorIndependence`,
`roundingModeIndependence`); that constrains only a module computing in both widths, and no
generated module uses float64 (tests/vulkan/test_float_controls.py checks), so they are not read.

The SPIR-V in the cache stays device-independent: `with_float_modes` rewrites the words handed to
vkCreateShaderModule. A SPIR-V module lists its capabilities first, then its extensions, then the
extended-instruction imports, the memory model, the entry points and the execution modes, so each
addition goes at the end of its own section.
"""
from __future__ import annotations

import struct

EXTENSION = "SPV_KHR_float_controls"
DEVICE_EXTENSION = "VK_KHR_shader_float_controls"

_OP_EXTENSION, _OP_CAPABILITY, _OP_ENTRY_POINT, _OP_EXECUTION_MODE = 10, 17, 15, 16
_CAP_FLOAT16, _CAP_FLOAT64 = 9, 10
# 16-bit storage (buffers, push constants, inputs/outputs): converts to float16 without Float16
_CAPS_16BIT_STORAGE = {4433, 4434, 4435, 4436}
# mode name -> (execution mode, capability), SPIR-V 1.4 / SPV_KHR_float_controls numbering
MODES = {"DenormPreserve": (4459, 4464), "SignedZeroInfNanPreserve": (4461, 4466), "RoundingModeRTE": (4462, 4467)}
# VkPhysicalDeviceFloatControlsProperties field prefix per mode
PROPERTY_PREFIX = {"DenormPreserve": "shaderDenormPreserveFloat",
                   "SignedZeroInfNanPreserve": "shaderSignedZeroInfNanPreserveFloat",
                   "RoundingModeRTE": "shaderRoundingModeRTEFloat"}
WIDTHS = (16, 32, 64)


def supported_modes(props) -> frozenset[tuple[str, int]]:
    """(mode, float width) pairs a VkPhysicalDeviceFloatControlsProperties reports."""
    return frozenset((mode, w) for mode, prefix in PROPERTY_PREFIX.items() for w in WIDTHS
                     if getattr(props, f"{prefix}{w}", False))


def _instructions(words: list[int]):
    """(index, opcode, word count) of each instruction after the 5-word header; ValueError where
    an instruction's word count is 0 or runs past the end."""
    i = 5
    while i < len(words):
        count, op = words[i] >> 16, words[i] & 0xFFFF
        if count == 0 or i + count > len(words):
            raise ValueError(f"SPIR-V instruction at word {i} has a bad word count ({count})")
        yield i, op, count
        i += count


def _string_words(text: str) -> list[int]:
    raw = text.encode() + b"\0"
    raw += b"\0" * (-len(raw) % 4)
    return list(struct.unpack(f"<{len(raw) // 4}I", raw))


def with_float_modes(code: bytes, modes: frozenset[tuple[str, int]]) -> bytes:
    """`code` with each supported (mode, width) declared for every entry point, for the widths the
    module computes in (32 always; 16 where it declares Float16 or 16-bit storage, 64 where it
    declares Float64). Unchanged when nothing applies, and when the module is malformed: the
    driver then refuses it with its own error, as it would without the modes."""
    if not modes or len(code) < 20 or len(code) % 4:
        return code
    words = list(struct.unpack(f"<{len(code) // 4}I", code))
    if words[0] != 0x07230203:
        return code
    caps, exts, entries, declared = set(), set(), [], set()
    last_cap = last_ext = last_entry = None
    try:
        instructions = list(_instructions(words))
    except ValueError:
        return code
    for i, op, count in instructions:
        if op == _OP_CAPABILITY:
            caps.add(words[i + 1])
            last_cap = i + count
        elif op == _OP_EXTENSION:
            exts.add(struct.pack(f"<{count - 1}I", *words[i + 1:i + count]).split(b"\0")[0].decode())
            last_ext = i + count
        elif op == _OP_ENTRY_POINT:
            entries.append(words[i + 2])
            last_entry = i + count
        elif op == _OP_EXECUTION_MODE:
            declared.add((words[i + 1], words[i + 2], tuple(words[i + 3:i + count])))
    if last_cap is None or last_entry is None:
        return code
    widths = {32} | ({16} if caps & ({_CAP_FLOAT16} | _CAPS_16BIT_STORAGE) else set()) \
        | ({64} if _CAP_FLOAT64 in caps else set())
    wanted = sorted((name, w) for name, w in modes if w in widths)
    if not wanted:
        return code
    new_modes = [[(4 << 16) | _OP_EXECUTION_MODE, entry, MODES[name][0], w]
                 for entry in entries for name, w in wanted if (entry, MODES[name][0], (w,)) not in declared]
    new_caps = sorted({MODES[name][1] for name, _ in wanted} - caps)
    if not new_modes and not new_caps:
        return code
    ext = [] if EXTENSION in exts or words[1] >= 0x00010400 else _string_words(EXTENSION)
    # insert from the back so earlier indices stay valid
    out = words[:last_entry] + [w for m in new_modes for w in m] + words[last_entry:]
    if ext:
        at = last_ext if last_ext is not None else last_cap
        out[at:at] = [((1 + len(ext)) << 16) | _OP_EXTENSION, *ext]
    out[last_cap:last_cap] = [w for cap in new_caps for w in ((2 << 16) | _OP_CAPABILITY, cap)]
    return struct.pack(f"<{len(out)}I", *out)
