"""The precision pass: `precision="fp16"` stores the tensors of float16-capable ops as float16.

It runs on a finished plan (representations chosen, transitions inserted, identity ops folded):
precision changes a tensor's bytes, never its representation (float16 and float32 are one layout
family), so planning first and narrowing after gives the same plan. Before / after, for a graph
whose `layer_norm` has float16 variants and whose `foo` has none:

    x -> layer_norm(w) -> foo -> out     x -> cast_to_float16 -> layer_norm(w16) -> cast_to_float32 -> foo -> out

- A device node whose op has float16 variants the device can run takes float16 for every
  float32 tensor it reads and writes (tensors its op fixes with `dtype_of` keep their dtype).
- Unless `prune=False`, a region of float16-capable nodes stays float32 when its casts would move
  more bytes than float16 saves inside it (a lone layer norm between float32 matmuls: two casts
  of its tensor, less than one saved); `_Narrowing._unprofitable` says how it counts.
- A folded node (a view, a free permute: no dispatch, its output aliases its input) follows its
  input's dtype.
- A float32 constant read by float16 nodes is stored as float16 (prepacked at load); a float16
  copy of it is added when float32 nodes read it too.
- A float32 value read by a float16 node gets one `cast_to_float16` node, shared by its readers;
  a float16 value read by a float32 device node (one without float16 variants, a transition
  without them) one `cast_to_float32`. A cast keeps its input's representation, so the plan's
  assignment gains the cast's slots and nothing else changes.
- Graph inputs stay float32 (the call checks and uploads them as the user passes them, a device
  cast follows); float16 values the host reads (graph outputs, CPU fallback inputs) come back as
  float32, converted on the host after the download (`graph.input_host_dtypes`), so the user only
  ever sees float32.

Kernels compute and accumulate in float32 either way; only storage narrows (docs/precision.md).
This module never touches Vulkan: the device's features come in as a set of names.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from texelflow.generated.layouts import DTYPES
from texelflow.generated.ops import OPS
from texelflow.generated.variants import VARIANTS

from .ir import Node, Role, Value

PRECISIONS = ("fp32", "fp16")
HALF, SINGLE = "float16", "float32"
CASTS = {HALF: "cast_to_float16", SINGLE: "cast_to_float32"}  # target dtype -> cast op


@dataclass
class PrecisionReport:
    """What the pass did, for the plan: the precision asked for and used, and why they differ."""

    requested: str = "fp32"
    used: str = "fp32"
    reason: str = ""  # why float32 variants are used where fp16 was asked for
    half_nodes: list[str] = field(default_factory=list)  # device nodes running float16 variants
    casts: list[str] = field(default_factory=list)  # cast nodes inserted (dispatched on every call)
    half_constants: list[str] = field(default_factory=list)  # constants stored as float16
    single_ops: dict[str, int] = field(default_factory=dict)  # op -> device nodes kept float32: no float16 variant
    pruned_ops: dict[str, int] = field(default_factory=dict)  # op -> nodes kept float32: casts would cost more

    @property
    def num_casts(self) -> int:
        return len(self.casts)

    def summary(self) -> str:
        if self.requested == "fp32":
            return "precision=fp32"
        if self.used == "fp32":
            return f"precision=fp16 requested, fp32 variants used: {self.reason}"
        kept = ", ".join(f"{op} x{n}" for op, n in sorted(self.single_ops.items()))
        pruned = ", ".join(f"{op} x{n}" for op, n in sorted(self.pruned_ops.items()))
        return (f"precision=fp16: {len(self.half_nodes)} nodes in float16, {self.num_casts} casts, "
                f"{len(self.half_constants)} float16 constants; float32 kept (no float16 variant): {kept or 'none'}"
                f"; (casts would cost more than float16 saves): {pruned or 'none'}")


def half_features() -> frozenset[str]:
    """The device features float16 variants need (layouts.yaml, float16 `features`)."""
    return frozenset(DTYPES[HALF].features)


def has_half_variants(op_name: str, features: frozenset[str] | None = None) -> bool:
    """Whether the op has float16 variants that a device with `features` runs (None: any device)."""
    op = OPS.get(op_name)
    return op is not None and any(
        VARIANTS[v].dtype == HALF and (features is None or set(VARIANTS[v].features) <= features) for v in op.variants)


def apply_precision(plan, precision: str = "fp32", features=None, prune: bool = True) -> PrecisionReport:
    """Rewrite a finished Plan (its graph and assignment) in place for `precision`: "fp32" leaves
    it as it is, "fp16" narrows as the module says. `features`: the device's enabled features, or
    None when planning without a device (float16 support is then assumed). `prune`: keep float32
    the regions whose casts would cost more than float16 saves (below); False narrows every
    float16-capable node (tests exercise the float16 kernels so). The report is also
    `plan.precision`."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r}: expected one of {', '.join(repr(p) for p in PRECISIONS)}")
    report = plan.precision = PrecisionReport(requested=precision)
    if precision == "fp32":
        return report
    features = None if features is None else frozenset(features)
    if features is not None and not half_features() <= features:
        report.reason = (f"the device lacks {', '.join(sorted(half_features() - features))}, "
                         f"which float16 variants need")
        return report
    report.used = "fp16"
    _Narrowing(plan, features, report, prune).run()
    return report


