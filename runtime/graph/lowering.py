"""Lower an ExportedProgram to the planning IR and partition it between Vulkan and the CPU.

A node goes to Vulkan when the registry has its target and accepts its dtypes, ranks and
arguments, and when every tensor keeps at least one representation under the device's texture
limits. A node that does not is decomposed alone (`decompose.py`) and replaced by its pieces when
they all run on Vulkan; everything else runs in PyTorch on the CPU, one IR node per fx node, with
its reason in the plan. The graph is torch.export's own, not re-traced: in-place ops on fresh
tensors are rebound here (`inplace.py`), identity-like nodes become the registry's alias op.
"""

from __future__ import annotations

import math
import operator
import time
from typing import Sequence

from texelflow.generated.layouts import DTYPES, TEXTURE_LIMITS
from texelflow.generated.ops import OpEntry, op_for_target
from texelflow.shaders.node_rules import run_checks

from . import complex_pairs, int_ranges
from .constant_folding import MAX_FOLDED_ELEMENTS, RECIPE, ConstantFolder, drop_unread
from .inplace import local_functionals
from .ir import Node, PlanGraph, Role, Value
from .narrowing import (device_input_dtype, fits_narrowed, is_widening_cast, narrow_view, narrow_widening,
                        narrowed_scalar_reason)
from .op_repsets import OpRepSets
from .repr import TensorRepSet

# Schema arguments the layout system makes meaningless: dim order / memory format / placement.
IGNORED_ARGS = frozenset({"memory_format", "non_blocking", "layout", "device", "pin_memory", "dim_order"})


def dtype_name(torch_dtype) -> str:
    return str(torch_dtype).replace("torch.", "")


_TARGET_NAMES: dict = {}


def target_name(target) -> str:
    name = _TARGET_NAMES.get(target)
    if name is None:
        name = _TARGET_NAMES[target] = "getitem" if target is operator.getitem else str(target)
    return name


def lower(ep, texture_limits: Sequence[int] = TEXTURE_LIMITS, timings: dict | None = None,
          decompose_first: dict[str, str] | None = None) -> PlanGraph:
    """The planning IR of `ep` (an ExportedProgram), with every node partitioned.

    The exported graph is lowered as it is (torch.export keeps composite ops such as linear and
    scaled_dot_product_attention). A node that cannot run on Vulkan whole is decomposed alone
    (`decompose.py`), recursively, and replaced by its pieces only when every piece runs on
    Vulkan; otherwise it stays one CPU node with its reason. Identity-like nodes the exported
    graph keeps (dropout in inference, to() that changes nothing) become the registry's alias op
    (`IDENTITY_RULES`). `timings` (when given) gets "lowering" and "decomposition" seconds.
    `decompose_first` maps targets (by name) that the device runs faster as their decomposition
    to why (prepack_matmul.attention_form: attention on a GPU): such a node takes its pieces
    when every piece runs on Vulkan, else it stays whole; its first piece's note says why."""
    from .problem import gc_paused  # (problem imports this module)

    with gc_paused():  # a full collection rescans the exported program's objects: seconds, for nothing
        graph = _lower(ep, texture_limits, timings, decompose_first or {})
        return _with_input_bounds(ep, graph, texture_limits, decompose_first or {})


# Ranges tried for int64 user inputs whose int64 arithmetic sends nodes to the CPU: the smallest
# first (if it moves nothing, none does), then the largest that moves as many
INPUT_BOUNDS = (2**24, 2**20, 2**16, 2**12, 2**8)
UNBOUNDED = "past int32"  # (int_ranges.unbounded_note's words for an interval past int32)


def _with_input_bounds(ep, graph: PlanGraph, texture_limits, decompose_first) -> PlanGraph:
    """`graph`, or where int64 arithmetic of int64 user inputs runs on the CPU only because an
    input is known only to fit int32 (BLOOM's alibi, `(mask.cumsum(-1) - 1) * mask`; `ids * 3 + 1`),
    the graph lowered again assuming those inputs lie in [-R, R]: R the largest of INPUT_BOUNDS
    that leaves fewest CPU nodes and holds the example inputs' own values. The interval analysis
    (int_ranges.py) then bounds the arithmetic inside int32 and it runs on the device. Each call
    checks the inputs lie in that range (call_args: InputValueError otherwise); `graph.input_bounds`
    holds it and the plan shows it. A mask of 0 / 1 times its own running sum (BLOOM) needs 2^12;
    `ids * 3 + 1` needs only 2^24."""
    stuck = [n for n in graph.nodes if n.fallback is not None and UNBOUNDED in n.fallback]
    if not stuck:
        return graph
    names = _int64_inputs_read_by(ep, graph, [n.fx for n in stuck if n.fx is not None])
    seen = _example_magnitudes(ep, names)
    if not names or seen is None:
        return graph
    bounds = [b for b in INPUT_BOUNDS if b >= seen]  # never below the example's own values
    if not bounds:
        return graph

    def lowered(bound: int):
        tried = _lower(ep, texture_limits, None, decompose_first, {name: (-bound, bound) for name in names})
        return tried, sum(n.fallback is not None for n in tried.nodes)

    tightest, fewest = lowered(bounds[-1])
    if fewest >= sum(n.fallback is not None for n in graph.nodes):
        return graph
    for bound in bounds[:-1]:
        tried, count = lowered(bound)
        if count <= fewest:
            return tried
    return tightest


def _example_magnitudes(ep, names: list[str]) -> int | None:
    """The largest magnitude among the example inputs `names` (ep.example_inputs, matched to the
    signature's user inputs), or None when the exported program does not hold them."""
    import torch

    examples = getattr(ep, "example_inputs", None)
    if not examples:
        return None
    leaves = torch.utils._pytree.tree_leaves(examples)
    by_name = dict(zip(ep.graph_signature.user_inputs, leaves))
    largest = 0
    for name in names:
        t = by_name.get(name)
        if not isinstance(t, torch.Tensor):
            return None
        if t.numel():
            largest = max(largest, int(t.abs().max()))
    return largest


