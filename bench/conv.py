"""Convolution benchmark: the specialised conv kernels the fusion pass chooses (conv2d_pw,
conv2d_wino / conv2d_wino_runs, Winograd F(4x4)'s conv2d_wino4_input + linear_packed +
conv2d_wino4_output, the im2col form, conv2d_gemm, conv2d_dw3_s1 / conv2d_dw5_s1) against the
general conv2d / conv2d_dw they replace (and the F(4x4) form against the fused F(2x2) kernel it
replaces), on the layer shapes ResNet-18 and MobileNetV3 spend their time in, in one process, the
programs alternated, median of the repeats, each a replay of the recorded device program
(no upload or download): GPU timestamps (Program.profile), or with `--cpu` the process's CPU time
per replay (all threads, lavapipe's workers included: far steadier than wall time on a shared
machine; a kernel that keeps both of lavapipe's threads busy takes half of it in wall time).
GFLOP/s (direct-convolution FLOPs, Winograd's too), the fraction of the device's trivial-FMA peak
(bench/ceilings.py, measured in the same run, by the same clock) and the error against torch.

Each case is compiled as a one-layer model, so the fusion pass picks the kernel a model would get;
the baseline is the same model compiled with the kernel choice off (fusion step 6).
`--baseline REV` also times the chosen kernel's own dispatch with the SPIR-V its variant had at git
revision REV (same tensors, alternated): the before / after of a template change.
Usage: python bench/conv.py [--reps N] [--cpu] [--no-peak] [--baseline REV] [CASE ...]
"""
from __future__ import annotations

import argparse
import contextlib
import statistics

import torch
import torch.nn as nn

import texelflow

# name -> (layer, input shape)
CASES = {
    "3x3 64->64 [1,64,56,56]": (lambda: nn.Conv2d(64, 64, 3, padding=1), (1, 64, 56, 56)),
    "3x3 128->128 [1,128,28,28]": (lambda: nn.Conv2d(128, 128, 3, padding=1), (1, 128, 28, 28)),
    "3x3 256->256 [1,256,14,14]": (lambda: nn.Conv2d(256, 256, 3, padding=1), (1, 256, 14, 14)),
    "3x3 512->512 [1,512,7,7]": (lambda: nn.Conv2d(512, 512, 3, padding=1), (1, 512, 7, 7)),
    "3x3 32->32 [1,32,64,64]": (lambda: nn.Conv2d(32, 32, 3, padding=1), (1, 32, 64, 64)),
    "3x3 8->8 [1,8,32,32]": (lambda: nn.Conv2d(8, 8, 3, padding=1), (1, 8, 32, 32)),            # tiny_resnet
    "3x3 12->12 [1,12,64,64]": (lambda: nn.Conv2d(12, 12, 3, padding=1), (1, 12, 64, 64)),      # unet_decoder
    "3x3 48->48 [1,48,16,16]": (lambda: nn.Conv2d(48, 48, 3, padding=1), (1, 48, 16, 16)),
    "3x3/2 64->128 [1,64,56,56]": (lambda: nn.Conv2d(64, 128, 3, stride=2, padding=1), (1, 64, 56, 56)),
    "1x1/2 64->128 [1,64,56,56]": (lambda: nn.Conv2d(64, 128, 1, stride=2), (1, 64, 56, 56)),
    "7x7/2 3->64 [1,3,224,224]": (lambda: nn.Conv2d(3, 64, 7, stride=2, padding=3), (1, 3, 224, 224)),
    "1x1 96->24 [1,96,28,28]": (lambda: nn.Conv2d(96, 24, 1), (1, 96, 28, 28)),
    "1x1 16->72 [1,16,56,56]": (lambda: nn.Conv2d(16, 72, 1), (1, 16, 56, 56)),
    "1x1 576->1024 [1,576,7,7]": (lambda: nn.Conv2d(576, 1024, 1), (1, 576, 7, 7)),
    "dw 3x3 96 [1,96,28,28]": (lambda: nn.Conv2d(96, 96, 3, padding=1, groups=96), (1, 96, 28, 28)),
    "dw 5x5 240 [1,240,14,14]": (lambda: nn.Conv2d(240, 240, 5, padding=2, groups=240), (1, 240, 14, 14)),
    "dw 5x5/2 96 [1,96,28,28]": (lambda: nn.Conv2d(96, 96, 5, stride=2, padding=2, groups=96), (1, 96, 28, 28)),
    # transposed convs (runtime/graph/conv_transpose.py) against the transposed conv's own kernel
    "convT 2x2/2 128->64 [1,128,28,28]": (lambda: nn.ConvTranspose2d(128, 64, 2, 2), (1, 128, 28, 28)),  # U-Net
    "convT 4x4/2 64->32 [1,64,32,32]": (lambda: nn.ConvTranspose2d(64, 32, 4, 2, 1), (1, 64, 32, 32)),  # DCGAN
    "convT 3x3/2 64->32 [1,64,28,28]": (lambda: nn.ConvTranspose2d(64, 32, 3, 2, 1, 1), (1, 64, 28, 28)),  # CycleGAN
}


