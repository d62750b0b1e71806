"""Planned host transfers (runtime/vulkan/transfer.py) write exactly the bytes `packing.pack` writes
and read back exactly what `packing.unpack` reads, for every representation; a Program's results
are new arrays that a later call never changes."""
from __future__ import annotations

import numpy as np
import pytest

from texelflow.generated.layouts import LAYOUT_INFO, Layout, Storage
from texelflow.runtime.errors import ProgramClosedError
from texelflow.runtime.vulkan import packing
from texelflow.runtime.vulkan.transfer import Transfer
from texelflow.runtime.vulkan.tensor import VkTensor

from .helpers import random_array
from .test_program import chain, close_all

SHAPES = [(), (1,), (3,), (5, 7), (2, 3, 5), (1, 3, 5, 7), (2, 5, 3, 7), (3, 1, 1, 6), (2, 1, 3, 5, 7)]


def float_family():
    out = []
    for layout, info in sorted(LAYOUT_INFO.items()):
        if info.family == "float":
            out += [(storage, layout, dt) for storage in sorted(info.storages) for dt in ("float32", "int32", "bool")]
    return out


def sample(shape, dtype, seed):
    if dtype == "bool":
        return np.random.default_rng(seed).random(shape) < 0.5
    return random_array(shape, dtype, seed)


@pytest.mark.parametrize("storage,layout,dtype", float_family(), ids=lambda x: getattr(x, "name", x))
def test_planned_transfer_matches_packing(device, storage, layout, dtype):
    for i, shape in enumerate(SHAPES):
        if storage != Storage.BUFFER and len(shape) > 4:
            continue
        t = VkTensor(device, shape, dtype, storage, layout, allocate=False)
        try:
            raw = np.full(t.nbytes, 0xAB, np.uint8)  # garbage where padding lies
            transfer = Transfer(t, raw)
            assert transfer.planned
            a = sample(shape, dtype, i)
            transfer.write(a)
            np.testing.assert_array_equal(raw, t.pack(a), err_msg=f"{shape}")
            got = transfer.read()
            assert got.dtype == np.dtype(np.bool_ if dtype == "bool" else dtype) and got.shape == shape
            np.testing.assert_array_equal(got, a)
            np.testing.assert_array_equal(got, packing.unpack(packing.pack(a, storage, layout), shape, dtype,
                                                              storage, layout))
            raw[:] = 0  # the result is the caller's: later writes to the bytes do not change it
            np.testing.assert_array_equal(got, a)
        finally:
            t.close()


def test_host_only_bytes_get_their_padding_zeroed_once(device):
    shape = (1, 3, 5, 7)  # channels-packed texture: one padding lane per texel
    t = VkTensor(device, shape, "float32", Storage.TEXTURE_3D, Layout.CHANNELS_PACKED, allocate=False)
    try:
        raw = np.full(t.nbytes, 0xFF, np.uint8)
        transfer = Transfer(t, raw, host_only=True)
        a = random_array(shape, "float32", 3)
        transfer.write(a)
        np.testing.assert_array_equal(raw, t.pack(a))
    finally:
        t.close()


def test_int8_words_go_through_pack(device):
    shape = (1, 6, 3, 5)
    t = VkTensor(device, shape, "int8", Storage.BUFFER, Layout.PACKED_INT8_4W4C, allocate=False)
    try:
        raw = np.zeros(t.nbytes, np.uint8)
        transfer = Transfer(t, raw)
        assert not transfer.planned
        a = random_array(shape, "int8", 4)
        transfer.write(a)
        np.testing.assert_array_equal(raw, t.pack(a))
        np.testing.assert_array_equal(transfer.read(), a)
    finally:
        t.close()


def test_wrong_shape_is_refused_before_anything_is_written(device):
    t = VkTensor(device, (2, 3), "float32", allocate=False)
    try:
        raw = np.zeros(t.nbytes, np.uint8)
        with pytest.raises(ValueError, match=r"array of shape \(3, 2\) does not match tensor shape \(2, 3\)"):
            Transfer(t, raw).write(np.zeros((3, 2), np.float32))
        assert not raw.any()
    finally:
        t.close()


@pytest.mark.parametrize("storage,layout", [(Storage.BUFFER, Layout.WIDTH_PACKED),
                                            (Storage.TEXTURE_3D, Layout.CHANNELS_PACKED)])
