"""Read and validate ops.yaml into OpSpecs, reporting every problem with its line."""

from __future__ import annotations

import re

from .checks import Checker
from .diagnostics import Collector, did_you_mean
from .model import ArgSpec, LayoutsModel, OpSpec, OutputSpec, ShaderSpec
from .yamlsrc import LMap

TOP_KEYS = ("variant_axes", "dtype_sets", "ops")
OP_KEYS = ("targets", "args", "outputs", "dtypes")
OP_OPTIONAL = ("sync", "flags", "weights", "dim_order", "shader", "doc")
SHADER_KEYS = ("template", "axes")
SHADER_OPTIONAL = ("params", "storage_of", "push", "read_outputs", "target_env")
PUSH_KINDS = ("int", "float", "ivec4")
SCALAR_KINDS = ("float", "int", "bool", "enum", "int_list", "any")
FLAGS = ("identity", "supports_highdim", "supports_resize")
TARGET_RE = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*){1,2}$")
NAME_RE = re.compile(r"^[a-z_][a-z0-9_]*$")
TARGET_ENVS = ("vulkan1.1", "vulkan1.2", "vulkan1.3")


def parse_ops(
    data: LMap, file: str, out: Collector, layouts: LayoutsModel, templates: dict[str, set[str]]
) -> tuple[tuple, tuple, tuple[OpSpec, ...]] | None:
    """Validate ops.yaml. `templates` maps template name -> the parameters it uses.

    Returns (axes, dtype_sets, ops), or None when problems were recorded in `out`.
    """
    c = Checker(file, out)
    before = len(out.items)
    c.keys(data, "ops.yaml", TOP_KEYS)
    axes = _axes(c, data.get("variant_axes"), data.line_of("variant_axes"), layouts)
    dtype_sets = _dtype_sets(c, data.get("dtype_sets"), data.line_of("dtype_sets"), layouts)
    ops_raw = c.mapping(data.get("ops"), data.line_of("ops"), "'ops'")
    ops: list[OpSpec] = []
    seen_targets: dict[str, tuple[str, int]] = {}
    if ops_raw is not None:
        for name, body in ops_raw.items():
            op = _op(c, name, body, ops_raw.line_of(name), layouts, dict(axes), dict(dtype_sets), templates)
            if op is None:
                continue
            for t in op.targets:
                if t in seen_targets:
                    other, oline = seen_targets[t]
                    c.error(op.line, f"op '{name}': target '{t}' is already implemented by op '{other}' (line {oline})")
                else:
                    seen_targets[t] = (name, op.line)
            ops.append(op)
    if len(out.items) != before:
        return None
    return tuple(axes), tuple(dtype_sets), tuple(sorted(ops, key=lambda o: o.name))


def _axes(c: Checker, raw, line: int, layouts: LayoutsModel):
    m = c.mapping(raw, line, "'variant_axes'")
    result = []
    if m is None:
        return result
    storages = [s.glsl for s in layouts.storages]
    dtypes = [d.name for d in layouts.dtypes]
    for name, values in m.items():
        vals = c.listing(values, m.line_of(name), f"variant axis '{name}'")
        if vals is None:
            continue
        universe = dtypes if name == "dtype" else storages
        for i, v in enumerate(vals):
            c.name_in(v, universe, vals.line_of(i), "dtype" if name == "dtype" else "storage")
        result.append((name, tuple(str(v) for v in vals)))
    if "dtype" not in m:
        c.error(m.line, "variant_axes must declare the 'dtype' axis")
    return result


def _dtype_sets(c: Checker, raw, line: int, layouts: LayoutsModel):
    m = c.mapping(raw, line, "'dtype_sets'")
    result = []
    if m is None:
        return result
    dtypes = [d.name for d in layouts.dtypes]
    for name, values in m.items():
        vals = c.listing(values, m.line_of(name), f"dtype set '{name}'")
        if vals is not None and all(c.name_in(v, dtypes, vals.line_of(i), "dtype") for i, v in enumerate(vals)):
            result.append((name, tuple(vals)))
    return result