@contextlib.contextmanager
def general_kernels():
    """Compile with fusion step 6 off: every dense conv on the general conv2d kernel. The step
    itself is stubbed, not fuse_patterns' flag: texelflow.api runs it on its own (after the dim
    orders), so the flag alone left the specialised kernel in place."""
    from texelflow.runtime.graph import fusion

    original, phases = fusion.choose_conv_kernels, fusion._conv_transpose_as_phases
    fusion.choose_conv_kernels = lambda graph, *args, **kwargs: []
    fusion._conv_transpose_as_phases = lambda graph, node, limits: None  # conv_transpose2d's own kernel
    try:
        yield
    finally:
        fusion.choose_conv_kernels, fusion._conv_transpose_as_phases = original, phases


@contextlib.contextmanager
def fused_winograd():
    """Compile with the Winograd F(4x4) form off: a 3x3 conv keeps the fused F(2x2) kernel
    (conv2d_wino / conv2d_wino_runs), the baseline of the F(4x4) rows."""
    from texelflow.runtime.graph import fusion

    original = fusion.WINO4_MIN_CHANNELS
    fusion.WINO4_MIN_CHANNELS = 1 << 30
    try:
        yield
    finally:
        fusion.WINO4_MIN_CHANNELS = original


def cpu_ms(fn, *args) -> float:
    """CPU time (all threads of this process: lavapipe's workers too) of one call: on a shared
    machine far steadier than wall time, which counts the time other jobs held the cores."""
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF)
    fn(*args)
    after = resource.getrusage(resource.RUSAGE_SELF)
    return 1000 * (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)


def dispatch_ms(program) -> float:
    program()
    return sum(us for _, us in program.profile()) / 1000


