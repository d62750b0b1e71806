"""Benchmark: cold generation + SPIR-V compilation of every variant, and a warm no-op re-run.

Cold = a scratch copy of the sources with an empty generated/ and an empty SPIR-V cache.
Warm = the same command again with nothing changed (target: under 1 s). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import machine

ROOT = Path(__file__).resolve().parents[1]


def timed_cli(root: Path, env: dict, *args: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "texelflow.cli", "gen", "--root", str(root), *args], env=env, check=True,
                   capture_output=True)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3, help="warm runs to take the best of")
    args = parser.parse_args()
    from texelflow.codegen.generate import generate
    from texelflow.codegen.spirv import glslc_version

    with tempfile.TemporaryDirectory(prefix="texelflow-bench-") as tmp:
        root = Path(tmp) / "repo"
        root.mkdir()
        for name in ("layouts.yaml", "ops.yaml"):
            shutil.copy(ROOT / name, root / name)
        shutil.copytree(ROOT / "shaders", root / "shaders", ignore=shutil.ignore_patterns("__pycache__"))
        env = dict(os.environ, TEXELFLOW_CACHE_DIR=str(Path(tmp) / "spirv-cache"))
        os.environ["TEXELFLOW_CACHE_DIR"] = env["TEXELFLOW_CACHE_DIR"]

        cold_cli = timed_cli(root, env)
        variants = len(list((root / "generated" / "glsl").glob("*.comp")))
        warm_cli = min(timed_cli(root, env) for _ in range(args.repeats))
        check_cli = min(timed_cli(root, env, "--check") for _ in range(args.repeats))
        warm_inproc = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            generate(root)
            warm_inproc.append(time.perf_counter() - start)

    print(f"Machine: {machine()}; glslc: {glslc_version().splitlines()[0]}\n")
    print("| step | seconds |")
    print("|---|---|")
    print(f"| cold `texelflow gen` (render + compile {variants} variants, empty cache) | {cold_cli:.2f} |")
    print(f"| warm `texelflow gen`, nothing changed (CLI, incl. interpreter start) | {warm_cli:.2f} |")
    print(f"| warm generate() in process, nothing changed | {min(warm_inproc):.3f} |")
    print(f"| `texelflow gen --check` (CLI) | {check_cli:.2f} |")
    print(f"\nvariants: {variants}; warm target < 1 s: {'met' if warm_cli < 1.0 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
