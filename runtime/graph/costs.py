"""Predicted kernel time per node and representation: the planner's unary and transition costs.

A node's time is predicted as `fixed + per_byte * bytes + per_flop * flops`, with coefficients
per (cost class, representation). The cost class is the op's name, else its shader template, else
"*" (every class a table measured, fitted together); the representation is "STORAGE/LAYOUT", else
"STORAGE/*". Bytes are device bytes, texture and block padding included (geometry.nbytes), so a
3-channel tensor in a channels-packed texture costs a third more than in a buffer. The terms are
separable by slot: each tensor slot pays `per_byte * its bytes` at its own representation's rate,
and the node's fixed and FLOP terms are paid at its first output's representation, which is what
lets the integer program (optimal/integer_program.py) charge them to classes of slots.

A permute's time depends on its input's and output's representations together: where its
permutation takes the output's packed dim to the input's (and storages agree), the kernel moves
whole texels or vec4 words (shape class `units_match`), otherwise one element at a time, 5-10x
slower on lavapipe. Its slots are priced at the fast path's rates, and `pair_seconds` adds the
general path's extra time for a (self, out) pair that misses it: the one cost that is not
separable by slot, which the integer program charges through a pair variable. slice,
constant_pad_nd and select (PAIR_PATHS) are priced alike, their one shared representation deciding
the path.

Coefficients come from a per-device table (`texelflow tune` measures it, runtime/tune.py; stored
as JSON under `table_dir()`, keyed by the device; a node the tuner timed itself, by
node_signature, is predicted from that time instead) or, without one, from a built-in estimate that
treats every representation alike apart from padding. Pure data and arithmetic: no Vulkan here.
"""

from __future__ import annotations

import functools
import json
import math
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from texelflow.generated.layouts import DTYPES
from texelflow.shaders.geometry import nbytes as device_nbytes

from .ir import Role
from .repr import TensorRepr

FORMAT = 2  # the table file's format; a file of another format is ignored (re-run `texelflow tune`)
ANY = "*"
TRANSITION = "to_layout"  # the cost class of a transition
GENERAL = "!general"  # suffix of the cost class of a kernel's general path (pair_seconds)


@dataclass(frozen=True)
class Coeffs:
    """Seconds per dispatch, per device byte read or written, per floating-point operation."""

    fixed: float
    per_byte: float
    per_flop: float

    def seconds(self, nbytes: float, flops: float) -> float:
        return self.fixed + self.per_byte * nbytes + self.per_flop * flops


# The built-in estimate (no table for the device): a generic device doing 4 GB/s and 10 GFLOP/s
# with 10 us per dispatch, the same in every representation (only padding tells them apart).
ESTIMATE = Coeffs(fixed=10e-6, per_byte=1 / 4e9, per_flop=1 / 10e9)


# Templates whose fast path depends on two slots' representations together, and the shape class
# (spec constant, shaders/node_rules.py) that is non-zero where a node takes it. slice, pad and
# select keep self and out in one representation (a sync group), where their units move whole or
# not: a video's frame slice of [N, T, 3, H, W] moves vec4 words in a width-packed buffer and
# element by element in a channels-packed one (3 channels), 2.8x slower on lavapipe.
PAIR_PATHS = {"permute": ("self", "out", "units_match"), "slice": ("self", "out", "units_match"),
              "pad": ("self", "out", "units_match"), "select": ("self", "out", "units_match")}

# The built-in estimate's general path of a pair-priced kernel: this many times its fast path (a
# permute on lavapipe: CP texture -> WP buffer 4.8-7.0 ms, CP -> WP texture 1.0-1.1 ms, on ConvNeXt's
# 1x40x56x56).
GENERAL_FACTOR = 4.0


# A copy inside a model costs more than the same copy timed alone (a barrier before its reader,
# caches holding what the next kernel reads evicted) and predictions err, so the planner pays a
# transition only for a clear predicted gain: its predicted time counts this many times.
TRANSITION_MARGIN = 2.0


# ---- what a node does -------------------------------------------------------------------------
COMPUTE = "*compute"  # the catch-all class of nodes with a reduction (convolutions, linear, matmul)


def cost_classes(node, general: bool = False) -> tuple[str, ...]:
    """The keys a node's coefficients are looked up under, most specific first: its op, its
    template, then the catch-all of compute-bound nodes (a kernel no table measured yet: a new
    convolution or matmul variant) or of all the others. `general`: the keys of a pair-priced
    node's general path (its op's name with GENERAL), which only a table that timed it has."""
    op = node.op
    if node.transition or op.name == TRANSITION:
        return (TRANSITION, ANY)
    if general:
        return (op.name + GENERAL,)
    keys = [op.name]
    if op.template and op.template != op.name:
        keys.append(op.template)
    return tuple(keys) + ((COMPUTE,) if node_flops(node) > node.outputs[0][1].numel else (ANY,))


