"""The `texelflow` command line: gen, variants (and, as they land, plan, demo, bench)."""

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
        print(exc, file=sys.stderr)
        print("texelflow gen: generated/ left unchanged", file=sys.stderr)
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="texelflow", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("gen", help="validate the YAML and regenerate generated/ (and compile SPIR-V)")
    gen.add_argument("--check", action="store_true", help="fail if generated/ differs from what the YAML produces")
    gen.add_argument("--root", help="repository root holding ops.yaml and layouts.yaml (default: found from here)")
    gen.add_argument("--no-compile", action="store_true", help="skip compiling the variants with glslc")
    gen.set_defaults(func=cmd_gen)
    var = sub.add_parser("variants", help="list shader variants with their axes")
    var.add_argument("--op", help="only this op")
    var.set_defaults(func=cmd_variants)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
