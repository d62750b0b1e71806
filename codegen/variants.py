"""Expand each op's shader declaration into variants, with names and reflection.

This is the one place that says how an op fans out into variant names and files: the name is
`<op>_<value>...` over the op's axes in the global axis order of ops.yaml.
"""

from __future__ import annotations

import itertools

from .diagnostics import Collector
from .model import Binding, LayoutsModel, OpSpec, PushConstant, SpecConstant, Variant

LOCAL_SIZE = (("local_size_x", 64), ("local_size_y", 1), ("local_size_z", 1))
EXTRA_PUSH = {"int": 4, "float": 4, "ivec4": 16}
TEXEL_DESCRIPTOR = "UNIFORM_TEXEL_BUFFER"  # a buffer input's second binding (contract texel_reads)
TEXEL_READS = "texel_reads"  # the spec constant choosing it
TEXEL_DTYPES = ("float32", "float16")  # read as vec4 texels (rgba32f / rgba16f views, runtime/vulkan/tensor.py)


def variant_name(op: str, axes: tuple[tuple[str, str], ...]) -> str:
    return "_".join([op, *(value for _, value in axes)])


def expand(ops: tuple[OpSpec, ...], layouts: LayoutsModel, all_axes: dict, choices: dict, file: str,
           out: Collector) -> tuple[Variant, ...]:
    """`choices`: choice axis -> ((value, required device features), ...) in order of preference."""
    variants: list[Variant] = []
    for op in ops:
        if op.shader is None:
            continue
        taken = ({f"{t}_layout" for t in op.tensors} | {n for n, _ in LOCAL_SIZE} | {p.name for p in op.push}
                 | {TEXEL_READS})
        for s in op.spec:
            if s.name in taken or s.name in op.tensors:
                out.error(file, op.shader.line, f"op '{op.name}': spec constant '{s.name}' of template "
                          f"'{op.shader.template}' has the name of a tensor, push or layout constant")
        found = _expand_op(op, layouts, all_axes, choices)
        covered = {dict(v.axes)["dtype"] for v in found}
        for d in op.dtypes:
            if d not in covered:
                out.error(file, op.shader.line, f"op '{op.name}': no shader variant can hold dtype '{d}' "
                          f"in the op's repsets; drop it from dtypes or widen the repsets")
        variants.extend(found)
    return tuple(sorted(variants, key=lambda v: v.name))


def _expand_op(op: OpSpec, layouts: LayoutsModel, all_axes: dict, choices: dict) -> list[Variant]:
    shader = op.shader
    value_lists = []
    for axis in shader.axes:
        values = all_axes[axis]
        if axis == "dtype":
            values = tuple(v for v in values if v in op.dtypes)
        value_lists.append([(axis, v) for v in values])
    result = []
    storage_of = dict(shader.storage_of)
    repset_of = {a.name: a.repset for a in op.args if a.is_tensor} | {o.name: o.repset for o in op.outputs}
    for combo in itertools.product(*value_lists):
        axes = dict(combo)
        family = {t: layouts.dtype(op.tensor_dtype(t, axes["dtype"])).family for t in op.tensors}
        storages = {t: axes.get(storage_of[t], storage_of[t]) for t in op.tensors}
        if all(_reachable(layouts, repset_of[t], family[t], storages[t]) for t in op.tensors):
            result.append(_variant(op, tuple(combo), storages, layouts, repset_of, choices))
    return result


def local_size(op: OpSpec) -> tuple[tuple[str, int], ...]:
    """The default workgroup size (LOCAL_SIZE), or, for a grid that gives each unit or tile more
    invocations than that (contracts.WIDE_INVOCATIONS), one workgroup of exactly that many."""
    wide = op.grid[-1] if op.grid and op.grid[0] in ("cooperative", "per_tile") else 0
    if wide > LOCAL_SIZE[0][1]:
        return (("local_size_x", wide),) + LOCAL_SIZE[1:]
    return LOCAL_SIZE


