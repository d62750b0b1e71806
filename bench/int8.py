"""Benchmark: the q8ta kernels beside their float counterparts, on the same device in the same run.

Each case is a one-op model compiled twice: as it is (float32: `linear`, `conv2d`, depthwise
`conv2d`, on whatever kernels fusion picks for them, named in the table) and quantized through
`texelflow.quantize` (int8: the q8ta op between a quantize and a dequantize). Only the op's own
dispatches are timed (every dispatch of the float program; the int8 program's less its quantize
and dequantize), GPU timestamps from `prog.profile()`, the best of --reps calls, float and int8
interleaved so both see the same load on a shared machine. The ratio is
float time / int8 time: above 1, int8 is faster. Then im2col beside the general sliding-window
kernel on the same non-grouped convs: the general kernel is forced by giving the planned node
that op (both read and write the same representations, so the plan stays valid). The one-op
programs are planned without a device, so their convs take the q8ta kernels whatever the device.
Last, whole zoo models: the float program beside the quantized one as the device's conv form takes
it and the quantized one with the q8ta conv kernels forced (latency per call, best of --reps), with
the dispatches of each and the quantized programs' error against the quantized graph in PyTorch.
Then dynamically quantized models (XNNPACKQuantizer's dynamic config): the float program, the
quantized one with its dynamic round trips on the device, and the same with them on the CPU
(`--only dynamic` runs this part alone).
Usage: python bench/int8.py [--reps N] [--only TEXT] [--no-models]
Prints markdown tables for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import time
from unittest import mock

import torch
import torch.nn as nn

from machine import machine

# (name, float module, input shape): linears at ViT-S/16 and ResNet-18 head shapes, convs at
# ResNet-18 / MobileNetV3 shapes.
LINEARS = [
    ("linear 197x384 -> 1152 (ViT-S qkv)", lambda: nn.Linear(384, 1152), (197, 384)),
    ("linear 197x1536 -> 384 (ViT-S fc2)", lambda: nn.Linear(1536, 384), (197, 1536)),
    ("linear 64x384 -> 96", lambda: nn.Linear(384, 96), (64, 384)),
    ("gemv 1x512 -> 1000 (ResNet-18 fc)", lambda: nn.Linear(512, 1000), (1, 512)),
    ("gemv 1x384 -> 1152", lambda: nn.Linear(384, 1152), (1, 384)),
]
CONVS = [
    ("conv 3x3 64->64, 56x56 (ResNet-18 layer1)", lambda: nn.Conv2d(64, 64, 3, padding=1), (1, 64, 56, 56)),
    ("conv 3x3 128->128, 28x28 (layer2)", lambda: nn.Conv2d(128, 128, 3, padding=1), (1, 128, 28, 28)),
    ("conv 3x3/2 64->128, 56x56", lambda: nn.Conv2d(64, 128, 3, stride=2, padding=1), (1, 64, 56, 56)),
    ("conv 1x1/2 64->128, 56x56 (downsample)", lambda: nn.Conv2d(64, 128, 1, stride=2), (1, 64, 56, 56)),
    ("conv 7x7/2 3->64, 112x112 (stem, Cin 3)", lambda: nn.Conv2d(3, 64, 7, stride=2, padding=3), (1, 3, 112, 112)),
    ("depthwise 3x3 96, 28x28 (MobileNetV3)", lambda: nn.Conv2d(96, 96, 3, padding=1, groups=96), (1, 96, 28, 28)),
]
# Dispatches not counted as the op's: the quantize before an int8 op and the dequantize after it.
# The rest is the op, whatever kernels it took: a float conv may run as conv_im2col +
# linear_packed + permute_copy, a float linear as linear_packed.
QDQ = {"quantize_per_tensor", "dequantize_per_tensor"}
FLOAT, INT8 = frozenset(), frozenset(QDQ)  # what op_time skips in each program


def op_rows(prog, skip) -> list[tuple[str, float]]:
    """(op name, microseconds) of one call's dispatches, less those of the ops in `skip`."""
    from texelflow.demo import dispatch_times, op_name

    rows = [(op_name(node, label), us) for label, node, us in dispatch_times(prog, prog.bench_inputs)]
    return [(op, us) for op, us in rows if op not in skip]


def op_time(prog, skip) -> float:
    """Microseconds of one call's dispatches, less those of the ops in `skip`."""
    return sum(us for _, us in op_rows(prog, skip))


def the_op(prog, skip) -> str:
    """The ops (kernels) op_time counts, in dispatch order."""
    return " + ".join(dict.fromkeys(op for op, _ in op_rows(prog, skip)))


def best_of(progs: list, skips: list, reps: int) -> list[float]:
    """Best per-program op time over `reps` rounds, the programs interleaved within each round."""
    best = [float("inf")] * len(progs)
    for prog in progs:
        prog(*prog.bench_inputs)  # warm: pipelines, caches
    for _ in range(reps):
        for i, (prog, skip) in enumerate(zip(progs, skips)):
            best[i] = min(best[i], op_time(prog, skip))
    return best


