"""Compute pipelines built from the generated reflection of each shader variant.

Descriptor set layouts, push constant ranges and specialization constants come from
`texelflow.generated.variants` (never from reading GLSL). Pipelines are cached per
(variant, SPIR-V, specialization values) on top of a VkPipelineCache that can persist to disk.

A PipelineCache may be shared by programs built in several threads (`PipelineCache.shared` is the
device's): its lookups and builds run under its own lock.
"""
from __future__ import annotations

import hashlib
import os
import struct
import threading
from dataclasses import dataclass
from typing import Callable, Mapping

from texelflow.runtime.vulkan.errors import (MissingFeatureError, MissingVariantError, UnsupportedError,
                                            VulkanError, translate)
from texelflow.runtime.vulkan.float_controls import with_float_modes

_PUSH_FORMATS = {"int": "<i", "float": "<f", "ivec4": "<4i", "uint": "<I", "vec4": "<4f"}
LOCAL_SIZE_NAMES = ("local_size_x", "local_size_y", "local_size_z")


def find_variant(op: str, *, device=None, **axes: str):
    """The generated variant for `op` and `axes`; MissingVariantError lists what exists.

    With `device` (a Device), a variant needing device features the device lacks is refused with
    MissingFeatureError, never returned.
    """
    from texelflow.generated.variants import find_variant as generated_find

    try:
        variant = generated_find(op, **axes)
    except KeyError as exc:
        msg = exc.args[0] if exc.args else f"no variant of {op!r} with {axes}"
        raise MissingVariantError(f"no shader variant for op {op!r} with axes {axes}: {msg}") from None
    if device is not None:
        check_features(variant, device)
    return variant


def check_features(variant, device) -> None:
    """Raise MissingFeatureError when `device` lacks a device feature `variant` requires."""
    from texelflow.generated.variants import missing_features

    have = getattr(device, "enabled_features", None)
    lacking = missing_features(variant, have if have is not None else device.limits.features)
    if lacking:
        raise MissingFeatureError(
            f"shader variant {variant.name} needs device features {', '.join(lacking)}, which "
            f"{device.limits.name} does not offer; use a variant of another dtype")


def spec_values(variant, values: Mapping[str, int] | None = None) -> dict[int, int]:
    """Specialization constant id -> value: reflection defaults overridden by name."""
    by_name = {s.name: s for s in variant.spec_constants}
    unknown = set(values or ()) - set(by_name)
    if unknown:
        raise ValueError(f"variant {variant.name} has no specialization constants {sorted(unknown)}; "
                         f"it has {sorted(by_name)}")
    out = {s.id: int(s.default) for s in variant.spec_constants}
    for name, v in (values or {}).items():
        out[by_name[name].id] = int(v)
    return out


def local_size(variant, spec: Mapping[int, int]) -> tuple[int, int, int]:
    """Workgroup size after specialization (ids 0, 1, 2 by convention; 1 when absent)."""
    ids = {s.name: s.id for s in variant.spec_constants}
    return tuple(spec.get(ids[n], 1) if n in ids else 1 for n in LOCAL_SIZE_NAMES)


def pack_push_constants(variant, values: Mapping[str, object]) -> bytes:
    """Push constant bytes laid out by the reflection's names, types and offsets."""
    missing = [p.name for p in variant.push_constants if p.name not in values]
    if missing:
        raise ValueError(f"variant {variant.name} needs push constants {missing}")
    buf = bytearray(variant.push_constant_size)
    for p in variant.push_constants:
        fmt = _PUSH_FORMATS.get(p.type)
        if fmt is None:
            raise ValueError(f"push constant {p.name} has unsupported type {p.type}")
        v = values[p.name]
        args = tuple(v) if p.type.endswith("vec4") else (v,)
        if struct.calcsize(fmt) != p.size:
            raise ValueError(f"push constant {p.name}: {p.type} is {struct.calcsize(fmt)} bytes, reflection says {p.size}")
        struct.pack_into(fmt, buf, p.offset, *args)
    return bytes(buf)


