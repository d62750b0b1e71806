"""Shared fixtures of the Vulkan tests: one real Device per session.

A machine without a Vulkan device must FAIL these tests loudly, never skip them.
"""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def device():
    from texelflow.runtime.vulkan.device import Device
    from texelflow.runtime.vulkan.errors import NoDeviceError

    try:
        dev = Device()
    except NoDeviceError as exc:
        pytest.fail(f"no Vulkan device: {exc}", pytrace=False)
    yield dev
    dev.close()
