"""Exceptions of the Vulkan layer, and the translation of VkResult failures into them.

Every error the layer raises derives from `VulkanError`, so a caller can catch one class. The
`vulkan` binding raises one bare exception class per VkResult; `translate` turns those into ours
with a message saying what we were doing, so a user never sees a naked `VkErrorOutOfDeviceMemory()`.
"""
from __future__ import annotations

import contextlib

from texelflow.runtime.errors import TexelflowError

INSTALL_HINT = (
    "install a Vulkan loader and driver, e.g. `apt-get install libvulkan1 mesa-vulkan-drivers` "
    "(Mesa's lavapipe runs Vulkan on the CPU), and the Python binding with `pip install vulkan`"
)


class VulkanError(TexelflowError, RuntimeError):
    """Base class of every error raised by texelflow.runtime.vulkan."""


class NoDeviceError(VulkanError):
    """No Vulkan loader, driver or matching physical device is available."""


class DeviceLostError(VulkanError):
    """The device was lost (driver crash, timeout); the Device must be recreated."""


class OutOfMemoryError(VulkanError):
    """A host or device memory allocation failed or exceeds what the device allows."""


class MissingVariantError(VulkanError, KeyError):
    """No generated shader variant matches the requested op and axes."""

    def __str__(self) -> str:  # KeyError would repr() the message; keep it readable.
        return str(self.args[0]) if self.args else ""


class BufferTooLargeError(VulkanError, ValueError):
    """A tensor does not fit the device's storage buffer range or image extent limits."""


class TextureTooLargeError(BufferTooLargeError):
    """A texture's extents exceed the device's maximum 3-D image dimension."""


class UnsupportedError(VulkanError):
    """The device lacks a feature the request needs (format, timestamps, ...)."""


class MissingFeatureError(UnsupportedError):
    """A shader variant needs device features (shaderFloat16, ...) that the device lacks."""


# VkResult names (as the `vulkan` binding names its exception classes) -> (our class, meaning).
_RESULTS: dict[str, tuple[type[VulkanError], str]] = {
    "VkErrorOutOfHostMemory": (OutOfMemoryError, "the driver ran out of host memory"),
    "VkErrorOutOfDeviceMemory": (OutOfMemoryError, "the device ran out of memory"),
    "VkErrorOutOfPoolMemory": (OutOfMemoryError, "a descriptor pool ran out of space"),
    "VkErrorFragmentedPool": (OutOfMemoryError, "a descriptor pool is too fragmented"),
    "VkErrorTooManyObjects": (OutOfMemoryError, "too many objects of one type exist"),
    "VkErrorMemoryMapFailed": (OutOfMemoryError, "mapping device memory into the host failed"),
    "VkErrorDeviceLost": (DeviceLostError, "the device was lost (driver reset or hang)"),
    "VkErrorInitializationFailed": (NoDeviceError, "the driver failed to initialise"),
    "VkErrorIncompatibleDriver": (NoDeviceError, "no driver supports the requested Vulkan version"),
    "VkErrorLayerNotPresent": (NoDeviceError, "a requested layer is not installed"),
    "VkErrorExtensionNotPresent": (UnsupportedError, "a requested extension is not supported"),
    "VkErrorFeatureNotPresent": (UnsupportedError, "a requested device feature is not supported"),
    "VkErrorFormatNotSupported": (UnsupportedError, "the image format is not supported"),
    "VkErrorInvalidShaderNv": (VulkanError, "the driver rejected the shader"),
    "VkTimeout": (DeviceLostError, "waiting for the device timed out"),
}


def from_vk(exc: BaseException, what: str) -> VulkanError:
    """Return our exception for a `vulkan` binding exception raised while doing `what`."""
    name = type(exc).__name__
    cls, meaning = _RESULTS.get(name, (VulkanError, "the Vulkan call failed"))
    err = cls(f"{what}: {meaning} ({name})")
    err.__cause__ = exc
    return err


@contextlib.contextmanager
def translate(what: str):
    """Re-raise `vulkan` binding exceptions raised inside the block as VulkanError subclasses."""
    try:
        yield
    except VulkanError:
        raise
    except Exception as exc:  # the binding's VkError/VkException classes share no public base
        if type(exc).__module__.startswith("vulkan"):
            raise from_vk(exc, what) from exc
        raise
