"""Recorded programs: correctness, one submit per call, barriers, memory reuse, profiling."""
from __future__ import annotations

import numpy as np
import pytest

from texelflow.generated.layouts import STORAGE_AXIS, Layout, Storage
from texelflow.runtime.vulkan.pipeline import find_variant
from texelflow.runtime.vulkan.program import Dispatch, Program
from texelflow.runtime.vulkan.tensor import VkTensor

from .helpers import random_array
from .kernels import add_scalar


def chain(device, n, shape, storage, layout=Layout.WIDTH_PACKED, *, staging=None, alpha=0.5):
    """x -> add(., ones, alpha) -> ... (n dispatches of the generated `add`) -> y.

    Intermediates are left unbound so the program places them by lifetime.
    """
    variant = find_variant("add", dtype="float32", storage=STORAGE_AXIS[storage])
    ones = VkTensor(device, shape, "float32", storage, layout, label="ones")
    ones.upload(np.ones(shape, np.float32))
    ts = [VkTensor(device, shape, "float32", storage, layout, allocate=(i in (0, n)), label=f"t{i}")
          for i in range(n + 1)]
    ds = [Dispatch(variant, {"out": ts[i + 1], "self": ts[i], "other": ones}, {"alpha": alpha}) for i in range(n)]
    return Program(device, ds, [ts[0]], [ts[n]], staging=staging), ts + [ones]


def close_all(prog, ts):
    prog.close()
    for t in ts:
        t.close()


def test_100_chained_dispatches_cost_one_submit_per_call(device):
    prog, ts = chain(device, 100, (3, 5, 7), Storage.BUFFER)
    try:
        x = random_array((3, 5, 7), "float32", 0)
        for k in range(3):
            before = device.submit_count
            (y,) = prog(x + k)
            assert device.submit_count - before == 1
            np.testing.assert_allclose(y, x + k + 50.0, rtol=1e-5)
        assert prog.num_barriers == 99  # every dispatch reads its predecessor's output
    finally:
        close_all(prog, ts)


@pytest.mark.parametrize("staging", [None, True])
@pytest.mark.parametrize("storage,layout", [(Storage.BUFFER, Layout.HEIGHT_PACKED),
                                            (Storage.TEXTURE_3D, Layout.CHANNELS_PACKED),
                                            (Storage.TEXTURE_3D, Layout.WIDTH_PACKED)])
def test_chain_is_correct_on_buffers_and_textures(device, storage, layout, staging):
    shape = (2, 5, 3, 7)
    prog, ts = chain(device, 6, shape, storage, layout, staging=staging, alpha=1.0)
    try:
        x = random_array(shape, "float32", 1)
        before = device.submit_count
        (y,) = prog(x)
        assert device.submit_count - before == 1
        np.testing.assert_allclose(y, x + 6.0, rtol=1e-6)
    finally:
        close_all(prog, ts)


def test_intermediates_share_memory_by_lifetime(device):
    prog, ts = chain(device, 10, (64, 64), Storage.BUFFER)
    try:
        size = ts[1].requirements.size
        assert prog.naive_intermediate_bytes >= 9 * size
        assert prog.intermediate_bytes <= 2 * size + 2 * device.limits.buffer_image_granularity
        assert len({t.offset for t in ts[1:10]}) == 2  # ping-pong between two slots
        x = random_array((64, 64), "float32", 2)
        np.testing.assert_allclose(prog(x)[0], x + 5.0, rtol=1e-6)
    finally:
        close_all(prog, ts)


def test_shared_images_are_correct(device):
    prog, ts = chain(device, 8, (1, 5, 9, 6), Storage.TEXTURE_3D, Layout.CHANNELS_PACKED)
    try:
        assert prog.intermediate_bytes < prog.naive_intermediate_bytes
        x = random_array((1, 5, 9, 6), "float32", 3)
        np.testing.assert_allclose(prog(x)[0], x + 4.0, rtol=1e-6)
    finally:
        close_all(prog, ts)


