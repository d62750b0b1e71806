"""Read and validate ops.yaml into OpSpecs, reporting every problem with its line.

An entry is merged over its class (and the class's bases), its arguments are taken from torch's
schema of its first target, and the result is checked against the contract of its template.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass

from texelflow.shaders.node_rules import CHECK_RULES, PUSH_RULES

from . import torch_schema
from .checks import Checker
from .contracts import Contract, contract_span, contract_texel_reads, resolve_spec
from .diagnostics import Collector, did_you_mean
from .layouts_schema import KNOWN_FEATURES
from .model import ArgSpec, CheckSpec, LayoutsModel, OpSpec, OutputSpec, PushSpec, ShaderSpec
from .yamlsrc import LList, LMap

TOP_KEYS = ("variant_axes", "dtype_sets", "classes", "ops")
ENTRY_KEYS = ("class", "targets", "schema", "tensors", "args", "outputs", "sync", "dtypes", "dtype_of", "flags", "weights",
              "dim_order", "push", "checks", "samples", "sample_values", "shader", "doc")
REQUIRED = ("targets", "outputs", "dtypes")
CLASS_KEYS = tuple(k for k in ENTRY_KEYS if k not in ("targets", "schema", "class")) + ("base",)
SHADER_KEYS = ("template", "axes", "params", "storage_of", "target_env")
ARG_KEYS = ("values", "kind", "default", "optional")
PUSH_TYPES = ("int", "float", "ivec4")
FLAGS = ("identity", "supports_highdim")
TARGET_RE = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*){2}$")
NAME_RE = re.compile(r"^[a-z_][a-z0-9_]*$")
POSITION_RE = re.compile(r"^in(\d+)$")
TARGET_ENVS = ("vulkan1.1", "vulkan1.2", "vulkan1.3")
SPECIAL_FLOATS = {"inf": math.inf, "-inf": -math.inf, "+inf": math.inf}


@dataclass(frozen=True)
class TemplateInfo:
    params: frozenset[str]  # parameters the template uses
    contract: Contract


def parse_ops(data: LMap, file: str, out: Collector, layouts: LayoutsModel, templates: dict[str, TemplateInfo],
              hooks: dict[str, tuple[str, int]]) -> tuple[tuple, tuple, tuple, tuple[OpSpec, ...]] | None:
    """Validate ops.yaml. `hooks`: hook name -> (type, line in shaders/hooks.py).

    Returns (axes, choices, dtype_sets, ops), or None when problems were recorded in `out`.
    """
    c = Checker(file, out)
    before = len(out.items)
    c.keys(data, "ops.yaml", ("variant_axes", "dtype_sets", "ops"), ("classes",))
    axes, choices = _axes(c, data.get("variant_axes"), data.line_of("variant_axes"), layouts)
    dtype_sets = _dtype_sets(c, data.get("dtype_sets"), data.line_of("dtype_sets"), layouts)
    classes = _classes(c, data.get("classes", LMap()), data.line_of("classes"))
    ops_raw = c.mapping(data.get("ops"), data.line_of("ops"), "'ops'")
    if ops_raw is None or classes is None:
        return None
    entries = {}
    for name, body in ops_raw.items():
        line = ops_raw.line_of(name)
        if not isinstance(name, str) or not NAME_RE.match(name):
            c.error(line, f"op name '{name}' must be lower_snake_case")
            continue
        merged = _merge_entry(c, name, body, line, classes)
        if merged is not None:
            entries[name] = merged
    schemas = _schemas(c, entries)
    ctx = _Context(c, layouts, dict(axes), dict(choices), dict(dtype_sets), templates, hooks, schemas)
    ops: list[OpSpec] = []
    seen_targets: dict[str, tuple[str, int]] = {}
    for name, b in entries.items():
        op = ctx.op(name, b)
        if op is None:
            continue
        for t in op.targets:
            if t in seen_targets:
                other, oline = seen_targets[t]
                c.error(op.line, f"op '{name}': target '{t}' is already implemented by op '{other}' (line {oline})")
            else:
                seen_targets[t] = (name, op.line)
        ops.append(op)
    used = {dict(p.params)["hook"] for op in ops for p in op.push if p.rule == "hook"}
    for hname, (_, hline) in sorted(hooks.items()):
        if hname not in used and len(out.items) == before:
            out.error("shaders/hooks.py", hline, f"hook '{hname}' is declared by no op or template contract; "
                      "remove it or name it in a `{hook: ...}` push derivation")
    if len(out.items) != before:
        return None
    return tuple(axes), tuple(choices), tuple(dtype_sets), tuple(sorted(ops, key=lambda o: o.name))


# ---- variant axes, dtype sets, classes ----------------------------------------------------------------
def _axes(c: Checker, raw, line: int, layouts: LayoutsModel):
    """(axes, choices): every axis with its values in order, and each choice axis's value -> the
    device features it requires. A choice axis (a mapping) picks a code path of one template; its
    values are in order of preference and the last must need no feature, so every device has one."""
    m = c.mapping(raw, line, "'variant_axes'")
    result, choices = [], []
    if m is None:
        return result, choices
    storages = [s.axis for s in layouts.storages]
    dtypes = [d.name for d in layouts.dtypes]
    for name, values in m.items():
        if isinstance(values, LMap) and name != "dtype":
            choice = _choice_axis(c, name, values)
            if choice:
                result.append((name, tuple(v for v, _ in choice)))
                choices.append((name, choice))
            continue
        vals = c.listing(values, m.line_of(name), f"variant axis '{name}'")
        if vals is None:
            continue
        universe = dtypes if name == "dtype" else storages
        for i, v in enumerate(vals):
            c.name_in(v, universe, vals.line_of(i), "dtype" if name == "dtype" else "storage")
        result.append((name, tuple(str(v) for v in vals)))
    if "dtype" not in m:
        c.error(m.line, "variant_axes must declare the 'dtype' axis")
    return result, choices


def _choice_axis(c: Checker, name: str, values: LMap) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """A choice axis's (value, required device features) pairs, in order of preference."""
    result = []
    for value, features in values.items():
        where = f"variant axis '{name}' value '{value}'"
        if not isinstance(value, str) or not NAME_RE.match(value):
            c.error(values.line_of(value), f"{where} must be lower_snake_case (it becomes part of variant names)")
            continue
        fl = c.listing(features, values.line_of(value), f"{where} (the device features it requires)")
        if fl is None:
            continue
        if all(c.name_in(f, KNOWN_FEATURES, fl.line_of(i), "device feature") for i, f in enumerate(fl)):
            result.append((value, tuple(str(f) for f in fl)))
    if result and result[-1][1]:
        c.error(values.line_of(result[-1][0]), f"variant axis '{name}': its last value '{result[-1][0]}' must "
                "require no device feature (the fallback every device runs); add one like `plain: []`")
    return tuple(result)


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


