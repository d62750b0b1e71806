"""VkTensor: one tensor on the device, as a storage buffer or a 3-D storage image.

A tensor is created for a representation (shape, dtype, storage, layout) and bound to memory
either by itself (dedicated allocation) or later by a Program at an offset of a shared block.
Host data moves through numpy packing (packing.py); images always go through a staging buffer,
buffers are written directly when their memory is host-visible, else through staging too.

Lifetime: a tensor registers with its device (`Device.adopt`); closing the device closes it, and
close() is idempotent. Uploads and downloads through the device's shared staging buffer hold
`device.lock` from the staging write to the read back, so they are safe from any thread.
"""
from __future__ import annotations

import numpy as np

from texelflow.generated.layouts import DTYPES, STORAGE_INFO, Layout, Storage
from texelflow.runtime.vulkan import commands, packing
from texelflow.shaders import geometry
from texelflow.runtime.vulkan.errors import (BufferTooLargeError, TextureTooLargeError, UnsupportedError,
                                             translate)
from texelflow.runtime.vulkan.memory import (MemoryBlock, Requirements, buffer_requirements, create_buffer,
                                             image_requirements, staging_buffer)

_NP = {"float32": np.float32, "float16": np.float16, "int32": np.int32, "int8": np.int8, "bool": np.bool_}


def image_format(vk, dtype: str) -> int:
    """The VkFormat of a texture of `dtype` (layouts.yaml dtypes: vk_format)."""
    fmt = DTYPES[dtype].vk_format if dtype in DTYPES else None
    if fmt is None:
        raise UnsupportedError(f"no texture format for dtype {dtype}")
    return getattr(vk, f"VK_FORMAT_{fmt}")


def image_type(vk, storage: Storage) -> tuple[int, int]:
    """(VkImageType, VkImageViewType) of an image storage, from its dimensionality."""
    dims = STORAGE_INFO[storage].image_dims
    return getattr(vk, f"VK_IMAGE_TYPE_{dims}D"), getattr(vk, f"VK_IMAGE_VIEW_TYPE_{dims}D")


def _check_format(device, fmt: int) -> None:
    vk = device.vk
    with device.lock:
        cache = device.resources.setdefault("checked_formats", set())
    if fmt in cache:
        return
    props = vk.vkGetPhysicalDeviceFormatProperties(device.physical, fmt)
    transfer_src_dst = 0x4000 | 0x8000  # VK_FORMAT_FEATURE_TRANSFER_{SRC,DST}_BIT (1.1 core)
    need = vk.VK_FORMAT_FEATURE_STORAGE_IMAGE_BIT | transfer_src_dst
    if props.optimalTilingFeatures & need != need:
        raise UnsupportedError(f"{device.limits.name} cannot use format {fmt} as a 3-D storage image")
    cache.add(fmt)