def compiled(model, inputs, device, force_general: bool = False):
    """The program of `model`; with `force_general`, its im2col conv runs the general kernel."""
    import texelflow
    from texelflow.generated.ops import OPS
    from texelflow.runtime.program import CompiledProgram

    plan = texelflow.plan(model, inputs)
    if force_general:
        for node in plan.graph.nodes:
            if node.op is not None and node.op.name == "q8ta_conv2d_im2col":
                node.op, node.target = OPS["q8ta_conv2d"], OPS["q8ta_conv2d"].targets[0]
    prog = CompiledProgram(plan, plan.exported, device, profile=True)
    prog.bench_inputs = inputs
    return prog


def quantized(module, x):
    import texelflow

    torch.manual_seed(0)
    calibration = [(torch.randn_like(x),) for _ in range(2)]
    return texelflow.quantize(module, calibration, quantizer=texelflow.Quantizer(observer="minmax"))


def float_vs_int8(cases, device, reps: int) -> list[tuple]:
    rows = []
    for name, make, shape in cases:
        torch.manual_seed(0)
        module, x = make().eval(), torch.randn(*shape)
        progs = [compiled(module, (x,), device), compiled(quantized(module, x), (x,), device)]
        try:
            f_us, q_us = best_of(progs, [FLOAT, INT8], reps)
            rows.append((name, the_op(progs[0], FLOAT), f_us, the_op(progs[1], INT8), q_us))
        finally:
            for p in progs:
                p.close()
    return rows


def im2col_vs_general(device, reps: int) -> list[tuple]:
    rows = []
    for name, make, shape in CONVS:
        torch.manual_seed(0)
        module, x = make().eval(), torch.randn(*shape)
        if module.groups != 1 or module.in_channels % 4:
            continue  # im2col does not apply
        q = quantized(module, x)
        progs = [compiled(q, (x,), device), compiled(q, (x,), device, force_general=True)]
        try:
            assert the_op(progs[0], INT8) == "q8ta_conv2d_im2col" and the_op(progs[1], INT8) == "q8ta_conv2d"
            im2col_us, general_us = best_of(progs, [INT8, INT8], reps)
            same = bool(torch.equal(progs[0](x), progs[1](x)))
            rows.append((name, im2col_us, general_us, same))
        finally:
            for p in progs:
                p.close()
    return rows


MODELS = {"resnet18": 112, "mobilenet_v3_small": 96, "unet_decoder": 64, "vit_tiny": 32}  # model -> input size


def best_call_ms(progs: list, inputs, reps: int) -> list[float]:
    """Best wall ms per call of each program over `reps` rounds, the programs interleaved within
    each round (after one warm call each: pipelines, caches)."""
    for prog in progs:
        prog(*inputs)
    best = [float("inf")] * len(progs)
    for _ in range(reps):
        for i, prog in enumerate(progs):
            start = time.perf_counter()
            prog(*inputs)
            best[i] = min(best[i], (time.perf_counter() - start) * 1e3)
    return best


def zoo_models(device, reps: int) -> list[tuple]:
    """Per model: the float program, the quantized one as the device's conv form takes it
    (quantized.int8_conv_form: on a CPU device without int8 dot products the convs run on the
    float kernels between their dequantize and quantize), the quantized one with the q8ta conv
    kernels forced, and the device's form with its round trips left as passes of their own
    (quantized.fold_round_trips off); wall ms per call, best of `reps`, the four interleaved."""
    import texelflow
    from texelflow.models import ZOO
    from texelflow.runtime.graph import quantized as quantized_module
    from texelflow.runtime.graph.quantized import INT8_CONV_ENV

    rows = []
    for name, size in MODELS.items():
        model, inputs = ZOO[name](image_size=size)
        torch.manual_seed(1)
        calibration = [tuple(torch.randn_like(x) for x in inputs) for _ in range(4)]
        qmodel = texelflow.quantize(model, calibration)
        with mock.patch.dict(os.environ):  # the environment as it was, afterwards
            os.environ.pop(INT8_CONV_ENV, None)
            progs = [texelflow.compile(model, inputs, device=device), texelflow.compile(qmodel, inputs, device=device)]
            os.environ[INT8_CONV_ENV] = "q8ta"
            progs.append(texelflow.compile(qmodel, inputs, device=device))
            os.environ.pop(INT8_CONV_ENV, None)
            with mock.patch.object(quantized_module, "fold_round_trips", lambda *a: 0):  # the round trips unfolded
                progs.append(texelflow.compile(qmodel, inputs, device=device))
        try:
            ms = best_call_ms(progs, inputs, reps)
            want = qmodel(*inputs)
            errs = [(p(*inputs) - want).abs().max().item() for p in progs[1:]]
            rows.append((name, size, [sum(p.plan.dispatches.values()) for p in progs], ms,
                         sum(len(p.plan.fallbacks) for p in progs[1:]), max(errs)))
        finally:
            for p in progs:
                p.close()
    return rows


DYNAMIC_MODELS = {"vit_tiny": 32, "vit_s16": 224}  # model -> input size


