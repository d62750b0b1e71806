"""Kernel tests share the Vulkan tests' session Device fixture (a missing device FAILS, never skips)."""
from tests.vulkan.conftest import device  # noqa: F401  (re-exported fixture)
