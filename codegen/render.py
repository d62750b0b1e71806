"""Render the generated tree (Python modules and GLSL) from the validated models, in memory."""

from __future__ import annotations

from pathlib import Path

import jinja2
from jinja2 import meta

from .diagnostics import Collector
from .model import LayoutsModel, OpsModel, Variant

TEMPLATES_DIR = Path(__file__).parent / "templates"
# Names every shader template may use without declaring them as parameters.
SHADER_BUILTINS = frozenset({"op", "template", "variant", "tensors", "out", "outs", "ins", "T", "VEC4", "int8", "dtype"})
IMAGE_TYPES = {"float": ("image3D", "rgba32f"), "int": ("iimage3D", "rgba32i")}
VEC4_TYPES = {"float": "vec4", "int": "ivec4"}


def _env(loader: jinja2.BaseLoader) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=loader,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["pyrepr"] = repr
    return env


def shader_env(shaders_dir: Path) -> jinja2.Environment:
    return _env(jinja2.FileSystemLoader(str(shaders_dir)))


def scan_templates(shaders_dir: Path, out: Collector) -> dict[str, set[str]]:
    """Op templates (shaders/NAME.glsl.j2, not starting with '_') -> the parameters each uses."""
    env = shader_env(shaders_dir)
    result: dict[str, set[str]] = {}
    for path in sorted(shaders_dir.glob("*.glsl.j2")):
        if path.name.startswith("_"):
            continue
        name = path.name[: -len(".glsl.j2")]
        try:
            ast = env.parse(path.read_text(encoding="utf-8"), name=path.name)
        except jinja2.TemplateSyntaxError as exc:
            out.error(f"shaders/{path.name}", exc.lineno or 0, f"template syntax error: {exc.message}")
            continue
        result[name] = set(meta.find_undeclared_variables(ast)) - SHADER_BUILTINS
    return result


def render_python(layouts: LayoutsModel, ops: OpsModel) -> dict[str, str]:
    env = _env(jinja2.FileSystemLoader(str(TEMPLATES_DIR)))
    variants_of: dict[str, list[str]] = {op.name: [] for op in ops.ops}
    for v in ops.variants:
        variants_of[v.op].append(v.name)
    targets = sorted((t, op.name) for op in ops.ops for t in op.targets)
    return {
        "__init__.py": env.get_template("init.py.j2").render(),
        "layouts.py": env.get_template("layouts.py.j2").render(m=layouts),
        "ops.py": env.get_template("ops.py.j2").render(ops=ops.ops, variants_of=variants_of, targets=targets),
        "variants.py": env.get_template("variants.py.j2").render(axes=ops.axes, variants=ops.variants),
        "glsl/include/layouts.glslh": env.get_template("layouts.glslh.j2").render(layouts=layouts.layouts),
    }


def render_glsl(layouts: LayoutsModel, ops: OpsModel, shaders_dir: Path, out: Collector) -> dict[str, str]:
    env = shader_env(shaders_dir)
    by_name = {op.name: op for op in ops.ops}
    files = {}
    for v in ops.variants:
        op = by_name[v.op]
        try:
            text = env.get_template(f"{v.template}.glsl.j2").render(**_shader_context(v, op, layouts))
        except jinja2.TemplateError as exc:
            line = getattr(exc, "lineno", 0) or 0
            out.error(f"shaders/{v.template}.glsl.j2", line, f"rendering {v.name}: {exc}")
            continue
        files[f"glsl/{v.source}"] = text
    return files


def _shader_context(v: Variant, op, layouts: LayoutsModel) -> dict:
    dtype = layouts.dtype(v.dtype)
    int8 = dtype.family != "float"
    word = "int" if int8 else dtype.glsl
    image, fmt = IMAGE_TYPES[dtype.glsl]
    tensors = [
        {
            "name": b.tensor,
            "binding": b.index,
            "storage": b.storage,
            "access": b.access,
            "qualifier": {"write": "writeonly", "read": "readonly", "readwrite": ""}[b.access],
            "word": word,
            "image": image,
            "format": fmt,
        }
        for b in v.bindings
    ]
    n_out = len(op.outputs)
    return {
        "op": op,
        "template": v.template,
        "variant": v,
        "tensors": tensors,
        "out": tensors[0],
        "outs": tensors[:n_out],
        "ins": tensors[n_out:],
        "T": dtype.glsl,
        "VEC4": VEC4_TYPES[dtype.glsl],
        "int8": int8,
        "dtype": dtype,
        **dict(v.params),
    }
