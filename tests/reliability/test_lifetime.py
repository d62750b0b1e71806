"""Issue 9, items 8 and 9: ownership and lifetime of devices and programs.

Item 8: closing a Device and then calling or closing a program aborted the process (SIGABRT in
vkResetFences). Closing the device now closes what was made from it; a later call raises
ProgramClosedError and close() is a no-op. Those tests run in a subprocess, so an abort fails the
test instead of killing pytest.

Item 9: every compile opened its own Device and a program dropped without close() leaked it
(200 compile/run/del cycles grew RSS 455 -> 2,085 MB and OS threads 17 -> 1,217). Programs
compiled without `device=` now share one default device, and a finalizer frees a dropped program.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import warnings

import pytest
import torch

import texelflow
from texelflow.runtime.errors import ProgramClosedError


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=300)


class _ConvLinear(torch.nn.Module):
    def __init__(self, channels=3, width=8):
        super().__init__()
        self.conv = torch.nn.Conv2d(channels, 4, 3, padding=1)
        self.lin = torch.nn.Linear(width, 5)

    def forward(self, x):
        return self.lin(torch.relu(self.conv(x)))


def test_closing_the_device_first_makes_programs_raise_not_abort():
    out = _run("""
        import warnings; warnings.simplefilter("ignore")
        import numpy as np, torch, texelflow
        from texelflow.runtime.vulkan.device import Device
        from texelflow.runtime.vulkan.tensor import VkTensor
        from texelflow.runtime.vulkan.program import Program

        dev = Device()
        lin, conv = torch.nn.Linear(4, 3), torch.nn.Conv2d(3, 2, 3)
        x, y = torch.randn(2, 4), torch.randn(1, 3, 5, 5)
        p1 = texelflow.compile(lin, (x,), device=dev)
        p2 = texelflow.compile(conv, (y,), device=dev)
        p1(x), p2(y)
        t = VkTensor(dev, (4,), label="raw")
        dev.close()
        for prog, arg in ((p1, x), (p2, y)):
            try:
                prog(arg)
            except texelflow.ProgramClosedError as exc:
                print("call:", exc)
            prog.close()
            prog.close()
        t.close()
        try:
            t.upload(np.zeros(4, np.float32))
        except texelflow.ProgramClosedError as exc:
            print("tensor:", exc)
        try:
            texelflow.compile(lin, (x,), device=dev)
        except texelflow.ProgramClosedError as exc:
            print("compile:", exc)
        dev.close()
        print("done")
    """)
    assert out.returncode == 0, (out.returncode, out.stderr[-3000:])
    lines = out.stdout.splitlines()
    assert lines[0] == lines[1] == \
        "call: this compiled program was closed (its device was closed); compile it again to run it"
    assert lines[2] == "tensor: tensor raw was closed"
    assert lines[3].startswith("compile: compiling a program: device ") and lines[3].endswith(" was closed")
    assert lines[4] == "done"


def test_closing_a_program_in_use_by_a_thread_then_its_device():
    """A program closed (with its device) while another thread calls it: the call either finishes
    or raises ProgramClosedError; nothing aborts."""
    out = _run("""
        import threading, warnings; warnings.simplefilter("ignore")
        import torch, texelflow
        from texelflow.runtime.vulkan.device import Device

        dev = Device()
        lin = torch.nn.Linear(64, 64)
        x = torch.randn(8, 64)
        prog = texelflow.compile(lin, (x,), device=dev)
        outcomes = set()

        def work():
            for _ in range(200):
                try:
                    prog(x)
                    outcomes.add("ok")
                except texelflow.ProgramClosedError:
                    outcomes.add("closed")
                    return

        t = threading.Thread(target=work)
        t.start()
        dev.close()
        t.join()
        prog.close()
        print(sorted(outcomes))
    """)
    assert out.returncode == 0, (out.returncode, out.stderr[-3000:])
    assert out.stdout.strip() in ("['closed']", "['closed', 'ok']", "['ok']")


def test_exit_with_programs_alive_is_clean():
    """Programs never closed, on the default device and on a device of the user's: the finalizers
    and the default device's atexit close run in some order at exit, and nothing crashes."""
    out = _run("""
        import warnings; warnings.simplefilter("ignore")
        import torch, texelflow
        from texelflow.runtime.vulkan.device import Device

        lin = torch.nn.Linear(4, 3)
        x = torch.randn(2, 4)
        keep = [texelflow.compile(lin, (x,)), texelflow.compile(lin, (x,)),
                texelflow.compile(lin, (x,), device=Device())]
        print([tuple(p(x).shape) for p in keep])
    """)
    assert out.returncode == 0, (out.returncode, out.stderr[-3000:])
    assert out.stdout.strip() == "[(2, 3), (2, 3), (2, 3)]"
    assert "Traceback" not in out.stderr and "Exception ignored" not in out.stderr, out.stderr[-3000:]