def node_flops(node) -> int:
    """Floating-point operations of a node, roughly: 2 * outputs * reduction length for ops with a
    weight or a matrix operand (convolutions, linear, matmul), 4 * B*H * L * S * D for attention,
    one per output element otherwise."""
    out = node.outputs[0][1]
    op = node.op
    if op.template == "sdpa":
        q, k = node.arg("query"), node.arg("key")
        if q is not None and k is not None and len(q.shape) >= 2 and len(k.shape) >= 2:
            return 4 * math.prod(q.shape[:-1]) * k.shape[-2] * q.shape[-1]
    weight = node.arg("weight")
    if getattr(weight, "shape", None) is not None and len(weight.shape) >= 2 and out.shape:
        # weight elements per output channel: the reduction length, however the kernel prepacks it
        channels = out.shape[1] if len(out.shape) >= 3 and "conv" in op.name else out.shape[-1]
        return 2 * out.numel * max(1, weight.numel // max(1, channels))
    if op.template in ("matmul", "linear", "mm_tiled", "mm_wg", "q8ta_linear", "q8ta_linear_gemv"):
        first = next((v for _, v in node.tensor_args() if len(v.shape) >= 2), None)
        if first is not None and op.name != "addmm":
            return 2 * out.numel * first.shape[-1]
        mat1 = node.arg("mat1")
        if mat1 is not None:
            return 2 * out.numel * mat1.shape[-1]
    return out.numel


@functools.lru_cache(maxsize=65536)
def _bytes(shape: tuple, dtype: str, r: TensorRepr) -> int:
    if dtype not in DTYPES:
        return math.prod(shape) * 4
    try:
        return device_nbytes(shape, dtype, r.storage, r.layout)
    except (KeyError, ValueError):
        return math.prod(shape) * DTYPES[dtype].bytes


def value_bytes(v, r: TensorRepr) -> int:
    """Device bytes of value `v` held in `r`, padding included."""
    return _bytes(tuple(v.shape), v.dtype, r)


def slots_of(node) -> list[tuple[str, object]]:
    """(slot, value) for every tensor argument (list elements included) and output."""
    return list(node.tensor_args()) + list(node.outputs)


def charged_bytes(node, slots: dict) -> int:
    """The bytes the model charges a node: its computed tensors in their representations, its
    constants in its first output's (what runtime/tune.py fits the per-byte rate to)."""
    out_r = slots[node.outputs[0][0]]
    return sum(value_bytes(v, out_r if v.role is Role.CONST else slots[name]) for name, v in slots_of(node))


def node_signature(node) -> str:
    """What a kernel's time depends on, names aside: the op, its tensors' shapes and dtypes (and
    which are constants), its other arguments. Identical blocks of a network share it."""
    def arg(v):
        if isinstance(v, (list, tuple)):
            return "[" + ",".join(arg(x) for x in v) + "]"
        if hasattr(v, "shape") and hasattr(v, "role"):
            return f"{'c' if v.role is Role.CONST else 't'}{'x'.join(map(str, v.shape))}:{v.dtype}"
        return repr(v)
    out = node.outputs[0][1] if node.outputs else None
    tail = f"->{'x'.join(map(str, out.shape))}:{out.dtype}" if out is not None else ""
    return node.op.name + "(" + ",".join(f"{n}={arg(v)}" for n, v in node.args) + ")" + tail


def pair_slots(node) -> tuple[str, str] | None:
    """(input slot, output slot) of a node whose kernel time depends on their two representations
    together (PAIR_PATHS), both computed tensors; else None."""
    path = PAIR_PATHS.get(node.op.template) if not node.transition else None
    if path is None:
        return None
    src = node.arg(path[0])
    if src is None or getattr(src, "role", Role.CONST) is Role.CONST or not node.outputs:
        return None
    return path[0], path[1]


_FAST: dict = {}  # (node_signature, input repr, output repr) -> fast_pair


def fast_pair(node, r_in: TensorRepr, r_out: TensorRepr) -> bool:
    """Whether a pair-priced node (pair_slots) takes its kernel's fast path with its input in
    `r_in` and its output in `r_out`: the shape class its dispatch gets (lower_dispatch), so the
    planner prices the very path the program runs. True for any other node."""
    slots = pair_slots(node)
    if slots is None:
        return True
    key = (node_signature(node), r_in, r_out)
    fast = _FAST.get(key)
    if fast is None:
        from texelflow.runtime.lower_dispatch import select_variant, shape_classes

        reprs = {slots[0]: r_in, slots[1]: r_out}
        try:
            variant = select_variant(node.op.name, node.outputs[0][1].dtype, {k: r.storage for k, r in reprs.items()})
            fast = shape_classes(node, variant, reprs).get(PAIR_PATHS[node.op.template][2], 0) != 0
        except (KeyError, ValueError):  # no kernel for the pair: the planner never picks it
            fast = False
        if len(_FAST) > 65536:
            _FAST.clear()
        _FAST[key] = fast
    return fast


def moves_no_data(node, r: TensorRepr) -> bool:
    """An identity op in `r` whose output keeps every element where its input had it: folded,
    no dispatch (redundant.fold_identity_ops)."""
    if not node.op.is_identity or node.transition:
        return False
    from .redundant import same_placement

    src = next((v for _, v in node.tensor_args()), None)
    return src is not None and same_placement(src.shape, node.outputs[0][1].shape, r)


# ---- the model --------------------------------------------------------------------------------
@dataclass
class CostModel:
    """Coefficients per (cost class, representation); `source` says where they came from."""

    source: str  # "table" or "estimate"
    device: str = ""  # the device a table was measured on
    entries: dict[tuple[str, str], Coeffs] = field(default_factory=dict)  # (class, "STORAGE/LAYOUT")
    path: str | None = None  # the table file, when it came from one
    # (node_signature, "STORAGE/LAYOUT") -> seconds the tuner measured for that very node with its
    # computed tensors all in that representation: used before the fitted coefficients, which
    # miss single nodes by up to 2x across a 1000x range of sizes (linear in buffers on ViT-S).
    measured: dict[tuple[str, str], float] = field(default_factory=dict)

    @classmethod
    def estimate(cls) -> "CostModel":
        return cls("estimate")

    def coeffs(self, classes: tuple[str, ...], r: TensorRepr) -> Coeffs:
        found = self.lookup(classes, r)
        return ESTIMATE if found is None else found

    def lookup(self, classes: tuple[str, ...], r: TensorRepr) -> Coeffs | None:
        """The coefficients of the first class with an entry for `r` (or its storage side), else None."""
        exact, side = str(r), f"{r.storage.name}/{ANY}"
        for c in classes:
            for key in (exact, side):
                found = self.entries.get((c, key))
                if found is not None:
                    return found
        return None

    # What the planner and the plan ask -----------------------------------------------------------
    def slot_seconds(self, node, slot: str, value, r: TensorRepr) -> float:
        """The part of the node's time its tensor `slot` (holding `value`) pays in `r`: its bytes,
        and for the first output the node's fixed and FLOP terms and its constants' bytes. A
        constant's own slot pays nothing: how fast a kernel reads a weight depends on the other
        tensors' representations too, which a table measured only together, so a weight's
        representation is left to the preference order (as without costs). An identity op whose
        elements stay in place costs nothing (folded)."""
        if value.role is Role.CONST or moves_no_data(node, r):
            return 0.0
        c = self.coeffs(cost_classes(node), r)
        t = c.per_byte * value_bytes(value, r)
        if node.outputs and slot == node.outputs[0][0] and value is node.outputs[0][1]:
            known = self.measured.get((node_signature(node), str(r))) if self.measured else None
            if known is not None:  # the node's measured time less the other computed slots' shares
                others = sum(c.per_byte * value_bytes(v, r) for name, v in slots_of(node)
                             if v.role is not Role.CONST and not (name == slot and v is value))
                return max(known - others, t)
            consts = sum(value_bytes(v, r) for _, v in node.tensor_args() if v.role is Role.CONST)
            t += c.fixed + c.per_flop * node_flops(node) + c.per_byte * consts
        return t

    def pair_seconds(self, node, r_in: TensorRepr, r_out: TensorRepr) -> float:
        """The extra time of a pair-priced node (pair_slots) whose (input, output) representations
        miss its fast path (general_seconds), else 0."""
        if pair_slots(node) is None or fast_pair(node, r_in, r_out):
            return 0.0
        return self.general_seconds(node, r_out)

    def general_seconds(self, node, r: TensorRepr) -> float:
        """A pair-priced node's general path less its fast path, both with its tensors in `r`:
        the general path as the tuner measured it for this node, else from the general class's
        coefficients; the fast path as its slots are priced. 0 with a table that never timed the
        general path; the built-in estimate takes it as GENERAL_FACTOR times the fast path. It
        depends on the output's representation alone, so the integer program needs one pair
        variable per output representation."""
        slots = pair_slots(node)
        if slots is None:
            return 0.0
        fast = sum(self.slot_seconds(node, name, v, r) for name, v in slots_of(node))
        if self.source == "estimate":
            return (GENERAL_FACTOR - 1.0) * fast
        general = self.measured.get((node_signature(node) + GENERAL, str(r))) if self.measured else None
        if general is None:
            c = self.lookup(cost_classes(node, general=True), r)
            if c is None:
                return 0.0
            general = c.seconds(sum(value_bytes(v, r) for _, v in slots_of(node)), node_flops(node))
        return max(0.0, general - fast)

    def node_seconds(self, node, slots: dict) -> float:
        """Predicted time of a planned node; `slots` maps its slot names to representations. A
        transition is priced by its destination (transition_seconds)."""
        if node.folded:
            return 0.0
        if node.transition:
            return self.transition_seconds(node.arg("self"), slots["out"])
        total = sum(self.slot_seconds(node, name, v, slots[name]) for name, v in slots_of(node) if name in slots)
        pair = pair_slots(node)
        if pair is not None and pair[0] in slots and pair[1] in slots:
            total += self.pair_seconds(node, slots[pair[0]], slots[pair[1]])
        return total

    def transition_seconds(self, value, dst: TensorRepr) -> float:
        """A to_layout of `value` into `dst`: its read and its write, at the destination's rate,
        times TRANSITION_MARGIN."""
        c = self.coeffs((TRANSITION, ANY), dst)
        return TRANSITION_MARGIN * (c.fixed + c.per_byte * 2 * value_bytes(value, dst))

    # Files ---------------------------------------------------------------------------------------
    def to_json(self, device_info: dict | None = None, extra: dict | None = None) -> str:
        rows = [{"class": c, "repr": r, "fixed_s": k.fixed, "per_byte_s": k.per_byte, "per_flop_s": k.per_flop}
                for (c, r), k in sorted(self.entries.items())]
        doc = {"format": FORMAT, "device": self.device, "device_info": device_info or {}, "entries": rows,
               "measured": [{"node": k, "repr": r, "seconds": t} for (k, r), t in sorted(self.measured.items())]}
        doc.update(extra or {})
        return json.dumps(doc, indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, path: str | None = None) -> "CostModel":
        """A table from its file; ValueError (one line, naming the file) when it is not one."""
        where = path or "cost table"
        try:
            doc = json.loads(text)
            if doc.get("format") != FORMAT:
                raise ValueError(f"format {doc.get('format')!r}, expected {FORMAT}")
            entries = {}
            for row in doc["entries"]:
                k = Coeffs(float(row["fixed_s"]), float(row["per_byte_s"]), float(row["per_flop_s"]))
                if not all(math.isfinite(x) and x >= 0 for x in (k.fixed, k.per_byte, k.per_flop)):
                    raise ValueError(f"negative or non-finite coefficients for {row['class']} {row['repr']}")
                entries[(str(row["class"]), str(row["repr"]))] = k
            measured = {}
            for row in doc.get("measured", []):  # absent in tables written before it existed
                t = float(row["seconds"])
                if not (math.isfinite(t) and t >= 0):
                    raise ValueError(f"negative or non-finite time for {row['node']} {row['repr']}")
                measured[(str(row["node"]), str(row["repr"]))] = t
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"{where}: not a texelflow cost table ({exc})") from None
        return cls("table", str(doc.get("device", "")), entries, path, measured)


