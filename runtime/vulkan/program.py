"""Program: dispatches recorded once into a command buffer and replayed with one submit per call.

Building a Program binds every tensor (intermediates share memory by lifetime), creates the
pipelines and descriptor sets, and records: input copies (when staged), each dispatch with the
barriers its data dependencies need (computed from overlapping memory ranges, so reused memory is
ordered too), timestamps around each dispatch, and output copies. A call writes the inputs, submits
once, waits, and reads the outputs; `call_with` lets a caller that has checked its arguments
itself (a compiled program's fast call) bring its own writes and reads around the submit.

Threads: a call holds the program's lock from the input writes to the output reads (the staging
memory, the command buffer and the fence are the program's own), so calls from several threads
are serialised, never interleaved. The queue submit itself takes the device's queue lock, so
programs on one device may be called from different threads at once. close() takes the same
lock (it waits for a call in flight), is idempotent, and a later call raises ProgramClosedError.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from texelflow.generated.layouts import STORAGE_BY_AXIS, STORAGE_INFO
from texelflow.runtime.errors import ProgramClosedError
from texelflow.runtime.vulkan import commands
from texelflow.runtime.vulkan.errors import UnsupportedError, VulkanError, translate
from texelflow.runtime.vulkan.lifetime import Interval, plan_offsets
from texelflow.runtime.vulkan.memory import HostBuffer, MemoryBlock
from texelflow.runtime.vulkan.pipeline import PipelineCache, pack_push_constants, workgroups
from texelflow.runtime.vulkan.tensor import VkTensor
from texelflow.runtime.vulkan.transfer import Transfer

STAGING_ALIGN = 16


@dataclass
class Dispatch:
    """One kernel launch: a variant, its tensors (by reflection name or in binding order), scalars."""

    variant: object
    tensors: Mapping[str, VkTensor] | Sequence[VkTensor]
    scalars: Mapping[str, float | int] = field(default_factory=dict)
    label: str = ""
    local_size_x: int | None = None
    spirv: bytes | None = None  # override of the generated SPIR-V (tests, experiments)
    # units of work (pc.units); None: one per unit of the written tensor. The grid launches
    # ceil(units / variant.span) invocations (span: units per invocation, 1 for most kernels)
    units: int | None = None
    # binding -> the layout to read a tensor's memory with, where it is not the tensor's own (a
    # folded free permute: the same bytes as another representation of another shape)
    layouts: Mapping[str, object] = field(default_factory=dict)
    # shape classes (specialization constants a template contract declares under `spec`): name ->
    # value; those not given keep their general default, right for any tensors
    spec: Mapping[str, int] = field(default_factory=dict)

    def specialization(self, bound: Sequence[VkTensor], limits=None) -> dict[str, int]:
        """Specialization constant name -> value for the tensors `bound` (binding order): each
        tensor's layout id, the shape classes, and the workgroup size (given, or for a variant
        whose invocations each handle several units, one chosen from the device `limits`)."""
        names = {s.name for s in self.variant.spec_constants}
        bindings = sorted(self.variant.bindings, key=lambda b: b.index)
        spec = {f"{b.tensor}_layout": int(self.layouts.get(b.tensor, t.layout)) for b, t in zip(bindings, bound)
                if f"{b.tensor}_layout" in names}
        spec.update({k: int(v) for k, v in self.spec.items()})
        if TEXEL_READS in names and TEXEL_READS not in self.spec:
            texel = [t for b, t in zip(bindings, bound) if b.descriptor == TEXEL_DESCRIPTOR]
            spec[TEXEL_READS] = int(texel_reads(limits, texel))
        if self.local_size_x is not None:
            spec["local_size_x"] = self.local_size_x
        elif getattr(self.variant, "span", 1) > 1 and limits is not None:
            spec["local_size_x"] = vector_local_size(limits)
        return spec

    def bound(self) -> list[VkTensor]:
        """Tensors in binding order, checked against the reflection."""
        bindings = sorted(self.variant.bindings, key=lambda b: b.index)
        if isinstance(self.tensors, Mapping):
            names = [b.tensor for b in bindings]
            if set(self.tensors) != set(names):
                raise ValueError(f"{self.variant.name} binds tensors {names}, got {sorted(self.tensors)}")
            out = [self.tensors[n] for n in names]
        else:
            out = list(self.tensors)
            if len(out) != len(bindings):
                raise ValueError(f"{self.variant.name} binds {len(bindings)} tensors, got {len(out)}")
        for b, t in zip(bindings, out):
            if STORAGE_BY_AXIS[b.storage] != t.storage:
                raise ValueError(f"{self.variant.name}: binding {b.tensor!r} is a {b.storage}, "
                                 f"got a {t.storage.name} tensor")
        return out


TEXEL_DESCRIPTOR = "UNIFORM_TEXEL_BUFFER"  # a buffer input's second binding (contract texel_reads)
TEXEL_READS = "texel_reads"  # the spec constant that reads through it
TEXEL_READS_ENV = "TEXELFLOW_BUFFER_READS"


def texel_reads(limits, tensors: Sequence[VkTensor] = ()) -> bool:
    """Whether kernels read the buffer inputs their contract lists in `texel_reads` through
    uniform texel buffers rather than storage buffers. lavapipe (a CPU device) loads a storage
    buffer lane by lane and a texel buffer through its vectorised image path: on an AMD EPYC
    the trivial vec4 copy read 1.5 GB/s from a storage buffer and 4.9-6.5 GB/s from the same
    buffer as a texel buffer. GPUs keep storage buffers (not measured there). The environment
    variable TEXELFLOW_BUFFER_READS (`texel`, `storage`, `auto`) overrides the device type; a
    tensor past the device's maxTexelBufferElements keeps the storage-buffer path."""
    value = os.environ.get(TEXEL_READS_ENV, "").strip().lower() or "auto"
    if value not in ("auto", "texel", "storage"):
        raise ValueError(f"{TEXEL_READS_ENV}={os.environ[TEXEL_READS_ENV]!r}: expected one of auto, texel, storage")
    limit = getattr(limits, "max_texel_buffer_elements", 0) if limits is not None else 0
    if value == "storage" or limit <= 0 or (value == "auto" and getattr(limits, "device_type", None) != "cpu"):
        return False
    return all(-(-t.nbytes // (16 if t.dtype == "float32" else 8)) <= limit for t in tensors)


# Invocations per workgroup for kernels whose invocations each stream several units (contract
# `span`): they share nothing, so the size only has to fill the device's SIMD width. On lavapipe
# (subgroup 8), relu on 16M floats beside the trivial copy, alternating: 32 0.76-0.81x, 64
# 0.83-0.88x, 128 0.86-0.91x, 256 0.86-0.92x; 128 keeps small tensors' idle lanes fewer.
VECTOR_LOCAL_SIZE = 128


def vector_local_size(limits) -> int:
    """VECTOR_LOCAL_SIZE rounded up to whole subgroups, within the device's workgroup limits."""
    sub = max(int(getattr(limits, "subgroup_size", None) or 1), 1)
    size = -(-VECTOR_LOCAL_SIZE // sub) * sub
    return max(1, min(size, limits.max_workgroup_size[0], limits.max_workgroup_invocations))


def invocations(variant, out: VkTensor, units: int | None = None) -> int:
    """Invocations one dispatch launches: one per unit (`units`, else each unit of `out`), or for
    a variant whose invocations each handle `span` units (contract `span`): ceil(units / span) of
    a buffer, and ceil(x extent / span) per x-row of a texture (a span runs along one row)."""
    span = getattr(variant, "span", 1)
    if units is None and span > 1 and out.is_texture:
        x, y, z = out.extents
        return -(-x // span) * y * z
    units = out.units if units is None else units
    return -(-units // span)


def _range(t: VkTensor) -> tuple[int, int, int]:
    return id(t.memory), t.offset, t.offset + t.requirements.size


def _overlap(a, b) -> bool:
    return a[0] == b[0] and a[1] < b[2] and b[1] < a[2]


class Program:
    """A fixed sequence of dispatches over fixed tensors; `program(*arrays)` runs it once."""

    _close_rank = 1  # Device.close closes programs before the memory and tensors they use

    def __init__(self, device, dispatches: Sequence[Dispatch], inputs: Sequence[VkTensor] = (),
                 outputs: Sequence[VkTensor] = (), *, pipelines: PipelineCache | None = None,
                 staging: bool | None = None, timestamps: bool = True, profiling: bool = True):
        self.device, self.vk = device, device.vk
        self.dispatches = list(dispatches)
        self.inputs, self.outputs = list(inputs), list(outputs)
        self.pipelines = pipelines or PipelineCache.shared(device)
        self.labels = [d.label or f"{i}:{d.variant.name}" for i, d in enumerate(self.dispatches)]
        self._blocks: list[MemoryBlock] = []
        self._host: HostBuffer | None = None
        self.descriptor_pool = self.query_pool = self.cmd = self.cmd_timed = self.fence = None
        self._ran = self._closed = False
        self._lock = threading.Lock()
        device.check_open("building a program")
        self.timestamps = timestamps and device.limits.timestamp_valid_bits > 0 and bool(self.dispatches)
        self._profiling = profiling
        self._timed_ran = False  # whether the last call ran the timed recording (profile() reads it)
        try:
            device.adopt(self)
            self._bound = [d.bound() for d in self.dispatches]
            self._allocate(staging)
            self._prepare()
            self._record()
            self._plan_transfers()
        except BaseException:
            self.close()
            raise

    # ---- memory ---------------------------------------------------------------------------------
    def _allocate(self, staging: bool | None) -> None:
        """Dedicated memory for unbound inputs/outputs; shared, lifetime-planned memory for the rest."""
        io = {id(t) for t in self.inputs + self.outputs}
        for t in self.inputs + self.outputs:
            if not t.bound:
                t.allocate()
        life: dict[int, list] = {}  # id -> [tensor, first, last]
        for i, ts in enumerate(self._bound):
            for t in ts:
                if id(t) not in io and not t.bound:
                    life.setdefault(id(t), [t, i, i])[2] = i
        self.intermediates = [entry[0] for entry in life.values()]  # closed with the program
        self.naive_intermediate_bytes = 0
        self.intermediate_bytes = 0
        groups: dict[int, list] = {}
        for entry in life.values():
            groups.setdefault(self.device.memory_type(entry[0].requirements.type_bits).index, []).append(entry)
        gran = self.device.limits.buffer_image_granularity
        self._discard: dict[int, list[VkTensor]] = {}  # dispatch index -> shared images first used there
        for entries in groups.values():
            items = [Interval(-(-t.requirements.size // gran) * gran, max(t.requirements.alignment, gran), a, b)
                     for t, a, b in entries]
            offsets, total = plan_offsets(items)
            bits = 0xFFFFFFFF
            for t, _, _ in entries:
                bits &= t.requirements.type_bits
            block = MemoryBlock(self.device, max(total, 1), bits)
            self._blocks.append(block)
            for (t, first, _), off in zip(entries, offsets):
                t.bind(block, off)
                if t.is_texture:
                    self._discard.setdefault(first, []).append(t)
            self.naive_intermediate_bytes += sum(it.size for it in items)
            self.intermediate_bytes += total
        # Host transfer plan: direct mapping where possible, else one staging buffer for all.
        self._staged_in = [t for t in self.inputs if staging or not t.host_mappable]
        self._staged_out = [t for t in self.outputs if staging or not t.host_mappable]
        offset, self._stage_offsets = 0, {}
        for t in self._staged_in + self._staged_out:
            self._stage_offsets[id(t)] = offset
            offset += -(-t.nbytes // STAGING_ALIGN) * STAGING_ALIGN
        if offset:
            self._host = HostBuffer(self.device, offset)

    # ---- pipelines and descriptors ----------------------------------------------------------------
    def _prepare(self) -> None:
        vk, dev = self.vk, self.device
        self._pipes, self._push, self._groups = [], [], []
        descriptors = {info.descriptor: 0 for info in STORAGE_INFO.values()}  # descriptor type -> count
        descriptors[TEXEL_DESCRIPTOR] = 0
        for d, ts in zip(self.dispatches, self._bound):
            v = d.variant
            pipe = self.pipelines.get(v, d.specialization(ts, dev.limits), spirv=d.spirv)
            out = next((t for b, t in zip(self._bindings(v), ts) if b.access == "write"), ts[0])
            values = {f"{b.tensor}_sizes": t.sizes for b, t in zip(self._bindings(v), ts)}
            units = out.units if d.units is None else d.units
            values["units"] = units
            values.update(d.scalars)
            self._pipes.append(pipe)
            self._push.append(vk.ffi.new("char[]", pack_push_constants(v, values)))
            self._groups.append(workgroups(invocations(v, out, d.units), pipe.local_size[0],
                                           dev.limits.max_workgroup_count))
            for b in self._bindings(v):
                descriptors[b.descriptor] += 1
        sizes = [vk.VkDescriptorPoolSize(type=getattr(vk, f"VK_DESCRIPTOR_TYPE_{kind}"), descriptorCount=max(n, 1))
                 for kind, n in descriptors.items()]
        with translate("creating descriptor sets"):
            self.descriptor_pool = vk.vkCreateDescriptorPool(dev.handle, vk.VkDescriptorPoolCreateInfo(
                sType=vk.VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO, maxSets=max(len(self.dispatches), 1),
                poolSizeCount=len(sizes), pPoolSizes=sizes), None)
            self._sets = []
            if self.dispatches:
                self._sets = list(vk.vkAllocateDescriptorSets(dev.handle, vk.VkDescriptorSetAllocateInfo(
                    sType=vk.VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO, descriptorPool=self.descriptor_pool,
                    descriptorSetCount=len(self._pipes), pSetLayouts=[p.set_layout for p in self._pipes])))
            writes = []
            for dset, d, ts in zip(self._sets, self.dispatches, self._bound):
                for b, t in zip(self._bindings(d.variant), ts):
                    if b.descriptor == TEXEL_DESCRIPTOR:
                        info = dict(pTexelBufferView=[t.texel_view()])
                    elif t.is_texture:
                        info = dict(pImageInfo=[
                            vk.VkDescriptorImageInfo(imageView=t.view, imageLayout=vk.VK_IMAGE_LAYOUT_GENERAL)])
                    else:
                        info = dict(pBufferInfo=[
                            vk.VkDescriptorBufferInfo(buffer=t.buffer, offset=0, range=max(t.nbytes, 4))])
                    writes.append(vk.VkWriteDescriptorSet(
                        sType=vk.VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, dstSet=dset, dstBinding=b.index,
                        descriptorCount=1, descriptorType=getattr(vk, f"VK_DESCRIPTOR_TYPE_{b.descriptor}"), **info))
            if writes:
                vk.vkUpdateDescriptorSets(dev.handle, len(writes), writes, 0, None)
        if self.timestamps:
            with translate("creating a timestamp query pool"):
                self.query_pool = vk.vkCreateQueryPool(dev.handle, vk.VkQueryPoolCreateInfo(
                    sType=vk.VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO, queryType=vk.VK_QUERY_TYPE_TIMESTAMP,
                    queryCount=2 * len(self.dispatches)), None)

    @staticmethod
    def _bindings(variant):
        return sorted(variant.bindings, key=lambda b: b.index)

    # ---- recording --------------------------------------------------------------------------------
    def _record(self) -> None:
        """Record the program once without timestamps and, where the device has them, once more
        with a timestamp pair around each dispatch (profile()). A timestamp costs a few
        microseconds of device time on lavapipe (about 17 us per dispatch: 3x the whole run of a
        100-dispatch chain of small kernels), so calls run the plain recording unless profiling."""
        dev = self.device
        self.fence = dev.create_fence()
        self.cmd = dev.allocate_command_buffer()
        self._submit = dev.prepare_submit(self.cmd, self.fence)  # the call's submit structs, built once
        self._record_into(self.cmd, timed=False)
        self.cmd_timed = self._submit_timed = None
        if self.query_pool is not None:
            self.cmd_timed = dev.allocate_command_buffer()
            self._submit_timed = dev.prepare_submit(self.cmd_timed, self.fence)
            self._record_into(self.cmd_timed, timed=True)

    @property
    def profiling(self) -> bool:
        """Whether calls record GPU timestamps around each dispatch (what profile() reads)."""
        return self._profiling and self.cmd_timed is not None

    @profiling.setter
    def profiling(self, on: bool) -> None:
        self._profiling = bool(on)

    def _current_submit(self):
        """(command buffer, submit structs) a call runs, and whether it is the timed recording."""
        if self._profiling and self.cmd_timed is not None:
            return self.cmd_timed, self._submit_timed, True
        return self.cmd, self._submit, False

    def _record_into(self, cmd, timed: bool) -> None:
        vk, dev = self.vk, self.device
        query_pool = self.query_pool if timed else None
        self.num_barriers = 0  # barriers for data hazards between dispatches
        self.num_pipeline_barriers = 0  # vkCmdPipelineBarrier calls between dispatches (with image discards)
        # Recording touches the device's command pool, which other threads use too.
        with dev.lock, translate("recording the program"):
            vk.vkBeginCommandBuffer(cmd, vk.VkCommandBufferBeginInfo(sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO))
            if query_pool is not None:
                vk.vkCmdResetQueryPool(cmd, query_pool, 0, 2 * len(self.dispatches))
            commands.host_to_work(vk, cmd)
            for t in self._staged_in:
                t.record_copy_in(cmd, self._host.handle, self._stage_offsets[id(t)])
            if self._staged_in:
                commands.work_to_work(vk, cmd)
            pending: list[tuple[tuple, bool]] = []  # memory ranges touched since the last barrier
            for i, (d, ts) in enumerate(zip(self.dispatches, self._bound)):
                acc = [(_range(t), b.access in ("write", "readwrite")) for b, t in zip(self._bindings(d.variant), ts)]
                hazard = any(_overlap(r, pr) and (w or pw) for r, w in acc for pr, pw in pending)
                # shared memory: an image's old bytes belong to another tensor; its discard rides
                # on the hazard's barrier (one vkCmdPipelineBarrier per dispatch at most)
                discard = [img.image for img in self._discard.get(i, [])]
                if hazard or discard:
                    commands.work_to_work_discarding(vk, cmd, discard, memory=hazard)
                    self.num_pipeline_barriers += 1
                if hazard:
                    self.num_barriers += 1
                    pending = []
                pending += acc
                pipe = self._pipes[i]
                if query_pool is not None:
                    vk.vkCmdWriteTimestamp(cmd, vk.VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, query_pool, 2 * i)
                vk.vkCmdBindPipeline(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipe.handle)
                vk.vkCmdBindDescriptorSets(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipe.layout, 0, 1,
                                           [self._sets[i]], 0, None)
                if d.variant.push_constant_size:
                    vk.vkCmdPushConstants(cmd, pipe.layout, vk.VK_SHADER_STAGE_COMPUTE_BIT, 0,
                                          d.variant.push_constant_size, self._push[i])
                vk.vkCmdDispatch(cmd, *self._groups[i])
                if query_pool is not None:
                    vk.vkCmdWriteTimestamp(cmd, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, query_pool, 2 * i + 1)
            commands.work_to_work(vk, cmd)
            for t in self._staged_out:
                t.record_copy_out(cmd, self._host.handle, self._stage_offsets[id(t)])
            commands.work_to_host(vk, cmd)
            vk.vkEndCommandBuffer(cmd)

    # ---- running ----------------------------------------------------------------------------------
    def _plan_transfers(self) -> None:
        """One Transfer per input and output, over the host bytes a call writes or reads (its
        staging region, or the tensor's own mapped memory), so a call does no per-tensor planning."""
        def raw(t):
            if id(t) in self._stage_offsets:
                o = self._stage_offsets[id(t)]
                return self._host.view()[o:o + t.nbytes], True
            return t.memory.host_view(t.offset, t.nbytes), False

        self._writes, self._reads = [], []
        self._io = self.inputs + self.outputs
        for t in self.inputs:
            view, staged = raw(t)
            self._writes.append(Transfer(t, view, host_only=staged))
        for t in self.outputs:
            self._reads.append(Transfer(t, raw(t)[0]))

    def __call__(self, *arrays) -> list[np.ndarray]:
        """Upload `arrays` to the inputs, run every dispatch with one submit, return the outputs
        (new arrays: a later call never changes them)."""
        if len(arrays) != len(self.inputs):
            raise ValueError(f"program takes {len(self.inputs)} inputs, got {len(arrays)}")
        arrays = [np.asarray(a) for a in arrays]
        for t, a in zip(self.inputs, arrays):  # validate everything before writing anything
            if a.shape != t.shape:
                raise ValueError(f"array of shape {a.shape} does not match tensor shape {t.shape}")
        with self._lock:
            if self._closed:
                raise ProgramClosedError("the program was closed" if self.device.handle is not None
                                         else "the program was closed (its device was closed)")
            if any(t.memory is None for t in self._io):  # its mapped bytes are gone: never touch them
                raise ProgramClosedError("an input or output tensor of the program was closed")
            return self._run(arrays)

    def call_with(self, write, args, read):
        """One call whose host side the caller brings (a compiled program's fast call, which has
        checked `args` itself): under the lock, and only while the program and its tensors are
        open (so their mapped memory is live), `write(args)` fills the input bytes (`host_writes`),
        then one submit and wait, then `read()` returns what it makes of the output bytes."""
        with self._lock:
            if self._closed or any(t.memory is None for t in self._io):
                raise ProgramClosedError("the program or one of its tensors was closed")
            write(args)
            cmd, submit, self._timed_ran = self._current_submit()
            self.device.submit(cmd, self.fence, submit)
            self._ran = True
            return read()

    @property
    def host_writes(self) -> list:
        """The Transfer of each input (the host bytes a call writes), in input order."""
        return list(self._writes)

    @property
    def host_reads(self) -> list:
        """The Transfer of each output (the host bytes a call reads after the wait), in order."""
        return list(self._reads)

    def _run(self, arrays) -> list[np.ndarray]:
        for transfer, a in zip(self._writes, arrays):
            transfer.write(a)
        cmd, submit, self._timed_ran = self._current_submit()
        self.device.submit(cmd, self.fence, submit)
        self._ran = True
        return [transfer.read() for transfer in self._reads]

    def profile(self) -> list[tuple[str, float]]:
        """(label, microseconds) per dispatch, from the GPU timestamps of the last call."""
        if self.query_pool is None:
            raise UnsupportedError("this program records no timestamps (no dispatches, timestamps=False, "
                                   f"or {self.device.limits.name} has none on its compute queue)")
        if not self._ran:
            raise VulkanError("profile() needs a call of the program first")
        if not self._timed_ran:
            raise UnsupportedError("the last call ran without timestamps: set `profiling = True` "
                                   "(texelflow.compile(..., profile=True)) and call the program again")
        vk, n = self.vk, 2 * len(self.dispatches)
        data = vk.ffi.new("uint64_t[]", n)
        with self._lock, translate("reading timestamps"):
            if self._closed:
                raise ProgramClosedError("the program was closed")
            vk.vkGetQueryPoolResults(self.device.handle, self.query_pool, 0, n, 8 * n, data, 8,
                                     vk.VK_QUERY_RESULT_64_BIT | vk.VK_QUERY_RESULT_WAIT_BIT)
        bits = self.device.limits.timestamp_valid_bits
        mask = (1 << bits) - 1 if bits < 64 else (1 << 64) - 1
        period_us = self.device.limits.timestamp_period_ns / 1000.0
        return [(label, ((data[2 * i + 1] - data[2 * i]) & mask) * period_us)
                for i, label in enumerate(self.labels)]

    def close(self) -> None:
        """Free what the program owns: command buffer, sets, queries, shared memory and the
        intermediate tensors bound into it (their buffers/images cannot outlive that memory).
        Waits for a call in flight in another thread; closing twice is a no-op."""
        with self._lock:
            self._closed = True
            self._free()
        self.device.release(self)

    def _free(self) -> None:
        vk, h = self.vk, self.device.handle
        self._writes = self._reads = []  # views of mapped memory: never touched after this
        if h is None:  # the device was destroyed, and everything made from it
            self._blocks, self._host, self.intermediates = [], None, []
            self.cmd = self.cmd_timed = self.fence = self.query_pool = self.descriptor_pool = None
            return
        for cmd in (self.cmd, getattr(self, "cmd_timed", None)):
            if cmd is not None:
                self.device.free_command_buffer(cmd)
        if self.fence is not None:
            vk.vkDestroyFence(h, self.fence, None)
        if self.query_pool is not None:
            vk.vkDestroyQueryPool(h, self.query_pool, None)
        if self.descriptor_pool is not None:
            vk.vkDestroyDescriptorPool(h, self.descriptor_pool, None)
        if self._host is not None:
            self._host.close()
        for t in getattr(self, "intermediates", ()):  # their memory is ours; the handles go with it
            t.close()
        for b in self._blocks:
            b.close()
        self._blocks, self._host, self.intermediates = [], None, []
        self.cmd = self.cmd_timed = self.fence = self.query_pool = self.descriptor_pool = None