def _op(c: Checker, name, body, line, layouts, axes, dtype_sets, templates) -> OpSpec | None:
    where = f"op '{name}'"
    if not isinstance(name, str) or not NAME_RE.match(name):
        c.error(line, f"op name '{name}' must be lower_snake_case")
        return None
    b = c.mapping(body, line, where)
    if b is None or not c.keys(b, where, OP_KEYS, OP_OPTIONAL):
        return None
    before = len(c.out.items)
    repset_names = [r.name for r in layouts.repsets]

    targets = c.listing(b["targets"], b.line_of("targets"), f"{where} targets") or []
    for i, t in enumerate(targets):
        if not isinstance(t, str) or not TARGET_RE.match(t):
            c.error(targets.line_of(i), f"{where}: target '{t}' must look like namespace.op.overload")
    if not targets:
        c.error(b.line_of("targets"), f"{where} needs at least one target")

    args = _args(c, where, b["args"], b.line_of("args"), repset_names)
    outputs = []
    outs = c.mapping(b["outputs"], b.line_of("outputs"), f"{where} outputs")
    if outs is not None:
        if not outs:
            c.error(outs.line, f"{where} needs at least one output")
        for oname, rep in outs.items():
            if c.name_in(rep, repset_names, outs.line_of(oname), "repset"):
                outputs.append(OutputSpec(str(oname), rep, outs.line_of(oname)))
    tensor_names = [a.name for a in args if a.is_tensor] + [o.name for o in outputs]
    for o in outputs:
        if o.name in [a.name for a in args]:
            c.error(o.line, f"{where}: output '{o.name}' has the name of an argument")

    sync = []
    if "sync" in b:
        groups = c.listing(b["sync"], b.line_of("sync"), f"{where} sync")
        for gi, group in enumerate(groups or []):
            g = c.listing(group, groups.line_of(gi), f"{where} sync group")
            if g is None:
                continue
            for i, member in enumerate(g):
                if member not in tensor_names:
                    scalar = any(a.name == member for a in args)
                    reason = "is not a tensor" if scalar else "names no argument or output"
                    c.error(g.line_of(i), f"{where}: sync group member '{member}' {reason}"
                            f"{'' if scalar else did_you_mean(member, tensor_names)}")
            if len(g) < 2:
                c.error(groups.line_of(gi), f"{where}: a sync group needs at least two tensors")
            sync.append(tuple(str(x) for x in g))

    dtypes = _op_dtypes(c, where, b["dtypes"], b.line_of("dtypes"), dtype_sets, layouts)
    flags = []
    if "flags" in b:
        fl = c.listing(b["flags"], b.line_of("flags"), f"{where} flags") or []
        for i, f in enumerate(fl):
            if c.name_in(f, FLAGS, fl.line_of(i), "flag"):
                flags.append(f)
    weights = []
    if "weights" in b:
        wl = c.listing(b["weights"], b.line_of("weights"), f"{where} weights") or []
        for i, w in enumerate(wl):
            if w not in [a.name for a in args if a.is_tensor]:
                c.error(wl.line_of(i), f"{where}: weight '{w}' is not a tensor argument")
            weights.append(str(w))
    dim_order = None
    if "dim_order" in b and b["dim_order"] is not None:
        do = c.listing(b["dim_order"], b.line_of("dim_order"), f"{where} dim_order")
        if do is not None and sorted(do) != list(range(len(do))):
            c.error(b.line_of("dim_order"), f"{where}: dim_order must be a permutation of 0..{len(do) - 1}")
        dim_order = tuple(do or ())
    if "identity" in flags and (len(outputs) != 1 or len([a for a in args if a.is_tensor]) != 1):
        c.error(b.line_of("flags"), f"{where}: an identity op takes one tensor and returns one")

    shader = None
    if "shader" in b:
        storages = sorted({v for k, vals in axes.items() if k != "dtype" for v in vals})
        shader = _shader(c, where, b["shader"], b.line_of("shader"), axes, templates, args, tensor_names, storages,
                         [o.name for o in outputs])
    if len(c.out.items) != before:
        return None
    return OpSpec(
        name=name,
        targets=tuple(targets),
        args=tuple(args),
        outputs=tuple(outputs),
        sync=tuple(sync),
        dtypes=dtypes,
        flags=tuple(sorted(flags)),
        weights=tuple(weights),
        dim_order=dim_order,
        shader=shader,
        doc=str(b.get("doc", "")),
        line=line,
    )


def _args(c: Checker, where, raw, line, repset_names) -> list[ArgSpec]:
    m = c.mapping(raw, line, f"{where} args")
    result: list[ArgSpec] = []
    if m is None:
        return result
    for aname, spec in m.items():
        aw = f"{where} arg '{aname}'"
        s = c.mapping(spec, m.line_of(aname), aw)
        if s is None:
            continue
        if "tensor" in s or "tensor_list" in s:
            key = "tensor" if "tensor" in s else "tensor_list"
            if c.keys(s, aw, (key,), ("optional",)) and c.name_in(s[key], repset_names, s.line_of(key), "repset"):
                result.append(ArgSpec(str(aname), key, repset=s[key], optional=bool(s.get("optional", False)),
                                      line=m.line_of(aname)))
            continue
        if not c.keys(s, aw, ("kind",), ("optional", "default", "values")):
            continue
        kind = s["kind"]
        if not c.name_in(kind, SCALAR_KINDS, s.line_of("kind"), "argument kind"):
            continue
        values: tuple[str, ...] = ()
        if kind == "enum":
            vl = c.listing(s.get("values"), s.line_of("values") if "values" in s else s.line, f"{aw} values")
            values = tuple(str(v) for v in vl or ())
            if "default" in s and s["default"] not in values:
                c.error(s.line_of("default"), f"{aw}: default '{s['default']}' is not one of {list(values)}")
        elif "values" in s:
            c.error(s.line_of("values"), f"{aw}: only enum arguments take 'values'")
        default = s.get("default")
        if kind == "float" and default is not None and not isinstance(default, (int, float)):
            c.error(s.line_of("default"), f"{aw}: default must be a number")
        result.append(ArgSpec(str(aname), kind, optional=bool(s.get("optional", False)), default=default,
                              values=values, line=m.line_of(aname)))
    return result


