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

__all__ = ["compile", "plan", "quantize", "Quantizer", "__version__", "TexelflowError", "InputTypeError",
           "InputValueError", "UnsupportedModelError", "QuantizationError", "ProgramClosedError"]


def __getattr__(name: str):
    """`quantize` and `Quantizer` load torchao, so they are imported on first use only."""
    if name in ("quantize", "Quantizer"):
        from texelflow import quantizer

        return getattr(quantizer, name)
    raise AttributeError(f"module 'texelflow' has no attribute {name!r}")
