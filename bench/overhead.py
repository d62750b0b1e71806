"""Host overhead per call: what texelflow itself costs around the driver's submit and wait.

Two layers, each on a chain of 100 tiny dispatches (so the device work is negligible):
- `runtime.vulkan.program.Program.__call__`: a recorded program of 100 buffer `add` dispatches,
  called with a numpy array and with a torch tensor;
- `CompiledProgram.__call__` (`texelflow.compile`) of a 100-op torch chain of unary ops, called
  with a torch tensor (the user-facing path: argument checks, upload, submit, download, results),
  once on its fast call (runtime/call_fast.py) and once forced onto the general path.
Host time = wall time of a call minus the time spent inside the device's submit and fence wait
(`Device.submit_seconds`); the driver part (submit + wait) and the GPU time (timestamps) are
reported beside it. Medians over many calls, calls of the layers alternated in rounds.
`--waits` instead compares ways to wait for the fence (Device.submit blocks in vkWaitForFences;
polling vkGetFenceStatus with a yield, bounded or not, then blocking) on the raw add chains.
`--wait poll` runs the layers with that polling wait in place of Device.submit's blocking one
(`--wait both`: each layer both ways, alternated).
Usage: python bench/overhead.py [--calls N] [--rounds R] [--wait block|poll|both] [--profile | --waits]
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import numpy as np
from machine import cpu_model

from texelflow.runtime.vulkan.device import Device
from texelflow.runtime.vulkan.pipeline import find_variant
from texelflow.runtime.vulkan.program import Dispatch, Program
from texelflow.runtime.vulkan.tensor import VkTensor

CHAIN = 100
TARGET_US = 200.0


def add_chain_program(device, shape=(4,), n=CHAIN, timestamps=True):
    """(program, tensors to close): n buffer adds t[i+1] = t[i] + 1 (100 over tiny tensors)."""
    variant = find_variant("add", dtype="float32", storage="buffer")
    const = VkTensor(device, shape, label="c")
    const.upload(np.ones(shape, np.float32))
    chain = [VkTensor(device, shape, allocate=i in (0, n), label=f"t{i}") for i in range(n + 1)]
    ds = [Dispatch(variant, {"out": chain[i + 1], "self": chain[i], "other": const}, {"alpha": 1.0})
          for i in range(n)]
    return Program(device, ds, [chain[0]], [chain[n]], timestamps=timestamps), chain + [const]


def unary_chain_model(shape=(1, 4, 4, 4)):
    """(model, inputs): 100 unary ops in a row (relu, tanh, sigmoid, neg, cycled): bench/models.py's."""
    from models import unary_chain

    return unary_chain(CHAIN, shape)


class Layer:
    """One callable measured per call: wall seconds and seconds inside Device.submit."""

    def __init__(self, name: str, fn, device, gpu_us, submit=None):
        self.name, self.fn, self.device, self.gpu_us = name, fn, device, gpu_us
        self.submit = submit  # a replacement of device.submit while this layer runs (poll_submit)
        self.wall: list[float] = []
        self.driver: list[float] = []
        self.gpu: list[float] = []
        self.submits = 0

    def run(self, calls: int) -> None:
        dev = self.device
        if self.submit is not None:
            dev.submit = self.submit
        try:
            self._run(calls)
        finally:
            dev.__dict__.pop("submit", None)  # back to Device.submit

    def _run(self, calls: int) -> None:
        dev = self.device
        for _ in range(calls):
            before, count = dev.submit_seconds, dev.submit_count
            t0 = time.perf_counter()
            self.fn()
            self.wall.append(time.perf_counter() - t0)
            self.driver.append(dev.submit_seconds - before)
            self.submits = dev.submit_count - count
            self.gpu.append(self.gpu_us() * 1e-6)  # read after the timed call

    def row(self) -> dict:
        host = [w - d for w, d in zip(self.wall, self.driver)]
        return {"name": self.name, "wall": statistics.median(self.wall), "driver": statistics.median(self.driver),
                "host": statistics.median(host), "gpu": statistics.median(self.gpu), "submits": self.submits,
                "calls": len(self.wall)}