def _int64_inputs_read_by(ep, graph: PlanGraph, fx_nodes: list) -> list[str]:
    """The int64 user inputs held narrowed (int32 on the device) that `fx_nodes` of ep's graph
    read, directly or through other nodes."""
    user_inputs = set(ep.graph_signature.user_inputs)
    own = set(ep.graph.nodes)
    seen, stack, found = set(), [n for n in fx_nodes if n in own], []
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op == "placeholder" and n.name in user_inputs and graph.input_host_dtypes.get(n.name) == "int64":
            found.append(n.name)
        stack.extend(n.all_input_nodes)
    return sorted(found)


def _lower(ep, texture_limits, timings, decompose_first, input_bounds: dict | None = None) -> PlanGraph:
    import torch

    start = time.perf_counter()
    ctx = _Lowering(PlanGraph(), texture_limits, torch)
    ctx.decompose_first = decompose_first
    values = ctx.values
    graph = ctx.graph
    sig = ep.graph_signature
    user_inputs = set(sig.user_inputs)
    consts = {**sig.inputs_to_parameters, **sig.inputs_to_buffers, **sig.inputs_to_lifted_tensor_constants}
    # Buffers forward mutates: their prepacked copy would go stale, so their readers run on the CPU
    # (which reads the live state tensor that the call writes back).
    ctx.mutated = set(sig.buffers_to_mutate.values())
    inplace = local_functionals(ep.graph) or {}  # the importer functionalized any other mutation
    folder = ctx.folder = ConstantFolder(ep, torch, ctx.mutated)
    pairs = complex_pairs.rewritable(ep, torch)  # complex values held as float pairs (complex_pairs.py)
    written: dict[str, list[str]] = {}  # an in-place op's tensor: its creator's and writers' fx names
    for node in ep.graph.nodes:
        if node.op == "placeholder":
            val = node.meta.get("val")
            if not isinstance(val, torch.Tensor) and not node.users:
                continue  # a Python number torch.export specialised into the graph: the call checks it
            _check_placeholder(node, val, torch)
            if node.name in user_inputs:
                v = graph.add_input(node.name, val.shape, device_input_dtype(graph, node.name, dtype_name(val.dtype)))
                if input_bounds and node.name in input_bounds and graph.input_host_dtypes.get(node.name) == "int64":
                    graph.input_bounds[node.name] = graph.int_ranges[node.name] = input_bounds[node.name]
            elif pairs and complex_pairs.is_complex(val, torch):  # a complex constant: its real form
                source = consts.get(node.name, node.name)
                v = complex_pairs.constant(graph, node.name, folder.state[source], val.shape)
            else:
                source = consts.get(node.name, node.name)  # the state-dict key of its data
                dtype = dtype_name(val.dtype)
                if source not in ctx.mutated and fits_narrowed(folder.state.get(source), dtype, torch):
                    dtype = device_input_dtype(graph, node.name, dtype)
                v = graph.add_const(node.name, val.shape, dtype, source=source)
            values[node.name] = v
        elif node.op == "call_function":
            if node.target is operator.getitem:
                src, idx = node.args
                values[node.name] = values[src.name][idx]
                continue
            if node.meta.get("val") is None and not node.users:
                continue  # a runtime assertion (aten._assert_tensor_metadata, ...): nothing to compute
            if isinstance(node.target, torch._ops.HigherOrderOperator):  # (the importer inlined the rest)
                raise _unsupported(
                    f"node '{node.name}' is {node.target.name()} (data-dependent control flow, such as "
                    f"torch.cond or torch.while_loop): texelflow compiles straight-line graphs; compute both "
                    f"branches and select with torch.where")
            _check_static(node, node.meta.get("val"), torch)
            ins = [values[a.name] for a in node.all_input_nodes]
            if pairs and (complex_pairs.is_complex(node.meta.get("val"), torch) or
                          any(isinstance(v, (complex_pairs.Pair, complex_pairs.RealPart)) for v in ins)):
                values[node.name] = complex_pairs.lower(ctx, node, node.name, ins)
                continue
            functional = inplace.get(node.name)
            mark = (len(graph.nodes), len(graph.constants))
            wide = folder.widening(node, op_for_target(target_name(node.target)), ins) if functional is None else None
            if wide is not None:  # a constant broadcast inside WHCN's N: widened over it, not expanded per call
                ins = folder.widen(graph, ins, wide)
            values[node.name] = ctx.lower_call(node, node.name, ins, target=functional)
            if ctx.last_fallback is not None and target_name(node.target) in STORAGE_READERS:
                _check_storage_read(node, ctx.last_fallback)
            if functional is None and (ctx.last_fallback is not None or folder.free_view(node, ins) or
                                       folder.rounded_constant(node, ins) or folder.reads_fold(graph, node, ins)):
                values[node.name] = _constant_rescue(ctx, folder, node, ins, mark) or values[node.name]
            if functional is not None:  # every later use of the written tensor reads the result
                names = written.setdefault(node.args[0].name, [node.args[0].name])
                names.append(node.name)
                written[node.name] = names
                for name in names:
                    values[name] = values[node.name]
        elif node.op == "output":
            _lower_outputs(graph, node, values, sig)
    _drop_dead_nodes(graph)
    drop_unread(graph)
    if timings is not None:
        timings["decomposition"] = timings.get("decomposition", 0.0) + ctx.decompose_seconds
        timings["lowering"] = time.perf_counter() - start - ctx.decompose_seconds
    return graph


def _constant_rescue(ctx, folder, node, ins: list, mark: tuple):
    """A node bound for the CPU (or a view or reader of folded constants), folded into a new
    constant when it computes one (constant_folding.py); None when it does not."""
    graph = ctx.graph
    if folder.candidate(node, ins):
        results = folder.compute(node, ins)
        if results is not None:
            _truncate(graph, *mark)
            return folder.add(graph, node, node.name, results)
    return None


def _drop_dead_nodes(graph: PlanGraph) -> None:
    """Remove nodes whose results nothing reads: the pieces of a per-node decomposition the model
    never uses (`x.tensor_split(3)[2]` decomposes into three slices, one of them read), and what
    only they read. The lowered graph is functional, so a node nobody reads computes nothing the
    call returns or writes back."""
    live = {id(v) for v in graph.outputs}
    dead: set[int] = set()
    for node in reversed(graph.nodes):
        if any(v.users or id(v) in live for _, v in node.outputs):
            continue
        dead.add(id(node))
        for _, v in node.tensor_args():
            v.users[:] = [u for u in v.users if u is not node]
        graph.fx_inputs.pop(node, None)
    if dead:
        graph.nodes[:] = [n for n in graph.nodes if id(n) not in dead]


