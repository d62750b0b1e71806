"""Vulkan layer of texelflow: device, tensors, packing, pipelines and recorded programs.

Imports point one way: this package reads `texelflow.generated` (and the shared host code of
`texelflow.shaders`, e.g. `geometry`) and never `runtime.graph` or torch.fx. Submodules are imported lazily by callers; this file only re-exports the names.
"""
from texelflow.runtime.vulkan.errors import (  # noqa: F401
    BufferTooLargeError, DeviceLostError, MissingVariantError, NoDeviceError, OutOfMemoryError,
    TextureTooLargeError, UnsupportedError, VulkanError)
