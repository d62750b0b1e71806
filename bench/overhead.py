"""Host overhead per call: what texelflow itself costs around the driver's submit and wait.

Two layers, each on a chain of 100 tiny dispatches (so the device work is negligible):
- `runtime.vulkan.program.Program.__call__`: a recorded program of 100 buffer `add` dispatches,
  called with a numpy array and with a torch tensor;
- `CompiledProgram.__call__` (`texelflow.compile`) of a 100-op torch chain of unary ops, called
  with a torch tensor (the user-facing path: argument checks, upload, submit, download, results).
Host time = wall time of a call minus the time spent inside the device's submit and fence wait
(`Device.submit_seconds`); the driver part (submit + wait) and the GPU time (timestamps) are
reported beside it. Medians over many calls, calls of the layers alternated in rounds.
Usage: python bench/overhead.py [--calls N] [--rounds R] [--profile]
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


def add_chain_program(device, shape=(4,)):
    """(program, tensors to close): 100 buffer adds t[i+1] = t[i] + 1 over tiny tensors."""
    variant = find_variant("add", dtype="float32", storage="buffer")
    const = VkTensor(device, shape, label="c")
    const.upload(np.ones(shape, np.float32))
    chain = [VkTensor(device, shape, allocate=i in (0, CHAIN), label=f"t{i}") for i in range(CHAIN + 1)]
    ds = [Dispatch(variant, {"out": chain[i + 1], "self": chain[i], "other": const}, {"alpha": 1.0})
          for i in range(CHAIN)]
    return Program(device, ds, [chain[0]], [chain[CHAIN]]), chain + [const]


def unary_chain_model(shape=(1, 4, 4, 4)):
    """(model, inputs): 100 unary ops in a row (relu, tanh, sigmoid, neg, cycled)."""
    import torch

    steps = (torch.relu, torch.tanh, torch.sigmoid, torch.neg)

    class Chain(torch.nn.Module):
        def forward(self, x):
            for i in range(CHAIN):
                x = steps[i % len(steps)](x)
            return x

    return Chain(), (torch.randn(*shape),)


class Layer:
    """One callable measured per call: wall seconds and seconds inside Device.submit."""

    def __init__(self, name: str, fn, device, gpu_us):
        self.name, self.fn, self.device, self.gpu_us = name, fn, device, gpu_us
        self.wall: list[float] = []
        self.driver: list[float] = []
        self.gpu: list[float] = []
        self.submits = 0

    def run(self, calls: int) -> None:
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

    def prog_gpu():
        return sum(us for _, us in prog.profile())

    def compiled_gpu():
        return sum(us for _, us in compiled.profile())

    layers = [
        Layer(f"Program.__call__, numpy input ({CHAIN} dispatches)", lambda: prog(x_np), device, prog_gpu),
        Layer(f"Program.__call__, torch input ({CHAIN} dispatches)", lambda: prog(x_t), device, prog_gpu),
        Layer(f"CompiledProgram.__call__, torch input ({CHAIN}-op unary chain, {dispatches} dispatches)",
              lambda: compiled(*inputs), device, compiled_gpu),
    ]

    def close():
        compiled.close()
        prog.close()
        for t in tensors:
            t.close()

    return layers, close


def measure(device, calls: int, rounds: int) -> list[dict]:
    layers, close = build_layers(device)
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
        print(f"| {r['name']} | {r['wall'] * 1e6:.0f} | {r['driver'] * 1e6:.0f} | {r['gpu'] * 1e6:.0f} | "
              f"{r['host'] * 1e6:.0f} | {r['submits']} | {ok} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=50, help="calls per layer per round")
    ap.add_argument("--rounds", type=int, default=6, help="rounds (the layers alternate between rounds)")
    ap.add_argument("--profile", action="store_true", help="print a cProfile of each layer's calls to stderr")
    args = ap.parse_args(argv)
    with Device() as device:
        if args.profile:
            profile(device, args.calls * args.rounds)
            return 0
        rows = measure(device, args.calls, args.rounds)
        print_table(device, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