# Targets that compute their input unchanged under a condition on the node (the fx node and its
# lowered inputs): lowered as the registry's alias op, an identity op that planning folds away.
# The exported graph keeps them because torch.export does not decompose them; core ATen would.
def _dropout_inference(node, ins) -> bool:
    train = node.kwargs.get("train", node.args[2] if len(node.args) > 2 else True)
    p = node.kwargs.get("p", node.args[1] if len(node.args) > 1 else 0.5)
    return train is False or p == 0


def _unchanged(node, ins) -> bool:
    """to() / _to_copy() (or expand) whose output has its input's dtype and shape (device and
    memory format mean nothing to the layout system)."""
    out = node.meta.get("val")
    src = node.args[0].meta.get("val") if node.args and hasattr(node.args[0], "meta") else None
    return src is not None and out is not None and out.dtype == src.dtype and tuple(out.shape) == tuple(src.shape)


def _unchanged_or_widened(node, ins) -> bool:
    """_unchanged, or an int32 -> int64 cast: the device holds its result as the int32 it
    already is (narrowing.narrow_widening), or a cast to the dtype the device already holds its
    input in (`ids.int()` of int64 ids held as int32, whose values the call checked fit)."""
    return is_widening_cast(node) or _unchanged(node, ins) or _held_as_cast(node, ins)


def _float_cast(node, target) -> str | None:
    """The registry cast target of a float cast node (FLOAT_CASTS), else None."""
    if target_name(target) not in CAST_TARGETS:
        return None
    out = node.meta.get("val")
    src = node.args[0].meta.get("val") if node.args and hasattr(node.args[0], "meta") else None
    if out is None or src is None or tuple(out.shape) != tuple(src.shape):
        return None
    return FLOAT_CASTS.get((dtype_name(src.dtype), dtype_name(out.dtype)))


def cast_to_int32_reference(self):
    """What cast_to_int32 computes, in torch (the kernel test's reference)."""
    import torch

    return self.to(torch.int32)


def _held_as_cast(node, ins) -> bool:
    """A cast whose result dtype is the one the device already holds its input in (a narrowed
    int64 cast to int32)."""
    out = node.meta.get("val")
    src = node.args[0].meta.get("val") if node.args and hasattr(node.args[0], "meta") else None
    return out is not None and src is not None and dtype_name(out.dtype) == ins[0].dtype and \
        dtype_name(src.dtype) != ins[0].dtype and tuple(out.shape) == tuple(src.shape)


IDENTITY_RULES = {
    "aten.dropout.default": _dropout_inference,
    "aten.feature_dropout.default": _dropout_inference,
    "aten.alpha_dropout.default": _dropout_inference,
    "aten._to_copy.default": _unchanged_or_widened,
    "aten.to.dtype": _unchanged_or_widened,
    "aten.to.dtype_layout": _unchanged,
    "aten.to.device": _unchanged,
    "aten.to.other": _unchanged,
    "aten.expand.default": _unchanged,  # to its own shape (torch's attention decomposition has four)
}
IDENTITY_OP = "aten.alias.default"
# float32 <-> float16 casts (`x.half()`, a float16 model's upcast around a norm) of these targets:
# lowered as the registry's casts that precision="fp16" programs insert (precision.py); float to
# int32 (`x.int()`) as cast_to_int32.
CAST_TARGETS = frozenset({"aten._to_copy.default", "aten.to.dtype", "aten.to.dtype_layout"})
FLOAT_CASTS = {("float32", "float16"): "texelflow.cast_to_float16.default",
               ("float16", "float32"): "texelflow.cast_to_float32.default",
               ("float32", "int32"): "texelflow.cast_to_int32.default",
               ("float16", "int32"): "texelflow.cast_to_int32.default"}
# Why a node with an identity rule that does not hold runs on the CPU (torch has no Vulkan-able
# decomposition of it either).
NOT_IDENTITY_REASONS = {
    "aten.dropout.default": "dropout with train=True is random: it runs in PyTorch",
    "aten.feature_dropout.default": "dropout with train=True is random: it runs in PyTorch",
    "aten.alpha_dropout.default": "dropout with train=True is random: it runs in PyTorch",
}
# Pieces of a decomposition that make a one-element tensor from a number (lerp's weight, ...):
# lowered as a 0-d literal constant, prepacked at load. Target -> the position of the number.
CONSTANT_PIECES = {"aten.full.default": 1, "aten.scalar_tensor.default": 0}
# Pieces that make a tensor from numbers alone (argmax's positions): computed once at lowering and
# prepacked as a folded constant (constant_folding.RECIPE).
FACTORY_PIECES = frozenset({"aten.arange.default", "aten.arange.start", "aten.arange.start_step"})
# PT2E's quantize / dequantize ops: lowered, checked and never decomposed by quantized.py.
QUANTIZED_NAMESPACE = "quantized_decomposed."
MAX_DECOMPOSITION_DEPTH = 8
# Ops computed row by row along the last dim (their other tensors are per-column weights), which a
# rank > 4 input may reach with its leading dims merged (_rows_of_rank3): target -> whether this
# node's arguments keep it so (a layer norm over the last dim only).
ROW_OPS = {
    "aten.linear.default": lambda node: True,
    "aten.layer_norm.default": lambda node: len(node.args[1]) == 1,
    "aten.rms_norm.default": lambda node: len(node.args[1]) == 1,
}


# Reductions, running ops and softmaxes whose kernels take rank <= 4, or a rank 5+ tensor only
# along its last 3 dims (lowering merges a rank 5+ input's dims: _merged_dims).
ALONG_ONE_DIM = frozenset({"aten.cumsum.default", "aten.cumprod.default", "aten.logcumsumexp.default",
                           "aten.softmax.int", "aten.log_softmax.int", "aten._softmax.default",
                           "aten._log_softmax.default"})
MERGED_DIM_TARGETS = ALONG_ONE_DIM | frozenset({
    "aten.sum.dim_IntList", "aten.sum.default", "aten.mean.dim", "aten.mean.default", "aten.amax.default",
    "aten.amin.default", "aten.prod.dim_int", "aten.prod.default", "aten.logsumexp.default", "aten.var.correction",
    "aten.var_mean.correction", "aten.linalg_vector_norm.default"})


