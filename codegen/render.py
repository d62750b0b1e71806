"""Render the generated tree (Python modules and GLSL) from the validated models, in memory."""

from __future__ import annotations

import functools
from pathlib import Path

import jinja2
from jinja2 import meta

from .diagnostics import Collector
from .model import LayoutsModel, OpsModel, Variant
from .variants import TEXEL_DESCRIPTOR

TEMPLATES_DIR = Path(__file__).parent / "templates"
# Names every shader template may use without declaring them as parameters.
SHADER_BUILTINS = frozenset({"op", "template", "variant", "axis", "tensors", "out", "outs", "ins", "T", "VEC4", "int8",
                             "dtype", "extensions"})


def _env(loader: jinja2.BaseLoader) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=loader,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["pyrepr"] = py_literal
    return env


def py_literal(value) -> str:
    """repr() that stays valid Python for infinities and NaN inside tuples and lists."""
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return f"float({repr(value)!r})"
    if isinstance(value, tuple):
        inner = ", ".join(py_literal(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, list):
        return "[" + ", ".join(py_literal(v) for v in value) + "]"
    return repr(value)


def shader_env(shaders_dir: Path) -> jinja2.Environment:
    """Shader templates render with `#line` markers back to shaders/NAME.glsl.j2 (see glsl_lines)."""
    from . import glsl_lines

    return glsl_lines.install(_env(jinja2.FileSystemLoader(str(shaders_dir))), prefix="shaders/")


def scan_templates(shaders_dir: Path, out: Collector) -> dict:
    """Op templates (shaders/NAME.glsl.j2, not starting with '_') -> TemplateInfo: the parameters
    each uses and its contract."""
    from .contracts import parse_contract
    from .ops_schema import TemplateInfo

    env = shader_env(shaders_dir)
    result: dict = {}
    for path in sorted(shaders_dir.glob("*.glsl.j2")):
        if path.name.startswith("_"):
            continue
        name = path.name[: -len(".glsl.j2")]
        text = path.read_text(encoding="utf-8")
        try:
            ast = env.parse(text, name=path.name)
        except jinja2.TemplateSyntaxError as exc:
            out.error(f"shaders/{path.name}", exc.lineno or 0, f"template syntax error: {exc.message}")
            continue
        params = frozenset(set(meta.find_undeclared_variables(ast)) - SHADER_BUILTINS)
        result[name] = TemplateInfo(params, parse_contract(text, f"shaders/{path.name}", out))
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
        "samples.py": env.get_template("samples.py.j2").render(ops=ops.ops),
        "variants.py": env.get_template("variants.py.j2").render(
            axes=ops.axes, choices=ops.choices, variants=ops.variants,
            variant_features=tuple(sorted({f for v in ops.variants for f in v.features}))),
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
    """Template variables of one variant. Each tensor carries the facts of its storage and dtype
    from layouts.yaml (is_buffer / is_image, word, vec4, image, format; its dtype is the variant's
    unless the op's dtype_of fixes it, and T / VEC4 name its GLSL types), so templates never
    compare storage or GLSL type names: a new storage or dtype is a layouts.yaml entry (plus the
    prologue's access functions for a new kind of storage), not an edit of every template."""
    dtype = layouts.dtype(v.dtype)
    int8 = dtype.family != "float"
    tensors = []
    texel = {b.tensor: b.index for b in v.bindings if b.descriptor == TEXEL_DESCRIPTOR}
    rounded = {value for s in v.spec_constants if s.rule == "round_bfloat16" for key, value in s.params
               if key == "round_bfloat16"}
    for b in v.bindings:
        if b.descriptor == TEXEL_DESCRIPTOR:
            continue  # a buffer input's texel binding: its tensor's `texel` below
        storage = layouts.storage_by_axis(b.storage)
        own = layouts.dtype(op.tensor_dtype(b.tensor, v.dtype))  # the variant's, or fixed by dtype_of
        same = own.name == dtype.name
        # a float32 tensor the contract's `round_bfloat16` shape class names: every store of it
        # goes through tf_bf16_out (_prologue.glsl.j2), which rounds when a bfloat16 program asks
        rounds = own.name == "float32" and b.tensor in rounded
        to_word = "tf_bf16_out" if rounds else _to_word(own)
        tensors.append({
            "name": b.tensor,
            "binding": b.index,
            "storage": b.storage,  # the axis name, for comments
            "is_buffer": not storage.is_image,
            "is_image": storage.is_image,
            "access": b.access,
            # the binding of its uniform texel buffer (samplerBuffer tb_<name>), or None: a buffer
            # input of a template whose contract lists it in texel_reads
            "texel": texel.get(b.tensor),
            "qualifier": {"write": "writeonly", "read": "readonly", "readwrite": ""}[b.access],
            "dtype": own.name,
            "int8": own.family != "float",  # int8x4: 4 lanes per 32-bit word, read with bitfieldExtract
            "word": own.glsl,  # a buffer element (int8: a word of 4 lanes, also an int)
            "vec4": own.vec4,
            "image": own.image_type(storage),  # None in buffers
            "format": own.image_format,
            # the element and texel types a shader computes in: the T / VEC4 macros for the
            # variant's dtype (float16 computes in float / vec4, docs/precision.md)
            "T": "T" if same else _compute(own),
            "VEC4": "VEC4" if same else _compute_vec4(own),
            # what turns a computed value into a stored buffer element ("tf_to_float16" where the
            # storage is narrower than the arithmetic, else nothing), and the store expression:
            # `t_out[u] = {{ out.as_word("v") }};` renders `v`, or `tf_to_float16(v)` for float16
            "to_word": to_word,
            "as_word": functools.partial(_as_word, to_word),
            # what turns a computed VEC4 into a stored texel or buffer vec4: the same rounding
            # function for float16 (or bfloat16's), else the vec4 type's constructor (`vec4(v)`)
            "store4": to_word or own.vec4,
            "rounds_bf16": rounds,
        })
    n_out = len(op.outputs)
    return {
        "op": op,
        "template": v.template,
        "variant": v,
        "axis": dict(v.axes),  # the variant's value of each axis: `axis.int_dot == "dot4x8"`
        "tensors": tensors,
        "out": tensors[0],
        "outs": tensors[:n_out],
        "ins": tensors[n_out:],
        "T": _compute(dtype),
        "VEC4": _compute_vec4(dtype),
        "int8": int8,
        "dtype": dtype,
        # GLSL extensions of every tensor's dtype (a cast's float16 out in a float32 variant too)
        "extensions": list(dict.fromkeys(e for d in [dtype.name, *(t["dtype"] for t in tensors)]
                                         for e in layouts.dtype(d).extensions)),
        **dict(v.params),
    }


def _to_word(dtype) -> str:
    """Nothing where a dtype is stored as it computes; for a narrower storage (float16, computed in
    float) `tf_to_<dtype>` (shaders/include/math.glslh), which rounds to nearest even itself
    rather than trusting the device's conversion."""
    return f"tf_to_{dtype.name}" if dtype.glsl != _compute(dtype) else ""


def _as_word(to_word: str, expr: str) -> str:
    return f"{to_word}({expr})" if to_word else expr


def _compute(dtype) -> str:
    """The scalar type shaders compute a dtype in (its stored type unless layouts.yaml says)."""
    return dtype.compute or dtype.glsl


def _compute_vec4(dtype) -> str:
    return dtype.compute_vec4 or dtype.vec4
