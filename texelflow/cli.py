"""The `texelflow` command line: gen, variants, plan, demo, compile, run, inspect, tune, bench."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def find_root(start: Path) -> Path | None:
    """The nearest folder at or above `start` holding both ops.yaml and layouts.yaml."""
    for d in (start, *start.parents):
        if (d / "ops.yaml").is_file() and (d / "layouts.yaml").is_file():
            return d
    return None


def cmd_gen(args) -> int:
    from texelflow.codegen.diagnostics import GenError
    from texelflow.codegen.generate import generate
    from texelflow.codegen.spirv import GlslcMissingError, ShaderCompileError

    root = Path(args.root).resolve() if args.root else find_root(Path.cwd().resolve())
    if root is None or not (root / "ops.yaml").is_file():
        print(f"texelflow gen: no ops.yaml and layouts.yaml in {args.root or 'this folder or above'}", file=sys.stderr)
        return 2
    try:
        result = generate(root, check=args.check, compile=not args.no_compile)
    except GenError as exc:
        for d in exc.diagnostics:
            print(d, file=sys.stderr)
        print(f"texelflow gen: {len(exc.diagnostics)} problem(s); generated/ left unchanged", file=sys.stderr)
        return 1
    except ShaderCompileError as exc:
        for line in exc.lines():  # `shaders/NAME.glsl.j2:LINE: error: ... (generated/glsl/VARIANT.comp:LINE)`
            print(line, file=sys.stderr)
        print(f"texelflow gen: {len(exc.failures)} shader variant(s) failed to compile; generated/ left unchanged",
              file=sys.stderr)
        return 1
    except GlslcMissingError as exc:
        print(f"texelflow gen: {exc}", file=sys.stderr)
        return 1
    if args.check:
        if result.drift:
            for line in result.drift:
                print(line, file=sys.stderr)
            print("texelflow gen --check: generated/ does not match the YAML; run `make gen`", file=sys.stderr)
            return 1
        print(f"generated/ is up to date ({result.variants} shader variants)")
        return 0
    changed = ", ".join(result.touched[:8]) + (" ..." if len(result.touched) > 8 else "")
    print(f"{result.variants} shader variants; {len(result.touched)} file(s) changed{': ' + changed if changed else ''}")
    return 0


def cmd_variants(args) -> int:
    from texelflow.generated import ops, variants

    names = [args.op] if args.op else sorted(ops.OPS)
    for name in names:
        entry = ops.OPS.get(name)
        if entry is None:
            from texelflow.codegen.diagnostics import did_you_mean

            print(f"texelflow variants: unknown op '{name}'{did_you_mean(name, ops.OPS)}", file=sys.stderr)
            return 1
        print(f"{name}  ({', '.join(entry.targets)})")
        for vname in entry.variants:
            v = variants.VARIANTS[vname]
            axes = "  ".join(f"{k}={val}" for k, val in v.axes)
            print(f"  {vname:<40} {axes}")
    return 0


def load_target(spec: str):
    """MODULE:ATTR -> (model, example_inputs). ATTR is a factory returning that pair, or a model
    (instance, or class built without arguments) with an `example_inputs` attribute or method.
    A bare name of the model zoo (texelflow.models.ZOO, e.g. vit_s16) is its factory."""
    import importlib

    import torch

    if ":" not in spec:
        from texelflow.models import ZOO

        if spec in ZOO:
            return ZOO[spec]()
        raise SystemExit(f"texelflow: '{spec}' is neither MODULE:ATTR (e.g. {DEFAULT_MODEL}) nor a zoo model "
                         f"({', '.join(ZOO)})")
    module_name, attr = spec.split(":", 1)
    sys.path.insert(0, str(Path.cwd()))
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise SystemExit(f"texelflow: cannot load {spec}: {exc}") from None
    if isinstance(obj, type) and issubclass(obj, torch.nn.Module):
        obj = obj()
    if not isinstance(obj, torch.nn.Module) and callable(obj):
        obj = obj()
    if isinstance(obj, tuple) and len(obj) == 2:
        return obj
    inputs = getattr(obj, "example_inputs", None)
    inputs = inputs() if callable(inputs) else inputs
    if inputs is None:
        raise SystemExit(f"texelflow: {spec} gives no example inputs (return (model, inputs) or set example_inputs)")
    return obj, tuple(inputs)


DEFAULT_MODEL = "texelflow.models:tiny_resnet"


class SvgError(Exception):
    """`plan --svg` cannot write its file; the message is one line saying why."""


def check_svg_target(path: str) -> None:
    """Refuse, before planning, a file that cannot be written: a missing folder, a folder in its
    place, or an SVG without Graphviz's `dot`."""
    import shutil

    target = Path(path)
    folder = target.parent
    if not folder.exists():
        raise SvgError(f"cannot write {path}: folder {folder} does not exist")
    if not folder.is_dir():
        raise SvgError(f"cannot write {path}: {folder} is not a folder")
    if target.is_dir():
        raise SvgError(f"cannot write {path}: it is a folder")
    if not path.endswith(".dot") and shutil.which("dot") is None:
        raise SvgError(f"cannot write {path}: drawing an SVG needs Graphviz's `dot` (apt-get install graphviz), "
                       "or name a .dot file to get the Graphviz source")


