"""The Vulkan device: instance, physical device choice, limits, compute queue and submission.

One `Device` owns everything the rest of the layer allocates from: the logical device, one compute
queue, a command pool, and memory type selection. It counts queue submissions so tests can check
that a Program call costs exactly one submit.

Threads and lifetime: a Device may be used from any number of threads. `lock` (re-entrant) guards
host access to the command pool (allocating, freeing and recording command buffers), the one-shot
command buffer and fence of `run_once`, the shared staging buffer and `resources`; a separate queue
lock serialises `vkQueueSubmit` (the queue must be externally synchronised). Every object that
holds handles of the device (tensors, memory, programs, pipeline caches) registers itself with
`adopt`; `close()` first closes every one still alive, so closing a device under live programs
cannot crash: their later calls raise ProgramClosedError and their close() is a no-op.
`default_device()` is the process-wide device that `texelflow.compile` shares.
"""
from __future__ import annotations

import atexit
import itertools
import os
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Callable

from texelflow.generated.layouts import DEVICE_FEATURES
from texelflow.generated.variants import VARIANT_FEATURES
from texelflow.runtime.errors import ProgramClosedError
from texelflow.runtime.vulkan.errors import INSTALL_HINT, DeviceLostError, NoDeviceError, translate
from texelflow.runtime.vulkan.float_controls import DEVICE_EXTENSION as FLOAT_CONTROLS_EXTENSION
from texelflow.runtime.vulkan.float_controls import supported_modes

ENV_VAR = "TEXELFLOW_DEVICE"
# A submit waits as long as its work runs: a big model on a CPU device, or any device on a loaded
# machine, may take minutes, and a hung GPU is the driver's to report (VK_ERROR_DEVICE_LOST). The
# wait is cut into slices so that Ctrl-C is seen between them; TEXELFLOW_WAIT_TIMEOUT_S caps it.
WAIT_TIMEOUT_ENV = "TEXELFLOW_WAIT_TIMEOUT_S"
WAIT_SLICE_S = 1.0
_VK_TIMEOUT = 2  # VkResult VK_TIMEOUT: the fence is not signalled yet


def wait_limit_s() -> float | None:
    """Seconds a submit may wait for its work ($TEXELFLOW_WAIT_TIMEOUT_S), or None: no limit."""
    raw = os.environ.get(WAIT_TIMEOUT_ENV, "").strip()
    if not raw:
        return None
    try:
        limit = float(raw)
    except ValueError:
        limit = float("nan")
    if not limit > 0:  # NaN, zero and negative values too
        raise ValueError(f"{WAIT_TIMEOUT_ENV}={raw!r}: give a number of seconds above 0, or leave it unset for no limit")
    return limit

# Feature structs chained into VkPhysicalDeviceFeatures2: (sType, API version where they are core).
_FEATURE_STRUCTS = {
    "VkPhysicalDevice16BitStorageFeatures": ("VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES", (1, 1, 0)),
    "VkPhysicalDevice8BitStorageFeatures": ("VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_8BIT_STORAGE_FEATURES", (1, 2, 0)),
    "VkPhysicalDeviceShaderFloat16Int8Features": (
        "VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES", (1, 2, 0)),
    "VkPhysicalDeviceShaderIntegerDotProductFeatures": (
        "VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES", (1, 3, 0)),
}
# Every device feature a shader variant may require (layouts.yaml dtypes: `features`; ops.yaml
# choice axes, e.g. int_dot; validated against the same names in codegen/layouts_schema.py
# KNOWN_FEATURES) -> the struct reporting it (None: VkPhysicalDeviceFeatures itself).
FEATURE_SOURCES: dict[str, str | None] = {
    "shaderFloat64": None,
    "shaderInt64": None,
    "shaderInt16": None,
    "shaderStorageImageExtendedFormats": None,
    "storageBuffer16BitAccess": "VkPhysicalDevice16BitStorageFeatures",
    "uniformAndStorageBuffer16BitAccess": "VkPhysicalDevice16BitStorageFeatures",
    "storageBuffer8BitAccess": "VkPhysicalDevice8BitStorageFeatures",
    "uniformAndStorageBuffer8BitAccess": "VkPhysicalDevice8BitStorageFeatures",
    "shaderFloat16": "VkPhysicalDeviceShaderFloat16Int8Features",
    "shaderInt8": "VkPhysicalDeviceShaderFloat16Int8Features",
    "shaderIntegerDotProduct": "VkPhysicalDeviceShaderIntegerDotProductFeatures",
}