def _merged_shape(key: str, shape: list[int], kwargs: dict) -> list[int] | None:
    """The rank <= 4 shape `_merged_dims` reshapes to, with kwargs' `dim` (and `keepdim`: False)
    rewritten in place for it; None where more than 4 groups remain."""
    rank = len(shape)
    if key in ALONG_ONE_DIM:
        d = kwargs["dim"] % rank
        kwargs["dim"] = 1
        return [math.prod(shape[:d]), shape[d], math.prod(shape[d + 1:])]
    if "dim" not in kwargs:  # sum / mean / prod of every element
        return [math.prod(shape)]
    dims = kwargs["dim"]
    dims = list(range(rank)) if dims is None or dims == [] else [dims] if isinstance(dims, int) else list(dims)
    reduced = {d % rank for d in dims}
    groups: list[list] = []  # [is reduced, size]
    for k, n in enumerate(shape):
        if n == 1:
            continue
        if groups and groups[-1][0] == (k in reduced):
            groups[-1][1] *= n
        else:
            groups.append([k in reduced, n])
    if not any(r for r, _ in groups):  # only size-1 dims reduced: nothing to merge for
        return None
    if len(groups) > 4:  # kept and reduced dims interleave: the caller permutes the reduced ones last
        kept = [n for r, n in groups if not r]
        groups = ([[False, math.prod(kept)]] if kept else []) + [[True, math.prod(n for r, n in groups if r)]]
    new_dims = [i for i, (r, _) in enumerate(groups) if r]
    if isinstance(kwargs["dim"], int):
        if len(new_dims) != 1:
            return None
        kwargs["dim"] = new_dims[0]
    else:
        kwargs["dim"] = new_dims
    if "keepdim" in kwargs:
        kwargs["keepdim"] = False
    return [n for _, n in groups]


def _reduced_last(key: str, shape: list[int], dims) -> list[int] | None:
    """The permutation _merged_dims applies first where kept and reduced dims (of size > 1)
    interleave in more than 4 runs: kept dims in order, then reduced ones; else None."""
    if key in ALONG_ONE_DIM or dims is None or dims == [] or isinstance(dims, int):
        return None
    rank = len(shape)
    reduced = {d % rank for d in dims}
    flags = [k in reduced for k, n in enumerate(shape) if n != 1]
    runs = sum(1 for j, f in enumerate(flags) if j == 0 or f != flags[j - 1])
    if runs <= 4:
        return None
    return [k for k in range(rank) if k not in reduced] + sorted(reduced)


