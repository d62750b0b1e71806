"""Benchmark: cold generation + SPIR-V compilation of every variant, a warm no-op re-run, and where
glslc's time goes.

Cold = a scratch copy of the sources with an empty generated/ and an empty SPIR-V cache
(TEXELFLOW_CACHE_DIR), through the CLI (interpreter start and rendering included); the rate is
variants per second of that (target: at least 36/s). Warm = the same command again with nothing
changed (target: under 1 s). The breakdown compiles the rendered variants serially, in one glslc
process each or all in one process, with and without -O. Prints markdown tables.
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


def scratch_copy(dest: Path) -> Path:
    dest.mkdir()
    for name in ("layouts.yaml", "ops.yaml"):
        shutil.copy(ROOT / name, dest / name)
    shutil.copytree(ROOT / "shaders", dest / "shaders", ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def breakdown(root: Path, work: Path) -> list[tuple[str, float, int]]:
    """(how, seconds, variants) compiling the generated GLSL serially with glslc."""
    try:
        from texelflow.shaders.spirv_cache import flags_for, glslc_path
    except ImportError:  # a checkout from before the shared cache (to compare before / after)
        from texelflow.codegen.spirv import flags_for, glslc_path

    sources = sorted((root / "generated" / "glsl").glob("*.comp"))
    incs = [f"-I{root / 'generated' / 'glsl' / 'include'}", f"-I{root / 'shaders' / 'include'}"]
    glslc = glslc_path()
    rows = []
    for optimise in (True, False):
        flags = [f for f in flags_for("vulkan1.1") if optimise or f != "-O"]
        tag = "-O" if optimise else "no -O"
        out = work / f"per-{tag}"
        out.mkdir()
        start = time.perf_counter()
        for src in sources:
            subprocess.run([glslc, *flags, *incs, str(src), "-o", str(out / f"{src.name}.spv")], check=True)
        rows.append((f"one glslc process per variant, {tag}", time.perf_counter() - start, len(sources)))
        out = work / f"batch-{tag}"
        out.mkdir()
        start = time.perf_counter()
        subprocess.run([glslc, *flags, *incs, "-c", *map(str, sources)], cwd=out, check=True)
        rows.append((f"all variants in one glslc process, {tag}", time.perf_counter() - start, len(sources)))
    start = time.perf_counter()
    for _ in range(20):
        subprocess.run([glslc, "--version"], check=True, capture_output=True)
    rows.append(("`glslc --version` (process start only)", (time.perf_counter() - start) / 20, 1))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3, help="cold and warm runs to take the best of")
    parser.add_argument("--no-breakdown", action="store_true", help="skip the serial glslc breakdown")
    args = parser.parse_args()
    from texelflow.codegen.generate import build_models, compile_rendered, generate, render_all
    try:
        from texelflow.shaders.spirv_cache import glslc_version
    except ImportError:  # a checkout from before the shared cache (to compare before / after)
        from texelflow.codegen.spirv import glslc_version

    with tempfile.TemporaryDirectory(prefix="texelflow-bench-") as tmp:
        tmp = Path(tmp)
        cold = []
        for i in range(args.repeats):
            root = scratch_copy(tmp / f"repo{i}")
            env = dict(os.environ, TEXELFLOW_CACHE_DIR=str(tmp / f"spirv-cache-{i}"))
            cold.append(timed_cli(root, env))
        variants = len(list((root / "generated" / "glsl").glob("*.comp")))
        warm_cli = min(timed_cli(root, env) for _ in range(args.repeats))
        check_cli = min(timed_cli(root, env, "--check") for _ in range(args.repeats))
        os.environ["TEXELFLOW_CACHE_DIR"] = env["TEXELFLOW_CACHE_DIR"]
        warm_inproc = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            generate(root)
            warm_inproc.append(time.perf_counter() - start)
        layouts, ops = build_models(root)
        files = render_all(root, layouts, ops)
        compile_only = []
        for i in range(args.repeats):
            os.environ["TEXELFLOW_CACHE_DIR"] = str(tmp / f"compile-only-{i}")
            start = time.perf_counter()
            compile_rendered(root, files, ops, progress=False)
            compile_only.append(time.perf_counter() - start)
        rows = [] if args.no_breakdown else breakdown(root, tmp)

    best_cold = min(cold)
    print(f"Machine: {machine()}; glslc: {glslc_version().splitlines()[0]}\n")
    print("| step | seconds | variants/s |")
    print("|---|---|---|")
    print(f"| cold `texelflow gen` (render + compile {variants} variants, empty cache; best of {args.repeats}, "
          f"all: {', '.join(f'{c:.2f}' for c in cold)}) | {best_cold:.2f} | {variants / best_cold:.1f} |")
    print(f"| compile only (compile_rendered, empty cache, {os.cpu_count()} processes) | {min(compile_only):.2f} | "
          f"{variants / min(compile_only):.1f} |")
    print(f"| warm `texelflow gen`, nothing changed (CLI, incl. interpreter start) | {warm_cli:.2f} | |")
    print(f"| warm generate() in process, nothing changed | {min(warm_inproc):.3f} | |")
    print(f"| `texelflow gen --check` (CLI) | {check_cli:.2f} | |")
    print(f"\nvariants: {variants}; cold target >= 36 variants/s: "
          f"{'met' if variants / best_cold >= 36 else 'NOT met'}; warm target < 1 s: "
          f"{'met' if warm_cli < 1.0 else 'NOT met'}")
    if rows:
        print("\nWhere glslc's time goes (serial, one core, the rendered variants):\n")
        print("| how | seconds | ms per variant |")
        print("|---|---|---|")
        for how, secs, n in rows:
            print(f"| {how} | {secs:.2f} | {1000 * secs / n:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