class VkTensor:
    """A device tensor in one representation; `upload`/`download` move contiguous NCHW arrays."""

    def __init__(self, device, shape, dtype: str = "float32", storage: Storage | str = Storage.BUFFER,
                 layout: Layout | str = Layout.WIDTH_PACKED, *, allocate: bool = True, label: str = ""):
        self.device, self.label = device, label
        self.shape = tuple(int(s) for s in shape)
        self.dtype = dtype
        self.storage, self.layout = geometry.as_storage(storage), geometry.as_layout(layout)
        packing.check_representation(self.shape, dtype, self.storage, self.layout)
        self.sizes = geometry.whcn_sizes(self.shape)
        self.units = geometry.units(self.shape, self.storage, self.layout)
        self.nbytes = geometry.nbytes(self.shape, dtype, self.storage, self.layout)
        self.memory: MemoryBlock | None = None
        self.offset = 0
        self.view = None
        self._texel_view = None  # a buffer's uniform texel buffer view (texel_view), made on first use
        self._owned: MemoryBlock | None = None
        self.buffer = self.image = None
        vk = device.vk
        device.check_open(f"creating a tensor {label}".rstrip())
        if self.is_texture:
            self.extents = geometry.texture_extents(self.shape, self.layout, self.storage)
            limit = device.limits.max_image_extent_3d
            if any(e > m for e, m in zip(self.extents, limit)):
                raise TextureTooLargeError(
                    f"tensor {self.shape} as {self.storage.name}/{self.layout.name} needs texture extents "
                    f"{self.extents}, over the device limit {limit} ({device.limits.name}); use a buffer")
            fmt = image_format(vk, dtype)
            _check_format(device, fmt)
            with translate(f"creating a {self.extents} image"):
                self.image = vk.vkCreateImage(device.handle, vk.VkImageCreateInfo(
                    sType=vk.VK_STRUCTURE_TYPE_IMAGE_CREATE_INFO, imageType=image_type(vk, self.storage)[0], format=fmt,
                    extent=vk.VkExtent3D(*self.extents), mipLevels=1, arrayLayers=1,
                    samples=vk.VK_SAMPLE_COUNT_1_BIT, tiling=vk.VK_IMAGE_TILING_OPTIMAL,
                    usage=(vk.VK_IMAGE_USAGE_STORAGE_BIT | vk.VK_IMAGE_USAGE_TRANSFER_SRC_BIT
                           | vk.VK_IMAGE_USAGE_TRANSFER_DST_BIT),
                    sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE, initialLayout=vk.VK_IMAGE_LAYOUT_UNDEFINED), None)
            self.requirements: Requirements = image_requirements(device, self.image)
        else:
            self.extents = None
            limit = device.limits.max_storage_buffer_range
            if self.nbytes > limit:
                raise BufferTooLargeError(
                    f"tensor {self.shape} {dtype} as BUFFER/{self.layout.name} needs {self.nbytes} bytes, over "
                    f"maxStorageBufferRange = {limit} bytes ({device.limits.name}); split it or use a texture")
            # whole 16-byte words, so that a texel view (texel_view) covers the last partial vec4
            self.buffer = create_buffer(device, -(-self.nbytes // 16) * 16, vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT
                                        | vk.VK_BUFFER_USAGE_UNIFORM_TEXEL_BUFFER_BIT
                                        | vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT)
            self.requirements = buffer_requirements(device, self.buffer)
        device.adopt(self)
        if allocate:
            try:
                self.allocate()
            except BaseException:
                self.close()
                raise

    # ---- memory -------------------------------------------------------------------------------
    @property
    def is_texture(self) -> bool:
        return STORAGE_INFO[self.storage].is_image

    @property
    def bound(self) -> bool:
        return self.memory is not None

    def allocate(self) -> None:
        """Bind to a dedicated allocation of our own (freed by close())."""
        block = MemoryBlock(self.device, self.requirements.size, self.requirements.type_bits)
        try:
            self.bind(block, 0)
        except BaseException:
            block.close()
            raise
        self._owned = block

    def bind(self, block: MemoryBlock, offset: int) -> None:
        """Bind to `block` at `offset` (once); images then get a view and the GENERAL layout."""
        vk, dev = self.device.vk, self.device
        if self.memory is not None:
            raise ValueError(f"tensor {self.label or self.shape} is already bound to memory")
        if offset % self.requirements.alignment or offset + self.requirements.size > block.size:
            raise ValueError(f"offset {offset} is misaligned or out of the {block.size}-byte block")
        with translate("binding tensor memory"):
            if self.is_texture:
                vk.vkBindImageMemory(dev.handle, self.image, block.handle, offset)
                rng = vk.VkImageSubresourceRange(aspectMask=vk.VK_IMAGE_ASPECT_COLOR_BIT, baseMipLevel=0,
                                                 levelCount=1, baseArrayLayer=0, layerCount=1)
                self.view = vk.vkCreateImageView(dev.handle, vk.VkImageViewCreateInfo(
                    sType=vk.VK_STRUCTURE_TYPE_IMAGE_VIEW_CREATE_INFO, image=self.image,
                    viewType=image_type(vk, self.storage)[1], format=image_format(vk, self.dtype),
                    subresourceRange=rng), None)
            else:
                vk.vkBindBufferMemory(dev.handle, self.buffer, block.handle, offset)
        self.memory, self.offset = block, offset
        if self.is_texture:
            dev.run_once(lambda cmd: commands.image_to_general(vk, cmd, self.image, discard=True),
                         "an image layout change")

    @property
    def host_mappable(self) -> bool:
        """Buffers in host-visible memory can be read and written without a copy."""
        return not self.is_texture and self.memory is not None and self.memory.host_visible

    # ---- recording copies (used by upload/download and by Program) ------------------------------
    def record_copy_in(self, cmd, src_buffer, src_offset: int = 0) -> None:
        """Record a copy of packed bytes from `src_buffer` into this tensor."""
        vk = self.device.vk
        if self.is_texture:
            vk.vkCmdCopyBufferToImage(cmd, src_buffer, self.image, vk.VK_IMAGE_LAYOUT_GENERAL, 1,
                                      [self._image_copy(vk, src_offset)])
        else:
            vk.vkCmdCopyBuffer(cmd, src_buffer, self.buffer, 1,
                               [vk.VkBufferCopy(srcOffset=src_offset, dstOffset=0, size=self.nbytes)])

    def record_copy_out(self, cmd, dst_buffer, dst_offset: int = 0) -> None:
        """Record a copy of this tensor's packed bytes into `dst_buffer`."""
        vk = self.device.vk
        if self.is_texture:
            vk.vkCmdCopyImageToBuffer(cmd, self.image, vk.VK_IMAGE_LAYOUT_GENERAL, dst_buffer, 1,
                                      [self._image_copy(vk, dst_offset)])
        else:
            vk.vkCmdCopyBuffer(cmd, self.buffer, dst_buffer, 1,
                               [vk.VkBufferCopy(srcOffset=0, dstOffset=dst_offset, size=self.nbytes)])

    def _image_copy(self, vk, offset: int):
        layers = vk.VkImageSubresourceLayers(aspectMask=vk.VK_IMAGE_ASPECT_COLOR_BIT, mipLevel=0,
                                             baseArrayLayer=0, layerCount=1)
        return vk.VkBufferImageCopy(bufferOffset=offset, bufferRowLength=0, bufferImageHeight=0,
                                    imageSubresource=layers, imageOffset=vk.VkOffset3D(0, 0, 0),
                                    imageExtent=vk.VkExtent3D(*self.extents))

    # ---- host transfer ----------------------------------------------------------------------
    def pack(self, array) -> np.ndarray:
        """Check `array` against this tensor and pack it into bytes (uint8)."""
        arr = np.asarray(array)
        if arr.shape != self.shape:
            raise ValueError(f"array of shape {arr.shape} does not match tensor shape {self.shape}")
        arr = arr.astype(_NP[self.dtype], copy=False)
        return packing.pack(arr, self.storage, self.layout).view(np.uint8).reshape(-1)

    def unpack(self, raw: np.ndarray) -> np.ndarray:
        """Turn packed bytes of this tensor back into a contiguous NCHW array."""
        word = np.dtype(np.int32 if self.dtype in ("int8", "bool") else _NP[self.dtype])  # bool: int32 0 / 1
        data = np.frombuffer(raw.tobytes() if not raw.flags.c_contiguous else raw, dtype=word)
        if self.is_texture:
            data = data.reshape(self.extents[2], self.extents[1], self.extents[0],
                                geometry.texel_lanes(self.layout, self.storage))
        return packing.unpack(data, self.shape, self.dtype, self.storage, self.layout)

    def upload(self, array, *, staging: bool | None = None) -> None:
        """Copy a host array in. staging=None: direct when host-mappable; True forces staging."""
        raw = self.pack(array)
        vk = self.device.vk
        # Under the device lock: the tensor is not closed by another thread meanwhile, and the
        # staging buffer is shared by every thread.
        with self.device.lock:
            self._require_bound()
            if not staging and self.host_mappable:
                self.memory.host_view(self.offset, self.nbytes)[:] = raw
                return
            if staging is False:
                raise ValueError("this tensor is not host-mappable; it needs the staging path")
            stage = staging_buffer(self.device, self.nbytes)
            stage.view(self.nbytes)[:] = raw

            def record(cmd):
                commands.host_to_work(vk, cmd)
                self.record_copy_in(cmd, stage.handle)
                commands.work_to_work(vk, cmd)
                commands.work_to_host(vk, cmd)  # a later direct (mapped) read must see the copy

            self.device.run_once(record, "an upload")

    def download(self, *, staging: bool | None = None) -> np.ndarray:
        """Copy the tensor out to a new host array (contiguous NCHW)."""
        return self.unpack(self.download_raw(staging=staging))

    def download_raw(self, *, staging: bool | None = None) -> np.ndarray:
        """The tensor's packed bytes (uint8) exactly as stored, padding included."""
        vk = self.device.vk
        with self.device.lock:  # as in upload()
            self._require_bound()
            if not staging and self.host_mappable:
                return self.memory.host_view(self.offset, self.nbytes).copy()
            if staging is False:
                raise ValueError("this tensor is not host-mappable; it needs the staging path")
            stage = staging_buffer(self.device, self.nbytes)

            def record(cmd):
                commands.work_to_work(vk, cmd)
                self.record_copy_out(cmd, stage.handle)
                commands.work_to_host(vk, cmd)

            self.device.run_once(record, "a download")
            return stage.view(self.nbytes).copy()

    def _require_bound(self) -> None:
        if self.buffer is None and self.image is None:
            from texelflow.runtime.errors import ProgramClosedError
            raise ProgramClosedError(f"tensor {self.label or self.shape} was closed")
        if self.memory is None:
            raise ValueError(f"tensor {self.label or self.shape} has no memory bound yet")

    def texel_view(self):
        """A uniform texel buffer view of this float buffer as vec4 texels (word k = texel k:
        R32G32B32A32_SFLOAT for float32, R16G16B16A16_SFLOAT for float16), for the `tb_<name>`
        bindings of contract texel_reads; made on first use (the buffer must be bound) and
        destroyed with the tensor. It covers the last partial word (the buffer holds whole 16
        bytes), clipped to maxTexelBufferElements: past it the kernels read the storage buffer
        (program.texel_reads)."""
        dev = self.device
        with dev.lock:
            if self._texel_view is not None:
                return self._texel_view
            vk = dev.vk
            formats = {"float32": (vk.VK_FORMAT_R32G32B32A32_SFLOAT, 16),
                       "float16": (vk.VK_FORMAT_R16G16B16A16_SFLOAT, 8)}
            if self.is_texture or self.dtype not in formats or self.memory is None:
                raise ValueError(f"tensor {self.label or self.shape}: a texel view needs a bound float32 or "
                                 "float16 buffer")
            limit = dev.limits.max_texel_buffer_elements
            if limit <= 0:
                raise UnsupportedError(f"{dev.limits.name} cannot read float buffers as uniform texel buffers")
            fmt, size = formats[self.dtype]
            texels = min(-(-self.nbytes // size), limit)
            with translate("creating a texel buffer view"):
                self._texel_view = vk.vkCreateBufferView(dev.handle, vk.VkBufferViewCreateInfo(
                    sType=vk.VK_STRUCTURE_TYPE_BUFFER_VIEW_CREATE_INFO, buffer=self.buffer, format=fmt, offset=0,
                    range=texels * size), None)
            return self._texel_view

    # ---- teardown -----------------------------------------------------------------------------
    def close(self) -> None:
        """Destroy the buffer or image (and its memory when dedicated); a no-op when closed."""
        dev = self.device
        with dev.lock:
            view, image, buffer, owned = self.view, self.image, self.buffer, self._owned
            texel_view, self._texel_view = self._texel_view, None
            self.view = self.image = self.buffer = self._owned = self.memory = None
            vk, h = dev.vk, dev.handle
            if h is not None:
                if texel_view is not None:
                    vk.vkDestroyBufferView(h, texel_view, None)
                if view is not None:
                    vk.vkDestroyImageView(h, view, None)
                if image is not None:
                    vk.vkDestroyImage(h, image, None)
                if buffer is not None:
                    vk.vkDestroyBuffer(h, buffer, None)
            if owned is not None:
                owned.close()
            dev.release(self)

    def __repr__(self) -> str:
        return (f"VkTensor({self.label + ' ' if self.label else ''}{self.shape} {self.dtype} "
                f"{self.storage.name}/{self.layout.name})")