class _Lowering:
    """One lowering pass: the IR being built and the fx value map (fx name -> Value or list)."""

    def __init__(self, graph: PlanGraph, limits, torch):
        self.graph, self.limits, self.torch = graph, limits, torch
        self.values: dict[str, object] = {}
        self.mutated: set[str] = set()
        self.decompose_seconds = 0.0
        self.piece_names: set[str] = set()
        self.fits: dict = {}  # partition_reason's representation check, per signature
        self.folder = None  # the ConstantFolder: the constants' data (quantization parameters)
        self.last_fallback: str | None = None  # the reason of the last lower_call, None on Vulkan
        self.last_cause = ""  # its innermost piece that needs the CPU: "target (reason)"
        self.decompose_first: dict[str, str] = {}  # target name -> why its pieces run faster (lower())

    def lower_call(self, node, name: str, ins: list, depth: int = 0, target=None):
        """Lower fx `node` (its tensor inputs' IR values `ins`, in `all_input_nodes` order) under
        IR name `name`: one node, or the pieces of its decomposition. Returns its value(s).
        `target` replaces the node's own (the functional op of an in-place one)."""
        if target_name(target or node.target).startswith(QUANTIZED_NAMESPACE):
            from .quantized import lower_quantized  # (it imports this module)

            value, self.last_fallback = lower_quantized(self, node, name, ins)
            self.last_cause = f"{target_name(node.target)} ({self.last_fallback})"
            return value
        graph = self.graph
        mark = (len(graph.nodes), len(graph.constants))
        ir_node = self._add(node, name, ins, target or node.target)
        if depth > 0 and ir_node.fallback is not None and target_name(ir_node.target) == "aten.convolution.default":
            from .fusion import canonical_conv2d  # (it imports this module)

            ir_node = canonical_conv2d(graph, ir_node, self.limits) or ir_node  # a piece's 2-D conv: conv2d
        self.last_fallback = ir_node.fallback
        self.last_cause = f"{target_name(target or node.target)} ({ir_node.fallback})"
        faster = self.decompose_first.get(target_name(target or node.target)) if ir_node.fallback is None else None
        if (ir_node.fallback is None and faster is None) or depth >= MAX_DECOMPOSITION_DEPTH:
            return self._result(node, ir_node)
        if ir_node.fallback is not None and target is None:
            flat = self._rows_of_rank3(node, name, ins, depth, mark, ir_node)
            if flat is None:
                flat = self._merged_dims(node, name, ins, depth, mark, ir_node)
            if flat is not None:
                return flat
        start = time.perf_counter()
        from .decompose import decompose

        pieces = decompose(node, target)
        alternative = pieces is None  # (torch's full table may still have one: an RNN's composite kernel fails to trace)
        if alternative:
            pieces = decompose(node, target, alternative=True)
        self.decompose_seconds += time.perf_counter() - start
        if pieces is None:
            from .decompose import refusal

            why = refusal(node, target) if ir_node.fallback is not None else None
            if why:  # own_decompositions' limit (`topk with k = 17, above 16 rounds`)
                ir_node.fallback = self.last_fallback = f"{ir_node.fallback}; its decomposition refuses {why}"
                self.last_cause = f"{target_name(target or node.target)} ({ir_node.fallback})"
            return self._result(node, ir_node)
        _truncate(graph, *mark)
        result, why = self._lowered_pieces(pieces, name, ins, depth)
        if why is not None and not alternative:  # the first's pieces need the CPU: torch's full table's, if any
            cause = self.last_cause
            start = time.perf_counter()
            pieces = decompose(node, target, alternative=True)
            self.decompose_seconds += time.perf_counter() - start
            if pieces is not None:
                _truncate(graph, *mark)
                result, why = self._lowered_pieces(pieces, name, ins, depth)
            if why is not None:
                self.last_cause = cause  # the first decomposition's reason: the one torch itself uses
        if why is None:
            self.last_fallback = None
            if faster is not None and len(graph.nodes) > mark[0]:
                graph.nodes[mark[0]].fused.append(f"first piece of {target_name(target or node.target)} "
                                                  f"{name}, decomposed: {faster}")
            return result
        _truncate(graph, *mark)
        _restore(graph, ir_node)
        if faster is not None:  # it runs whole on the device after all
            self.last_fallback = None
            return self._result(node, ir_node)
        ir_node.fallback = f"{ir_node.fallback}; its decomposition needs the CPU for {self.last_cause}"
        self.last_fallback = ir_node.fallback
        return self._result(node, ir_node)

    def _rows_of_rank3(self, node, name: str, ins: list, depth: int, mark: tuple, ir_node: Node):
        """A row-wise op (ROW_OPS: along the last dim, each row alone) whose input has rank > 4,
        which its kernel cannot take: the leading dims merged by a reshape into rank 3, the op,
        its result reshaped back (Video Swin's LayerNorm and MLP on [B, D, H, W, C] tokens). The op
        stays itself, so a constant linear weight is still prepacked (torch's decomposition of
        linear would give an addmm of the general kernel). None where it does not apply or the
        pieces do not all run on the device; the node is as it was then."""
        torch = self.torch
        key = target_name(node.target)
        val = node.meta.get("val")
        inputs = node.all_input_nodes
        if key not in ROW_OPS or not inputs or not isinstance(val, torch.Tensor) or val.dim() <= 4:
            return None
        first = inputs[0].meta.get("val")
        if node.args[0] is not inputs[0] or first.dim() != val.dim() or not ROW_OPS[key](node):
            return None
        from .fx_build import Built

        cause = self.last_cause
        built = Built([(tuple(a.meta["val"].shape), a.meta["val"].dtype) for a in inputs])
        by_node = dict(zip(inputs, built.inputs))
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda a: by_node[a])
        shape = tuple(first.shape)
        rows = built.call(torch.ops.aten.reshape.default, args[0], [-1, shape[-2], shape[-1]])
        out = built.call(node.target, rows, *args[1:], **kwargs)
        out = built.call(torch.ops.aten.reshape.default, out, list(val.shape))
        return self._spliced(built.module(out), name, ins, depth, mark, ir_node, cause)

    def _spliced(self, pieces, name: str, ins: list, depth: int, mark: tuple, ir_node: Node, cause: str):
        """The value(s) of `pieces` (a rewrite of ir_node's fx node) lowered in its place, or None
        with the node restored as it was (its reason and cause too) where a piece needs the CPU."""
        _truncate(self.graph, *mark)
        result, why = self._lowered_pieces(pieces, name, ins, depth)
        if why is None:
            self.last_fallback = None
            return result
        _truncate(self.graph, *mark)
        _restore(self.graph, ir_node)
        self.last_fallback, self.last_cause = ir_node.fallback, cause
        return None

    def _merged_dims(self, node, name: str, ins: list, depth: int, mark: tuple, ir_node: Node):
        """A reduction or running op (MERGED_DIM_TARGETS) of a rank > 4 tensor, which its kernel
        cannot take: neighbouring dims that are all reduced, or all kept, merged by a reshape
        (size-1 dims dropped), the op over the merged dims, its result(s) reshaped to torch's
        (a video model's mean over [T, H, W] of [B, C, T, H, W] runs over [B, C, T H W]; a
        cumsum or softmax along dim d over [before d, d, after d]; kept and reduced dims that
        interleave in more than 4 runs permuted apart first). None where it does not apply (more than 4
        groups remain) or the pieces do not all run on the device; the node is as it was then."""
        torch = self.torch
        key = target_name(node.target)
        inputs = node.all_input_nodes
        if key not in MERGED_DIM_TARGETS or not inputs or node.args[0] is not inputs[0]:
            return None
        first = inputs[0].meta.get("val")
        if not isinstance(first, torch.Tensor) or first.dim() <= 4:
            return None
        from torch.fx.operator_schemas import normalize_function

        normal = normalize_function(node.target, node.args, node.kwargs, normalize_to_only_use_kwargs=True)
        if normal is None:
            return None
        kwargs = dict(normal.kwargs)
        merged = _merged_shape(key, list(first.shape), kwargs)
        if merged is None:
            return None
        from .fx_build import Built

        cause = self.last_cause
        built = Built([(tuple(a.meta["val"].shape), a.meta["val"].dtype) for a in inputs])
        kwargs.pop("input" if "input" in kwargs else "self")  # (normalize_function names it input)
        x = built.inputs[0]
        order = _reduced_last(key, list(first.shape), normal.kwargs.get("dim"))
        if order is not None:
            x = built.call(torch.ops.aten.permute.default, x, order)
        x = built.call(torch.ops.aten.reshape.default, x, merged)
        out = built.call(node.target, x, **kwargs)
        val = node.meta.get("val")
        if isinstance(val, (tuple, list)):
            out = tuple(built.call(torch.ops.aten.reshape.default, built.item(out, i), list(v.shape))
                        for i, v in enumerate(val))
        else:
            out = built.call(torch.ops.aten.reshape.default, out, list(val.shape))
        return self._spliced(built.module(out), name, ins, depth, mark, ir_node, cause)

    def _lowered_pieces(self, pieces, name: str, ins: list, depth: int):
        """_lower_pieces one level deeper, an exception as the reason."""
        try:
            return self._lower_pieces(pieces, name, ins, depth + 1)
        except Exception as exc:  # a piece texelflow cannot lower: the node stays whole
            self.last_cause = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
            return None, self.last_cause

    def _lower_pieces(self, gm, name: str, ins: list, depth: int, keep_cpu: bool = False):
        """Lower a decomposition's graph; (its output value(s), None) when every piece runs on
        Vulkan, else (None, the first piece's reason). With `keep_cpu`, a piece that needs the CPU
        stays a CPU node of its own (complex_pairs' real forms, which have no whole node to go back to)."""
        env: dict[str, object] = {}
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        for p, v in zip(placeholders, ins):
            env[p.name] = v
        for n in gm.graph.nodes:
            if n.op == "call_function" and n.target is operator.getitem:
                src, idx = n.args
                env[n.name] = env[src.name][idx]
            elif n.op == "call_function" and self._constant_piece(n) is not None:
                val = n.meta["val"]
                env[n.name] = self.graph.add_const(self._piece_name(name, n.name), tuple(val.shape),
                                                   dtype_name(val.dtype), literal=self._constant_piece(n))
            elif n.op == "call_function" and self._factory_piece(n):
                data = n.target(*n.args, **n.kwargs).contiguous()  # numbers in, a real tensor out
                if self.folder is not None:  # (int64 positions that fit are held narrowed)
                    env[n.name] = self.folder.add(self.graph, n, self._piece_name(name, n.name), [data])
                else:
                    env[n.name] = self.graph.add_derived(self._piece_name(name, n.name), tuple(data.shape),
                                                         dtype_name(data.dtype), RECIPE, (), data=data)
            elif n.op == "call_function":
                _check_static(n, n.meta.get("val"), self.torch)
                piece = self._piece_name(name, n.name)
                piece_ins = [env[a.name] for a in n.all_input_nodes]
                mark = (len(self.graph.nodes), len(self.graph.constants))
                env[n.name] = self.lower_call(n, piece, piece_ins, depth)
                if self.last_fallback is not None or self._of_constants(n, piece_ins):
                    folded = self._fold_piece(n, piece, piece_ins, mark)
                    if folded is None and self.last_fallback is not None and not keep_cpu:
                        return None, self.last_fallback
                    if folded is not None:
                        env[n.name], self.last_fallback = folded, None
            elif n.op == "output":
                conv = self.torch.fx.node.map_arg(n.args[0], lambda a: env[a.name])
                outs = list(conv) if isinstance(conv, (tuple, list)) else [conv]
                if not all(isinstance(v, Value) for v in outs):
                    self.last_cause = "a decomposition whose outputs are not all tensors"
                    return None, self.last_cause
                return (outs if isinstance(conv, (tuple, list)) else conv), None
        self.last_cause = "a decomposition without an output"
        return None, self.last_cause

    def _of_constants(self, n, ins: list) -> bool:
        """A piece computed from constants alone and no larger than they are: folded at lowering
        even where the device could run it, so that a weight the decomposition reshapes (an RNN's
        `weight.t()` into addmm, its two biases summed) stays a constant for the ops that prepack
        it, and the work is done once rather than every call."""
        val = n.meta.get("val")
        if self.folder is None or not ins or not isinstance(val, self.torch.Tensor):
            return False
        return (val.numel() <= sum(v.numel for v in ins if isinstance(v, Value))
                and self.folder.candidate(n, ins))

    def _fold_piece(self, n, piece: str, ins: list, mark: tuple):
        """A piece bound for the CPU that computes a constant (numbers and constants in: the
        causal mask torch's attention decomposition builds with ones() and tril()), folded into
        one at lowering (constant_folding.py); None when it does not."""
        folder = self.folder
        if folder is None or not folder.candidate(n, ins):
            return None
        results = folder.compute(n, ins)
        if results is None:
            return None
        _truncate(self.graph, *mark)
        return folder.add(self.graph, n, piece, results)

    def _constant_piece(self, n):
        """The number a CONSTANT_PIECES node fills its one-element tensor with, else None."""
        pos = CONSTANT_PIECES.get(target_name(n.target))
        val = n.meta.get("val")
        if pos is None or n.all_input_nodes or not isinstance(val, self.torch.Tensor) or val.numel() != 1:
            return None
        number = n.args[pos] if len(n.args) > pos else None
        return number if isinstance(number, (int, float)) and not isinstance(number, bool) else None

    def _factory_piece(self, n) -> bool:
        """A FACTORY_PIECES node small enough to fold (constant_folding.MAX_FOLDED_ELEMENTS)."""
        val = n.meta.get("val")
        return (target_name(n.target) in FACTORY_PIECES and not n.all_input_nodes
                and isinstance(val, self.torch.Tensor) and val.numel() <= MAX_FOLDED_ELEMENTS)

    def _piece_name(self, parent: str, piece: str) -> str:
        root = parent.split("/", 1)[0]
        name, i = f"{root}/{piece}", 1
        while name in self.piece_names:
            name, i = f"{root}/{piece}_{i}", i + 1
        self.piece_names.add(name)
        return name

    def _add(self, node, name: str, ins: list, target) -> Node:
        """Append the IR node of fx `node` (computing `target`) with its partition (fallback
        reason or None), and the inputs a CPU fallback of it reads (`graph.fx_inputs`)."""
        rule = IDENTITY_RULES.get(target_name(target))
        identity = rule is not None and ins and isinstance(ins[0], Value) and rule(node, ins)
        cast = _float_cast(node, target) if not identity and ins and isinstance(ins[0], Value) else None
        if identity or cast is not None:
            op = op_for_target(IDENTITY_OP if identity else cast)
            val = node.meta.get("val")
            ir_node = self.graph.add_node(name, target_name(target), op, [("self", ins[0])],
                                          [("out", tuple(val.shape), dtype_name(val.dtype))])
            ir_node.fx = node
            ir_node.fallback = partition_reason(ir_node, self.limits, self.fits)
        else:
            by_fx = dict(zip(node.all_input_nodes, ins))
            ir_node = _lower_node(self.graph, node, name, by_fx, self.limits, self.torch, self.fits, target)
            if rule is not None and ir_node.op is None:
                ir_node.fallback = NOT_IDENTITY_REASONS.get(target_name(target), ir_node.fallback)
        self.graph.fx_inputs[ir_node] = ins
        if ir_node.op is not None:
            int_ranges.record(self.graph, ir_node, self.folder.tensor if self.folder is not None else lambda v: None)
        if ir_node.op is not None and (narrow_view(self.graph, ir_node) or
                                       ir_node.op.is_identity and narrow_widening(self.graph, ir_node) or
                                       int_ranges.narrow_bounded(self.graph, ir_node)):
            ir_node.fallback = partition_reason(ir_node, self.limits, self.fits)
        if ir_node.fallback is None and any(v.role is Role.CONST and v.source in self.mutated
                                            for _, v in ir_node.tensor_args()):
            ir_node.fallback = "reads a buffer that forward mutates (it runs on the CPU, on the live buffer)"
        if ir_node.fallback is None:
            ir_node.fallback = narrowed_scalar_reason(self.graph, ir_node)
        elif ir_node.op is not None:
            note = int_ranges.unbounded_note(self.graph, ir_node)
            ir_node.fallback = ir_node.fallback if note is None else f"{ir_node.fallback}: {note}"
        return ir_node

    @staticmethod
    def _result(node, ir_node: Node):
        outs = [v for _, v in ir_node.outputs]
        return outs if isinstance(node.meta.get("val"), (tuple, list)) else outs[0]