# Features whose instructions a device may support without hardware for them (it then emulates
# them, often no faster than the code they replace) -> (properties struct, its sType, the API
# version where it is core, the property saying the instructions we use are accelerated).
# Variant selection prefers the variants needing them only where they are accelerated.
ACCELERATION_PROPERTIES: dict[str, tuple[str, str, tuple[int, int, int], str]] = {
    "shaderIntegerDotProduct": (
        "VkPhysicalDeviceShaderIntegerDotProductProperties",
        "VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_PROPERTIES", (1, 3, 0),
        "integerDotProduct4x8BitPackedSignedAccelerated"),
}
# Device extensions that bring a feature to devices below the API version where it is core; each is
# enabled with its feature where the device lists it.
FEATURE_EXTENSIONS: dict[str, str] = {"shaderIntegerDotProduct": "VK_KHR_shader_integer_dot_product"}

_TYPE_NAMES = {0: "other", 1: "integrated", 2: "discrete", 3: "virtual", 4: "cpu"}
# Lower rank is preferred: real GPUs first, lavapipe (CPU) only as a fallback.
_TYPE_RANK = {"discrete": 0, "integrated": 1, "virtual": 2, "cpu": 3, "other": 4}


def load_vulkan():
    """Import the `vulkan` binding, turning a missing binding or loader into NoDeviceError."""
    try:
        import vulkan
    except ImportError as exc:
        raise NoDeviceError(f"the Python `vulkan` binding is not importable ({exc}); {INSTALL_HINT}") from exc
    except OSError as exc:  # the binding raises OSError when libvulkan.so.1 cannot be loaded
        raise NoDeviceError(f"no Vulkan loader (libvulkan.so.1) found ({exc}); {INSTALL_HINT}") from exc
    return vulkan


@dataclass(frozen=True)
class DeviceLimits:
    """Plain copy of the device facts the planner and runtime need (no Vulkan objects)."""

    name: str
    device_type: str  # "discrete" | "integrated" | "virtual" | "cpu" | "other"
    api_version: tuple[int, int, int]
    max_image_extent_3d: tuple[int, int, int]
    max_storage_buffer_range: int
    max_memory_allocation_size: int
    max_workgroup_count: tuple[int, int, int]
    max_workgroup_size: tuple[int, int, int]
    max_workgroup_invocations: int
    max_shared_memory: int
    max_push_constants_size: int
    min_storage_buffer_offset_alignment: int
    buffer_image_granularity: int
    subgroup_size: int | None
    timestamp_period_ns: float
    timestamp_valid_bits: int
    shader_float16: bool
    shader_int8: bool
    storage_buffer_8bit: bool
    features: frozenset[str] = frozenset()  # FEATURE_SOURCES names the device supports
    # supported features whose instructions the device reports as not accelerated
    # (ACCELERATION_PROPERTIES): variants needing them are run only where nothing else fits
    emulated_features: frozenset[str] = frozenset()
    # VK_SUBGROUP_FEATURE_SHUFFLE_BIT in compute shaders (None: a Vulkan 1.0 device did not say)
    subgroup_shuffle: bool | None = None
    # (execution mode, float width) pairs of SPV_KHR_float_controls the device supports, e.g.
    # ("SignedZeroInfNanPreserve", 32); empty where it lacks VK_KHR_shader_float_controls
    float_modes: frozenset[tuple[str, int]] = frozenset()
    # maxTexelBufferElements, where the device can read float32 and float16 buffers as uniform
    # texel buffers of vec4 texels (R32G32B32A32 / R16G16B16A16_SFLOAT with
    # UNIFORM_TEXEL_BUFFER_BIT); 0 where it cannot (program.texel_reads then leaves them off)
    max_texel_buffer_elements: int = 0


@dataclass(frozen=True)
class MemoryType:
    """One VkMemoryType, with its property flags decoded."""

    index: int
    heap_size: int
    device_local: bool
    host_visible: bool
    host_coherent: bool
    host_cached: bool


def _version(v: int) -> tuple[int, int, int]:
    return ((v >> 22) & 0x7F, (v >> 12) & 0x3FF, v & 0xFFF)


