"""Benchmark: third-party transformer blocks at real sizes, as their own code writes them.

The blocks of tests/models/test_third_party_transformers.py (HF-style BERT and GPT-2 with eager
attention, GPT-2's Conv1D as addmm, a LLaMA block with grouped-query SDPA, Meta's LLaMA attention
with repeated key / value heads and an additive causal mask, a Swin stage's window attention),
compiled as planned and with buffers forced (texture_limits (1, 1, 1)). Per block: the sum of
its dispatches' device times (GPU timestamps, the best of --reps calls) and the five ops that
take most of it, and how many nodes fell back to the CPU. Prints a markdown table for
bench/RESULTS.md. To compare two checkouts, run this file from each in turn on the same host.

Usage: python bench/blocks.py [--reps 5] [--only NAME] [--buffers]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from machine import machine

ROOT = Path(__file__).resolve().parents[1]


def blocks():
    """(name, module, inputs) of each block at its size."""
    import torch

    sys.path.insert(0, str(ROOT))
    from tests.models.test_third_party_transformers import (BertLayer, GPT2Block, LlamaBlock, MetaLlamaAttention,
                                                            SwinStage, seeded)

    g = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=g)

    return [
        ("BERT layer (dim 768, 12 heads, 128 tokens)", seeded(BertLayer(768, 12, 3072)),
         (rand(1, 128, 768), torch.zeros(1, 1, 1, 128))),
        ("GPT-2 block (dim 768, 12 heads, 128 tokens, eager attention)", seeded(GPT2Block(768, 12, 3072, 128, False)),
         (rand(1, 128, 768),)),
        ("GPT-2 block (dim 384, 6 heads, 256 tokens, eager attention)", seeded(GPT2Block(384, 6, 1536, 256, False)),
         (rand(1, 256, 384),)),
        ("LLaMA block (dim 512, 8 heads, 4 kv heads, 256 tokens)", seeded(LlamaBlock(512, 8, 4, 256)),
         (rand(1, 256, 512),)),
        ("Meta LLaMA attention (dim 512, 8 heads, 4 kv heads, 128 tokens)", seeded(MetaLlamaAttention(512, 8, 4, 128)),
         (rand(1, 128, 512),)),
        ("Swin stage (dim 96, 56 x 56, 3 heads, window 7)", seeded(SwinStage(96, (56, 56), 3, 7)),
         (rand(1, 56 * 56, 96),)),
    ]


def measure(module, inputs, buffers: bool, reps: int):
    """(device ms of the best call, [(op, ms)] of the five largest ops, CPU nodes)."""
    import texelflow
    from texelflow.demo import dispatch_times, time_by_op

    prog = texelflow.compile(module.eval(), inputs, texture_limits=(1, 1, 1) if buffers else None)
    try:
        for _ in range(2):
            prog(*inputs)
        best = None
        for _ in range(reps):
            rows = time_by_op(dispatch_times(prog, inputs))
            total = sum(us for _, _, us in rows)
            if best is None or total < best[0]:
                best = (total, rows)
        total, rows = best
        top = [(op, us / 1000) for op, _, us in sorted(rows, key=lambda r: -r[2])[:5]]
        return total / 1000, top, sum(1 for n in prog.plan.graph.nodes if n.fallback)
    finally:
        prog.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5, help="calls timed per block (the best is kept)")
    ap.add_argument("--only", default="", help="only the blocks whose name contains this")
    ap.add_argument("--buffers", action="store_true", help="also with buffers forced")
    args = ap.parse_args()
    from texelflow.demo import quiet_third_party_warnings
    from texelflow.runtime.vulkan.device import default_device

    quiet_third_party_warnings()
    import torch

    import texelflow

    torch.set_num_threads(1)  # torch's spinning OpenMP workers would take cores from lavapipe's threads

    print("# texelflow: third-party transformer blocks\n")
    print(f"- device: {default_device().limits.name}")
    print(f"- machine: {machine()}")
    print(f"- texelflow: {Path(texelflow.__file__).resolve().parents[1]}; device ms = the sum of one call's "
          f"dispatch times, best of {args.reps} calls\n")
    print("| block | storage | device ms | largest ops (ms) | CPU nodes |")
    print("|---|---|---:|---|---:|")
    for name, module, inputs in blocks():
        if args.only and args.only not in name:
            continue
        for buffers in ((False, True) if args.buffers else (False,)):
            ms, top, cpu = measure(module, inputs, buffers, args.reps)
            ops = ", ".join(f"{op} {t:.2f}" for op, t in top)
            print(f"| {name} | {'buffers' if buffers else 'as planned'} | {ms:.2f} | {ops} | {cpu} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