class _Narrowing:
    """One pass over the plan's nodes in execution order."""

    def __init__(self, plan, features, report: PrecisionReport, prune: bool = True):
        self.graph, self.assignment, self.features, self.report = plan.graph, plan.assignment, features, report
        self.casts: dict[tuple[Value, str], Value] = {}  # (value, target dtype) -> the cast's output
        self.half_consts: dict[Value, Value] = {}  # float32 constant -> its float16 version
        self.cast_nodes: set[Node] = set()
        # decided once, before any dtype changes: the dispatched nodes that run float16 variants
        self.half = {n for n in self.graph.nodes if n.on_device and not n.folded and
                     has_half_variants(n.op.name, features) and _float_slots(n)}
        if prune:
            self.half -= self._unprofitable()
        # nodes running float16 variants as the model wrote them (a float16 model, `x.half() * 2`):
        # their float16 tensors are the model's own and need no cast
        self.native_half = {n for n in self.graph.nodes if n.on_device and not n.folded and _native_half(n)}
        self.native_values = {v for v in self.graph.values() if v.dtype == HALF}

    # ---- which float16 regions pay for their casts ------------------------------------------------
    def _unprofitable(self) -> set[Node]:
        """Float16-capable nodes in regions whose casts move more bytes than float16 saves.

        A region is a connected set of float16-capable nodes (joined by the values between them,
        through folded views). Its casts read 4 and write 2 bytes per element of every value
        crossing into it from a float32 device node or out of it to one; float16 saves 2 bytes per
        element on every write and read of a value inside it and on every read of a constant.
        A lone layer norm between float32 matmuls costs two casts of its tensor and saves less
        than one: it stays float32, and so does nothing the user would notice but speed."""
        regions = self._regions()
        dropped: set[Node] = set()
        for region in regions:
            saved = cost = 0
            for n in region:
                for _, v in n.tensor_args():
                    src = self._origin(v)
                    if v.role is Role.CONST:
                        saved += 2 * v.numel
                    elif src is not None and src in region:
                        saved += 2 * v.numel  # a float16 read
                    elif v.role is not Role.CONST:
                        cost += 6 * v.numel  # a cast in (shared casts counted per read: an upper bound)
                for name, v in n.outputs:
                    if name not in _float_slots(n):
                        continue
                    saved += 2 * v.numel  # a float16 write
                    if any(u not in region and u.on_device for u in self._readers(v)):
                        cost += 6 * v.numel  # a cast out
            if saved <= cost:
                dropped |= region
        return dropped

    def _origin(self, v: Value) -> Node | None:
        """The dispatched node whose output `v` is (through folded views), or None."""
        n = v.producer
        while n is not None and n.folded:
            src = n.arg("self")
            n = src.producer if isinstance(src, Value) else None
        return n

    def _readers(self, v: Value) -> list[Node]:
        """The dispatched nodes reading `v`, directly or through folded views of it."""
        out = []
        for u in v.users:
            if u.folded and u.on_device:
                out += self._readers(u.outputs[0][1])
            else:
                out.append(u)
        return out

    def _regions(self) -> list[set[Node]]:
        parent = {n: n for n in self.half}

        def find(n):
            while parent[n] is not n:
                parent[n] = parent[parent[n]]
                n = parent[n]
            return n

        for n in self.half:
            for _, v in n.tensor_args():
                src = self._origin(v)
                if src in parent:
                    parent[find(n)] = find(src)
        groups: dict[Node, set[Node]] = {}
        for n in self.half:
            groups.setdefault(find(n), set()).add(n)
        return list(groups.values())

    def run(self) -> None:
        for node in list(self.graph.nodes):
            if node in self.cast_nodes:
                continue
            if node.on_device and node.folded:
                self._follow_input(node)
            elif node in self.half:
                self._narrow(node)
                self.report.half_nodes.append(node.name)
            else:
                self._widen_inputs(node)
                if node.on_device and _float_slots(node):
                    kept = self.report.pruned_ops if has_half_variants(node.op.name, self.features) else \
                        self.report.single_ops
                    kept[node.op.name] = kept.get(node.op.name, 0) + 1
        # the host reads the values the pass narrowed as float32 (outputs, CPU inputs); a float16
        # model's own float16 values stay float16, as torch gives them
        for v in self.graph.values():
            if v.dtype == HALF and v.role is not Role.CONST and v not in self.native_values:
                self.graph.input_host_dtypes.setdefault(v.name, SINGLE)

    # ---- float16 nodes ---------------------------------------------------------------------------
    def _narrow(self, node: Node) -> None:
        slots = _float_slots(node)
        for i, (name, arg) in enumerate(node.args):
            node.args[i] = (name, _map_values(arg, lambda v, name=name: self._half_input(node, name, v, slots)))
        for name, v in node.outputs:
            if name in slots and v.dtype == SINGLE:
                _set_dtype(v, HALF)

    def _half_input(self, node: Node, name: str, v: Value, slots: set[str]) -> Value:
        if name not in slots or v.dtype != SINGLE:
            return v
        if v.role is Role.CONST:
            return self._half_constant(node, v)
        return self._cast(node, v, HALF)

    def _half_constant(self, node: Node, v: Value) -> Value:
        """The float16 version of a float32 constant: itself when float16 nodes are its only
        readers and no derivation reads it, else a float16 copy (same source or recipe)."""
        half = self.half_consts.get(v)
        if half is None:
            only_half = all(u in self.half for u in v.users)
            derived_from = any(v in (c.derive.sources if c.derive else ()) for c in self.graph.constants)
            if only_half and not derived_from:
                _set_dtype(v, HALF)
                half = v
            else:
                half = Value(f"{v.name}_fp16", v.shape, HALF, Role.CONST, source=v.source, literal=v.literal,
                             derive=v.derive)
                self.graph.constants.append(half)
            self.half_consts[v] = half
            self.report.half_constants.append(half.name)
        if half is not v:
            _move_use(v, half, node)
        return half

    # ---- float32 nodes and folded ones -------------------------------------------------------------
    def _widen_inputs(self, node: Node) -> None:
        """A float32 device node reads float16 values through a cast; a CPU node reads them as the
        host converts them (float32), so it needs none."""
        if not node.on_device or node in self.native_half:
            return
        fixed = dict(node.op.dtype_of)
        for i, (name, arg) in enumerate(node.args):
            node.args[i] = (name, _map_values(arg, lambda v, name=name: (
                self._cast(node, v, SINGLE) if v.dtype == HALF and name not in fixed else v)))

    def _follow_input(self, node: Node) -> None:
        """A folded node's output aliases its input: it takes the input's dtype."""
        src = node.arg("self")
        out = node.outputs[0][1]
        if isinstance(src, Value) and src.dtype == HALF and out.dtype == SINGLE:
            _set_dtype(out, HALF)

    # ---- casts -------------------------------------------------------------------------------------
    def _cast(self, reader: Node, v: Value, dtype: str) -> Value:
        """`v` as `dtype` for `reader`: one cast node per (value, dtype), in v's representation."""
        out = self.casts.get((v, dtype))
        if out is None:
            out = self._insert_cast(v, dtype)
            self.casts[(v, dtype)] = out
        _move_use(v, out, reader)
        return out

    def _insert_cast(self, v: Value, dtype: str) -> Value:
        op = OPS[CASTS[dtype]]
        name = f"{v.name}_{'fp16' if dtype == HALF else 'fp32'}"
        node = Node(name, op.targets[0], op, [("self", v)], [])
        out = Value(name, v.shape, dtype, Role.NODE, producer=node)
        node.outputs.append(("out", out))
        v.users.append(node)
        nodes = self.graph.nodes
        nodes.insert(nodes.index(v.producer) + 1 if v.producer in nodes else 0, node)
        rep = self.assignment.values[v]
        self.assignment.values[out] = rep
        self.assignment.slots[(node, "self")] = rep
        self.assignment.slots[(node, "out")] = rep
        self.cast_nodes.add(node)
        self.report.casts.append(name)
        return out


