"""Issue 9, item 1: calls of compiled programs from several threads give torch's answer.

The report: 4 threads x 50 calls of one compiled nn.Linear gave 111-168 wrong results of 200, and
with a conv model the corruption lingered into later single-threaded calls. Each test runs threads
x calls with distinct inputs and compares every result with eager torch; then it calls once more
from the main thread. Also: two programs on one device called at once (the queue is shared), and
uploads/downloads through the device's shared staging buffer from several threads.
"""
from __future__ import annotations

import threading

import numpy as np
import torch

import texelflow

THREADS, CALLS = 4, 25


def _hammer(prog, model, make_input, threads=THREADS, calls=CALLS):
    """Run `calls` calls in each of `threads` threads; return the number of wrong results."""
    wrong, errors = [], []
    start = threading.Barrier(threads)

    def work(k):
        try:
            gen = torch.Generator().manual_seed(k)
            start.wait()
            for _ in range(calls):
                x = make_input(gen)
                with torch.no_grad():
                    want = model(x)
                got = prog(x)
                if not torch.allclose(got, want, rtol=1e-4, atol=1e-4):
                    wrong.append(k)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
    return len(wrong)


def _check_after(prog, model, make_input):
    x = make_input(torch.Generator().manual_seed(99))
    with torch.no_grad():
        torch.testing.assert_close(prog(x), model(x), rtol=1e-4, atol=1e-4)


def test_one_linear_program_from_four_threads(device):
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 8).eval()

    def make(gen):
        return torch.randn(4, 16, generator=gen)

    prog = texelflow.compile(model, (make(torch.Generator()),), device=device)
    try:
        assert _hammer(prog, model, make) == 0
        _check_after(prog, model, make)
    finally:
        prog.close()


class _SmallConv(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(8, 4, 3, padding=1)

    def forward(self, x):
        return self.conv2(torch.relu(self.conv1(x))) + 1.0


def test_one_conv_program_from_four_threads(device):
    torch.manual_seed(1)
    model = _SmallConv().eval()

    def make(gen):
        return torch.randn(1, 3, 9, 7, generator=gen)

    prog = texelflow.compile(model, (make(torch.Generator()),), device=device)
    try:
        assert _hammer(prog, model, make) == 0
        _check_after(prog, model, make)  # nothing lingers into a later single-threaded call
    finally:
        prog.close()


def test_two_programs_on_one_device_at_once(device):
    torch.manual_seed(2)
    lin = torch.nn.Linear(16, 8).eval()
    conv = _SmallConv().eval()

    def make_lin(gen):
        return torch.randn(4, 16, generator=gen)

    def make_conv(gen):
        return torch.randn(1, 3, 9, 7, generator=gen)

    p1 = texelflow.compile(lin, (make_lin(torch.Generator()),), device=device)
    p2 = texelflow.compile(conv, (make_conv(torch.Generator()),), device=device)
    try:
        counts = []
        ts = [threading.Thread(target=lambda: counts.append(_hammer(p1, lin, make_lin, threads=2))),
              threading.Thread(target=lambda: counts.append(_hammer(p2, conv, make_conv, threads=2)))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert counts == [0, 0]
    finally:
        p1.close()
        p2.close()


def test_staged_uploads_and_downloads_from_threads(device):
    """VkTensor upload/download of textures share the device's one staging buffer and one-shot
    command buffer: they must not interleave."""
    from texelflow.generated.layouts import Layout, Storage
    from texelflow.runtime.vulkan.tensor import VkTensor

    shape = (1, 4, 5, 6)
    tensors = [VkTensor(device, shape, "float32", Storage.TEXTURE_3D, Layout.CHANNELS_PACKED, label=f"t{k}")
               for k in range(4)]
    wrong, errors = [], []

    def work(k):
        try:
            for i in range(20):
                x = np.full(shape, 100 * k + i, np.float32)
                tensors[k].upload(x)
                if not np.array_equal(tensors[k].download(), x):
                    wrong.append((k, i))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    try:
        ts = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert not errors, errors
        assert wrong == []
    finally:
        for t in tensors:
            t.close()


def test_building_programs_while_others_run(device):
    """Building programs (command pool, pipeline cache, constant uploads through the shared staging
    buffer) in threads while another thread calls a program on the same device."""
    from texelflow.runtime.program import CompiledProgram

    torch.manual_seed(3)
    model = _SmallConv().eval()
    x = torch.randn(1, 3, 9, 7)
    with torch.no_grad():
        want = model(x)
    plan = texelflow.plan(model, (x,), planner="greedy")
    running = CompiledProgram(plan, plan.exported, device)
    stop, results, errors = threading.Event(), [], []

    def call():
        try:
            while not stop.is_set():
                results.append(torch.allclose(running(x), want, rtol=1e-4, atol=1e-4))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    def build():
        try:
            for _ in range(3):
                prog = CompiledProgram(plan, plan.exported, device)
                results.append(torch.allclose(prog(x), want, rtol=1e-4, atol=1e-4))
                prog.close()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    caller = threading.Thread(target=call)
    builders = [threading.Thread(target=build) for _ in range(3)]
    caller.start()
    for t in builders:
        t.start()
    for t in builders:
        t.join()
    stop.set()
    caller.join()
    running.close()
    assert not errors, errors
    assert results and all(results)
