"""The errors texelflow raises at its public API: one base class a user can catch.

`TexelflowError` is the base of every error texelflow raises on purpose; the Vulkan layer's
`VulkanError` derives from it too. The subclasses also derive from the built-in class a Python
user expects (TypeError for a wrong kind of argument, ValueError for a wrong value), so existing
`except ValueError` code keeps working.
"""

from __future__ import annotations


class TexelflowError(Exception):
    """Base class of every error texelflow raises."""


class InputTypeError(TexelflowError, TypeError):
    """A call argument of the wrong kind (a numpy array, None, a meta tensor, ...); names its position."""


class InputValueError(TexelflowError, ValueError):
    """A call argument of the right kind but a wrong shape or dtype; names its position."""


class UnsupportedModelError(TexelflowError, ValueError):
    """A model texelflow cannot lower (e.g. dynamic shapes); names the node and the reason."""


class QuantizationError(UnsupportedModelError):
    """A quantized model with bad quantization parameters (a zero scale, a zero point outside its
    range, a dtype other than int8 / uint8), refused at plan time; names the node and the argument."""


class ProgramClosedError(TexelflowError, RuntimeError):
    """A program (or the device it runs on) was used after close()."""