def test_closed_program_raises_and_closes_once(device):
    lin = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4)
    with texelflow.compile(lin, (x,), device=device) as prog:
        torch.testing.assert_close(prog(x), lin(x).detach(), rtol=1e-5, atol=1e-5)
    assert prog.closed
    with pytest.raises(ProgramClosedError) as info:
        prog(x)
    assert str(info.value) == "this compiled program was closed; compile it again to run it"
    prog.close()  # a no-op
    assert not device.closed


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _threads() -> tuple[int, int]:
    return threading.active_count(), len(os.listdir("/proc/self/task"))


def test_default_device_is_shared_and_dropped_programs_are_freed():
    lin = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4)
    p1 = texelflow.compile(lin, (x,))
    p2 = texelflow.compile(lin, (x,))
    dev = p1.device
    assert p2.device is dev
    res = p1._res
    del p1  # no close(): the finalizer frees it at once (the program is in no reference cycle)
    assert res.closed
    torch.testing.assert_close(p2(x), lin(x).detach(), rtol=1e-5, atol=1e-5)
    p2.close()
    assert not dev.closed  # programs never close the shared device


def test_200_program_cycles_keep_memory_and_threads_flat(device):
    """200 build/run/del cycles of a program with ~2 MB of weights, never closed explicitly.

    Planning (torch.export's decompositions, ~0.2 s a compile on this 2-core machine) is done once:
    the cycles build the CompiledProgram from that plan (what holds device memory, command buffers
    and descriptor sets), on the session's device. test_compile_cycles_share_one_device runs
    the whole public `texelflow.compile` in a shorter loop."""
    from texelflow.runtime.program import CompiledProgram

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256)).eval()
    x = torch.randn(4, 512)
    with torch.no_grad():
        want = model(x)
    plan = texelflow.plan(model, (x,), planner="greedy")
    children = None
    for i in range(200):
        prog = CompiledProgram(plan, plan.exported, device)
        torch.testing.assert_close(prog(x), want, rtol=1e-4, atol=1e-4)
        del prog
        if i == 9:  # after a warm-up: pipelines built, allocator settled
            rss, threads, children = _rss_mb(), _threads(), len(getattr(device, "_children", ()))
    grown = _rss_mb() - rss
    assert grown < 150, f"RSS grew by {grown:.0f} MB over 190 cycles"
    now = _threads()
    assert now[0] - threads[0] < 10 and now[1] - threads[1] < 10, (threads, now)
    assert len(getattr(device, "_children", ())) <= children  # nothing left registered on the device


def test_compile_cycles_share_one_device():
    """The public API end to end: 25 compile/run/del cycles of one ExportedProgram (built once, to
    keep the wall time reasonable) with device=None; each used to open a Device (about six OS
    threads and 8 MB each on lavapipe)."""
    model = _ConvLinear().eval()
    x = torch.randn(1, 3, 6, 8)
    with torch.no_grad():
        want = model(x)
    ep = torch.export.export(model, (x,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        devices = set()
        for i in range(25):
            prog = texelflow.compile(ep, (x,), planner="greedy")
            torch.testing.assert_close(prog(x), want, rtol=1e-4, atol=1e-4)
            devices.add(id(prog.device))
            del prog
            if i == 4:
                rss, threads = _rss_mb(), _threads()
    assert len(devices) == 1
    now = _threads()
    assert now[0] - threads[0] < 10 and now[1] - threads[1] < 10, (threads, now)
    assert _rss_mb() - rss < 100