def _classes(c: Checker, raw, line: int) -> dict[str, LMap] | None:
    """Class name -> its body merged over its bases."""
    m = c.mapping(raw, line, "'classes'")
    if m is None:
        return None
    bodies = {}
    for name, body in m.items():
        b = c.mapping(body, m.line_of(name), f"class '{name}'")
        if b is not None and c.keys(b, f"class '{name}'", (), CLASS_KEYS):
            bodies[name] = b
    resolved: dict[str, LMap] = {}

    def resolve(name: str, chain: tuple[str, ...]) -> LMap | None:
        if name in resolved:
            return resolved[name]
        body = bodies.get(name)
        if body is None:
            return None
        base = body.get("base")
        if base is None:
            resolved[name] = body
            return body
        if base in chain:
            c.error(body.line_of("base"), f"class '{name}': base classes form a cycle ({' -> '.join(chain + (base,))})")
            return None
        if base not in m:
            c.error(body.line_of("base"), f"class '{name}': unknown base class '{base}'{did_you_mean(base, list(m))}")
            return None
        parent = resolve(base, chain + (base,))
        if parent is None:
            return None
        resolved[name] = merge(parent, body)
        return resolved[name]

    for name in bodies:
        resolve(name, (name,))
    return resolved


def merge(base: LMap, over: LMap) -> LMap:
    """`over` on top of `base`: mappings merge key by key, anything else replaces; lines kept."""
    out = LMap()
    out.line, out.key_lines = over.line, {}
    for src in (base, over):
        for k, v in src.items():
            if k == "base":
                continue
            if isinstance(v, LMap) and isinstance(out.get(k), LMap):
                v = merge(out[k], v)
            out[k] = v
            out.key_lines[k] = src.line_of(k)
    return out


def _merge_entry(c: Checker, name: str, body, line: int, classes: dict[str, LMap]) -> LMap | None:
    where = f"op '{name}'"
    b = c.mapping(body, line, where)
    if b is None or not c.keys(b, where, (), ENTRY_KEYS):
        return None
    if "class" in b:
        cls = classes.get(b["class"])
        if cls is None:
            c.error(b.line_of("class"), f"{where}: unknown class '{b['class']}'{did_you_mean(b['class'], list(classes))}")
            return None
        b = merge(cls, b)
    b.line = line
    ok = True
    for key in REQUIRED:
        if key not in b:
            c.error(line, f"{where} is missing required key '{key}'")
            ok = False
    return b if ok else None


def _schemas(c: Checker, entries: dict[str, LMap]) -> dict[str, object]:
    """torch's schema (or why there is none) for every well-formed target."""
    wanted: dict[str, str | None] = {}
    for name, b in entries.items():
        targets = b.get("targets")
        declared = b.get("schema")
        if declared is not None and not isinstance(declared, str):
            c.error(b.line_of("schema"), f"op '{name}': schema must be a string in torch's schema syntax")
            declared = None
        if isinstance(targets, LList):
            for t in targets:
                if isinstance(t, str) and TARGET_RE.match(t):
                    wanted[t] = declared
    return torch_schema.lookup(wanted) if wanted else {}


