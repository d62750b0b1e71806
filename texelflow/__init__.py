"""texelflow: run PyTorch programs on Vulkan compute, with representations planned from YAML.

The folders of the repository are mapped under this namespace: texelflow.codegen (codegen/),
texelflow.generated (generated/), texelflow.runtime (runtime/), texelflow.shaders (shaders/).
"""

__version__ = "0.1.0"

from texelflow.api import compile, plan  # noqa: E402
from texelflow.runtime.errors import (  # noqa: E402
    InputTypeError,
    InputValueError,
    ProgramClosedError,
    QuantizationError,
    TexelflowError,
    UnsupportedModelError,
)

__all__ = ["compile", "plan", "load", "inspect", "quantize", "Quantizer", "__version__", "TexelflowError", "InputTypeError",
           "InputValueError", "UnsupportedModelError", "QuantizationError", "ProgramClosedError"]


def load(path, device=None):
    """A program saved by `prog.save(path)`, ready to run with numpy and Vulkan only (no torch):
    `texelflow.runtime.saved.load` (format: docs/format.md)."""
    from texelflow.runtime.saved import load as _load

    return _load(path, device)


def inspect(path) -> str:
    """A saved program's plan summary, shader variants and sizes, checked like a load but built on
    no device (`texelflow inspect`)."""
    from texelflow.runtime.saved import inspect as _inspect

    return _inspect(path)


def __getattr__(name: str):
    """`quantize` and `Quantizer` load torchao, so they are imported on first use only."""
    if name in ("quantize", "Quantizer"):
        from texelflow import quantizer

        return getattr(quantizer, name)
    raise AttributeError(f"module 'texelflow' has no attribute {name!r}")
