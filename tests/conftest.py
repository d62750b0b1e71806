"""Shared test helpers: the repository root and scratch copies of its YAML sources."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def copy_sources(dest: Path) -> Path:
    """A scratch repository: the YAML files, shader templates and current generated/ tree."""
    for name in ("layouts.yaml", "ops.yaml"):
        shutil.copy(ROOT / name, dest / name)
    shutil.copytree(ROOT / "shaders", dest / "shaders", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "generated", dest / "generated", ignore=shutil.ignore_patterns("__pycache__"))
    return dest


@pytest.fixture
def scratch_repo(tmp_path: Path) -> Path:
    return copy_sources(tmp_path)


@pytest.fixture(scope="session")
def device():
    """One real Vulkan Device for the whole session. No device FAILS the test, never skips it."""
    from texelflow.runtime.vulkan.device import Device
    from texelflow.runtime.vulkan.errors import NoDeviceError

    try:
        dev = Device()
    except NoDeviceError as exc:
        pytest.fail(f"no Vulkan device: {exc}", pytrace=False)
    yield dev
    dev.close()