# ---- one op -----------------------------------------------------------------------------------------
class _Context:
    def __init__(self, c: Checker, layouts, axes, choices, dtype_sets, templates, hooks, schemas):
        self.c, self.layouts, self.axes, self.dtype_sets = c, layouts, axes, dtype_sets
        self.choices = choices  # choice axis -> ((value, features), ...): not storages
        self.templates, self.hooks, self.schemas = templates, hooks, schemas
        self.repsets = [r.name for r in layouts.repsets]

    def op(self, name: str, b: LMap) -> OpSpec | None:
        c = self.c
        where = f"op '{name}'"
        before = len(c.out.items)
        targets = c.listing(b["targets"], b.line_of("targets"), f"{where} targets") or LList()
        schemas = []
        for i, t in enumerate(targets):
            if not isinstance(t, str) or not TARGET_RE.match(t):
                c.error(targets.line_of(i), f"{where}: target '{t}' must look like namespace.op.overload")
                continue
            s = self.schemas.get(t)
            if isinstance(s, str):
                c.error(targets.line_of(i), f"{where}: target '{t}': {s}")
            elif s is not None:
                schemas.append((t, targets.line_of(i), s))
        if not targets:
            c.error(b.line_of("targets"), f"{where} needs at least one target")
        if len(c.out.items) != before or not schemas:
            return None

        outputs = self._outputs(where, b)
        args = self._args(where, b, schemas, outputs)
        if args is None:
            return None
        tensor_names = [a.name for a in args if a.is_tensor] + [o.name for o in outputs]
        refs = _Refs([a.name for a in args if a.is_tensor], [o.name for o in outputs])
        sync = self._sync(where, b, refs, args)
        dtypes = self._dtypes(where, b["dtypes"], b.line_of("dtypes"))
        dtype_of = self._dtype_of(where, b, refs, dtypes)
        flags = self._names(b, "flags", FLAGS, "flag", where)
        weights = []
        if "weights" in b:
            wl = c.listing(b["weights"], b.line_of("weights"), f"{where} weights") or []
            for i, w in enumerate(wl):
                if w not in [a.name for a in args if a.is_tensor]:
                    c.error(wl.line_of(i), f"{where}: weight '{w}' is not a tensor argument")
                weights.append(str(w))
        dim_order = self._dim_order(where, b, refs, weights)
        if "identity" in flags and (len(outputs) != 1 or len([a for a in args if a.is_tensor]) != 1):
            c.error(b.line_of("flags"), f"{where}: an identity op takes one tensor and returns one")

        shader, contract = None, None
        if "shader" in b:
            shader, contract = self._shader(where, b["shader"], b.line_of("shader"), tensor_names, outputs)
        push = self._push(where, b, args, contract, refs)
        checks = self._checks(where, b, args, contract, refs)
        grid = ("per_output_unit",)
        if contract is not None:
            self._check_contract(where, b, contract, refs, sync, weights, args, shader)
            g = contract.data.get("grid")
            if isinstance(g, dict) and "per_row" in g:
                grid = ("per_row", str(g["per_row"]))
                if grid[1] not in tensor_names:
                    c.error(b.line_of("shader"), f"{where}: template '{shader.template}' dispatches per row of "
                            f"'{grid[1]}', which is not a tensor of the op ({contract.file}:{contract.line_of('grid')})")
            elif isinstance(g, dict) and ("cooperative" in g or "per_tile" in g):
                grid = (("cooperative", str(g["cooperative"]), int(g["invocations"])) if "cooperative" in g
                        else ("per_tile", str(g["per_tile"]), int(g["width"]), int(g["height"]),
                              int(g.get("planes", 0)), int(g.get("invocations", 1))))
                if grid[1] not in tensor_names:
                    c.error(b.line_of("shader"), f"{where}: template '{shader.template}' dispatches per unit of "
                            f"'{grid[1]}', which is not a tensor of the op ({contract.file}:{contract.line_of('grid')})")
            elif isinstance(g, dict):
                grid = ("per_list_element", str(g["per_list_element"]), g.get("element_units"))
                if not any(a.name == grid[1] and a.kind == "tensor_list" for a in args):
                    c.error(b.line_of("shader"), f"{where}: template '{shader.template}' dispatches per element of "
                            f"the tensor list '{grid[1]}', which the op does not have ({contract.file}:"
                            f"{contract.line_of('grid')})")
        spec, span, texel_reads = (), (), ()
        if contract is not None:  # plan-time shape classes (codegen/contracts.py)
            spec = resolve_spec(contract, lambda r: list(refs.inputs) if r == "inputs" else refs.resolve(r),
                                where, c.out)
            span = contract_span(contract)
            inputs = set(refs.inputs)
            texel_reads = contract_texel_reads(  # `inputs`: every tensor argument the op has
                contract, lambda r: list(refs.inputs) if r == "inputs" else
                (lambda got: got if got and set(got) <= inputs else None)(refs.resolve(r)), where, c.out)
        samples = self._samples(where, b, args, refs)
        sample_values = self._sample_values(where, b, refs)
        if len(c.out.items) != before:
            return None
        return OpSpec(
            name=name, targets=tuple(targets), args=tuple(args), outputs=tuple(outputs), sync=tuple(sync),
            dtypes=dtypes, flags=tuple(sorted(flags)), weights=tuple(weights), push=tuple(push),
            checks=tuple(checks), grid=grid, shader=shader, doc=str(b.get("doc", "")), samples=samples,
            sample_values=sample_values, line=b.line, dtype_of=dtype_of, dim_order=dim_order,
            spec=spec, span=span, texel_reads=texel_reads)

    # ---- arguments from torch's schema ----
    def _args(self, where, b: LMap, schemas, outputs) -> list[ArgSpec] | None:
        c = self.c
        first_target, _, schema = schemas[0]
        tensor_args = [a for a in schema.args if a.kind in ("tensor", "tensor_list")]
        reprs = c.mapping(b.get("tensors", LMap()), b.line_of("tensors"), f"{where} tensors") or LMap()
        repset_of = {}
        for ref, rep in reprs.items():
            name = ref
            m = POSITION_RE.match(str(ref))
            if m:
                idx = int(m.group(1))
                if idx >= len(tensor_args):
                    c.error(reprs.line_of(ref), f"{where}: tensors names '{ref}', but {first_target} has "
                            f"{len(tensor_args)} tensor argument(s)")
                    continue
                name = tensor_args[idx].name
            elif schema.arg(ref) is None or schema.arg(ref).kind not in ("tensor", "tensor_list"):
                names = [a.name for a in tensor_args]
                c.error(reprs.line_of(ref), f"{where}: '{ref}' is no tensor argument of {first_target} "
                        f"(its tensors: {', '.join(names) or 'none'}){did_you_mean(ref, names)}")
                continue
            if c.name_in(rep, self.repsets, reprs.line_of(ref), "repset"):
                repset_of[name] = rep
        refine = c.mapping(b.get("args", LMap()), b.line_of("args"), f"{where} args") or LMap()
        for key in refine:
            sa = schema.arg(key)
            if sa is None:
                names = [a.name for a in schema.args]
                c.error(refine.line_of(key), f"{where}: arg '{key}' is not an argument of {first_target} "
                        f"(its schema: {', '.join(names)}){did_you_mean(key, names)}")
        result: list[ArgSpec] = []
        for sa in schema.args:
            line = refine.line_of(sa.name) if sa.name in refine else b.line
            if sa.kind in ("tensor", "tensor_list"):
                if sa.name not in repset_of:
                    c.error(b.line_of("tensors") if "tensors" in b else b.line,
                            f"{where}: tensor argument '{sa.name}' of {first_target} needs a repset in `tensors`")
                    continue
                result.append(ArgSpec(sa.name, sa.kind, repset=repset_of[sa.name], optional=sa.optional,
                                      has_default=sa.has_default, line=line))
                continue
            kind, values, default = sa.kind, (), sa.default
            if sa.name in refine:
                kind, values = self._refine(where, refine, sa, first_target)
            if kind == "float" and isinstance(default, (int, float)) and not isinstance(default, bool):
                default = float(default)
            result.append(ArgSpec(sa.name, kind, optional=sa.optional, default=default, values=values,
                                  has_default=sa.has_default, line=line))
        for t, line, other in schemas[1:]:
            self._same_args(where, t, line, other, result, first_target)
            # An argument some target lacks (squeeze.default has no `dim`) may be absent: optional.
            result = [a if other.arg(a.name) is not None else dataclasses.replace(a, optional=True) for a in result]
        for t, line, s in schemas:
            if s.returns != len(outputs):
                c.error(line, f"{where}: {t} returns {s.returns} tensor(s), but the op declares {len(outputs)} "
                        f"output(s)")
        return result

    def _refine(self, where, refine: LMap, sa, target) -> tuple[str, tuple[str, ...]]:
        c = self.c
        aw = f"{where} arg '{sa.name}'"
        s = c.mapping(refine[sa.name], refine.line_of(sa.name), aw)
        if s is None or not c.keys(s, aw, (), ARG_KEYS):
            return sa.kind, ()
        kind, values = sa.kind, ()
        if "default" in s and not _same_value(s["default"], sa.default if sa.has_default else None):
            shown = repr(sa.default) if sa.has_default else "no default"
            c.error(s.line_of("default"), f"{aw}: default {s['default']!r} disagrees with torch's schema of "
                    f"{target} ({sa.torch_type} {sa.name}: {shown}); drop it, the schema's is used")
        if "optional" in s and bool(s["optional"]) != sa.optional:
            c.error(s.line_of("optional"), f"{aw}: optional: {s['optional']} disagrees with torch's schema of "
                    f"{target} ({sa.torch_type})")
        if "values" in s:
            vl = c.listing(s["values"], s.line_of("values"), f"{aw} values")
            if sa.kind != "str":
                c.error(s.line_of("values"), f"{aw}: only str arguments take 'values' (torch says {sa.torch_type})")
            elif vl is not None:
                values = tuple(str(v) for v in vl)
                kind = "enum"
                if sa.has_default and sa.default not in values:
                    c.error(s.line_of("values"), f"{aw}: torch's default '{sa.default}' is not one of {list(values)}")
        if "kind" in s:
            if s["kind"] != "any":
                c.error(s.line_of("kind"), f"{aw}: kind comes from torch's schema ({sa.torch_type}); only "
                        f"`kind: any` (targets disagree on it) may be declared")
            else:
                kind = "any"
        return kind, values

    def _same_args(self, where, target, line, schema, args: list[ArgSpec], first) -> None:
        """Every argument of another target must be one of the op's, in order, of the same kind."""
        names = [a.name for a in args]
        pos = -1
        for sa in schema.args:
            if sa.name not in names:
                self.c.error(line, f"{where}: {target} has argument '{sa.name}', which {first} lacks; "
                             f"targets of one op must share their arguments")
                continue
            i = names.index(sa.name)
            if i < pos:
                self.c.error(line, f"{where}: {target} orders its arguments differently from {first}")
            pos = i
            mine = args[i]
            if mine.kind != "any" and mine.kind != ("enum" if sa.kind == "str" and mine.kind == "enum" else sa.kind):
                self.c.error(line, f"{where}: {target} has {sa.name}: {sa.torch_type}, but {first} has "
                             f"kind {mine.kind}; declare args: {{{sa.name}: {{kind: any}}}}")

    def _outputs(self, where, b: LMap) -> list[OutputSpec]:
        c = self.c
        outputs = []
        outs = c.mapping(b["outputs"], b.line_of("outputs"), f"{where} outputs")
        if outs is not None:
            if not outs:
                c.error(outs.line, f"{where} needs at least one output")
            for oname, rep in outs.items():
                if c.name_in(rep, self.repsets, outs.line_of(oname), "repset"):
                    outputs.append(OutputSpec(str(oname), rep, outs.line_of(oname)))
        return outputs

    def _sync(self, where, b: LMap, refs: "_Refs", args) -> list[tuple[str, ...]]:
        c = self.c
        sync = []
        if "sync" not in b:
            return sync
        groups = c.listing(b["sync"], b.line_of("sync"), f"{where} sync")
        for gi, group in enumerate(groups or []):
            g = c.listing(group, groups.line_of(gi), f"{where} sync group")
            if g is None:
                continue
            members: list[str] = []
            for i, member in enumerate(g):
                names = refs.resolve(member)
                if names is None:
                    scalar = any(a.name == member for a in args)
                    reason = "is not a tensor" if scalar else "names no argument or output"
                    c.error(g.line_of(i), f"{where}: sync group member '{member}' {reason}"
                            f"{'' if scalar else did_you_mean(member, refs.names)}")
                    continue
                members += [n for n in names if n not in members]
            if len(g) < 2:
                c.error(groups.line_of(gi), f"{where}: a sync group needs at least two tensors")
            sync.append(tuple(members))
        return sync

    def _dtypes(self, where, raw, line) -> tuple[str, ...]:
        c = self.c
        if isinstance(raw, str):
            if c.name_in(raw, list(self.dtype_sets), line, "dtype set"):
                return self.dtype_sets[raw]
            return ()
        items = c.listing(raw, line, f"{where} dtypes")
        names = [d.name for d in self.layouts.dtypes]
        return tuple(d for i, d in enumerate(items or []) if c.name_in(d, names, items.line_of(i), "dtype"))

    def _dtype_of(self, where, b: LMap, refs: "_Refs", dtypes) -> tuple[tuple[str, str], ...]:
        """`dtype_of: {TENSOR: DTYPE}`: tensors whose dtype is fixed, whatever the variant's."""
        c = self.c
        if "dtype_of" not in b:
            return ()
        m = c.mapping(b["dtype_of"], b.line_of("dtype_of"), f"{where} dtype_of") or LMap()
        names = [d.name for d in self.layouts.dtypes]
        fixed: dict[str, str] = {}
        for ref, d in m.items():
            tensors = refs.resolve(ref)
            if not tensors:
                c.error(m.line_of(ref), f"{where}: dtype_of names '{ref}', which is no tensor of the op"
                        f"{did_you_mean(str(ref), refs.names)}")
            elif c.name_in(d, names, m.line_of(ref), "dtype"):
                fixed.update((t, str(d)) for t in tensors)
        if fixed and set(fixed) >= set(refs.names):
            c.error(b.line_of("dtype_of"), f"{where}: dtype_of fixes every tensor, so `dtypes` would choose "
                    f"nothing; list the dtype in `dtypes` instead")
        return tuple(sorted(fixed.items()))

    def _dim_order(self, where, b: LMap, refs: "_Refs", weights) -> tuple[tuple[str, tuple[int, ...]], ...]:
        """`dim_order: {TENSOR: [d0, d1, ...]}`: the torch dim order the kernel computes a tensor in
        (its torch tensor is `permute(order)` of the model's); lowering inserts the permutes."""
        c = self.c
        if "dim_order" not in b:
            return ()
        m = c.mapping(b["dim_order"], b.line_of("dim_order"), f"{where} dim_order") or LMap()
        orders: dict[str, tuple[int, ...]] = {}
        for ref, order in m.items():
            tensors = refs.resolve(ref)
            line = m.line_of(ref)
            if not tensors:
                c.error(line, f"{where}: dim_order names '{ref}', which is no tensor of the op"
                        f"{did_you_mean(str(ref), refs.names)}")
                continue
            if any(t in weights for t in tensors):
                c.error(line, f"{where}: dim_order names weight '{ref}'; prepack the weight in the kernel's order "
                        f"instead (a derived constant)")
                continue
            if not (isinstance(order, list) and order and all(type(d) is int for d in order)
                    and sorted(order) == list(range(len(order)))):
                c.error(line, f"{where}: dim_order of '{ref}' must be a permutation of 0 .. rank - 1, found {order!r}")
                continue
            if order == sorted(order):
                c.error(line, f"{where}: dim_order of '{ref}' is the identity {order}; leave the tensor out")
                continue
            orders.update((t, tuple(order)) for t in tensors)
        return tuple(sorted(orders.items()))

    def _names(self, b: LMap, key: str, choices, what: str, where: str) -> list[str]:
        result = []
        if key in b:
            fl = self.c.listing(b[key], b.line_of(key), f"{where} {key}") or []
            for i, f in enumerate(fl):
                if self.c.name_in(f, choices, fl.line_of(i), what):
                    result.append(str(f))
        return result

    # ---- shader and its template's contract ----
    def _shader(self, where, raw, line, tensor_names, outputs):
        c = self.c
        sw = f"{where} shader"
        s = c.mapping(raw, line, sw)
        if s is None or not c.keys(s, sw, ("template", "axes"), SHADER_KEYS[2:]):
            return None, None
        ok = True
        template = s["template"]
        if not c.name_in(template, sorted(self.templates), s.line_of("template"), "shader template"):
            return None, None
        info = self.templates[template]
        contract = info.contract
        axl = c.listing(s["axes"], s.line_of("axes"), f"{sw} axes") or []
        for i, a in enumerate(axl):
            ok &= c.name_in(a, list(self.axes), axl.line_of(i), "variant axis")
        if "dtype" not in axl:
            c.error(s.line_of("axes"), f"{sw}: axes must include 'dtype'")
            ok = False
        storages = sorted({v for k, vals in self.axes.items() if k != "dtype" and k not in self.choices for v in vals})
        storage_of = {}
        fixed = contract.data.get("storage") or {}
        for t, st in fixed.items():
            storage_of[str(t)] = str(st)
        if "storage_of" in s:
            so = c.mapping(s["storage_of"], s.line_of("storage_of"), f"{sw} storage_of") or {}
            for t, ax in so.items():
                if t not in tensor_names:
                    c.error(so.line_of(t), f"{sw}: storage_of names '{t}', which is no tensor"
                            f"{did_you_mean(t, tensor_names)}")
                    ok = False
                if ax not in storages and (ax not in axl or ax == "dtype" or ax in self.choices):
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
        needed = info.params
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
                c.error(s.line_of("params") if "params" in s else s.line,
                        f"{sw}: template '{template}' needs parameter '{p}'")
                ok = False
        read_outputs = [str(o) for o in contract.data.get("read_outputs") or ()]
        for o in read_outputs:
            if o not in [x.name for x in outputs]:
                c.error(s.line, f"{sw}: template '{template}' reads output '{o}', which the op does not have "
                        f"({contract.file}:{contract.line_of('read_outputs')})")
                ok = False
        env = s.get("target_env", "vulkan1.1")
        if env not in TARGET_ENVS:
            c.error(s.line_of("target_env"), f"{sw}: target_env must be one of {', '.join(TARGET_ENVS)}")
            ok = False
        if not ok:
            return None, contract
        return ShaderSpec(
            template=template,
            axes=tuple(a for a in self.axes if a in axl),  # global axis order
            params=tuple(sorted((str(k), str(v)) for k, v in (pm or {}).items())),
            storage_of=tuple(sorted(storage_of.items())),
            read_outputs=tuple(read_outputs),
            target_env=env,
            line=line,
        ), contract

    def _check_contract(self, where, b, contract: Contract, refs, sync, weights, args, shader) -> None:
        """Refuse an op whose sync groups, weights and repsets break its template's assumptions."""
        c = self.c
        data = contract.data
        at = b.line_of("shader")
        template = shader.template if shader else "?"
        for gi, group in enumerate(data.get("sync") or ()):
            names: list[str] = []
            for member in group:
                resolved = refs.resolve(member)
                if resolved is None:
                    c.error(at, f"{where}: template '{template}' needs tensor '{member}' "
                            f"({contract.file}:{data['sync'].line_of(gi)})")
                    break
                names += resolved
            else:
                if len(names) > 1 and not any(set(names) <= set(g) for g in sync):
                    c.error(b.line_of("sync") if "sync" in b else b.line,
                            f"{where}: template '{template}' assumes {', '.join(names)} share packed-dim info "
                            f"({contract.file}:{data['sync'].line_of(gi)}), but no sync group of the op holds them; "
                            f"add sync: [[{', '.join(names)}]]")
        for w in data.get("weights") or ():
            if w not in weights:
                c.error(b.line_of("weights") if "weights" in b else b.line,
                        f"{where}: template '{template}' reads '{w}' as a prepacked constant "
                        f"({contract.file}:{contract.line_of('weights')}); list it in `weights`")
        for t, storage in (data.get("storage") or {}).items():
            rep = next((a.repset for a in args if a.name == t), None)
            if rep is None:
                c.error(at, f"{where}: template '{template}' binds tensor '{t}', which the op does not have "
                        f"({contract.file}:{contract.line_of('storage')})")
                continue
            sname = self.layouts.storage_by_axis(storage).name
            others = [s for s in self.layouts.repset(rep).storages() if s != sname]
            if others:
                c.error(b.line_of("tensors") if "tensors" in b else at, f"{where}: template '{template}' binds '{t}' as a {storage} "
                        f"({contract.file}:{contract.line_of('storage')}), but its repset {rep} allows "
                        f"{', '.join(others)}")

    # ---- push constants and checks ----
    def _push(self, where, b: LMap, args, contract: Contract | None, refs) -> list[PushSpec]:
        c = self.c
        by_name: dict[str, PushSpec] = {}
        for a in args:
            if a.kind == "tensor" and a.optional:
                by_name[f"has_{a.name}"] = PushSpec(f"has_{a.name}", "int", "present", (("present", a.name),))
        tensor_names = set(refs.names)
        sources = []
        if contract is not None and "push" in contract.data:
            sources.append((contract.data["push"], contract.file, True))
        if "push" in b:
            pm = c.mapping(b["push"], b.line_of("push"), f"{where} push")
            if pm is not None:
                sources.append((pm, None, False))
        required: dict[str, tuple[str, str, int]] = {}
        for pm, file, from_contract in sources:
            for pname, raw in pm.items():
                line = pm.line_of(pname)
                loc = f" ({file}:{line})" if file else ""
                if pname in tensor_names or any(a.name == pname and a.is_tensor for a in args):
                    self._error(file, line, f"{where}: push constant '{pname}' has the name of a tensor{loc}")
                    continue
                if from_contract and raw in PUSH_TYPES:
                    required[pname] = (raw, file, line)
                    continue
                spec = self._derivation(where, pname, raw, args, file, line, tensor_names)
                if spec is not None:
                    by_name[pname] = spec
        for pname, (ptype, file, line) in required.items():
            spec = by_name.get(pname)
            if spec is None:
                c.error(b.line_of("push") if "push" in b else b.line,
                        f"{where}: push constant '{pname}' ({ptype}) of template contract {file}:{line} has no "
                        f"derivation; add push: {{{pname}: ...}}")
            elif spec.type != ptype:
                c.error(b.line_of("push"), f"{where}: push constant '{pname}' derives a {spec.type}, the template "
                        f"wants {ptype} ({file}:{line})")
        return [by_name[k] for k in by_name]

    def _error(self, file, line, message) -> None:
        if file is None:
            self.c.error(line, message)
        else:
            self.c.out.error(file, line, message)

    def _derivation(self, where, pname, raw, args, file, line, tensor_names) -> PushSpec | None:
        """A push derivation (`arg`, or {RULE: ..., params}) checked against the rule vocabulary."""
        pw = f"{where}: push constant '{pname}'"
        if raw == "arg":
            raw = {"arg": pname}
        if not isinstance(raw, dict):
            self._error(file, line, f"{pw} needs a derivation: `arg`, a type for the op to derive, or one of "
                        f"{{{', '.join(sorted(PUSH_RULES))}: ...}}")
            return None
        rules = [k for k in raw if k in PUSH_RULES]
        if len(rules) != 1:
            self._error(file, line, f"{pw}: a derivation names exactly one of {', '.join(sorted(PUSH_RULES))}"
                        f"{did_you_mean(next(iter(raw), ''), PUSH_RULES)}")
            return None
        rule = PUSH_RULES[rules[0]]
        extra = [k for k in raw if k != rule.name]
        for k in extra:
            if k not in rule.required + rule.optional:
                self._error(file, line, f"{pw}: rule '{rule.name}' takes no parameter '{k}'")
                return None
        for k in rule.required:
            if k not in raw:
                self._error(file, line, f"{pw}: rule '{rule.name}' needs parameter '{k}'")
                return None
        by_arg = {a.name: a for a in args}
        params = dict(raw)
        ptype = rule.type

        def need_arg(name, kinds) -> bool:
            a = by_arg.get(name)
            if a is None or (kinds and a.kind not in kinds):
                self._error(file, line, f"{pw}: '{name}' is no {'/'.join(kinds) or ''} argument of the op"
                            f"{did_you_mean(name, by_arg)}")
                return False
            return True

        if rule.name == "arg":
            if not need_arg(raw["arg"], ("float", "int", "bool", "enum")):
                return None
            a = by_arg[raw["arg"]]
            ptype = "float" if a.kind == "float" else "int"
            if a.kind == "enum":
                params["values"] = list(a.values)
            none = raw.get("none")
            if isinstance(none, str):
                if none not in SPECIAL_FLOATS:
                    self._error(file, line, f"{pw}: none must be a number, inf or -inf")
                    return None
                params["none"] = SPECIAL_FLOATS[none]
            if a.optional and "none" not in raw:
                self._error(file, line, f"{pw}: argument '{a.name}' may be None; say what the shader gets then "
                            f"with `none:`")
                return None
        elif rule.name == "present":
            if not need_arg(raw["present"], ("tensor",)):
                return None
        elif rule.name in ("whcn_dim", "dims_mask", "list_offset"):
            kinds = {"whcn_dim": ("int",), "dims_mask": ("int_list",), "list_offset": ("tensor_list",)}[rule.name]
            if not need_arg(raw[rule.name], kinds):
                return None
            if rule.name == "list_offset":
                if not need_arg(raw["dim"], ("int",)):
                    return None
            elif raw["of"] not in tensor_names:
                self._error(file, line, f"{pw}: 'of' names '{raw['of']}', which is no tensor of the op"
                            f"{did_you_mean(raw['of'], tensor_names)}")
                return None
        elif rule.name == "ivec4":
            pieces = raw["ivec4"]
            if not isinstance(pieces, list):
                self._error(file, line, f"{pw}: ivec4 takes a list of pieces")
                return None
            norm, lanes = [], 0
            for piece in pieces:
                if isinstance(piece, int) and not isinstance(piece, bool):
                    norm.append(piece)
                    lanes += 1
                elif isinstance(piece, dict) and "pair" in piece and set(piece) <= {"pair", "default"}:
                    if not need_arg(piece["pair"], ("int_list", "int")):
                        return None
                    d = piece.get("default")
                    if isinstance(d, str) and not need_arg(d, ("int_list", "int")):
                        return None
                    norm.append(("pair", piece["pair"], tuple(d) if isinstance(d, list) else d))
                    lanes += 2
                else:
                    self._error(file, line, f"{pw}: an ivec4 piece is an int or {{pair: ARG, default: ...}}")
                    return None
            if lanes > 4:
                self._error(file, line, f"{pw}: the pieces make {lanes} lanes; an ivec4 has 4")
                return None
            params["ivec4"] = tuple(norm)
        elif rule.name == "hook":
            h = self.hooks.get(raw["hook"])
            if h is None:
                self._error(file, line, f"{pw}: hook '{raw['hook']}' does not exist in shaders/hooks.py"
                            f"{did_you_mean(raw['hook'], self.hooks)}")
                return None
            ptype = h[0]
        return PushSpec(pname, ptype, rule.name, tuple(sorted((k, _freeze(v)) for k, v in params.items())))

    def _checks(self, where, b: LMap, args, contract: Contract | None, refs) -> list[CheckSpec]:
        result = []
        sources = []
        if contract is not None and "checks" in contract.data:
            sources.append((contract.data["checks"], contract.file))
        if "checks" in b:
            sources.append((b["checks"], None))
        by_arg = {a.name for a in args} | set(refs.names)
        for raw, file in sources:
            line = getattr(raw, "line", b.line)
            if not isinstance(raw, list):
                self._error(file, line, f"{where}: checks must be a list")
                continue
            for i, item in enumerate(raw):
                iline = raw.line_of(i) if isinstance(raw, LList) else line
                rules = [k for k in item if k in CHECK_RULES] if isinstance(item, dict) else []
                if len(rules) != 1:
                    self._error(file, iline, f"{where}: a check names exactly one of {', '.join(sorted(CHECK_RULES))}")
                    continue
                rule = CHECK_RULES[rules[0]]
                params = dict(item)
                unknown = [k for k in params if k != rule.name and k not in rule.required + rule.optional]
                missing = [k for k in rule.required if k not in params]
                if unknown or missing:
                    self._error(file, iline, f"{where}: check '{rule.name}' "
                                + (f"takes no parameter '{unknown[0]}'" if unknown else f"needs parameter '{missing[0]}'"))
                    continue
                main = params[rule.name]
                if isinstance(main, list):  # a list of tensors (in0, in1, ... or names): resolved here
                    resolved = [refs.resolve(n) for n in main]
                    bad = [n for n, r in zip(main, resolved) if r is None]
                    if not bad:
                        params[rule.name] = [n for r in resolved for n in r]
                    named = [n for n in params[rule.name] if not bad] + bad + [params["of"]]
                else:
                    named = list(main) if rule.name == "rank" else [main, params["of"]]
                bad = [n for n in named if n not in by_arg]
                if bad:
                    self._error(file, iline, f"{where}: check '{rule.name}' names '{bad[0]}', which the op does "
                                f"not have{did_you_mean(str(bad[0]), by_arg)}")
                    continue
                wrong = [(k, params[k], allowed) for k, allowed in rule.choices if params.get(k) not in allowed]
                if wrong:
                    k, got, allowed = wrong[0]
                    self._error(file, iline, f"{where}: check '{rule.name}' takes {k} one of {', '.join(allowed)}, "
                                f"not '{got}'{did_you_mean(str(got), allowed)}")
                    continue
                result.append(CheckSpec(rule.name, tuple(sorted((k, _freeze(v)) for k, v in params.items()))))
        return result

    # ---- samples for the generic kernel test ----
    def _samples(self, where, b: LMap, args, refs) -> tuple:
        c = self.c
        if "samples" not in b:
            return ()
        raw = c.listing(b["samples"], b.line_of("samples"), f"{where} samples")
        result = []
        by_arg = {a.name: a for a in args}
        for i, item in enumerate(raw or []):
            line = raw.line_of(i)
            m = c.mapping(item, line, f"{where} sample")
            if m is None:
                continue
            sample = {}
            for key, value in m.items():
                names = refs.resolve(key) if key not in by_arg else [key]
                if not names or names[0] not in by_arg:
                    c.error(m.line_of(key), f"{where}: sample names '{key}', which is no argument of the op"
                            f"{did_you_mean(key, by_arg)}")
                    continue
                a = by_arg[names[0]]
                if a.kind == "tensor" and value is not None and not _is_shape(value):
                    c.error(m.line_of(key), f"{where}: sample tensor '{a.name}' must be a shape (a list of ints)")
                    continue
                if a.kind == "tensor_list" and not (isinstance(value, list) and all(_is_shape(v) for v in value)):
                    c.error(m.line_of(key), f"{where}: sample tensor list '{a.name}' must be a list of shapes")
                    continue
                sample[a.name] = _freeze(value)
            for a in args:
                if a.is_tensor and not a.optional and a.name not in sample:
                    c.error(line, f"{where}: sample lacks tensor '{a.name}'")
                elif not a.is_tensor and not a.has_default and a.name not in sample:
                    c.error(line, f"{where}: sample lacks argument '{a.name}' (torch gives it no default)")
            result.append(tuple(sorted(sample.items())))
        return tuple(result)

    def _sample_values(self, where, b: LMap, refs) -> tuple:
        c = self.c
        if "sample_values" not in b:
            return ()
        m = c.mapping(b["sample_values"], b.line_of("sample_values"), f"{where} sample_values") or {}
        result = []
        for key, rng in m.items():
            names = refs.resolve(key)
            if not names:
                c.error(m.line_of(key), f"{where}: sample_values names '{key}', which is no tensor")
                continue
            if not (isinstance(rng, list) and len(rng) == 2 and all(isinstance(x, (int, float)) for x in rng)):
                hint = " (YAML reads 1e38 as a string: write 1.0e+38)" if isinstance(rng, list) and any(
                    isinstance(x, str) for x in rng) else ""
                c.error(m.line_of(key), f"{where}: sample_values '{key}' must be [low, high], two numbers{hint}")
                continue
            result.append((names[0], (float(rng[0]), float(rng[1]))))
        return tuple(sorted(result))


class _Refs:
    """Tensor references of ops.yaml and contracts: names, in0/in1/... (tensor arguments in order),
    and `outputs` (every output)."""

    def __init__(self, inputs: list[str], outputs: list[str]):
        self.inputs, self.outputs = inputs, outputs
        self.names = inputs + outputs

    def resolve(self, ref) -> list[str] | None:
        if not isinstance(ref, str):
            return None
        m = POSITION_RE.match(ref)
        if m:
            i = int(m.group(1))
            return [self.inputs[i]] if i < len(self.inputs) else None
        if ref == "outputs":
            return list(self.outputs)
        return [ref] if ref in self.names else None


def _is_shape(v) -> bool:
    return isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v)


def _freeze(v):
    """Lists become tuples (recursively), so specs stay hashable and render as tuples."""
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _freeze(x)) for k, x in v.items()))
    return v


def _same_value(a, b) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return a == b
