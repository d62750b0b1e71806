"""Device memory blocks: one VkDeviceMemory each, persistently mapped when host-visible.

Tensors bind to (block, offset) rather than owning memory, so a Program can place many
intermediates into one shared block at offsets chosen by their lifetimes (see lifetime.py).
Staging buffers for uploads and downloads live here too.

Every block and host buffer registers with its device (`Device.adopt`), so closing the device
frees them first; close() is idempotent and a no-op once the device is gone. The device's shared
staging buffer (`staging_buffer`) may only be used while holding `device.lock`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from texelflow.runtime.vulkan.errors import OutOfMemoryError, translate


@dataclass(frozen=True)
class Requirements:
    """What a buffer or image needs from memory (VkMemoryRequirements, decoded)."""

    size: int
    alignment: int
    type_bits: int


class MemoryBlock:
    """One device memory allocation; `host_view(offset, n)` gives bytes when host-visible."""

    def __init__(self, device, size: int, type_bits: int, *, host_visible: bool = False):
        vk = device.vk
        self.device, self.size = device, int(size)
        self.handle = self._mapped = None
        device.check_open("allocating device memory")
        mtype = device.memory_type(type_bits, host_visible=host_visible)
        self.type_index = mtype.index
        self.host_visible = mtype.host_visible and mtype.host_coherent
        limit = min(device.limits.max_memory_allocation_size, mtype.heap_size)
        if self.size > limit:
            raise OutOfMemoryError(
                f"allocating {self.size} bytes: over this device's limit of {limit} bytes per allocation "
                f"({device.limits.name})")
        with translate(f"allocating {self.size} bytes of device memory"):
            self.handle = vk.vkAllocateMemory(device.handle, vk.VkMemoryAllocateInfo(
                sType=vk.VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, allocationSize=max(self.size, 1),
                memoryTypeIndex=self.type_index), None)
        self._mapped = None
        if self.host_visible:
            try:
                with translate("mapping device memory"):
                    self._mapped = vk.vkMapMemory(device.handle, self.handle, 0, max(self.size, 1), 0)
            except BaseException:
                vk.vkFreeMemory(device.handle, self.handle, None)
                raise
        device.adopt(self)

    def host_view(self, offset: int, nbytes: int) -> np.ndarray:
        """A writable uint8 numpy view of [offset, offset + nbytes) of the mapped memory."""
        if self._mapped is None:
            raise ValueError("memory block is not host-visible")
        return np.frombuffer(self._mapped, dtype=np.uint8, count=nbytes, offset=offset)

    def close(self) -> None:
        with self.device.lock:
            handle, self.handle = self.handle, None
            mapped, self._mapped = self._mapped, None
            if handle is not None and self.device.handle is not None:
                vk = self.device.vk
                if mapped is not None:
                    vk.vkUnmapMemory(self.device.handle, handle)
                vk.vkFreeMemory(self.device.handle, handle, None)
            self.device.release(self)


def buffer_requirements(device, buffer) -> Requirements:
    r = device.vk.vkGetBufferMemoryRequirements(device.handle, buffer)
    return Requirements(int(r.size), int(r.alignment), int(r.memoryTypeBits))


def image_requirements(device, image) -> Requirements:
    r = device.vk.vkGetImageMemoryRequirements(device.handle, image)
    return Requirements(int(r.size), int(r.alignment), int(r.memoryTypeBits))


def create_buffer(device, nbytes: int, usage: int):
    """A VkBuffer with no memory bound yet."""
    vk = device.vk
    with translate(f"creating a {nbytes}-byte buffer"):
        return vk.vkCreateBuffer(device.handle, vk.VkBufferCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, size=max(int(nbytes), 4), usage=usage,
            sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE), None)


class HostBuffer:
    """A host-visible, coherent transfer buffer (staging), mapped for numpy access."""

    def __init__(self, device, nbytes: int):
        vk = device.vk
        self.device, self.nbytes = device, int(nbytes)
        device.check_open("creating a staging buffer")
        self.handle = create_buffer(device, self.nbytes,
                                    vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT)
        try:
            req = buffer_requirements(device, self.handle)
            self.memory = MemoryBlock(device, req.size, req.type_bits, host_visible=True)
            with translate("binding staging memory"):
                vk.vkBindBufferMemory(device.handle, self.handle, self.memory.handle, 0)
        except BaseException:
            vk.vkDestroyBuffer(device.handle, self.handle, None)
            raise
        device.adopt(self)

    def view(self, nbytes: int | None = None) -> np.ndarray:
        return self.memory.host_view(0, self.nbytes if nbytes is None else nbytes)

    def close(self) -> None:
        with self.device.lock:
            handle, self.handle = self.handle, None
            if handle is not None and self.device.handle is not None:
                self.device.vk.vkDestroyBuffer(self.device.handle, handle, None)
            if handle is not None:
                self.memory.close()
            self.device.release(self)


def staging_buffer(device, nbytes: int) -> HostBuffer:
    """The device's shared staging buffer, grown to at least `nbytes` (used synchronously only).

    The caller must hold `device.lock` from here until it has read what it needs from the buffer:
    another thread's upload would otherwise overwrite (or replace) it."""
    with device.lock:
        current = device.resources.get("staging")
        if current is None or current.nbytes < nbytes:
            if current is not None:
                current.close()
                del device.resources["staging"]
            device.resources["staging"] = HostBuffer(device, max(int(nbytes), 1 << 16))
        return device.resources["staging"]