def write_svg(dot_source: str, path: str) -> None:
    """Draw `dot_source` to `path` (SVG; Graphviz source for a .dot name); SvgError says what failed."""
    import shutil
    import subprocess

    check_svg_target(path)
    if path.endswith(".dot"):
        data = dot_source.encode()
    else:
        try:
            proc = subprocess.run([shutil.which("dot") or "dot", "-Tsvg"], input=dot_source.encode(),
                                  capture_output=True)
        except OSError as exc:
            raise SvgError(f"cannot write {path}: cannot run Graphviz's `dot`: {exc.strerror or exc}") from None
        if proc.returncode != 0:
            why = (proc.stderr.decode(errors="replace").strip().splitlines() or [f"exit status {proc.returncode}"])[0]
            raise SvgError(f"cannot write {path}: Graphviz's `dot` failed: {why}")
        data = proc.stdout
    try:
        Path(path).write_bytes(data)
    except OSError as exc:
        raise SvgError(f"cannot write {path}: {exc.strerror or exc}") from None


def cmd_plan(args) -> int:
    import texelflow

    try:
        if args.svg:  # before planning, which can take a while
            check_svg_target(args.svg)
        model, inputs = load_target(args.target)
        plan = texelflow.plan(model, inputs, planner=args.planner)
        print(plan.summary())
        print("\n" + plan.timing_summary())
        if args.svg:
            write_svg(plan.to_dot(), args.svg)
            print(f"\nwrote {args.svg}")
    except SvgError as exc:
        print(f"texelflow plan: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_demo(args) -> int:
    """Plan a zoo model (ViT-S/16 by default) or a MODULE:ATTR target with both planners, compile
    it for the Vulkan device, run it, check it against eager PyTorch and time both."""
    from texelflow import demo
    from texelflow.models import ZOO

    name = args.model or (args.target if args.target and ":" not in args.target else None)
    if args.target and ":" in args.target and not args.model:
        model, inputs = load_target(args.target)
        title = args.target
    else:
        name = name or demo.DEFAULT_MODEL
        if name not in ZOO:
            from texelflow.codegen.diagnostics import did_you_mean

            print(f"texelflow demo: unknown model '{name}'{did_you_mean(name, ZOO)}; "
                  f"choose one of {', '.join(ZOO)} or give MODULE:ATTR", file=sys.stderr)
            return 2
        model, inputs = ZOO[name]()
        title = name
    return demo.run(model, inputs, title)


def cmd_bench(args) -> int:
    import subprocess

    root = find_root(Path.cwd().resolve())
    if root is None or not (root / "bench").is_dir():
        print("texelflow bench: run it inside the texelflow repository (bench/ holds the scripts)", file=sys.stderr)
        return 2
    rc = 0
    for script in ("codegen.py", "kernels.py", "planner.py", "models.py"):
        extra = ["--quick"] if args.quick and script != "codegen.py" else []
        print(f"## bench/{script}", flush=True)
        rc |= subprocess.run([sys.executable, str(root / "bench" / script), *extra]).returncode
    return rc


# ---- shipping a compiled program (runtime/saved: docs/format.md) ---------------------------------
def cmd_compile(args) -> int:
    """Export, plan, compile and prepack a model once, then save the runnable program to one file."""
    import time

    import texelflow
    from texelflow.runtime.errors import TexelflowError

    model, inputs = load_target(args.target)
    start = time.perf_counter()
    try:
        with texelflow.compile(model, inputs, planner=args.planner, precision=args.precision) as prog:
            compiled = time.perf_counter() - start
            prog.save(args.output)
    except (TexelflowError, OSError) as exc:
        print(f"texelflow compile: {exc}", file=sys.stderr)
        return 1
    size = Path(args.output).stat().st_size
    print(f"compiled {args.target} in {compiled:.1f} s; wrote {args.output} ({size / 1e6:.2f} MB)")
    return 0


def _saved_inputs(prog, paths: list[str], seed: int) -> list:
    """The arrays to call a loaded program with: one .npy per input in order, or seeded random
    values of each input's shape and dtype when none are given."""
    import numpy as np

    specs = list(prog.input_specs)
    if paths:
        if len(paths) != len(specs):
            raise SystemExit(f"texelflow run: the program takes {len(specs)} input(s) "
                             f"({', '.join(s['name'] for s in specs)}); --input was given {len(paths)}")
        arrays = []
        for path in paths:
            try:
                arrays.append(np.load(path, allow_pickle=False))
            except (OSError, ValueError) as exc:
                raise SystemExit(f"texelflow run: cannot read {path}: {exc}") from None
        return arrays
    rng = np.random.default_rng(seed)
    arrays = []
    for s in specs:
        dtype, shape = np.dtype(s["dtype"]), tuple(s["shape"])
        if dtype.kind == "f":
            arrays.append(rng.standard_normal(shape).astype(dtype))
        elif dtype.kind == "b":
            arrays.append(rng.integers(0, 2, shape).astype(dtype))
        else:
            arrays.append(rng.integers(0, 10, shape).astype(dtype))
    return arrays


def cmd_run(args) -> int:
    """Load a saved program (no torch needed) and run it on inputs from .npy files or random ones."""
    import statistics
    import time

    import numpy as np

    import texelflow
    from texelflow.runtime.errors import TexelflowError

    try:
        with texelflow.load(args.file) as prog:
            arrays = _saved_inputs(prog, args.input or [], args.seed)
            outputs = prog(*arrays)
            outputs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
            for spec, out in zip(prog.output_specs, outputs):
                out = np.asarray(out)
                finite = out[np.isfinite(out)] if out.dtype.kind == "f" else out
                stats = (f"min {finite.min():.4g} max {finite.max():.4g} mean {finite.mean():.4g}"
                         if finite.size else "no finite values")
                print(f"{spec['name']}: {out.dtype} {list(out.shape)}  {stats}")
            if args.output:
                names = [s["name"] for s in prog.output_specs]
                np.savez(args.output, **dict(zip(names, outputs)))
                print(f"wrote {args.output}")
            if args.bench:
                times = []
                for _ in range(args.bench):
                    start = time.perf_counter()
                    prog(*arrays)
                    times.append(time.perf_counter() - start)
                print(f"{args.bench} calls: median {statistics.median(times) * 1e3:.2f} ms, "
                      f"best {min(times) * 1e3:.2f} ms")
    except TexelflowError as exc:
        print(f"texelflow run: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_inspect(args) -> int:
    """Print a saved program's plan summary, the shader variants it uses and the sizes of its parts."""
    import texelflow
    from texelflow.runtime.errors import TexelflowError

    try:
        print(texelflow.inspect(args.file))
    except TexelflowError as exc:
        print(f"texelflow inspect: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_tune(args) -> int:
    """Measure this device's cost table (runtime/tune.py) and store it where compile finds it."""
    import time

    from texelflow.runtime.errors import TexelflowError

    tty = sys.stderr.isatty()
    last = [0.0]

    def progress(done: int, total: int, what: str) -> None:
        now = time.monotonic()
        if tty:
            width = 30
            bar = "#" * (width * done // max(total, 1))
            print(f"\r[{bar:<{width}}] {done}/{total} {what[:60]:<60}", end="", file=sys.stderr, flush=True)
            if done == total:
                print(file=sys.stderr)
        elif done == total or now - last[0] >= 5:  # a line every 5 s when not on a terminal
            last[0] = now
            print(f"tune: {done}/{total} {what}", file=sys.stderr, flush=True)

    try:
        from texelflow.runtime import tune
        from texelflow.runtime.vulkan.device import default_device

        device = default_device()
        start = time.perf_counter()
        skipped: list = []
        model, samples, path = tune.tune(device, quick=args.quick, progress=progress, skipped=skipped)
    except TexelflowError as exc:
        print(f"texelflow tune: {exc}", file=sys.stderr)
        return 1
    for label, why in skipped:
        print(f"texelflow tune: left out {label}: {why}", file=sys.stderr)
    print(f"{device.limits.name}: {len(samples)} kernel timings, {len(model.entries)} cost entries, "
          f"median fit error {tune.fit_error(model, samples) * 100:.1f}% in {time.perf_counter() - start:.1f} s")
    print(f"wrote {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="texelflow", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("gen", help="validate the YAML and regenerate generated/ (and compile SPIR-V)")
    gen.add_argument("--check", action="store_true", help="fail if generated/ differs from what the YAML produces, or a variant does not compile"
                     " (writes nothing; compiling fills the SPIR-V cache)")
    gen.add_argument("--root", help="repository root holding ops.yaml and layouts.yaml (default: found from here)")
    gen.add_argument("--no-compile", action="store_true", help="skip compiling the variants with glslc")
    gen.set_defaults(func=cmd_gen)
    var = sub.add_parser("variants", help="list shader variants with their axes")
    var.add_argument("--op", help="only this op")
    var.set_defaults(func=cmd_variants)
    plan = sub.add_parser("plan", help="plan a model and print its representations (no device needed)")
    plan.add_argument("target", nargs="?", default=DEFAULT_MODEL, help=f"MODULE:ATTR (default {DEFAULT_MODEL})")
    plan.add_argument("--planner", choices=["optimal", "greedy"], default="optimal")
    plan.add_argument("--svg", help="also draw the planned graph (SVG, or Graphviz source for a .dot name)")
    plan.set_defaults(func=cmd_plan)
    demo = sub.add_parser("demo", help="plan, compile and run a model on the Vulkan device (default: ViT-S/16)")
    demo.add_argument("target", nargs="?", help="MODULE:ATTR giving (model, inputs), or a zoo model name")
    demo.add_argument("--model", help="a zoo model from texelflow.models.ZOO (default vit_s16)")
    demo.set_defaults(func=cmd_demo)
    tune = sub.add_parser("tune", help="measure this device's kernel cost table (the planner's predicted times)")
    tune.add_argument("--quick", action="store_true", help="fewer sizes and repetitions (well under a minute)")
    tune.set_defaults(func=cmd_tune)
    comp = sub.add_parser("compile", help="compile a model for this device and save it to one file (docs/format.md)")
    comp.add_argument("target", help="MODULE:ATTR giving (model, inputs), or a zoo model name")
    comp.add_argument("-o", "--output", required=True, help="the file to write, e.g. model.tflow")
    comp.add_argument("--planner", choices=["optimal", "greedy"], default="optimal")
    comp.add_argument("--precision", choices=["fp32", "fp16"], default="fp32")
    comp.set_defaults(func=cmd_compile)
    run = sub.add_parser("run", help="load a saved program and run it (torch not needed)")
    run.add_argument("file", help="a file written by `texelflow compile` or prog.save()")
    run.add_argument("--input", action="append", metavar="X.npy",
                     help="one .npy per program input, in order (default: seeded random inputs)")
    run.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    run.add_argument("--output", metavar="OUT.npz", help="save the outputs, by name")
    run.add_argument("--bench", type=int, nargs="?", const=20, default=0, metavar="N",
                     help="then time N more calls (default 20)")
    run.set_defaults(func=cmd_run)
    insp = sub.add_parser("inspect", help="print a saved program's plan summary, variants and sizes")
    insp.add_argument("file")
    insp.set_defaults(func=cmd_inspect)
    bench = sub.add_parser("bench", help="run the benchmarks under bench/")
    bench.add_argument("--quick", action="store_true", help="small sizes")
    bench.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