def _truncate(graph: PlanGraph, num_nodes: int, num_consts: int) -> None:
    """Drop the nodes and constants added after the given counts (a decomposition not taken)."""
    for n in graph.nodes[num_nodes:]:
        for _, v in n.tensor_args():
            if n in v.users:
                v.users.remove(n)
    del graph.nodes[num_nodes:]
    del graph.constants[num_consts:]


def _restore(graph: PlanGraph, node: Node) -> None:
    """Append a node that _truncate removed, with its inputs' use sites and constants back."""
    for _, v in node.tensor_args():
        v.users.append(node)
        if v.role is Role.CONST and v.literal is not None and v not in graph.constants:
            graph.constants.append(v)
    graph.nodes.append(node)


STORAGE_READERS = frozenset({"aten.as_strided.default", "aten.as_strided_copy.default"})


def _check_storage_read(node, reason: str) -> None:
    """An as_strided left on the CPU must read only its input's own elements from a tensor of
    its own (offset 0, contiguous): the CPU side receives the input's values, not the storage of
    the tensor it was a view of, so any other read would give another answer than torch's."""
    val = node.all_input_nodes[0].meta.get("val") if node.all_input_nodes else None
    view = val is not None and (val.storage_offset() != 0 or not val.is_contiguous())
    if view or "outside its input's elements" in reason:
        raise _unsupported(
            f"node '{node.name}' ({target_name(node.target)}) reads storage positions that are not elements of "
            f"its input{' (a view of another tensor)' if view else ''}: texelflow holds each tensor's elements, not "
            f"torch's storage; take the elements by slicing, unfold or index instead")


