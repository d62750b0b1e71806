"""`texelflow gen`: validate the YAML, render generated/, compile every variant, then write.

Nothing under generated/ changes unless validation, rendering and compilation all succeed.
`--check` writes nothing: it compares the rendered tree with generated/ and, when they agree,
compiles every variant too, so that a clean checkout's check both proves every shader compiles
with this glslc and fills the SPIR-V cache that the tests and the runtime then read.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from . import spirv
from .diagnostics import Collector
from .layouts_schema import parse_layouts
from .model import OpsModel
from .ops_schema import parse_ops
from .hooks import scan_hooks
from .render import render_glsl, render_python, scan_templates
from .variants import expand
from .writer import drift, write_tree
from .yamlsrc import load


@dataclass
class GenResult:
    files: dict[str, str]
    variants: int
    touched: list[str]
    drift: list[str]


def build_models(root: Path):
    """Parse and validate both YAML files and the templates; raises GenError listing every problem."""
    out = Collector()
    layouts_data = ops_data = None
    for name in ("layouts.yaml", "ops.yaml"):
        try:
            data = load(root / name, name)
        except Exception as exc:  # GenError: keep collecting from the other file
            if not hasattr(exc, "diagnostics"):
                raise
            out.items.extend(exc.diagnostics)
            continue
        if name == "layouts.yaml":
            layouts_data = data
        else:
            ops_data = data
    layouts = parse_layouts(layouts_data, "layouts.yaml", out) if layouts_data is not None else None
    templates = scan_templates(root / "shaders", out)
    hooks = scan_hooks(root / "shaders" / "hooks.py", out)
    ops = None
    if layouts is not None and ops_data is not None:
        parsed = parse_ops(ops_data, "ops.yaml", out, layouts, templates, hooks)
        if parsed is not None:
            axes, choices, dtype_sets, op_specs = parsed
            variants = expand(op_specs, layouts, dict(axes), dict(choices), "ops.yaml", out)
            names = [v.name for v in variants]
            for dup in sorted({n for n in names if names.count(n) > 1}):
                out.error("ops.yaml", 0, f"variant name '{dup}' is produced twice")
            ops = OpsModel(axes=axes, choices=choices, dtype_sets=dtype_sets, ops=op_specs, variants=variants)
    out.raise_if_any()
    return layouts, ops


def render_all(root: Path, layouts, ops: OpsModel) -> dict[str, str]:
    out = Collector()
    files = render_python(layouts, ops)
    files.update(render_glsl(layouts, ops, root / "shaders", out))
    out.raise_if_any()
    return files


def compile_rendered(root: Path, files: dict[str, str], ops: OpsModel, progress: bool | None = None) -> None:
    """Compile every rendered variant against the rendered (not yet written) include files."""
    with tempfile.TemporaryDirectory(prefix="texelflow-gen-") as tmp:
        inc = Path(tmp) / "include"
        inc.mkdir()
        for rel, text in files.items():
            if rel.startswith("glsl/include/"):
                (inc / Path(rel).name).write_text(text, encoding="utf-8")
        jobs = [spirv.CompileJob(v.name, files[f"glsl/{v.source}"], v.target_env, f"generated/glsl/{v.source}")
                for v in ops.variants]
        shared = root / "shaders" / "include"
        spirv.compile_many(jobs, [inc, shared], progress=progress,
                           include_names={inc: "generated/glsl/include", shared: "shaders/include"})


def generate(root: Path, check: bool = False, compile: bool = True, progress: bool | None = None) -> GenResult:
    root = Path(root)
    layouts, ops = build_models(root)
    files = render_all(root, layouts, ops)
    out_dir = root / "generated"
    if check:
        differs = drift(out_dir, files)
        if compile and not differs:
            compile_rendered(root, files, ops, progress)
        return GenResult(files, len(ops.variants), [], differs)
    if compile:
        compile_rendered(root, files, ops, progress)
    touched = write_tree(out_dir, files)
    return GenResult(files, len(ops.variants), touched, [])