# ---- where tables live ------------------------------------------------------------------------
def table_dir() -> Path:
    """`TEXELFLOW_COSTS_DIR`, else `costs/` beside the SPIR-V cache: under `TEXELFLOW_CACHE_DIR`,
    or ~/.cache/texelflow."""
    own = os.environ.get("TEXELFLOW_COSTS_DIR")
    if own:
        return Path(own)
    root = os.environ.get("TEXELFLOW_CACHE_DIR")
    return (Path(root) if root else Path.home() / ".cache" / "texelflow") / "costs"


def table_path(device_key: str) -> Path:
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in device_key)
    return table_dir() / f"{safe}.json"


def load_table(device_key: str) -> CostModel | None:
    """The device's table, or None when there is none; a file that is not a table raises
    ValueError naming it."""
    path = table_path(device_key)
    if not path.is_file():
        return None
    return CostModel.from_json(path.read_text(), str(path))


def resolve(costs, device_key: str | None) -> CostModel | None:
    """The cost model of a `costs=` option: "none" (transitions alone) -> None; "estimate";
    "table" (the device's table, else the estimate); a CostModel as it is; None -> the device's
    table when one exists, else transitions alone."""
    if isinstance(costs, CostModel):
        return costs
    if costs == "none":
        return None
    if costs == "estimate":
        return CostModel.estimate()
    if costs in ("table", None):
        try:
            table = load_table(device_key) if device_key else None
        except ValueError as exc:
            if costs == "table":
                raise
            warnings.warn(f"{exc}; planning by transitions alone (re-run `texelflow tune`)", stacklevel=3)
            return None
        if table is not None:
            return table
        return CostModel.estimate() if costs == "table" else None
    raise ValueError(f"costs={costs!r}: choose 'table', 'estimate' or 'none' (or pass a CostModel)")