def _op_dtypes(c: Checker, where, raw, line, dtype_sets, layouts) -> tuple[str, ...]:
    if isinstance(raw, str):
        if c.name_in(raw, list(dtype_sets), line, "dtype set"):
            return dtype_sets[raw]
        return ()
    items = c.listing(raw, line, f"{where} dtypes")
    names = [d.name for d in layouts.dtypes]
    return tuple(d for i, d in enumerate(items or []) if c.name_in(d, names, items.line_of(i), "dtype"))


def _shader(c: Checker, where, raw, line, axes, templates, args, tensor_names, storages, outputs) -> ShaderSpec | None:
    sw = f"{where} shader"
    s = c.mapping(raw, line, sw)
    if s is None or not c.keys(s, sw, SHADER_KEYS, SHADER_OPTIONAL):
        return None
    ok = True
    template = s["template"]
    if not c.name_in(template, sorted(templates), s.line_of("template"), "shader template"):
        return None
    axl = c.listing(s["axes"], s.line_of("axes"), f"{sw} axes") or []
    for i, a in enumerate(axl):
        ok &= c.name_in(a, list(axes), axl.line_of(i), "variant axis")
    if "dtype" not in axl:
        c.error(s.line_of("axes"), f"{sw}: axes must include 'dtype'")
        ok = False
    storage_of = {}
    if "storage_of" in s:
        so = c.mapping(s["storage_of"], s.line_of("storage_of"), f"{sw} storage_of") or {}
        for t, ax in so.items():
            if t not in tensor_names:
                c.error(so.line_of(t), f"{sw}: storage_of names '{t}', which is no tensor{did_you_mean(t, tensor_names)}")
                ok = False
            fixed = ax in storages
            if not fixed and (ax not in axl or ax == "dtype"):
                c.error(so.line_of(t), f"{sw}: storage_of '{ax}' is neither a storage ({', '.join(storages)}) "
                        f"nor a storage axis of this shader")
                ok = False
            storage_of[str(t)] = str(ax)
    for t in tensor_names:
        if t not in storage_of:
            if "storage" not in axl:
                c.error(s.line_of("axes"), f"{sw}: tensor '{t}' has no storage axis (add 'storage' or storage_of)")
                ok = False
            storage_of[t] = "storage"
    params = s.get("params") or LMap()
    pm = c.mapping(params, s.line_of("params") if "params" in s else s.line, f"{sw} params")
    needed = templates[template]
    if pm is not None:
        for p in pm:
            if p not in needed:
                c.error(pm.line_of(p), f"{sw}: template '{template}' has no parameter '{p}'"
                        f"{did_you_mean(p, needed)}")
                ok = False
            elif not isinstance(pm[p], str):
                c.error(pm.line_of(p), f"{sw}: parameter '{p}' must be a string of GLSL")
                ok = False
        for p in sorted(needed - set(pm)):
            c.error(s.line_of("params"), f"{sw}: template '{template}' needs parameter '{p}'")
            ok = False
    push = []
    if "push" in s:
        pm2 = c.mapping(s["push"], s.line_of("push"), f"{sw} push") or {}
        arg_names = [a.name for a in args]
        for pname, pkind in pm2.items():
            if pname in arg_names or pname in tensor_names:
                c.error(pm2.line_of(pname), f"{sw}: push constant '{pname}' has the name of an argument")
                ok = False
            elif not c.name_in(pkind, PUSH_KINDS, pm2.line_of(pname), "push constant type"):
                ok = False
            push.append((str(pname), str(pkind)))
    read_outputs = []
    if "read_outputs" in s:
        ro = c.listing(s["read_outputs"], s.line_of("read_outputs"), f"{sw} read_outputs") or []
        for i, o in enumerate(ro):
            if c.name_in(o, outputs, ro.line_of(i), "output"):
                read_outputs.append(str(o))
    env = s.get("target_env", "vulkan1.1")
    if env not in TARGET_ENVS:
        c.error(s.line_of("target_env"), f"{sw}: target_env must be one of {', '.join(TARGET_ENVS)}")
        ok = False
    if not ok:
        return None
    return ShaderSpec(
        template=template,
        axes=tuple(a for a in axes if a in axl),  # global axis order
        params=tuple(sorted((str(k), str(v)) for k, v in (pm or {}).items())),
        storage_of=tuple(sorted(storage_of.items())),
        push=tuple(push),
        read_outputs=tuple(read_outputs),
        target_env=env,
        line=line,
    )