def _reachable(layouts: LayoutsModel, repset: str, family: str, storage_axis: str) -> bool:
    """Whether some layout of `family` in `repset` lives in this storage."""
    storage = layouts.storage_by_axis(storage_axis).name
    names = layouts.repset(repset).as_dict().get(storage, ())
    return any(layouts.layout(n).family == family for n in names)


def _variant(op: OpSpec, axes, storages: dict, layouts: LayoutsModel, repset_of: dict, choices: dict) -> Variant:
    name = variant_name(op.name, axes)
    bindings = tuple(
        Binding(
            index=i,
            tensor=t,
            descriptor=layouts.storage_by_axis(storages[t]).descriptor,
            access=("readwrite" if t in op.shader.read_outputs else "write") if i < len(op.outputs) else "read",
            storage=storages[t],
        )
        for i, t in enumerate(op.tensors)
    )
    dtypes = {t: layouts.dtype(op.tensor_dtype(t, dict(axes)["dtype"])) for t in op.tensors}
    # contract `texel_reads`: each such input bound as a float buffer gets a second binding, after
    # every tensor's own, of the same buffer as a uniform texel buffer (lavapipe loads a texel
    # buffer through its vectorised image path, but a storage buffer lane by lane)
    texel = [t for t in op.texel_reads
             if not layouts.storage_by_axis(storages[t]).is_image and dtypes[t].name in TEXEL_DTYPES]
    bindings += tuple(Binding(index=len(op.tensors) + j, tensor=t, descriptor=TEXEL_DESCRIPTOR, access="read",
                              storage=storages[t]) for j, t in enumerate(texel))
    # std430 push block: the 16-byte ivec4s first, then 4-byte scalars, so offsets need no padding.
    vec4s = [(f"{t}_sizes", "ivec4") for t in op.tensors] + [(p.name, p.type) for p in op.push if p.type == "ivec4"]
    scalars = [("units", "int")] + [(p.name, p.type) for p in op.push if p.type != "ivec4"]
    push: list[PushConstant] = []
    offset = 0
    for pname, ptype in vec4s + scalars:
        size = EXTRA_PUSH[ptype]
        push.append(PushConstant(pname, ptype, offset, size))
        offset += size
    spec = [SpecConstant(i, n, "int", d) for i, (n, d) in enumerate(local_size(op))]
    for t in op.tensors:
        spec.append(SpecConstant(len(spec), f"{t}_layout", "int",
                                 _default_layout(layouts, repset_of[t], dtypes[t].family, storages[t])))
    for s in op.spec:  # shape classes: the default is the rule's general (always correct) value
        spec.append(SpecConstant(len(spec), s.name, "int", s.general, s.rule, s.params))
    if texel:  # 1: read the texel bindings; the runtime decides per device (program.texel_reads)
        spec.append(SpecConstant(len(spec), TEXEL_READS, "int", 0))
    return Variant(
        name=name,
        op=op.name,
        axes=tuple(axes),
        dtype=dict(axes)["dtype"],
        source=f"{name}.comp",
        bindings=bindings,
        push_constants=tuple(push),
        push_constant_size=(offset + 15) // 16 * 16,
        spec_constants=tuple(spec),
        target_env=op.shader.target_env,
        template=op.shader.template,
        params=op.shader.params,
        features=tuple(sorted({f for d in dtypes.values() for f in d.features}
                              | {f for a, value in axes if a in choices for f in dict(choices[a])[value]})),
        preference=tuple([v for v, _ in choices[a]].index(value) for a, value in axes if a in choices),
        span=dict(op.span).get(storages[op.outputs[0].name], 1) if op.outputs else 1,
    )


def _default_layout(layouts: LayoutsModel, repset: str, family: str, storage_axis: str) -> int:
    storage = layouts.storage_by_axis(storage_axis).name
    allowed = set(layouts.repset(repset).as_dict().get(storage, ()))
    for name in layouts.layout_preference:
        if name in allowed and layouts.layout(name).family == family:
            return layouts.layout(name).id
    raise AssertionError("unreachable: variant exists only when a layout is reachable")