def _unsupported(message: str):
    from texelflow.runtime.errors import UnsupportedModelError

    return UnsupportedModelError(message)


def _check_placeholder(node, val, torch) -> None:
    """Refuse, clearly, a graph input texelflow cannot feed: a symbolic scalar or a dynamic shape."""
    if not isinstance(val, torch.Tensor):
        kind = type(val).__name__
        raise _unsupported(
            f"input '{node.name}' is a {kind} the graph computes with, not a tensor: texelflow compiles "
            f"tensor inputs and Python numbers torch.export specialises; pass a tensor (a 0-d one for a scalar)")
    _check_static(node, val, torch)


def _check_static(node, val, torch) -> None:
    vals = val if isinstance(val, (tuple, list)) else (val,)
    for v in vals:
        if node.op == "call_function" and v is not None and not isinstance(v, torch.Tensor):
            raise _unsupported(
                f"node '{node.name}' ({target_name(node.target)}) computes a {type(v).__name__}, not a tensor "
                f"(a Python number read from tensor data, e.g. .item() or .tolist()): texelflow compiles "
                f"graphs of tensors only")
        shape = getattr(v, "shape", ())
        if any(not isinstance(d, int) for d in shape):
            raise _unsupported(
                f"node '{node.name}' has the dynamic shape {list(shape)}: texelflow compiles static shapes "
                f"only; export without dynamic_shapes (torch.export.Dim)")


def _lower_outputs(graph: PlanGraph, node, values, sig) -> None:
    """graph.outputs: every tensor the host needs back; graph.output_specs: for each output of the
    exported graph, in order, (kind, target, value) with kind "user" (returned to the caller),
    "buffer" (target: the state-dict key written back) or "input" (target: the position of the
    user input written back among the flattened call arguments); value is a Value or a literal."""
    from torch.export.graph_signature import OutputKind

    specs = list(sig.output_specs)
    # the position of each user input among the call's flattened arguments (Python numbers included)
    user_index = {name: i for i, name in enumerate(sig.user_inputs) if isinstance(name, str)}
    graph.output_specs = []
    for i, out in enumerate(node.args[0]):
        v = values.get(out.name) if hasattr(out, "name") else out
        spec = specs[i] if i < len(specs) else None
        kind, target = "user", None
        if spec is not None and spec.kind == OutputKind.BUFFER_MUTATION:
            kind, target = "buffer", spec.target
        elif spec is not None and spec.kind == OutputKind.USER_INPUT_MUTATION:
            kind, target = "input", user_index[spec.target]
        elif spec is not None and spec.kind not in (OutputKind.USER_OUTPUT, OutputKind.LOSS_OUTPUT):
            raise _unsupported(f"output '{getattr(out, 'name', out)}' is a {spec.kind.name} output, "
                               f"which texelflow does not support")
        if isinstance(v, Value):
            graph.outputs.append(v)
        graph.output_specs.append((kind, target, v))


def _lower_node(graph: PlanGraph, node, name: str, by_fx: dict, limits, torch, fits: dict | None = None,
                target_op=None) -> Node:
    """Append the IR node of fx `node` (its inputs' IR values in `by_fx`, fx node -> value),
    computing `target_op` (default: the node's target)."""
    target_op = target_op or node.target
    target = target_name(target_op)
    op = op_for_target(target)
    schema = target_op._schema
    val = node.meta.get("val")
    vals = val if isinstance(val, (tuple, list)) else (val,)
    if op is not None and len(op.outputs) == len(vals):
        out_names = [o.name for o in op.outputs]
    else:
        out_names = ["out"] if len(vals) == 1 else [f"out{i}" for i in range(len(vals))]
    outputs = [(n, tuple(v.shape), dtype_name(v.dtype)) for n, v in zip(out_names, vals) if v is not None]

    args, reason = _resolve_args(graph, node, name, schema, op, by_fx, torch)
    ir_node = graph.add_node(name, target, op, args, outputs)
    ir_node.fx = node
    if reason is None:
        reason = partition_reason(ir_node, limits, fits)
    ir_node.fallback = reason
    return ir_node