def build_layers(device):
    """The measured callables, each checked for the right answer first; and a close() for them."""
    import torch

    import texelflow

    prog, tensors = add_chain_program(device)
    x_np = np.zeros((4,), np.float32)
    x_t = torch.zeros(4)
    assert np.array_equal(prog(x_np)[0], x_np + CHAIN), "the add chain computed a wrong result"
    model, inputs = unary_chain_model()
    compiled = texelflow.compile(model, inputs, device=device)
    got, want = compiled(*inputs), model(*inputs)
    assert torch.allclose(got, want, atol=1e-5), "the compiled unary chain computed a wrong result"
    dispatches = len(compiled.dispatch_variants)

    assert compiled._fast is not None, "the unary chain should take the fast call (runtime/call_fast.py)"

    def with_setting(attr: str, value: bool):
        """A call of `compiled` with one of its switches (fast_path, profiling) set for that call."""
        def call(*args):
            before = getattr(compiled, attr)
            setattr(compiled, attr, value)
            try:
                return compiled(*args)
            finally:
                setattr(compiled, attr, before)
        return call

    general, timed = with_setting("fast_path", False), with_setting("profiling", True)

    def prog_gpu():
        return sum(us for _, us in prog.profile())

    def compiled_gpu():  # GPU time only where the call recorded timestamps
        return sum(us for _, us in compiled.profile()) if compiled.profiling else float("nan")

    layers = [
        Layer(f"Program.__call__, numpy input ({CHAIN} dispatches)", lambda: prog(x_np), device, prog_gpu),
        Layer(f"Program.__call__, torch input ({CHAIN} dispatches)", lambda: prog(x_t), device, prog_gpu),
        Layer(f"CompiledProgram.__call__, torch input ({CHAIN}-op unary chain, {dispatches} dispatches)",
              lambda: compiled(*inputs), device, compiled_gpu),
        Layer("the same, general path forced (fast_path=False)", lambda: general(*inputs), device, compiled_gpu),
        Layer("the same, fast path with GPU timestamps (profile=True)", lambda: timed(*inputs), device,
              lambda: sum(us for _, us in compiled.profile())),
    ]

    def close():
        compiled.close()
        prog.close()
        for t in tensors:
            t.close()

    return layers, close


def measure(device, calls: int, rounds: int, wait: str = "block") -> list[dict]:
    layers, close = build_layers(device)
    if wait != "block":  # each layer once more (or only) with the polling wait, alternated
        poll = poll_submit(device, WAITS["yield 2 ms, then block"])
        polled = [Layer(f"{layer.name}, polling wait", layer.fn, device, layer.gpu_us, poll) for layer in layers]
        layers = [x for pair in zip(layers, polled) for x in pair] if wait == "both" else polled
    try:
        for layer in layers:  # warm
            layer.run(5)
            layer.wall.clear()
            layer.driver.clear()
            layer.gpu.clear()
        for _ in range(rounds):  # alternate the layers so a load swing hits them all alike
            for layer in layers:
                layer.run(calls)
        return [layer.row() for layer in layers]
    finally:
        close()


def profile(device, calls: int) -> None:
    """cProfile of the calls of each layer, the top functions by own time, to stderr."""
    import cProfile
    import pstats

    layers, close = build_layers(device)
    try:
        for layer in layers:
            layer.run(5)
            pr = cProfile.Profile()
            pr.enable()
            layer.run(calls)
            pr.disable()
            print(f"\n## {layer.name}: {calls} calls", file=sys.stderr)
            pstats.Stats(pr, stream=sys.stderr).sort_stats("tottime").print_stats(18)
    finally:
        close()


WAITS = {"block": None, "yield": 60_000_000_000, "yield 2 ms, then block": 2_000_000}


def submit_waiting(device, program, spin_ns) -> None:
    """One submit of `program`'s command buffer, then a wait for its fence: blocking in
    vkWaitForFences (spin_ns None, what Device.submit does), or polling vkGetFenceStatus with
    os.sched_yield() in between for up to spin_ns, then blocking. An experiment beside
    Device.submit (no queue lock, no counters): this process submits from one thread only."""
    lib, h, p = device.vk.lib, device.handle, program._submit
    lib.vkResetFences(h, 1, p.fences)
    lib.vkQueueSubmit(device.queue, 1, p.info, program.fence)
    if spin_ns is not None:
        end = time.perf_counter_ns() + spin_ns
        while lib.vkGetFenceStatus(h, program.fence) == 1:  # VK_NOT_READY
            if time.perf_counter_ns() > end:
                break
            os.sched_yield()
        else:
            return
    lib.vkWaitForFences(h, 1, p.fences, 1, 60_000_000_000)