def workgroups(units: int, local_x: int, max_count: tuple[int, int, int]) -> tuple[int, int, int]:
    """(gx, gy, 1) covering `units` invocations, gx within the device's x limit (dispatch contract)."""
    groups = max(1, -(-units // local_x))
    gx = min(groups, max_count[0])
    gy = -(-groups // gx)
    if gy > max_count[1]:
        raise UnsupportedError(f"{units} units need {groups} workgroups, over the device limit {max_count[:2]}")
    return gx, gy, 1


def generated_spirv(variant) -> bytes:
    """SPIR-V of a generated variant from the shared cache (texelflow.shaders.spirv_cache), compiled
    with glslc only on a miss; never through the code generator, and no glslc when it is cached."""
    from pathlib import Path

    import texelflow.generated as generated
    import texelflow.shaders as shaders
    from texelflow.shaders import spirv_cache

    glsl = Path(generated.__file__).parent / "glsl"
    source = (glsl / variant.source).read_text(encoding="utf-8")
    return spirv_cache.spirv(source, [glsl / "include", Path(shaders.__file__).parent / "include"],
                             variant.target_env, variant.name)


@dataclass(frozen=True)
class ComputePipeline:
    """A specialised pipeline with the layouts needed to bind and dispatch it."""

    variant: object
    handle: object
    layout: object
    set_layout: object
    local_size: tuple[int, int, int]
    spec: tuple[tuple[int, int], ...]


class PipelineCache:
    """Builds and caches pipelines for one device; `save()` persists the VkPipelineCache."""

    def __init__(self, device, *, path: str | os.PathLike | None = None,
                 spirv_for: Callable[[object], bytes] | None = None):
        vk = self.vk = device.vk
        self.device, self.path, self._spirv_for = device, path, spirv_for
        self._pipelines: dict[tuple, ComputePipeline] = {}
        self._modules: dict[tuple, object] = {}
        self._set_layouts: dict[tuple, tuple[object, object]] = {}
        self._spirv_code: dict[str, bytes] = {}
        self._lock = threading.RLock()
        self.handle = None
        device.check_open("creating a pipeline cache")
        initial = b""
        if path is not None and os.path.exists(path):
            with open(path, "rb") as f:
                initial = f.read()
        self._initial = vk.ffi.new("char[]", initial) if initial else None
        with translate("creating a pipeline cache"):
            self.handle = vk.vkCreatePipelineCache(device.handle, vk.VkPipelineCacheCreateInfo(
                sType=vk.VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO, initialDataSize=len(initial),
                pInitialData=self._initial), None)
        device.adopt(self)

    @classmethod
    def shared(cls, device) -> "PipelineCache":
        """The device's default cache, closed with the device."""
        with device.lock:
            if "pipelines" not in device.resources:
                device.resources["pipelines"] = cls(device)
            return device.resources["pipelines"]

    def spirv(self, variant) -> bytes:
        """The variant's SPIR-V, looked up once per cache: building a program asks per dispatch,
        and each lookup reads and hashes the GLSL and every include."""
        with self._lock:
            code = self._spirv_code.get(variant.name)
            if code is None:
                code = (self._spirv_for or generated_spirv)(variant)
                self._spirv_code[variant.name] = code
            return code

    def get(self, variant, spec: Mapping[str, int] | None = None, *, spirv: bytes | None = None) -> ComputePipeline:
        """The pipeline for `variant` specialised with `spec` (names from its reflection)."""
        with self._lock:
            if self.handle is None:
                from texelflow.runtime.errors import ProgramClosedError
                raise ProgramClosedError("the pipeline cache (or its device) was closed")
            return self._get(variant, spec, spirv)

    def _get(self, variant, spec, spirv) -> ComputePipeline:
        check_features(variant, self.device)
        values = spec_values(variant, spec)
        code = spirv if spirv is not None else self.spirv(variant)
        code_key = hashlib.sha256(code).hexdigest()
        key = (variant.name, code_key, tuple(sorted(values.items())))
        if key in self._pipelines:
            return self._pipelines[key]
        lsize = local_size(variant, values)
        lim = self.device.limits
        if any(a > b for a, b in zip(lsize, lim.max_workgroup_size)) or \
                lsize[0] * lsize[1] * lsize[2] > lim.max_workgroup_invocations:
            raise UnsupportedError(f"workgroup size {lsize} exceeds the device limits {lim.max_workgroup_size} / "
                                   f"{lim.max_workgroup_invocations} invocations")
        if variant.push_constant_size > lim.max_push_constants_size:
            raise UnsupportedError(f"variant {variant.name} needs {variant.push_constant_size} bytes of push "
                                   f"constants; the device allows {lim.max_push_constants_size}")
        set_layout, layout = self._layouts(variant)
        module = self._module(variant.name, code_key, code)
        vk = self.vk
        entries = [vk.VkSpecializationMapEntry(constantID=cid, offset=4 * k, size=4)
                   for k, cid in enumerate(sorted(values))]
        data = vk.ffi.new("int32_t[]", [values[cid] for cid in sorted(values)] or [0])
        spec_info = vk.VkSpecializationInfo(mapEntryCount=len(entries), pMapEntries=entries or None,
                                            dataSize=4 * len(entries), pData=vk.ffi.cast("void*", data))
        stage = vk.VkPipelineShaderStageCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO, stage=vk.VK_SHADER_STAGE_COMPUTE_BIT,
            module=module, pName="main", pSpecializationInfo=spec_info if entries else None)
        with translate(f"creating the compute pipeline of {variant.name}"):
            handle = vk.vkCreateComputePipelines(self.device.handle, self.handle, 1, [vk.VkComputePipelineCreateInfo(
                sType=vk.VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO, stage=stage, layout=layout)], None)[0]
        del data
        pipe = ComputePipeline(variant, handle, layout, set_layout, lsize, key[2])
        self._pipelines[key] = pipe
        return pipe

    def _module(self, name: str, code_key: str, code: bytes):
        if (name, code_key) not in self._modules:
            from texelflow.shaders.spirv_cache import spirv_problem

            problem = spirv_problem(bytes(code))  # the driver would answer a bad module with VkErrorUnknown
            if problem is not None:
                raise VulkanError(f"creating the shader module of {name}: its SPIR-V is not valid ({problem})")
            vk = self.vk
            # NaN, Inf, -0.0 and subnormals kept as torch keeps them, where the device can say so
            code = with_float_modes(bytes(code), self.device.limits.float_modes)
            with translate(f"creating the shader module of {name}"):
                self._modules[(name, code_key)] = vk.vkCreateShaderModule(self.device.handle, vk.VkShaderModuleCreateInfo(
                    sType=vk.VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO, codeSize=len(code), pCode=code), None)
        return self._modules[(name, code_key)]

    def _layouts(self, variant):
        """Descriptor set layout (set 0) and pipeline layout from the bindings and push constants."""
        vk = self.vk
        key = (tuple((b.index, b.descriptor) for b in variant.bindings), variant.push_constant_size)
        if key in self._set_layouts:
            return self._set_layouts[key]
        bindings = [vk.VkDescriptorSetLayoutBinding(binding=b.index,
                                                    descriptorType=getattr(vk, f"VK_DESCRIPTOR_TYPE_{b.descriptor}"),
                                                    descriptorCount=1, stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT)
                    for b in variant.bindings]
        with translate(f"creating the layouts of {variant.name}"):
            set_layout = vk.vkCreateDescriptorSetLayout(self.device.handle, vk.VkDescriptorSetLayoutCreateInfo(
                sType=vk.VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO, bindingCount=len(bindings),
                pBindings=bindings), None)
            ranges = [vk.VkPushConstantRange(stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT, offset=0,
                                             size=variant.push_constant_size)] if variant.push_constant_size else []
            layout = vk.vkCreatePipelineLayout(self.device.handle, vk.VkPipelineLayoutCreateInfo(
                sType=vk.VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO, setLayoutCount=1, pSetLayouts=[set_layout],
                pushConstantRangeCount=len(ranges), pPushConstantRanges=ranges or None), None)
        self._set_layouts[key] = (set_layout, layout)
        return set_layout, layout

    def data(self) -> bytes:
        """The driver's serialised pipeline cache."""
        vk = self.vk
        size = vk.ffi.new("size_t*")
        vk.lib.vkGetPipelineCacheData(self.device.handle, self.handle, size, vk.ffi.NULL)
        buf = vk.ffi.new("char[]", size[0])
        vk.lib.vkGetPipelineCacheData(self.device.handle, self.handle, size, buf)
        return bytes(vk.ffi.buffer(buf, size[0]))

    def save(self) -> None:
        if self.path is not None:
            with open(self.path, "wb") as f:
                f.write(self.data())

    def __len__(self) -> int:
        return len(self._pipelines)

    def close(self) -> None:
        with self._lock:
            self._close()
        self.device.release(self)

    def _close(self) -> None:
        if self.handle is None:
            return
        vk, h = self.vk, self.device.handle
        if h is None:  # the device is gone, and everything made from it
            self._pipelines.clear(), self._set_layouts.clear(), self._modules.clear()
            self.handle = None
            return
        for p in self._pipelines.values():
            vk.vkDestroyPipeline(h, p.handle, None)
        for set_layout, layout in self._set_layouts.values():
            vk.vkDestroyPipelineLayout(h, layout, None)
            vk.vkDestroyDescriptorSetLayout(h, set_layout, None)
        for m in self._modules.values():
            vk.vkDestroyShaderModule(h, m, None)
        vk.vkDestroyPipelineCache(h, self.handle, None)
        self._pipelines.clear(), self._set_layouts.clear(), self._modules.clear()
        self.handle = None