def kernel_program(prog, rev: str | None = None):
    """A vulkan Program running `prog`'s dispatches on its resident tensors, with no transfers:
    with `rev`, the SPIR-V of git revision `rev` (None when `rev` had no such variant)."""
    import dataclasses

    from matmul import baseline_spirv

    from texelflow.runtime.vulkan.program import Program

    (segment,) = prog.segments
    dispatches = []
    for d in segment.program.dispatches:
        spirv = baseline_spirv(d.variant, rev) if rev else None
        if rev and spirv is None:
            return None
        dispatches.append(dataclasses.replace(d, spirv=spirv))
    return Program(prog.device, dispatches)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--cpu", action="store_true",
                        help="time by CPU time of the process (all threads) instead of GPU timestamps")
    parser.add_argument("--no-peak", action="store_true", help="skip measuring the FMA peak")
    parser.add_argument("--baseline", default=None, help="git revision of the SPIR-V to compare the chosen kernel with")
    parser.add_argument("cases", nargs="*", help="substrings of case names (default: all)")
    args = parser.parse_args()
    torch.manual_seed(0)
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    peak = None
    if not args.no_peak:
        from ceilings import fma_peak, fma_probe
        from machine import machine

        from texelflow.runtime.vulkan.device import default_device

        device = default_device()
        if args.cpu:  # the trivial FMA kernel's FLOPs per CPU second: the same measure as the convs'
            probe = fma_probe(device, 1 << 16, 256)
            try:
                peak = probe.work / statistics.median(cpu_ms(probe.program) for _ in range(args.reps)) / 1e6
            finally:
                probe.close()
        else:
            peak = fma_peak(device)
        unit = "GFLOP per CPU second" if args.cpu else "GFLOP/s"
        print(f"device: {device.limits.name}; machine: {machine()}; trivial FMA peak {peak:.1f} {unit}\n")
    base = f" kernel at {args.baseline} ms | speed-up |" if args.baseline else ""
    if args.cpu:
        print("(ms: CPU time per replay, all threads; GFLOP/s: per CPU second)\n")
    print(f"| case | kernel | ms | GFLOP/s | of FMA peak | general kernel ms | speed-up | F(2x2) kernel ms | speed-up |"
          f"{base} max rel. error |\n"
          f"|---|---|---|---|---|---|---|---|---|{'---|---|' if args.baseline else ''}---|")
    for name, (make, shape) in CASES.items():
        if args.cases and not any(c in name for c in args.cases):
            continue
        layer, x = make().eval(), torch.randn(shape)
        with torch.no_grad():
            want = layer(x)
        # direct FLOPs: every output (a transposed conv: every input) element times its weight row
        flops = 2 * (x if isinstance(layer, nn.ConvTranspose2d) else want).numel() * layer.weight[0].numel()
        with general_kernels():
            old = texelflow.compile(layer, (x,), profile=True)
        new = texelflow.compile(layer, (x,), profile=True)
        kernel = " + ".join(n.op.name for n in new.plan.graph.device_nodes())
        f2 = None
        if "conv2d_wino4_output" in kernel:
            with fused_winograd():
                f2 = texelflow.compile(layer, (x,), profile=True)
        with old, new, (f2 or contextlib.nullcontext()):
            got = new(x)
            before = kernel_program(new, args.baseline) if args.baseline else None
            times_new, times_old, times_base, times_f2 = [], [], [], []
            old(x)
            if f2 is not None:
                f2(x)
            # the dispatches alone, on the resident tensors: no upload, download or Python per call.
            # Each program must have run once with x: a replay reads whatever its input tensor
            # holds, and memory a freed program left behind can be NaN, which sends a Winograd
            # kernel down its direct-sum path for every tile (5-10x slower)
            run_new, run_old = kernel_program(new), kernel_program(old)
            run_f2 = kernel_program(f2) if f2 is not None else None
            for _ in range(args.reps):
                times_new.append(cpu_ms(run_new) if args.cpu else dispatch_ms(run_new))
                times_old.append(cpu_ms(run_old) if args.cpu else dispatch_ms(run_old))
                if run_f2 is not None:
                    times_f2.append(cpu_ms(run_f2) if args.cpu else dispatch_ms(run_f2))
                if before is not None:
                    times_base.append(cpu_ms(before) if args.cpu else dispatch_ms(before))
            for p in (run_new, run_old, run_f2, before):
                if p is not None:
                    p.close()
        ms, ms_old = statistics.median(times_new), statistics.median(times_old)
        ms_f2 = f" {statistics.median(times_f2):.2f} | {statistics.median(times_f2) / ms:.2f}x |" if times_f2 else " - | - |"
        base = ""
        if args.baseline:
            ms_base = statistics.median(times_base) if times_base else None
            base = f" {ms_base:.2f} | {ms_base / ms:.2f}x |" if ms_base else " - | - |"
        err = float((got - want).abs().max() / want.abs().max())
        gflops = flops / ms / 1e6
        frac = f"{gflops / peak:.0%}" if peak else "-"
        print(f"| {name} | {kernel} | {ms:.2f} | {gflops:.2f} | {frac} | {ms_old:.2f} | {ms_old / ms:.2f}x |{ms_f2}"
              f"{base} {err:.1e} |", flush=True)


if __name__ == "__main__":
    main()