def _feature_chain(vk, api: tuple[int, int, int], enable: frozenset[str] | None = None):
    """(VkPhysicalDeviceFeatures2, {struct name: struct}) with every feature struct core at `api`
    chained in. For a query leave `enable` None; for vkCreateDevice pass the features to turn on."""
    structs: dict[str | None, object] = {}
    nxt = None
    for name, (stype, since) in _FEATURE_STRUCTS.items():
        if api < since:
            continue
        on = {f: vk.VK_TRUE for f in enable or () if FEATURE_SOURCES.get(f) == name}
        nxt = structs[name] = getattr(vk, name)(sType=getattr(vk, stype), pNext=nxt, **on)
    core = {f: vk.VK_TRUE for f in enable or () if f in FEATURE_SOURCES and FEATURE_SOURCES[f] is None}
    feats2 = vk.VkPhysicalDeviceFeatures2(sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, pNext=nxt,
                                          features=vk.VkPhysicalDeviceFeatures(**core))
    return feats2, structs


def _supported_features(feats2, structs) -> frozenset[str]:
    """The FEATURE_SOURCES names a queried chain reports as supported."""
    found = set()
    for feature, source in FEATURE_SOURCES.items():
        struct = feats2.features if source is None else structs.get(source)
        if struct is not None and getattr(struct, feature):
            found.add(feature)
    return frozenset(found)