def dynamic_models(device, reps: int) -> list[tuple]:
    """Per model, dynamically quantized by XNNPACKQuantizer's dynamic config (each linear's input
    quantized with parameters computed at run time): the float program, the quantized one as the
    fusion makes it (dynamic_quantize_dequantize on the device) and the quantized one with that
    step off (choose_qparams, quantize and dequantize on the CPU, a host round trip per linear);
    wall ms per call, best of `reps`, the three interleaved."""
    import warnings

    import texelflow
    from texelflow.models import ZOO
    from texelflow.runtime.graph import quantized as quantized_module
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "XNNPACKQuantizer is deprecated"
        from torchao.testing.pt2e._xnnpack_quantizer import XNNPACKQuantizer, get_symmetric_quantization_config
    rows = []
    for name, size in DYNAMIC_MODELS.items():
        model, inputs = ZOO[name](image_size=size)
        quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True,
                                                                                    is_dynamic=True))
        prepared = prepare_pt2e(torch.export.export(model, inputs).module(), quantizer)
        prepared(*inputs)
        qmodel = convert_pt2e(prepared)
        progs = [texelflow.compile(model, inputs, device=device), texelflow.compile(qmodel, inputs, device=device)]
        with mock.patch.object(quantized_module, "_dynamic_round_trips", lambda *a: None):
            progs.append(texelflow.compile(qmodel, inputs, device=device))
        try:
            ms = best_call_ms(progs, inputs, reps)
            want = qmodel(*inputs)
            errs = [(p(*inputs) - want).abs().max().item() / want.abs().max().item() for p in progs[1:]]
            rows.append((name, size, [sum(p.plan.dispatches.values()) for p in progs],
                         [len(p.plan.fallbacks) for p in progs], ms, errs))
        finally:
            for p in progs:
                p.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--only", default="", help="run only cases whose name contains this text")
    parser.add_argument("--no-models", action="store_true", help="skip the whole-model comparison")
    args = parser.parse_args()

    from texelflow.runtime.vulkan.device import default_device

    device = default_device()
    print(f"Device: {device.limits.name}. Machine: {machine()}. torch {torch.__version__}, best of {args.reps}.\n")
    start = time.perf_counter()
    keep = lambda cases: [c for c in cases if args.only in c[0]]  # noqa: E731
    rows = float_vs_int8(keep(LINEARS) + keep(CONVS), device, args.reps)
    if rows:
        print("| case | float op | float32 ms | int8 op | int8 ms | float / int8 |")
        print("|---|---|---|---|---|---|")
    for name, fop, f_us, qop, q_us in rows:
        print(f"| {name} | {fop} | {f_us / 1e3:.2f} | {qop} | {q_us / 1e3:.2f} | {f_us / q_us:.2f}x |")
    conv_rows = im2col_vs_general(device, args.reps) if any(args.only in c[0] for c in CONVS) else []
    if conv_rows:
        print("\n| non-grouped conv | q8ta_conv2d_im2col ms | q8ta_conv2d (general) ms | general / im2col | same output |")
        print("|---|---|---|---|---|")
        for name, im2col_us, general_us, same in conv_rows:
            print(f"| {name} | {im2col_us / 1e3:.2f} | {general_us / 1e3:.2f} | {general_us / im2col_us:.2f}x | "
                  f"{'yes' if same else 'NO'} |")
    if not args.no_models and not args.only:
        print("\n| model (input size) | float32: dispatches, ms / call | int8, the device's conv form: dispatches, ms "
              "| float / int8 | int8, q8ta convs forced: dispatches, ms | float / int8 | int8, round trips not folded "
              "into the convs: dispatches, ms | int8 fallbacks | max error vs quantized graph |")
        print("|---|---|---|---:|---|---:|---|---|---|")
        for name, size, (fd, qd, kd, ud), (f_ms, q_ms, k_ms, u_ms), fallbacks, err in zoo_models(device, args.reps):
            print(f"| {name} ({size}) | {fd}, {f_ms:.1f} | {qd}, {q_ms:.1f} | {f_ms / q_ms:.2f}x | {kd}, {k_ms:.1f} "
                  f"| {f_ms / k_ms:.2f}x | {ud}, {u_ms:.1f} | {fallbacks} | {err:.2g} |")
    if not args.no_models and (not args.only or args.only == "dynamic"):
        print("\n| model (input size), dynamic int8 (XNNPACK) | float32: dispatches, ms / call | dynamic round trips on "
              "the device: dispatches, ms | on the CPU: dispatches, CPU nodes, ms | CPU / device | relative error "
              "vs quantized graph (device, CPU) |")
        print("|---|---|---|---|---:|---|")
        for name, size, (fd, qd, cd), (_, _, cpu_nodes), (f_ms, q_ms, c_ms), errs in dynamic_models(device, args.reps):
            print(f"| {name} ({size}) | {fd}, {f_ms:.1f} | {qd}, {q_ms:.1f} | {cd}, {cpu_nodes}, {c_ms:.1f} "
                  f"| {c_ms / q_ms:.2f}x | {errs[0]:.1e}, {errs[1]:.1e} |")
    print(f"\n({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