def poll_submit(device, spin_ns: int):
    """A replacement of `device.submit` that waits by yield-polling for up to spin_ns before
    blocking, counting submit_seconds as Device.submit does: the proposed Device.submit wait,
    measured on the layers (`--wait`). No queue lock: this benchmark submits from one thread."""
    lib = device.vk.lib

    def submit(cmd, fence, prepared=None):
        p = prepared if prepared is not None else device.prepare_submit(cmd, fence)
        start = time.perf_counter()
        device.check_open("submitting work")
        if lib.vkResetFences(device.handle, 1, p.fences) or lib.vkQueueSubmit(device.queue, 1, p.info, fence):
            raise RuntimeError("vkQueueSubmit failed")
        device.submit_count += 1
        end = time.perf_counter_ns() + spin_ns
        while lib.vkGetFenceStatus(device.handle, fence) == 1:  # VK_NOT_READY
            if time.perf_counter_ns() > end:
                lib.vkWaitForFences(device.handle, 1, p.fences, 1, 60_000_000_000)
                break
            os.sched_yield()
        device.submit_seconds += time.perf_counter() - start

    return submit


def wait_experiment(device, calls: int, rounds: int) -> None:
    """Wall us per submit + wait of the 100-add chain (with and without timestamps) and of a
    heavy 3-add chain (4M floats) for each wait in WAITS, alternated round by round."""
    cases = []
    for label, shape, stamps in ((f"{CHAIN} adds of 4 floats, no timestamps", (4,), False),
                                 (f"{CHAIN} adds of 4 floats, timestamps", (4,), True),
                                 ("3 adds of 4M floats, no timestamps", (4_000_000,), False)):
        prog, tensors = add_chain_program(device, shape, n=3 if shape[0] > 4 else CHAIN, timestamps=stamps)
        cases.append((label, prog, tensors, max(calls // (100 if shape[0] > 4 else 1), 2)))
    try:
        wall = {(c[0], w): [] for c in cases for w in WAITS}
        for _ in range(rounds):
            for label, prog, _, n in cases:
                for w, spin in WAITS.items():
                    for _ in range(n):
                        t0 = time.perf_counter_ns()
                        submit_waiting(device, prog, spin)
                        wall[(label, w)].append((time.perf_counter_ns() - t0) / 1e3)
        print("| program | " + " | ".join(f"{w}: median / best us" for w in WAITS) + " |")
        print("|---|" + "---:|" * len(WAITS))
        for label, *_ in cases:
            print(f"| {label} | " + " | ".join(f"{statistics.median(wall[(label, w)]):.0f} / "
                                               f"{min(wall[(label, w)]):.0f}" for w in WAITS) + " |")
    finally:
        for _, prog, tensors, _ in cases:
            prog.close()
            for t in tensors:
                t.close()


def print_table(device, rows: list[dict]) -> None:
    lim = device.limits
    print(f"# texelflow host overhead per call\n\n- device: {lim.name} ({lim.device_type}, Vulkan "
          f"{'.'.join(map(str, lim.api_version))})\n- machine: {cpu_model()}, {os.cpu_count()} cores, "
          f"{platform.system()} {platform.machine()}, Python {platform.python_version()}\n"
          f"- medians over {rows[0]['calls']} calls per layer, layers alternated; host = wall - (submit + fence "
          f"wait); target: host < {TARGET_US:.0f} us\n")
    print("| layer | wall us | submit + wait us | of which GPU us | host us | submits | target |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for r in rows:
        ok = "met" if r["host"] * 1e6 < TARGET_US else "NOT met"
        gpu = "-" if r["gpu"] != r["gpu"] else f"{r['gpu'] * 1e6:.0f}"  # NaN: no timestamps recorded
        print(f"| {r['name']} | {r['wall'] * 1e6:.0f} | {r['driver'] * 1e6:.0f} | {gpu} | "
              f"{r['host'] * 1e6:.0f} | {r['submits']} | {ok} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=50, help="calls per layer per round")
    ap.add_argument("--rounds", type=int, default=6, help="rounds (the layers alternate between rounds)")
    ap.add_argument("--profile", action="store_true", help="print a cProfile of each layer's calls to stderr")
    ap.add_argument("--waits", action="store_true", help="compare fence waits (blocking, yield-polling) instead")
    ap.add_argument("--wait", choices=["block", "poll", "both"], default="block",
                    help="poll: the layers' submits yield-poll the fence for up to 2 ms before blocking; "
                         "both: each layer both ways, alternated")
    args = ap.parse_args(argv)
    with Device() as device:
        if args.profile:
            profile(device, args.calls * args.rounds)
            return 0
        if args.waits:
            wait_experiment(device, args.calls, args.rounds)
            return 0
        rows = measure(device, args.calls, args.rounds, args.wait)
        print_table(device, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