def test_independent_dispatches_need_no_barrier(device):
    variant, spirv = add_scalar("buffer")  # throwaway shader: also exercises the SPIR-V override
    x, a, b = (VkTensor(device, (16,), label=n) for n in "xab")
    ds = [Dispatch(variant, [a, x], {"alpha": 1.0}, spirv=spirv, label="a"),
          Dispatch(variant, [b, x], {"alpha": 2.0}, spirv=spirv, label="b")]
    prog = Program(device, ds, [x], [a, b])
    try:
        assert prog.num_barriers == 0
        v = np.arange(16, dtype=np.float32)
        ya, yb = prog(v)
        np.testing.assert_array_equal(ya, v + 1)
        np.testing.assert_array_equal(yb, v + 2)
    finally:
        close_all(prog, [x, a, b])


def test_calls_without_profiling_give_the_same_results_and_no_timestamps(device):
    """Profiling off runs the recording without timestamps: the same outputs, and profile()
    then says how to switch it on instead of returning stale timings."""
    from texelflow.runtime.vulkan.errors import UnsupportedError

    prog, ts = chain(device, 5, (3, 5), Storage.BUFFER)
    try:
        x = np.array([[np.nan, np.inf, -np.inf, 0.0, -0.0]] * 3, np.float32)
        prog.profiling = False
        plain = prog(x)[0]
        with pytest.raises(UnsupportedError, match="profiling = True"):
            prog.profile()
        prog.profiling = True
        timed = prog(x)[0]
        assert plain.tobytes() == timed.tobytes()
        assert len(prog.profile()) == 5
        prog.profiling = False
        prog(x)
        with pytest.raises(UnsupportedError, match="without timestamps"):
            prog.profile()
    finally:
        close_all(prog, ts)


def test_compiled_program_profiles_only_when_asked(device):
    import torch

    import texelflow
    from texelflow.runtime.errors import TexelflowError

    model, x = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Tanh()), torch.randn(1, 3, 5, 7)
    with texelflow.compile(model, (x,), device=device) as prog:
        assert not prog.profiling
        want = prog(x)
        with pytest.raises(TexelflowError, match="profile=True"):
            prog.profile()
        prog.profiling = True
        assert torch.equal(prog(x), want)
        assert [r.label for r in prog.profile()] == [label for label, _ in prog.dispatch_variants]
    with texelflow.compile(model, (x,), device=device, profile=True) as prog:
        prog(x)
        assert prog.profiling and all(r.measured_us >= 0 for r in prog.profile())


def test_profile_has_one_entry_per_dispatch(device):
    prog, ts = chain(device, 5, (8, 8), Storage.BUFFER)
    try:
        prog(np.zeros((8, 8), np.float32))
        prof = prog.profile()
        assert [label for label, _ in prof] == prog.labels and len(prof) == 5
        assert all(us >= 0 for _, us in prof)
        assert sum(us for _, us in prof) > 0
    finally:
        close_all(prog, ts)


def test_failed_call_leaves_program_usable(device):
    prog, ts = chain(device, 3, (4, 4), Storage.BUFFER, alpha=1.0)
    try:
        with pytest.raises(ValueError):
            prog(np.zeros((5, 4), np.float32))
        with pytest.raises(ValueError):
            prog()
        x = np.ones((4, 4), np.float32)
        np.testing.assert_array_equal(prog(x)[0], x + 3)
    finally:
        close_all(prog, ts)


def test_calls_from_threads_do_not_interleave(device):
    """Each call owns the program's staging memory and fence until its outputs are read."""
    import threading

    prog, ts = chain(device, 4, (16, 16), Storage.TEXTURE_3D, Layout.CHANNELS_PACKED, alpha=1.0)
    wrong, errors = [], []

    def work(k):
        try:
            for i in range(20):
                x = np.full((16, 16), 10.0 * k + i, np.float32)
                if not np.array_equal(prog(x)[0], x + 4):
                    wrong.append((k, i))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    try:
        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors and not wrong, (errors, wrong)
    finally:
        close_all(prog, ts)


def test_closed_program_raises_and_closes_once(device):
    from texelflow.runtime.errors import ProgramClosedError

    prog, ts = chain(device, 2, (4, 4), Storage.BUFFER)
    close_all(prog, ts)
    with pytest.raises(ProgramClosedError, match="^the program was closed$"):
        prog(np.zeros((4, 4), np.float32))
    close_all(prog, ts)  # closing twice is a no-op
