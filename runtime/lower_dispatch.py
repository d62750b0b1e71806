"""Turn a planned device node into Vulkan dispatches: pick the variant, derive its push constants.

Everything op-specific comes from the generated registry: the variant is chosen by the op, the
dtype and the storage each binding must have (never by building a name); push constants are
evaluated from their declared derivations (texelflow.shaders.node_rules); an absent optional
tensor is bound as a 1-element dummy buffer; a template whose grid is `per_list_element` gets one
dispatch per element of its tensor list (over the element's own units where the grid's
`element_units` shape class says so), one whose grid is `per_row` one invocation per W-row of
the named tensor (H * C * N of its WHCN sizes) instead of one per output unit, one whose grid is
`cooperative` that many invocations (of one workgroup) per unit of the named tensor, one whose
grid is `per_tile` one invocation (or `invocations`, one workgroup's) per width x height tile of
each W-H plane of the named tensor.
Shape classes (a template contract's `spec`) are evaluated here, once per dispatch, from the
node's shapes and the representations its tensors were planned in: the program specialises the
pipeline with them (texelflow.shaders.node_rules SPEC_RULES).
No op is named here: the kernel tests build their dispatches through this same code.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from texelflow.generated.layouts import STORAGE_AXIS, Storage
from texelflow.generated.variants import variants_of
from texelflow.shaders.geometry import units as geometry_units, whcn_sizes
from texelflow.shaders.node_rules import list_slab_shape, push_values, spec_values


@dataclass
class DispatchSpec:
    """What the program needs to launch one kernel: variant, tensors by binding name, scalars."""

    variant: object
    tensors: dict  # binding name -> Value (the program maps values to device tensors)
    scalars: dict
    label: str
    units: int | None = None  # invocations, when not one per unit of the output (grids per_row, cooperative, per_tile)
    spec: dict = field(default_factory=dict)  # shape class name -> value (specialization constants)


class _Absent:
    """Stands for the 1-element float32 buffer bound where an optional tensor is absent."""

    def __repr__(self) -> str:
        return "DUMMY_BUFFER"


DUMMY_BUFFER = _Absent()


class _SpecFacts:
    """What a shape-class rule sees of a node: its shapes, which tensors it has, the planned
    representation of each (slot_reprs) and the variant's span."""

    def __init__(self, node, slot_reprs: dict, span: int, element: int | None = None):
        self.node, self.slot_reprs, self.span, self.element = node, slot_reprs, span, element

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.node.shape(name))

    def present(self, name: str) -> bool:
        return name in self.slot_reprs and hasattr(self.node.value(name), "shape")

    def value(self, name: str):
        return self.node.value(name)

    def repr(self, name: str):
        return self.slot_reprs[name]


def shape_classes(node, variant, slot_reprs: dict, element: int | None = None) -> dict:
    """The variant's shape-class spec constants for this node (for one element of its tensor
    list, for a per-element dispatch): name -> value."""
    rules = [s for s in variant.spec_constants if getattr(s, "rule", None)]
    facts = _SpecFacts(node, slot_reprs, getattr(variant, "span", 1), element)
    return spec_values(facts, rules) if rules else {}


def select_variant(op_name: str, dtype: str, storages: dict[str, Storage], device_features=None,
                   preferred_features=None):
    """The variant of `op_name` whose dtype and binding storages match, among those the device can
    run (all of them when `device_features` is None); KeyError lists the candidates.

    Variants that differ only on a choice axis (ops.yaml: int_dot) all match; the one taken is the
    first in ops.yaml's order whose features are all in `preferred_features` (the device's
    Device.preferred_features: what it does not emulate; None: every feature), else the first the
    device can run."""
    candidates = variants_of(op_name, device_features)
    matches = [v for v in candidates if v.dtype == dtype
               and all(STORAGE_AXIS[storages[b.tensor]] == b.storage for b in v.bindings if b.tensor in storages)]
    if matches:
        prefer = None if preferred_features is None else frozenset(preferred_features)
        return min(matches, key=lambda v: (prefer is not None and not prefer.issuperset(v.features), v.preference))
    have = ", ".join(sorted(v.name for v in candidates)) or "none"
    want = ", ".join(f"{k}={STORAGE_AXIS[s]}" for k, s in sorted(storages.items()))
    raise KeyError(f"no shader variant of '{op_name}' for dtype={dtype}, {want}; variants: {have}")


def node_dispatches(node, slot_reprs: dict, dtype: str, device_features=None,
                    preferred_features=None) -> list[DispatchSpec]:
    """Dispatches for one planned node. `slot_reprs`: tensor slot name -> TensorRepr;
    `dtype`: the node's dtype, used unless the op fixes some tensors' dtypes (`dtype_of`: a
    comparison's bool out), when the variant's dtype is that of its other tensors;
    `device_features`: what the device has (None: every variant is a candidate);
    `preferred_features`: what it runs fast, for choice axes (select_variant)."""
    op = node.op
    tensors = {name: v for name, v in node.args if name in slot_reprs}
    tensors.update(node.outputs)
    storages = {name: slot_reprs[name].storage for name in tensors}
    if op.dtype_of:
        slots = dict(node.outputs) | dict(node.tensor_args())
        dtype = op.variant_dtype({name: v.dtype for name, v in slots.items()}) or dtype
    variant = select_variant(op.name, dtype, storages, device_features, preferred_features)
    bound = {b.tensor for b in variant.bindings}
    for a in op.args:
        if a.kind == "tensor" and a.optional and tensors.get(a.name) is None and a.name in bound:
            tensors[a.name] = DUMMY_BUFFER
    if op.grid[0] == "per_list_element":
        _, name, element_units = op.grid
        specs = []
        r = slot_reprs[name]
        for i, element in enumerate(node.value(name)):
            if element.numel:  # an empty element has nothing to write
                spec = shape_classes(node, variant, slot_reprs, i)
                own = element_units is not None and spec.get(element_units)  # 1: its own units, 2: its slab of out's
                units = None
                if own == 1:
                    units = geometry_units(element.shape, r.storage, r.layout)
                elif own == 2:  # (cat, the one list op: its `dim`, the elements before this one)
                    out_shape = node.outputs[0][1].shape
                    dim = node.value("dim") % len(out_shape)
                    offset = sum(e.shape[dim] for e in node.value(name)[:i])
                    units = geometry_units(list_slab_shape(out_shape, offset, element.shape[dim], dim),
                                           r.storage, r.layout)
                specs.append(DispatchSpec(variant, {**tensors, name: element}, push_values(node, op.push, i),
                                          f"{node.name}[{i}]", units, spec))
        return specs
    units = None
    if op.grid[0] == "per_row":
        w, h, c, n = whcn_sizes(tensors[op.grid[1]].shape)
        units = h * c * n
    if op.grid[0] == "cooperative":
        _, name, invocations = op.grid
        r = slot_reprs[name]
        units = geometry_units(tensors[name].shape, r.storage, r.layout) * invocations
    if op.grid[0] == "per_tile":
        _, name, width, height, planes, per_tile = op.grid
        w, h, c, n = whcn_sizes(tensors[name].shape)
        units = -(-w // width) * -(-h // height) * (min(c * n, planes) if planes else c * n) * per_tile
    return [DispatchSpec(variant, tensors, push_values(node, op.push), node.name, units,
                         shape_classes(node, variant, slot_reprs))]