def _resolve_args(graph, node, name: str, schema, op: OpEntry | None, by_fx: dict, torch):
    """(name, value) pairs in schema order; python numbers in tensor slots become constants."""
    given = {}
    for i, a in enumerate(node.args):
        given[schema.arguments[i].name] = a
    given.update(node.kwargs)
    declared = {a.name: a for a in op.args} if op else {}
    args = []
    reason = None
    for sarg in schema.arguments:
        if sarg.name not in given:
            continue
        raw = given[sarg.name]
        value = _convert(raw, by_fx)
        spec = declared.get(sarg.name)
        if op is not None and spec is None:
            if sarg.name in IGNORED_ARGS or raw is None or raw == sarg.default_value:
                continue
            reason = reason or f"argument '{sarg.name}'={raw!r} is not supported by the Vulkan op"
        if spec is not None and spec.kind == "tensor" and isinstance(value, (int, float)) and not isinstance(value, bool):
            out_dtype = dtype_name(node.meta["val"].dtype) if hasattr(node.meta.get("val"), "dtype") else "float32"
            value = graph.add_const(f"{name}_{sarg.name}", (), out_dtype, literal=value)
        args.append((sarg.name, value))
    return args, reason


def _convert(raw, by_fx: dict):
    if hasattr(raw, "name") and hasattr(raw, "op"):  # an fx Node
        return by_fx[raw]
    if isinstance(raw, (list, tuple)):
        return [_convert(x, by_fx) for x in raw]
    return raw


def tensor_shapes(node: Node) -> dict[str, object]:
    """Registry tensor name -> shape (a list of shapes for a tensor list) for OpRepSets.build."""
    shapes: dict[str, object] = {}
    for name, v in node.args:
        if isinstance(v, Value):
            shapes[name] = v.shape
        elif isinstance(v, list) and v and all(isinstance(x, Value) for x in v):
            shapes[name] = [x.shape for x in v]
    for name, v in node.outputs:
        shapes[name] = v.shape
    return shapes


def variant_dtype(node: Node) -> str | None:
    """The dtype of the variant `node` runs: its output's, unless ops.yaml's dtype_of fixes that
    (quantize_per_tensor's int8 output: the variant is its float input's)."""
    dtypes = {name: v.dtype for name, v in node.outputs}
    for name, v in node.tensor_args():
        dtypes.setdefault(name, v.dtype)
    chosen = node.op.variant_dtype(dtypes) if node.op is not None else None
    return chosen or (node.outputs[0][1].dtype if node.outputs else None)


def node_repsets(node: Node, limits: Sequence[int] = TEXTURE_LIMITS) -> OpRepSets:
    dtype = variant_dtype(node)
    sets = OpRepSets.build(node.op, tensor_shapes(node), limits, dtype if dtype in DTYPES else None)
    if node.op.is_identity and not sets.any_empty():
        _foldable_only(node, sets)
    return sets


def _foldable_only(node: Node, sets: OpRepSets) -> None:
    """An identity op that reshapes is free only where its elements stay in place; elsewhere it
    is a copy dispatch, as costly as a transition. Narrow it to those representations (when it
    has any), so the planner counts that copy as the transition it really is."""
    from .redundant import same_placement

    ((in_name, src),) = list(node.tensor_args())
    out = node.outputs[0][1]
    if tuple(src.shape) == tuple(out.shape):
        return
    keep = [r for r in sets.sets[in_name] if same_placement(src.shape, out.shape, r)]
    if keep:
        sets.constrain(in_name, TensorRepSet.of(*keep))


def partition_reason(node: Node, limits, fits: dict | None = None) -> str | None:
    """Why `node` cannot run on Vulkan, or None. `fits` caches the representation check per
    signature for one lowering (large graphs repeat a few signatures thousands of times)."""
    op = node.op
    if op is None:
        return f"no Vulkan op implements {node.target}"
    if not op.variants:
        return f"op '{op.name}' has no shader"
    tensors = [v for _, v in node.tensor_args()] + [v for _, v in node.outputs]
    declared = {a.name for a in op.args if a.kind in ("tensor", "tensor_list")}
    for name, v in node.args:
        if isinstance(v, (Value, list)) and name not in declared and (isinstance(v, Value) or any(isinstance(x, Value) for x in v)):
            return f"tensor argument '{name}' is not declared by op '{op.name}'"
    fixed = dict(op.dtype_of)  # tensors of one dtype whatever the variant's (a comparison's bool out)
    free = []
    for name, v in list(node.tensor_args()) + list(node.outputs):
        if name in fixed and v.dtype != fixed[name]:
            return f"dtype {v.dtype} of '{v.name}' (op '{op.name}' takes {fixed[name]} as '{name}')"
        if name not in fixed:
            if v.dtype not in op.dtypes:
                return f"dtype {v.dtype} of '{v.name}' (op '{op.name}' takes {', '.join(op.dtypes)})"
            free.append(v)
    if len({v.dtype for v in free}) > 1:
        return f"mixed dtypes {sorted({v.dtype for v in free})}"
    for v in tensors:
        if 0 in v.shape:
            return f"'{v.name}' has no elements (shape {list(v.shape)})"
    if "supports_highdim" not in op.flags and any(len(v.shape) > 4 for v in tensors):
        return "a tensor has more than 4 dims and the op does not support that"
    for w in op.weights:
        v = node.arg(w)
        if isinstance(v, Value) and v.role is not Role.CONST:
            return f"weight '{w}' is not a constant (it is prepacked at load)"
    reason = run_checks(node, op.checks)
    if reason:
        return reason
    empty = _empty_tensors(node, limits, fits)
    if empty:
        shapes = tensor_shapes(node)
        bound = f", buffers up to {limits[3]} bytes" if len(limits) > 3 else ""
        return f"no representation fits {empty[0]} {list(shapes[empty[0]])} (texture limits {tuple(limits[:3])}{bound})"
    return None


def _empty_tensors(node: Node, limits, fits: dict | None) -> list[str]:
    """The tensors of `node` that no representation of their repset fits (a pure function of the
    op, the dtype and the shapes: cached in `fits` when given)."""
    if fits is None:
        return node_repsets(node, limits).empty_tensors()
    shapes = tensor_shapes(node)
    key = (id(node.op), variant_dtype(node),
           tuple((n, tuple(map(tuple, x)) if isinstance(x, list) else tuple(x)) for n, x in shapes.items()))
    empty = fits.get(key)
    if empty is None:
        empty = fits[key] = node_repsets(node, limits).empty_tensors()
    return empty
