"""Fold constant subgraphs that would otherwise run on the CPU into new constants, at lowering.

Third-party models compute tensors that do not depend on the call's inputs: position ids from
`torch.arange`, a relative position bias gathered from its table by a constant index
(`table[index.view(-1)]`), a 0-d `torch.full([], v)`, `torch.zeros_like(mask, dtype=float)`
whose values depend on the mask's shape only. Such a node, when lowering would send it to the CPU
(int64 data, an op the registry lacks), is computed once here with torch, from the exported
program's constants, into a derived constant (recipe `folded_constant`) that the program
prepacks like any weight: the call runs no CPU node for it. Only ATen ops are folded (quantized
weights keep their dequantize nodes for the q8ta fusion), never random ones, never in-place ones,
never a buffer that forward mutates, and never a result larger than MAX_FOLDED_ELEMENTS. Views
of constants (free on the device anyway) are folded too, so that a constant stays one through
reshapes; a constant that broadcasts inside WHCN's N is widened over it (`widening`). A folded
int64 constant whose values fit int32 is held narrowed (narrowing.py), so that `arange(T) <
lengths[:, None]` compares on the device. A node of constants alone that reads a folded constant
is folded on (`reads_fold`): a chain from `arange` becomes one constant.
"""

from __future__ import annotations

import math

from texelflow.generated.ops import op_for_target

from .derived import recipe
from .ir import PlanGraph, Role, Value
from .narrowing import device_input_dtype, fits_narrowed

RECIPE = "folded_constant"
MAX_FOLDED_ELEMENTS = 1 << 22  # 16 MiB of float32: a folded constant is prepacked, so it costs memory
FOLD_ON_GROWTH = 4  # a fold's reader folds on while its result is at most this many times its inputs
FOLD_ON_FLOOR = 1 << 16  # ... or at most this many elements
# Ops whose result depends on their tensor input's shape and dtype only, not on its data.
SHAPE_ONLY = frozenset({
    "aten.zeros_like.default", "aten.ones_like.default", "aten.full_like.default",
    "aten.new_zeros.default", "aten.new_ones.default", "aten.new_full.default",
})


@recipe
def folded_constant(*, data):
    """The tensor constant folding computed at lowering (runtime/graph/constant_folding.py)."""
    return data