class Device:
    """A logical Vulkan device with one compute queue; pick one by `TEXELFLOW_DEVICE` or rank."""

    def __init__(self, select: str | int | None = None):
        vk = self.vk = load_vulkan()
        self.resources: dict[str, object] = {}  # per-device singletons of higher layers (closed with us)
        self.submit_count = 0
        self.submit_seconds = 0.0  # wall time spent inside submit(): queue submit + fence wait
        self._closed = self._closing = False
        self.lock = threading.RLock()  # command pool, one-shot commands, staging, resources
        self._queue_lock = threading.Lock()  # vkQueueSubmit and the submit counters
        self._children: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self._child_ids = itertools.count()
        self.instance = self._create_instance()
        try:
            self.physical, self.limits = self._choose(select if select is not None else os.environ.get(ENV_VAR))
            self.queue_family, self.memory_types = self._queue_family(), self._memory_types()
            # Turn on every feature some dtype's or variant's shaders require that the device has:
            # variant lookup refuses variants needing the others (pipeline.find_variant).
            self.enabled_features = self.limits.features & frozenset(DEVICE_FEATURES + VARIANT_FEATURES)
            # What variant selection prefers among variants that differ only on a choice axis
            # (lower_dispatch.select_variant): the enabled features the device does not emulate.
            self.preferred_features = self.enabled_features - self.limits.emulated_features
            chain = _feature_chain(vk, self.limits.api_version, self.enabled_features)[0] \
                if self.enabled_features else None
            extensions = self._feature_extensions()
            with translate("creating the logical device"):
                queue_info = vk.VkDeviceQueueCreateInfo(
                    sType=vk.VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
                    queueFamilyIndex=self.queue_family, queueCount=1, pQueuePriorities=[1.0])
                self.handle = vk.vkCreateDevice(self.physical, vk.VkDeviceCreateInfo(
                    sType=vk.VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, pNext=chain,
                    queueCreateInfoCount=1, pQueueCreateInfos=[queue_info],
                    enabledExtensionCount=len(extensions), ppEnabledExtensionNames=extensions or None), None)
                self.queue = vk.vkGetDeviceQueue(self.handle, self.queue_family, 0)
                self.command_pool = vk.vkCreateCommandPool(self.handle, vk.VkCommandPoolCreateInfo(
                    sType=vk.VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
                    flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
                    queueFamilyIndex=self.queue_family), None)
                self._one_shot_cmd = self.allocate_command_buffer()
                self._one_shot_fence = self.create_fence()
        except BaseException:
            self._destroy_partial()
            raise

    # ---- creation helpers -------------------------------------------------------------------
    def _feature_extensions(self) -> list[str]:
        """The FEATURE_EXTENSIONS of enabled features that the device lists (our instance asks
        for Vulkan 1.1, so a feature core only later is valid with its extension on)."""
        wanted = {FEATURE_EXTENSIONS[f] for f in self.enabled_features if f in FEATURE_EXTENSIONS}
        if self.limits.float_modes:  # every module declares them (float_controls.py)
            wanted.add(FLOAT_CONTROLS_EXTENSION)
        if not wanted:
            return []
        listed = {e.extensionName for e in self.vk.vkEnumerateDeviceExtensionProperties(self.physical, None)}
        return sorted(wanted & listed)

    def _create_instance(self):
        vk = self.vk
        app = vk.VkApplicationInfo(sType=vk.VK_STRUCTURE_TYPE_APPLICATION_INFO,
                                   pApplicationName="texelflow", pEngineName="texelflow",
                                   apiVersion=vk.VK_MAKE_VERSION(1, 1, 0))
        try:
            available = {e.extensionName for e in vk.vkEnumerateInstanceExtensionProperties(None)}
            exts = ["VK_KHR_portability_enumeration"] if "VK_KHR_portability_enumeration" in available else []
            flags = 0x00000001 if exts else 0  # VK_INSTANCE_CREATE_ENUMERATE_PORTABILITY_BIT_KHR
            return vk.vkCreateInstance(vk.VkInstanceCreateInfo(
                sType=vk.VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, flags=flags, pApplicationInfo=app,
                enabledExtensionCount=len(exts), ppEnabledExtensionNames=exts), None)
        except Exception as exc:
            raise NoDeviceError(f"could not create a Vulkan instance ({type(exc).__name__}); "
                                f"{INSTALL_HINT}") from exc

    def _choose(self, select):
        vk = self.vk
        try:
            physicals = list(vk.vkEnumeratePhysicalDevices(self.instance))
        except Exception as exc:
            raise NoDeviceError(f"enumerating Vulkan devices failed ({type(exc).__name__}); {INSTALL_HINT}") from exc
        if not physicals:
            raise NoDeviceError(f"the Vulkan loader found no device; {INSTALL_HINT}")
        found = [(p, self._read_limits(p)) for p in physicals]
        names = ", ".join(f"[{i}] {lim.name} ({lim.device_type})" for i, (_, lim) in enumerate(found))
        if select is None or select == "":
            return min(found, key=lambda pl: _TYPE_RANK[pl[1].device_type])
        if isinstance(select, int) or str(select).strip().isdigit():
            index = int(select)
            if not 0 <= index < len(found):
                raise NoDeviceError(f"{ENV_VAR}={select!r}: no device with that index; devices: {names}")
            return found[index]
        matches = [pl for pl in found if str(select).lower() in pl[1].name.lower()]
        if not matches:
            raise NoDeviceError(f"{ENV_VAR}={select!r}: no device name contains it; devices: {names}")
        return matches[0]

    def _read_limits(self, physical) -> DeviceLimits:
        vk = self.vk
        props = vk.vkGetPhysicalDeviceProperties(physical)
        lim = props.limits
        sub = vk.VkPhysicalDeviceSubgroupProperties(sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES)
        m3 = vk.VkPhysicalDeviceMaintenance3Properties(
            sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES, pNext=sub)
        api = _version(props.apiVersion)
        accel, nxt = {}, m3
        for f, (struct, stype, since, _) in ACCELERATION_PROPERTIES.items():
            if api >= since:
                nxt = accel[f] = getattr(vk, struct)(sType=getattr(vk, stype), pNext=nxt)
        extended = api >= (1, 1, 0)
        floats = None  # float controls: core in 1.2, but our 1.1 instance needs the extension
        if extended and any(e.extensionName == FLOAT_CONTROLS_EXTENSION
                            for e in vk.vkEnumerateDeviceExtensionProperties(physical, None)):
            nxt = floats = vk.VkPhysicalDeviceFloatControlsProperties(
                sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FLOAT_CONTROLS_PROPERTIES, pNext=nxt)
        props2 = vk.VkPhysicalDeviceProperties2(sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, pNext=nxt)
        feats2, structs = _feature_chain(vk, api)
        if extended:  # Properties2/Features2 are 1.1 core
            vk.vkGetPhysicalDeviceProperties2(physical, vk.ffi.addressof(props2))
            vk.vkGetPhysicalDeviceFeatures2(physical, vk.ffi.addressof(feats2))
            features = _supported_features(feats2, structs)
        else:
            features = frozenset()
        families = vk.vkGetPhysicalDeviceQueueFamilyProperties(physical)
        ts_bits = max((f.timestampValidBits for f in families if f.queueFlags & vk.VK_QUEUE_COMPUTE_BIT), default=0)
        heap = max(vk.vkGetPhysicalDeviceMemoryProperties(physical).memoryHeaps[0].size, 0)
        return DeviceLimits(
            name=str(props.deviceName),
            device_type=_TYPE_NAMES.get(props.deviceType, "other"),
            api_version=_version(props.apiVersion),
            max_image_extent_3d=(lim.maxImageDimension3D,) * 3,
            max_storage_buffer_range=int(lim.maxStorageBufferRange),
            max_memory_allocation_size=int(m3.maxMemoryAllocationSize) if extended else int(heap),
            max_workgroup_count=tuple(int(x) for x in lim.maxComputeWorkGroupCount),
            max_workgroup_size=tuple(int(x) for x in lim.maxComputeWorkGroupSize),
            max_workgroup_invocations=int(lim.maxComputeWorkGroupInvocations),
            max_shared_memory=int(lim.maxComputeSharedMemorySize),
            max_push_constants_size=int(lim.maxPushConstantsSize),
            min_storage_buffer_offset_alignment=int(lim.minStorageBufferOffsetAlignment),
            buffer_image_granularity=int(lim.bufferImageGranularity),
            subgroup_size=int(sub.subgroupSize) if extended and sub.subgroupSize else None,
            subgroup_shuffle=(bool(sub.supportedOperations & vk.VK_SUBGROUP_FEATURE_SHUFFLE_BIT)
                              and bool(sub.supportedStages & vk.VK_SHADER_STAGE_COMPUTE_BIT)) if extended else None,
            timestamp_period_ns=float(lim.timestampPeriod),
            timestamp_valid_bits=int(ts_bits),
            shader_float16="shaderFloat16" in features,
            shader_int8="shaderInt8" in features,
            storage_buffer_8bit="storageBuffer8BitAccess" in features,
            features=features,
            emulated_features=frozenset(f for f, prop in accel.items() if f in features
                                        and not getattr(prop, ACCELERATION_PROPERTIES[f][3])),
            float_modes=supported_modes(floats) if floats is not None else frozenset(),
            max_texel_buffer_elements=int(lim.maxTexelBufferElements) if self._texel_formats(physical) else 0,
        )

    def _texel_formats(self, physical) -> bool:
        """Whether the vec4 float formats of texel_reads views can back uniform texel buffers
        (mandatory in Vulkan 1.0, checked all the same)."""
        vk = self.vk
        need = vk.VK_FORMAT_FEATURE_UNIFORM_TEXEL_BUFFER_BIT
        return all(vk.vkGetPhysicalDeviceFormatProperties(physical, fmt).bufferFeatures & need
                   for fmt in (vk.VK_FORMAT_R32G32B32A32_SFLOAT, vk.VK_FORMAT_R16G16B16A16_SFLOAT))

    def _queue_family(self) -> int:
        vk = self.vk
        families = list(vk.vkGetPhysicalDeviceQueueFamilyProperties(self.physical))
        compute = [i for i, f in enumerate(families) if f.queueFlags & vk.VK_QUEUE_COMPUTE_BIT]
        if not compute:
            raise NoDeviceError(f"device {self.limits.name!r} has no compute queue")
        # Prefer a family with timestamps so profiling works.
        return max(compute, key=lambda i: families[i].timestampValidBits > 0)

    def _memory_types(self) -> tuple[MemoryType, ...]:
        vk = self.vk
        props = vk.vkGetPhysicalDeviceMemoryProperties(self.physical)
        out = []
        for i in range(props.memoryTypeCount):
            t = props.memoryTypes[i]
            f = t.propertyFlags
            out.append(MemoryType(
                index=i, heap_size=int(props.memoryHeaps[t.heapIndex].size),
                device_local=bool(f & vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT),
                host_visible=bool(f & vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT),
                host_coherent=bool(f & vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT),
                host_cached=bool(f & vk.VK_MEMORY_PROPERTY_HOST_CACHED_BIT)))
        return tuple(out)

    # ---- memory types -------------------------------------------------------------------------
    def memory_type(self, type_bits: int, *, host_visible: bool = False) -> MemoryType:
        """Pick a memory type allowed by `type_bits`.

        host_visible=False: device-local preferred (Vulkan lists types with fewer flags first, so the
        first device-local one avoids small host-visible BAR heaps on discrete GPUs).
        host_visible=True: host-visible and coherent, for staging; cached preferred for reads back.
        """
        allowed = [t for t in self.memory_types if type_bits & (1 << t.index)]
        if host_visible:
            picks = [t for t in allowed if t.host_visible and t.host_coherent]
            picks.sort(key=lambda t: not t.host_cached)
        else:
            picks = [t for t in allowed if t.device_local] or allowed
        if not picks:
            kind = "host-visible coherent" if host_visible else "any"
            raise NoDeviceError(f"device {self.limits.name!r} offers no {kind} memory type for bits {type_bits:#x}")
        return picks[0]

    # ---- commands and submission ---------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed or self._closing

    def check_open(self, what: str = "using the device") -> None:
        """Raise ProgramClosedError when the device is closed (or closing)."""
        if self._closed or self._closing:
            raise ProgramClosedError(f"{what}: device {self.limits.name!r} was closed")

    def adopt(self, obj) -> None:
        """Register `obj` (anything with close() that holds handles of this device): close() of the
        device closes it first. Weakly held: an object freed without close() is simply dropped."""
        with self.lock:
            self.check_open(f"creating {type(obj).__name__}")
            key = next(self._child_ids)
            obj._device_key = key
            self._children[key] = obj

    def release(self, obj) -> None:
        """Unregister `obj` (its close() calls this)."""
        key = getattr(obj, "_device_key", None)
        if key is not None:
            with self.lock:
                self._children.pop(key, None)

    def allocate_command_buffer(self):
        vk = self.vk
        with self.lock, translate("allocating a command buffer"):
            self.check_open("allocating a command buffer")
            return vk.vkAllocateCommandBuffers(self.handle, vk.VkCommandBufferAllocateInfo(
                sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, commandPool=self.command_pool,
                level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1))[0]

    def free_command_buffer(self, cmd) -> None:
        with self.lock:
            if self.handle is not None:
                self.vk.vkFreeCommandBuffers(self.handle, self.command_pool, 1, [cmd])

    def create_fence(self):
        vk = self.vk
        self.check_open("creating a fence")
        with translate("creating a fence"):
            return vk.vkCreateFence(self.handle, vk.VkFenceCreateInfo(sType=vk.VK_STRUCTURE_TYPE_FENCE_CREATE_INFO), None)

    def submit(self, cmd, fence, prepared: "PreparedSubmit | None" = None) -> None:
        """Submit one command buffer and wait for it; the only place this layer calls vkQueueSubmit.

        The caller owns `cmd` and `fence` for the duration (a Program holds its own lock); the
        queue is shared, so the submit itself runs under the device's queue lock. The wait does
        not hold it: programs of other threads may submit meanwhile. `prepared` (from
        `prepare_submit(cmd, fence)`, built once by a caller that submits the same buffer many
        times) skips building the Vulkan structs on each call: about 25 us of Python each."""
        p = prepared if prepared is not None else PreparedSubmit(self.vk, cmd, fence)
        lib, codes = self.vk.lib, self.vk.exception_codes
        limit = wait_limit_s()  # a bad value is refused before anything is submitted
        start = time.perf_counter()
        with self._queue_lock:
            self.check_open("submitting work")
            with translate("submitting work to the queue"):
                result = lib.vkResetFences(self.handle, 1, p.fences)
                if result == 0:
                    result = lib.vkQueueSubmit(self.queue, 1, p.info, fence)
                if result != 0:
                    raise codes[result]
                self.submit_count += 1
        self._wait(p.fences, start, limit)
        with self._queue_lock:
            self.submit_seconds += time.perf_counter() - start

    def _wait(self, fences, start: float, limit: float | None) -> None:
        """Wait for a submitted fence, slice by slice, up to `limit` seconds after `start` (None: no limit)."""
        lib, codes = self.vk.lib, self.vk.exception_codes
        with translate("waiting for the device"):
            while True:
                left = WAIT_SLICE_S if limit is None else min(WAIT_SLICE_S, start + limit - time.perf_counter())
                result = lib.vkWaitForFences(self.handle, 1, fences, 1, max(int(left * 1e9), 0))
                if result == 0:
                    return
                if result != _VK_TIMEOUT:
                    raise codes[result]
                if limit is not None and time.perf_counter() - start >= limit:
                    raise DeviceLostError(
                        f"waiting for the device: the work did not finish within {limit:g} s "
                        f"({WAIT_TIMEOUT_ENV}); it may still be running, so close this device and open a new one")

    def prepare_submit(self, cmd, fence) -> "PreparedSubmit":
        """The structs `submit` passes for (cmd, fence), built once for a buffer submitted often."""
        return PreparedSubmit(self.vk, cmd, fence)

    def run_once(self, record: Callable[[object], None], what: str = "one-shot commands") -> None:
        """Record commands with `record(cmd)`, submit them once and wait (uploads, layout changes)."""
        vk = self.vk
        with self.lock:  # one command buffer and fence for every thread: one user at a time
            self.check_open(f"running {what}")
            cmd = self._one_shot_cmd
            with translate(f"recording {what}"):
                vk.vkResetCommandBuffer(cmd, 0)
                vk.vkBeginCommandBuffer(cmd, vk.VkCommandBufferBeginInfo(
                    sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                    flags=vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT))
                try:
                    record(cmd)
                finally:
                    vk.vkEndCommandBuffer(cmd)
            self.submit(cmd, self._one_shot_fence)

    def wait_idle(self) -> None:
        self.check_open("waiting for the device")
        with translate("waiting for the device to go idle"):
            self.vk.vkDeviceWaitIdle(self.handle)

    # ---- teardown -----------------------------------------------------------------------------
    def _destroy_partial(self) -> None:
        vk = self.vk
        if getattr(self, "_one_shot_fence", None) is not None:
            vk.vkDestroyFence(self.handle, self._one_shot_fence, None)
        if getattr(self, "command_pool", None) is not None:
            vk.vkDestroyCommandPool(self.handle, self.command_pool, None)
        if getattr(self, "handle", None) is not None:
            vk.vkDestroyDevice(self.handle, None)
        if getattr(self, "instance", None) is not None:
            vk.vkDestroyInstance(self.instance, None)
        self.handle = self.instance = self.command_pool = self._one_shot_fence = None

    def close(self) -> None:
        """Destroy the device and what hangs off it; closing twice is a no-op.

        Every registered object still alive (programs, tensors, memory, pipeline caches) is closed
        first, newest first; a program busy in another thread finishes its call before it closes.
        Later use of any of them raises ProgramClosedError."""
        with self.lock:
            if self._closed or self._closing:
                return
            self._closing = True
            # Owners first (compiled programs, then programs: each waits for a call in flight and
            # frees what it holds), then anything left, newest first.
            children = [self._children.get(k) for k in sorted(self._children.keys(), reverse=True)]
            children.sort(key=lambda c: getattr(c, "_close_rank", 2))
        # Not under self.lock: a child's close takes its own lock and then, briefly, self.lock.
        for child in children:
            if child is not None:
                try:
                    child.close()
                except Exception:  # best effort: the device goes away regardless
                    pass
        with self.lock, self._queue_lock:
            try:
                self.vk.vkDeviceWaitIdle(self.handle)
            except Exception:
                pass
            for res in reversed(list(self.resources.values())):
                close = getattr(res, "close", None)
                if close is not None:
                    close()
            self.resources.clear()
            self._children.clear()
            self._destroy_partial()
            self._closed = True

    def __enter__(self) -> "Device":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = ", closed" if self.closed else ""
        return f"Device({self.limits.name!r}, {self.limits.device_type}{state})"


class PreparedSubmit:
    """The C structs of one vkQueueSubmit of `cmd` signalling `fence` (and the fence array the
    reset and the wait read), built once: the binding's wrappers rebuild them on every call."""

    def __init__(self, vk, cmd, fence):
        ffi = vk.ffi
        self.cmds = ffi.new("VkCommandBuffer[1]", [cmd])
        self.fences = ffi.new("VkFence[1]", [fence])
        self.info = ffi.new("VkSubmitInfo*", {"sType": vk.VK_STRUCTURE_TYPE_SUBMIT_INFO,
                                              "commandBufferCount": 1, "pCommandBuffers": self.cmds})


_default_lock = threading.Lock()
_default: Device | None = None


def default_device() -> Device:
    """The process-wide Device shared by every program compiled without `device=`: created on first
    use (thread-safe), created again if it was closed, and closed at interpreter exit."""
    global _default
    with _default_lock:
        if _default is None or _default.closed:
            _default = Device()
        return _default


def _close_default() -> None:
    global _default
    with _default_lock:
        dev, _default = _default, None
    if dev is not None:
        dev.close()


atexit.register(_close_default)
