"""texelflow: run PyTorch programs on Vulkan compute, with representations planned from YAML.

The folders of the repository are mapped under this namespace: texelflow.codegen (codegen/),
texelflow.generated (generated/), texelflow.runtime (runtime/), texelflow.shaders (shaders/).
"""

__version__ = "0.1.0"

from texelflow.api import compile, plan  # noqa: E402

__all__ = ["compile", "plan", "__version__"]
