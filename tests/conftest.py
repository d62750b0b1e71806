"""Shared test helpers: the repository root and scratch copies of its YAML sources."""

from __future__ import annotations

import os
import shutil
import tempfile
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


@pytest.fixture
def register_tiles(monkeypatch):
    """GEMMs in register tiles, convs in their specialised kernels and attention in its fused one on
    every device, for tests that name those kernels (linear_packed, mm_tiled, conv2d_wino, one
    conv2d_act or sdpa dispatch, ...): on a GPU, which takes workgroup tiles, im2col convs and
    attention as GEMMs by default, they then still test what they name. test_linear_wg.py and
    test_attention.py test the GPU's own choice."""
    from texelflow.runtime.graph.fusion import CONV_ENV
    from texelflow.runtime.graph.prepack_matmul import ATTENTION_ENV, GEMM_ENV

    monkeypatch.setenv(GEMM_ENV, "register")
    monkeypatch.delenv(CONV_ENV, raising=False)
    monkeypatch.delenv(ATTENTION_ENV, raising=False)


def pytest_configure(config):
    """Plans under test are the ones CI sees: by transitions alone, whatever cost table
    `texelflow tune` left for this machine's device (a test of the tables sets its own folder)."""
    folder = tempfile.mkdtemp(prefix="texelflow-test-costs-")
    os.environ["TEXELFLOW_COSTS_DIR"] = folder
    config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`make test` runs `-n auto --dist loadgroup`), the tests of a module that
    share a module- or class-scoped fixture (a compiled model, a saved program, a tuned table) run
    on one worker, so the fixture is built once, not once per worker; every other test goes to
    whichever worker is free."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        scopes = {d.scope for defs in info.name2fixturedefs.values() for d in defs}
        if scopes & {"module", "class"}:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
