"""Host -> device -> host round trips are exact for every representation and dtype."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from texelflow.generated.layouts import Layout, Storage
from texelflow.runtime.vulkan.errors import BufferTooLargeError, TextureTooLargeError
from texelflow.runtime.vulkan.tensor import VkTensor

from .helpers import random_array, representations

DIMS = st.sampled_from([1, 3, 5, 7])
CHANNELS = st.sampled_from([1, 3, 5, 6, 7])  # never a multiple of 4


@st.composite
def shapes(draw):
    rank = draw(st.integers(1, 4))
    dims = [draw(DIMS) for _ in range(rank)]
    if rank >= 3:
        dims[-3] = draw(CHANNELS)
    return tuple(dims)


@pytest.mark.parametrize("storage,layout,dtype", representations(), ids=lambda x: getattr(x, "name", x))
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=shapes(), seed=st.integers(0, 2**16), staging=st.booleans())
def test_roundtrip_is_exact(device, storage, layout, dtype, shape, seed, staging):
    a = random_array(shape, dtype, seed)
    t = VkTensor(device, shape, dtype, storage, layout)
    try:
        t.upload(a, staging=staging or None)
        back = t.download(staging=staging or None)
    finally:
        t.close()
    assert back.dtype == a.dtype and back.shape == a.shape
    np.testing.assert_array_equal(back, a)


def test_staging_and_direct_paths_agree(device):
    """Where the buffer's memory is host-visible (lavapipe), each direct path agrees with the
    staging one; where it is not (a discrete GPU's device-local memory), the staging path round
    trips and asking for the direct one is a clear error, not a wrong copy."""
    a = random_array((2, 5, 3, 7), "float32", 3)
    t = VkTensor(device, a.shape, "float32", Storage.BUFFER, Layout.CHANNELS_PACKED)
    try:
        t.upload(a, staging=True)
        if t.host_mappable:
            np.testing.assert_array_equal(t.download(staging=False), a)
            t.upload(a * 2, staging=False)
        else:
            with pytest.raises(ValueError, match="not host-mappable"):
                t.download(staging=False)
            with pytest.raises(ValueError, match="not host-mappable"):
                t.upload(a * 2, staging=False)
            np.testing.assert_array_equal(t.download(), a)  # the refused upload changed nothing
            t.upload(a * 2, staging=True)
        np.testing.assert_array_equal(t.download(staging=True), a * 2)
    finally:
        t.close()


def test_rank5_buffer_roundtrip(device):
    a = random_array((2, 3, 5, 3, 7), "int8", 4)
    t = VkTensor(device, a.shape, "int8", Storage.BUFFER, Layout.PACKED_INT8_4W4C)
    try:
        t.upload(a)
        np.testing.assert_array_equal(t.download(), a)
    finally:
        t.close()


def test_too_large_buffer_is_refused_and_device_stays_usable(device):
    words = device.limits.max_storage_buffer_range // 4 + 1
    with pytest.raises(BufferTooLargeError, match="maxStorageBufferRange"):
        VkTensor(device, (words,), "float32", Storage.BUFFER, Layout.WIDTH_PACKED)
    a = random_array((3, 5), "float32", 5)
    t = VkTensor(device, a.shape)
    t.upload(a)
    np.testing.assert_array_equal(t.download(), a)
    t.close()


def test_too_large_texture_is_refused(device):
    x = device.limits.max_image_extent_3d[0] + 1
    with pytest.raises(TextureTooLargeError, match="texture extents"):
        VkTensor(device, (1, x), "float32", Storage.TEXTURE_3D, Layout.HEIGHT_PACKED)
    assert issubclass(TextureTooLargeError, BufferTooLargeError)


def test_shape_mismatch_is_refused(device):
    t = VkTensor(device, (3, 5))
    with pytest.raises(ValueError, match="does not match"):
        t.upload(np.zeros((5, 3), np.float32))
    t.close()