def _float_slots(node: Node) -> set[str]:
    """Names of the node's float32 tensor slots whose dtype follows the variant's (not dtype_of)."""
    fixed = dict(node.op.dtype_of) if node.op is not None else {}
    slots = list(node.tensor_args()) + list(node.outputs)
    return {name for name, v in slots if v.dtype == SINGLE and name not in fixed}


def _native_half(node: Node) -> bool:
    """Whether the node's float tensors (those not fixed by dtype_of) are all float16 before the
    pass: it runs its float16 variant whatever the precision."""
    fixed = dict(node.op.dtype_of) if node.op is not None else {}
    floats = [v.dtype for name, v in list(node.tensor_args()) + list(node.outputs)
              if name not in fixed and v.dtype in (HALF, SINGLE)]
    return bool(floats) and all(d == HALF for d in floats)


def _map_values(arg, fn):
    if isinstance(arg, Value):
        return fn(arg)
    if isinstance(arg, (list, tuple)):
        return type(arg)(fn(x) if isinstance(x, Value) else x for x in arg)
    return arg


def _set_dtype(v: Value, dtype: str) -> None:
    v.dtype = dtype
    v.__dict__.pop("nbytes", None)  # a cached_property of the old dtype


def _move_use(old: Value, new: Value, node: Node) -> None:
    """Move one use of `old` by `node` to `new` (users hold one entry per use site)."""
    if node in old.users:
        old.users.remove(node)
    new.users.append(node)


# ---- references for the generic kernel test (tests/kernels/nodecheck.py) ------------------------------
def cast_to_float16_reference(self):
    """torch's answer for cast_to_float16: .half() (round to nearest even, past 65504 to +-Inf)."""
    return self.half()


def cast_to_float32_reference(self):
    """torch's answer for cast_to_float32: .float() (exact)."""
    return self.float()