class ConstantFolder:
    """Folds nodes of one exported program; keeps the torch tensor of every constant it reads."""

    def __init__(self, ep, torch, mutated: set[str]):
        self.torch = torch
        self.mutated = mutated
        self.state = dict(ep.state_dict)
        self.state.update(getattr(ep, "constants", {}) or {})

    def candidate(self, node, ins: list) -> bool:
        """Whether `node` computes a constant: an ATen op (or texelflow's round_bfloat16), not random
        nor in-place, whose tensor inputs are all constants (or an op that reads only their shapes)."""
        torch = self.torch
        target = node.target
        if not isinstance(target, torch._ops.OpOverload) or target.namespace not in ("aten", "texelflow"):
            return False
        if target._schema.is_mutable or torch.Tag.nondeterministic_seeded in target.tags:
            return False
        if "empty" in target.name():  # uninitialised memory: its data is not a value
            return False
        if str(target) in SHAPE_ONLY:
            return True
        return all(isinstance(v, Value) and v.role is Role.CONST and v.source not in self.mutated for v in ins)

    def rounded_constant(self, node, ins: list) -> bool:
        """A bfloat16 program's rounding of a constant (runtime/graph/bfloat16.py: autocast's cast of
        a float32 weight): folded, so the weight stays a constant its linear or conv prepacks."""
        return str(node.target) == "texelflow.round_bfloat16.default" and self.candidate(node, ins)

    def free_view(self, node, ins: list) -> bool:
        """A view-like op (the registry's `identity` flag) of constants: folded even though it could
        run on the device, so that the constant it gives is one (Swin's mask.unsqueeze(1).unsqueeze(0)
        broadcast into an attention score, which `widening` may then expand)."""
        op = op_for_target(str(node.target))
        return op is not None and op.is_identity and bool(ins) and self.candidate(node, ins)

    def reads_fold(self, graph: PlanGraph, node, ins: list) -> bool:
        """A node of constants alone, one of them a constant folding made: folded on, so that a
        chain computed from `arange` becomes one constant rather than dispatches every call.
        GPT-2's position embedding of arange's ids, T5's relative position buckets (int64 ids,
        a float log, a cast back to int64, a clamp and a gather from the bias table). A reader of
        an int64 constant held narrowed always folds (left unfolded it would send its int64
        readers to the CPU); otherwise the result may grow past its inputs only up to
        FOLD_ON_GROWTH times them (or FOLD_ON_FLOOR elements), so that a folded mask is not
        expanded into a large constant that costs memory rather than a cheap dispatch. A reader
        that also takes a call input runs on the device."""
        folds = [v for v in ins if isinstance(v, Value) and v.derive is not None and v.derive.recipe == RECIPE]
        if not folds or not self.candidate(node, ins):
            return False
        if any(v.name in graph.input_host_dtypes for v in folds):
            return True
        val = node.meta.get("val")
        vals = list(val) if isinstance(val, (tuple, list)) else [val]
        if not all(isinstance(v, self.torch.Tensor) for v in vals):
            return False
        grown = sum(v.numel() for v in vals)
        return grown <= max(FOLD_ON_GROWTH * sum(v.numel for v in ins if isinstance(v, Value)), FOLD_ON_FLOOR)

    def compute(self, node, ins: list):
        """`node`'s result as torch tensors (a list, one per output), or None when it cannot be
        computed here (too large, not tensors, an op that fails on these inputs)."""
        torch = self.torch
        val = node.meta.get("val")
        vals = list(val) if isinstance(val, (tuple, list)) else [val]
        if not vals or not all(isinstance(v, torch.Tensor) for v in vals):
            return None
        if any(v.numel() > MAX_FOLDED_ELEMENTS for v in vals):
            return None
        shape_only = str(node.target) in SHAPE_ONLY
        tensors = {}
        for a, v in zip(node.all_input_nodes, ins):
            meta = a.meta.get("val")
            t = torch.zeros(tuple(meta.shape), dtype=meta.dtype) if shape_only else self.tensor(v)
            if t is None:
                return None
            tensors[a] = t
        try:
            with torch.no_grad():
                args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda a: tensors[a])
                result = node.target(*args, **kwargs)
        except Exception:  # an op that cannot run on these tensors on the CPU: lowering keeps the node
            return None
        results = list(result) if isinstance(result, (tuple, list)) else [result]
        if len(results) != len(vals):
            return None
        for r, v in zip(results, vals):
            if not isinstance(r, torch.Tensor) or tuple(r.shape) != tuple(v.shape) or r.dtype != v.dtype:
                return None
        return [r.detach().contiguous() for r in results]  # a view of a weight stays a view of it

    def add(self, graph: PlanGraph, node, name: str, results: list):
        """New constants holding `compute`'s results: the value (or list) that stands for `node`."""
        outs = []
        for i, r in enumerate(results):
            vname = name if len(results) == 1 else f"{name}.{i}"
            dtype = str(r.dtype).replace("torch.", "")
            if fits_narrowed(r, dtype, self.torch):  # int64 position ids from arange: held as int32
                dtype = device_input_dtype(graph, vname, dtype)
            outs.append(graph.add_derived(vname, tuple(r.shape), dtype, RECIPE, (), data=r))
        return outs if isinstance(node.meta.get("val"), (tuple, list)) else outs[0]

    def tensor(self, v: Value):
        """The torch tensor of constant `v`, or None when it has no data here."""
        torch = self.torch
        if v.literal is not None:
            return torch.tensor(v.literal, dtype=getattr(torch, v.dtype)).reshape(v.shape)
        if v.derive is not None:
            return dict(v.derive.params).get("data") if v.derive.recipe == RECIPE else None
        return self.state.get(v.source)

    def widening(self, node, op, ins: list) -> dict[int, tuple[int, ...]] | None:
        """For a broadcasting op (one with a `broadcast_foldable` check) whose constant operand
        broadcasts inside WHCN's N (Swin's window mask, [1, nW, 1, N, N] against [B, nW, heads,
        N, N]): input position -> the constant's shape expanded over the dims N folds, or None."""
        torch = self.torch
        val = node.meta.get("val")
        if op is None or not any(c.rule == "broadcast_foldable" for c in op.checks):
            return None
        if not isinstance(val, torch.Tensor) or val.dim() <= 4:
            return None
        out = tuple(val.shape)
        folded = len(out) - 3
        wide = {}
        for i, v in enumerate(ins):
            if not isinstance(v, Value) or v.role is not Role.CONST or v.source in self.mutated:
                continue
            padded = (1,) * (len(out) - len(v.shape)) + tuple(v.shape)
            if padded[:folded] != out[:folded] and any(d != 1 for d in padded[:folded]):
                shape = out[:folded] + padded[folded:]
                if math.prod(shape) > MAX_FOLDED_ELEMENTS or self.tensor(v) is None:
                    return None
                wide[i] = shape
        return wide or None

    def widen(self, graph: PlanGraph, ins: list, wide: dict[int, tuple[int, ...]]) -> list:
        """`ins` with the constants `widening` chose replaced by new, expanded constants."""
        out = list(ins)
        for i, shape in wide.items():
            v = ins[i]
            data = self.tensor(v).reshape((1,) * (len(shape) - len(v.shape)) + tuple(v.shape)).expand(shape)
            out[i] = graph.add_derived(f"{v.name}_widened", shape, v.dtype, RECIPE, (), data=data.contiguous())
        return out


def drop_unread(graph: PlanGraph) -> None:
    """Remove folded constants nothing reads: the steps of a folded chain (an index folded, then
    the view of it) leave every step but the last without a user."""
    live = {id(v) for v in graph.outputs}
    graph.constants[:] = [v for v in graph.constants if v.users or id(v) in live or v.derive is None
                          or v.derive.recipe != RECIPE]
