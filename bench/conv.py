"""Convolution benchmark: GFLOP/s of the conv kernels on the layer shapes ResNet-18 and
MobileNetV3 spend their time in, from GPU timestamps (the minimum over interleaved repeats, so
other work on a shared machine disturbs it least), with the error against torch.

Each case is compiled as a one-layer model, so the fusion pass picks the kernel a model would get
(conv2d, or conv2d_dw for a depthwise layer). Usage: python bench/conv.py [--reps N] [CASE ...]
"""
from __future__ import annotations

import argparse

import torch
import torch.nn as nn

import texelflow

# name -> (layer, input shape)
CASES = {
    "3x3 64->64 [1,64,56,56]": (lambda: nn.Conv2d(64, 64, 3, padding=1), (1, 64, 56, 56)),
    "3x3 512->512 [1,512,7,7]": (lambda: nn.Conv2d(512, 512, 3, padding=1), (1, 512, 7, 7)),
    "7x7/2 3->64 [1,3,224,224]": (lambda: nn.Conv2d(3, 64, 7, stride=2, padding=3), (1, 3, 224, 224)),
    "1x1 96->24 [1,96,28,28]": (lambda: nn.Conv2d(96, 24, 1), (1, 96, 28, 28)),
    "1x1 16->72 [1,16,56,56]": (lambda: nn.Conv2d(16, 72, 1), (1, 16, 56, 56)),
    "dw 3x3 96 [1,96,28,28]": (lambda: nn.Conv2d(96, 96, 3, padding=1, groups=96), (1, 96, 28, 28)),
    "dw 5x5/2 96 [1,96,28,28]": (lambda: nn.Conv2d(96, 96, 5, stride=2, padding=2, groups=96), (1, 96, 28, 28)),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("cases", nargs="*", help="substrings of case names (default: all)")
    args = parser.parse_args()
    torch.manual_seed(0)
    print("| case | kernel | ms | GFLOP/s | max rel. error |\n|---|---|---|---|---|")
    for name, (make, shape) in CASES.items():
        if args.cases and not any(c in name for c in args.cases):
            continue
        layer, x = make().eval(), torch.randn(shape)
        with torch.no_grad():
            want = layer(x)
        flops = 2 * want.numel() * layer.weight[0].numel()
        with texelflow.compile(layer, (x,)) as prog:
            got = prog(x)
            (node,) = prog.plan.graph.device_nodes()
            times = []
            for _ in range(args.reps):
                prog(x)
                times.append(sum(us for label, us in prog.profile() if label == node.name) / 1000)
        ms = min(times)
        err = float((got - want).abs().max() / want.abs().max())
        print(f"| {name} | {node.op.name} | {ms:.2f} | {flops / ms / 1e6:.2f} | {err:.1e} |", flush=True)


if __name__ == "__main__":
    main()
