"""Kernel benchmark: texelflow's Vulkan kernels beside numpy and torch on the same machine.

Prints a markdown table: elementwise `add` and a `to_layout` transition (contiguous buffer ->
channels-packed texture) on 16M floats, in GB/s of tensor bytes moved, with the Vulkan time taken
from GPU timestamps; then the host overhead per call of a recorded 100-dispatch program.
Usage: python bench/kernels.py [--quick] [--reps N]
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import numpy as np
from machine import cpu_model

from texelflow.generated.layouts import Layout, Storage
from texelflow.runtime.vulkan.device import Device
from texelflow.runtime.vulkan.pipeline import find_variant
from texelflow.runtime.vulkan.program import Dispatch, Program
from texelflow.runtime.vulkan.tensor import VkTensor

try:
    import torch
except ImportError:  # the bench still runs; torch rows say why they are missing
    torch = None


def median_seconds(fn, reps: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def vulkan_kernel_seconds(device, dispatch: Dispatch, reps: int) -> float:
    """Median GPU time of one dispatch (timestamps), tensors already resident on the device."""
    prog = Program(device, [dispatch])
    try:
        prog()
        samples = []
        for _ in range(reps):
            prog()
            samples.append(prog.profile()[0][1] * 1e-6)
        return statistics.median(samples)
    finally:
        prog.close()


def bench_add(device, n: int, reps: int) -> list[tuple]:
    shape = (n // (256 * 256), 256, 256)
    x, y = np.random.default_rng(0).standard_normal((2,) + shape, dtype=np.float32)
    nbytes = 3 * x.nbytes  # read two, write one
    ts = {k: VkTensor(device, shape, "float32", Storage.BUFFER, Layout.WIDTH_PACKED, label=k)
          for k in ("out", "self", "other")}
    try:
        ts["self"].upload(x)
        ts["other"].upload(y)
        variant = find_variant("add", dtype="float32", storage="buffer")
        vk_s = vulkan_kernel_seconds(device, Dispatch(variant, ts, {"alpha": 1.0}), reps)
        np.testing.assert_allclose(ts["out"].download(), x + y, rtol=1e-6)
    finally:
        for t in ts.values():
            t.close()
    out = np.empty_like(x)
    rows = [("add", f"vulkan ({device.limits.name})", vk_s, nbytes),
            ("add", "numpy", median_seconds(lambda: np.add(x, y, out=out), reps), nbytes)]
    if torch is not None:
        tx, ty, to = torch.from_numpy(x), torch.from_numpy(y), torch.empty(shape)
        rows.append(("add", "torch", median_seconds(lambda: torch.add(tx, ty, out=to), reps), nbytes))
    return rows


def bench_to_layout(device, n: int, reps: int) -> list[tuple]:
    shape = (1, 64, n // (64 * 512), 512)  # NCHW; -> channels-packed texture (NHWC-like, C in lanes)
    x = np.random.default_rng(1).standard_normal(shape, dtype=np.float32)
    nbytes = 2 * x.nbytes  # read once, write once
    src = VkTensor(device, shape, "float32", Storage.BUFFER, Layout.WIDTH_PACKED, label="self")
    dst = VkTensor(device, shape, "float32", Storage.TEXTURE_3D, Layout.CHANNELS_PACKED, label="out")
    try:
        src.upload(x)
        variant = find_variant("to_layout", dtype="float32", in_storage="buffer", out_storage="texture3d")
        vk_s = vulkan_kernel_seconds(device, Dispatch(variant, {"out": dst, "self": src}), reps)
        np.testing.assert_array_equal(dst.download(), x)
    finally:
        src.close()
        dst.close()
    nhwc = np.empty((shape[0], shape[2], shape[3], shape[1]), np.float32)
    label = "to_layout WP buffer -> CP texture"
    rows = [(label, f"vulkan ({device.limits.name})", vk_s, nbytes),
            (label, "numpy (NCHW -> NHWC copy)",
             median_seconds(lambda: np.copyto(nhwc, x.transpose(0, 2, 3, 1)), reps), nbytes)]
    if torch is not None:
        tx, tn = torch.from_numpy(x), torch.from_numpy(nhwc)
        rows.append((label, "torch (NCHW -> NHWC copy)",
                     median_seconds(lambda: tn.copy_(tx.permute(0, 2, 3, 1)), reps), nbytes))
    return rows


def bench_program_overhead(device, reps: int) -> dict:
    """Wall time per call of a 100-dispatch chain on tiny tensors, minus its GPU time."""
    variant = find_variant("add", dtype="float32", storage="buffer")
    shape = (4,)
    const = VkTensor(device, shape, label="c")
    const.upload(np.ones(shape, np.float32))
    chain = [VkTensor(device, shape, allocate=i in (0, 100), label=f"t{i}") for i in range(101)]
    ds = [Dispatch(variant, {"out": chain[i + 1], "self": chain[i], "other": const}, {"alpha": 1.0})
          for i in range(100)]
    prog = Program(device, ds, [chain[0]], [chain[100]])
    try:
        x = np.zeros(shape, np.float32)
        assert np.array_equal(prog(x)[0], x + 100)
        calls = reps * 5
        prog(x)
        submits, in_submit = device.submit_count, device.submit_seconds
        wall = median_seconds(lambda: prog(x), calls, warmup=0)
        device_s = (device.submit_seconds - in_submit) / calls
        gpu = sum(us for _, us in prog.profile()) * 1e-6
        per_call_submits = (device.submit_count - submits) / calls
    finally:
        prog.close()
        for t in chain + [const]:
            t.close()
    return {"wall": wall, "device": device_s, "gpu": gpu, "submits": per_call_submits}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1M floats and few repetitions")
    ap.add_argument("--reps", type=int, default=None, help="timed repetitions per row")
    args = ap.parse_args(argv)
    n = (1 << 20) if args.quick else (16 << 20)
    reps = args.reps or (3 if args.quick else 10)
    with Device() as device:
        lim = device.limits
        print(f"# texelflow kernel benchmark\n\n- device: {lim.name} ({lim.device_type}, Vulkan "
              f"{'.'.join(map(str, lim.api_version))})\n- machine: {cpu_model()}, {os.cpu_count()} cores, "
              f"{platform.system()} {platform.machine()}\n- numpy {np.__version__}"
              + (f", torch {torch.__version__} ({torch.get_num_threads()} threads)" if torch else ", torch not installed")
              + f"\n- {n:,} float32 elements, median of {reps} runs; Vulkan time from GPU timestamps\n")
        rows = bench_add(device, n, reps) + bench_to_layout(device, n, reps)
        print("| kernel | implementation | time (ms) | GB/s | vs numpy |\n|---|---|---:|---:|---:|")
        base = {k: s for k, impl, s, _ in rows if impl.startswith("numpy")}
        for kernel, impl, s, nbytes in rows:
            print(f"| {kernel} | {impl} | {s * 1e3:.2f} | {nbytes / s / 1e9:.2f} | {base[kernel] / s:.2f}x |")
        ov = bench_program_overhead(device, reps)
        print("\n| 100-dispatch program (tiny tensors) | per call |\n|---|---:|")
        print(f"| wall time (upload, 1 submit, wait, download) | {ov['wall'] * 1e6:.0f} us |")
        print(f"| submit + fence wait (driver and device) | {ov['device'] * 1e6:.0f} us |")
        print(f"| of which GPU time (sum of dispatch timestamps) | {ov['gpu'] * 1e6:.0f} us |")
        print(f"| host overhead in texelflow (wall - submit/wait) | {(ov['wall'] - ov['device']) * 1e6:.0f} us |")
        print(f"| queue submits per call | {ov['submits']:.0f} |")


if __name__ == "__main__":
    main()
