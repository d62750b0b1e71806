"""Saved programs (issue 14): time to load a file and create its pipelines, beside compile time.

For one zoo model (ViT-S/16 by default): `texelflow.compile` in this process (export, lowering,
planning, prepacking, pipelines), then `prog.save`, then `texelflow.load` in fresh child
processes where torch cannot be imported: the first child warms the driver's shader cache (Mesa's
on-disk cache on lavapipe), the next `--rounds` are timed (load = read + hash + schema check +
tensors + constant upload + pipelines + recording; the child's import time is reported apart).
Also the file's size against the prepacked constants plus the SPIR-V it holds.
Usage: python bench/load.py [--model vit_s16] [--rounds 3] [--keep PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import sys, time, json
start = time.perf_counter()
class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "jinja2", "yaml"):
            raise ImportError(name)
sys.meta_path.insert(0, Blocker())
import numpy as np
import texelflow
from texelflow.runtime.vulkan.device import default_device
default_device()
imported = time.perf_counter()
prog = texelflow.load(sys.argv[1])
loaded = time.perf_counter()
prog(*[np.zeros(s["shape"], s["dtype"]) for s in prog.input_specs])
ran = time.perf_counter()
print(json.dumps({"import_s": imported - start, "load_s": loaded - imported, "first_call_s": ran - loaded,
                  "sizes": prog.sizes()}))
"""


def child(path: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, cwd=ROOT,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="vit_s16")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--keep", default=None, help="write the file here (default: a temporary folder)")
    args = ap.parse_args()

    import texelflow
    from texelflow.models import ZOO

    model, inputs = ZOO[args.model]()
    start = time.perf_counter()
    prog = texelflow.compile(model, inputs)
    compile_s = time.perf_counter() - start
    prepacked = sum(t.nbytes for t in prog._consts.values())
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.keep or os.path.join(tmp, f"{args.model}.tflow"))
        start = time.perf_counter()
        prog.save(path)
        save_s = time.perf_counter() - start
        prog.close()
        size = path.stat().st_size
        warm = child(path)  # warms the driver's shader cache
        runs = [child(path) for _ in range(args.rounds)]
    loads = [r["load_s"] for r in runs]
    sizes = warm["sizes"]
    used = prepacked + sizes["spirv"]
    print(f"model {args.model}: compile {compile_s:.2f} s (plan timings: "
          f"{ {k: round(v, 2) for k, v in (prog.timings or {}).items()} }), save {save_s:.2f} s")
    print(f"load + pipelines, warm driver cache, fresh process without torch: median {statistics.median(loads):.3f} s, "
          f"best {min(loads):.3f} s over {len(loads)} (first, cold-ish: {warm['load_s']:.3f} s); "
          f"child import {statistics.median(r['import_s'] for r in runs):.2f} s, "
          f"first call {statistics.median(r['first_call_s'] for r in runs):.3f} s")
    print(f"file {size} B; constants stored {sizes['constants']} B (prepacked on the device {prepacked} B); "
          f"SPIR-V {sizes['spirv']} B; file / (prepacked + SPIR-V) = {size / used:.4f}, "
          f"file / (stored constants + SPIR-V) = {size / (sizes['constants'] + sizes['spirv']):.4f}")


if __name__ == "__main__":
    main()