def test_results_are_not_overwritten_by_the_next_call(device, storage, layout):
    shape = (1, 3, 5, 7)
    prog, ts = chain(device, 3, shape, storage, layout, alpha=1.0)
    try:
        x = random_array(shape, "float32", 5)
        (first,) = prog(x)
        (second,) = prog(x + 10)
        np.testing.assert_allclose(first, x + 3, rtol=1e-6)
        np.testing.assert_allclose(second, x + 13, rtol=1e-6)
        import torch

        (third,) = prog(torch.from_numpy(x))  # a CPU torch tensor is an array too
        np.testing.assert_allclose(third, x + 3, rtol=1e-6)
    finally:
        close_all(prog, ts)


def test_a_call_with_a_closed_input_tensor_is_refused(device):
    prog, ts = chain(device, 2, (4,), Storage.BUFFER)
    try:
        ts[0].close()
        with pytest.raises(ProgramClosedError, match="tensor of the program was closed"):
            prog(np.zeros(4, np.float32))
    finally:
        close_all(prog, ts)


def test_large_reordered_tensors_go_through_pack(device, monkeypatch):
    from texelflow.runtime.vulkan import transfer as transfer_module

    monkeypatch.setattr(transfer_module, "MAX_INDEXED", 8)  # as if (1, 3, 5, 7) were huge
    shape = (1, 3, 5, 7)
    t = VkTensor(device, shape, "float32", Storage.TEXTURE_3D, Layout.CHANNELS_PACKED, allocate=False)
    try:
        raw = np.zeros(t.nbytes, np.uint8)
        transfer = Transfer(t, raw)
        assert not transfer.planned
        a = random_array(shape, "float32", 6)
        transfer.write(a)
        np.testing.assert_array_equal(raw, t.pack(a))
        np.testing.assert_array_equal(transfer.read(), a)
    finally:
        t.close()


@pytest.mark.parametrize("storage,layout,dtype", float_family(), ids=lambda x: getattr(x, "name", x))
def test_put_and_direct_write_the_bytes_write_does(device, storage, layout, dtype):
    """`put` (no checks: a compiled program's fast call) and a copy into `direct` write exactly
    what `write` writes, for strided arrays with NaN and Inf too."""
    for i, shape in enumerate([(1,), (3,), (5, 7), (1, 3, 5, 7), (3, 1, 1, 6)]):
        t = VkTensor(device, shape, dtype, storage, layout, allocate=False)
        try:
            base = np.ascontiguousarray(sample(shape[::-1], dtype, i))
            if dtype == "float32":
                base.reshape(-1)[:3] = [np.nan, np.inf, -np.inf][:base.size]
            a = base.T  # a transposed (non-contiguous) view of the shape
            want = np.full(t.nbytes, 0xAB, np.uint8)
            Transfer(t, want).write(a)
            got = np.full(t.nbytes, 0xAB, np.uint8)
            transfer = Transfer(t, got)
            transfer.put(a)
            np.testing.assert_array_equal(got, want, err_msg=f"{shape}")
            direct = transfer.direct(writing=True)
            if direct is not None:
                assert direct.shape == shape and np.shares_memory(direct, got)
                got[:] = 0xAB
                np.copyto(direct, a, casting="unsafe")
                np.testing.assert_array_equal(got, want, err_msg=f"{shape}")
            else:  # the packed order differs from NCHW order (or padding lies between)
                assert transfer.index is not None or transfer.padding is not None
            readable = transfer.direct(writing=False)  # reads ignore padding
            if readable is not None:
                assert transfer.index is None
                np.testing.assert_array_equal(readable != 0 if dtype == "bool" else readable, transfer.read())
            else:
                assert transfer.index is not None
        finally:
            t.close()


def test_call_with_runs_the_callers_host_side_once_per_submit(device):
    prog, ts = chain(device, 3, (5,), Storage.BUFFER, alpha=1.0)
    try:
        (w,), (r,) = prog.host_writes, prog.host_reads
        x = np.array([1.0, np.nan, np.inf, -np.inf, 7.0], np.float32)
        got = prog.call_with(lambda a: w.put(a[0]), (x,), r.read)
        np.testing.assert_array_equal(got, x + 3)
        assert not np.shares_memory(got, r.raw)
        prog.close()
        with pytest.raises(ProgramClosedError, match="the program or one of its tensors was closed"):
            prog.call_with(lambda a: w.put(a[0]), (x,), r.read)
    finally:
        close_all(prog, ts)
