"""Device choice, limits, memory types and error translation on the real device."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from texelflow.runtime.vulkan import errors
from texelflow.runtime.vulkan.device import Device, DeviceLimits
from texelflow.runtime.vulkan.memory import MemoryBlock


def test_limits_are_sane(device):
    lim = device.limits
    assert isinstance(lim, DeviceLimits) and lim.name
    assert lim.device_type in {"discrete", "integrated", "virtual", "cpu", "other"}
    assert all(e >= 256 for e in lim.max_image_extent_3d)  # Vulkan minimum for 3-D images
    assert lim.max_storage_buffer_range >= 1 << 27
    assert all(c >= 65535 for c in lim.max_workgroup_count)
    assert lim.max_workgroup_size[0] >= 128 and lim.max_workgroup_invocations >= 128
    assert lim.max_shared_memory >= 16384 and lim.max_push_constants_size >= 128
    assert lim.timestamp_period_ns > 0
    assert lim.subgroup_size is None or lim.subgroup_size >= 1
    with pytest.raises(Exception):
        lim.name = "changed"  # frozen: a plain value the planner can keep


def test_memory_type_selection(device):
    staging = device.memory_type(0xFFFFFFFF, host_visible=True)
    assert staging.host_visible and staging.host_coherent
    local = device.memory_type(0xFFFFFFFF)
    assert local.device_local or not any(t.device_local for t in device.memory_types)


def test_one_shot_submit_is_counted(device):
    before = device.submit_count
    device.run_once(lambda cmd: None)
    assert device.submit_count == before + 1


def test_env_var_selects_by_index_and_name(device, monkeypatch):
    monkeypatch.setenv("TEXELFLOW_DEVICE", "0")
    with Device() as d:
        assert d.limits.name
    monkeypatch.setenv("TEXELFLOW_DEVICE", device.limits.name[:4].upper())
    with Device() as d:
        assert d.limits.name == device.limits.name
    monkeypatch.setenv("TEXELFLOW_DEVICE", "no-such-gpu")
    with pytest.raises(errors.NoDeviceError, match="no-such-gpu.*devices: \\[0\\]"):
        Device()


def _device_error_in_subprocess(env_extra: dict, prelude: str = "") -> str:
    code = (prelude + "\nfrom texelflow.runtime.vulkan.device import Device\n"
            "from texelflow.runtime.vulkan.errors import NoDeviceError\n"
            "try:\n    Device()\nexcept NoDeviceError as e:\n    print('NoDeviceError:', e)\n")
    env = dict(os.environ, **env_extra)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=60).stdout


def test_no_driver_raises_no_device_error_naming_the_fix():
    out = _device_error_in_subprocess({"VK_ICD_FILENAMES": "/nonexistent/icd.json",
                                       "VK_DRIVER_FILES": "/nonexistent/icd.json"})
    assert out.startswith("NoDeviceError:") and "apt-get install libvulkan1 mesa-vulkan-drivers" in out


def test_no_loader_raises_no_device_error_naming_the_fix():
    out = _device_error_in_subprocess({}, "import sys; sys.modules['vulkan'] = None")
    assert out.startswith("NoDeviceError:") and "apt-get install libvulkan1 mesa-vulkan-drivers" in out


def test_vk_results_map_to_our_errors(device):
    vk = device.vk
    assert isinstance(errors.from_vk(vk.VkErrorDeviceLost(), "x"), errors.DeviceLostError)
    assert isinstance(errors.from_vk(vk.VkErrorOutOfDeviceMemory(), "x"), errors.OutOfMemoryError)
    with pytest.raises(errors.OutOfMemoryError, match="allocating a thing: the device ran out of memory"):
        with errors.translate("allocating a thing"):
            raise vk.VkErrorOutOfDeviceMemory()
    for cls in (errors.NoDeviceError, errors.DeviceLostError, errors.OutOfMemoryError,
                errors.MissingVariantError, errors.BufferTooLargeError):
        assert issubclass(cls, errors.VulkanError)


def test_oversized_allocation_is_refused_and_device_stays_usable(device):
    with pytest.raises(errors.OutOfMemoryError, match="over this device's limit"):
        MemoryBlock(device, 1 << 50, 0xFFFFFFFF)
    block = MemoryBlock(device, 4096, 0xFFFFFFFF)
    block.close()
    device.run_once(lambda cmd: None)


def test_vulkan_layer_never_imports_torch():
    code = ("import sys\nimport texelflow.runtime.vulkan.program, texelflow.runtime.vulkan.packing\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
