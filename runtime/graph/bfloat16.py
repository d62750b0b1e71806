"""bfloat16 programs on devices without bfloat16: values held as float32, rounded where torch rounds.

A bfloat16 number is a float32 whose low 16 bits are zero, so the device can hold every bfloat16
tensor as float32 and still give torch's answer: torch's CPU kernels for bfloat16 compute in
float32 and round each op's result to bfloat16 once. `held_as_float32` rewrites an exported
program before lowering, and the rest of texelflow sees a float32 program:

- every bfloat16 placeholder (user input, parameter, buffer, constant) becomes float32 (exact);
- every `torch.bfloat16` argument (`.to(torch.bfloat16)`, `torch.full(..., dtype=)`) becomes float32;
- after each node whose result torch rounds to bfloat16, a `texelflow::round_bfloat16` node rounds
  it (nearest, ties to even, NaN stays NaN). Ops that only move or choose bfloat16 values (views,
  slices, cat, gathers, max, relu, ...: `MOVES`) need none;
- a number beside a bfloat16 tensor (`x + 0.3`, `x > torch.tensor(0.3)`) is rounded first where
  torch converts it to bfloat16 (ROUNDS_NUMBERS; mul and div keep it in float32, as torch does);
- a bfloat16 user input is rounded once where it enters, so a caller passing float32 (a saved
  program, which numpy runs without bfloat16) gets torch's answer too.

The caller still passes and gets bfloat16 tensors: the call converts, exactly, at the boundary
(`PlanGraph.bfloat16`, runtime/program.py and runtime/call_fast.py). Declined (the program keeps torch's bfloat16
nodes, which run on the CPU as before): a program whose forward writes a bfloat16 buffer (the call
writes it back into the model's own tensor) and any graph torch's fake tensors cannot re-propagate.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

BF16 = "bfloat16"

# aten ops (by overload packet) whose bfloat16 results are bfloat16 values of their inputs, moved or
# chosen, never computed: no rounding after them. Overloads that take a number (`where.ScalarOther`)
# write that number, which torch rounds: they are rounded. (A rounding too many changes nothing,
# rounding being idempotent; ops that may sum, as index_put and scatter with accumulate or reduce,
# are left out.)
MOVES = frozenset({
    "_unsafe_view", "abs", "adaptive_max_pool1d", "adaptive_max_pool2d", "alias", "amax", "amin",
    "as_strided", "cat", "chunk", "clone", "concat", "concatenate", "contiguous", "cummax", "cummin",
    "detach", "diagonal", "embedding", "expand", "expand_as", "flatten", "flip", "gather", "index",
    "index_select", "kthvalue", "lift_fresh_copy", "masked_select", "max", "max_pool1d", "max_pool2d",
    "max_pool2d_with_indices", "max_pool3d", "max_pool3d_with_indices", "maximum", "median", "min", "minimum",
    "mode", "movedim", "narrow", "neg", "permute", "pixel_shuffle", "pixel_unshuffle", "relu", "repeat",
    "reshape", "roll", "select", "select_scatter", "slice", "slice_scatter", "sort", "split",
    "split_with_sizes", "squeeze", "stack", "t", "take_along_dim", "tensor_split", "tile", "topk",
    "transpose", "tril", "triu", "unbind", "unflatten", "unfold", "unsqueeze", "view", "view_as", "where",
})
CASTS = frozenset({"_to_copy", "to", "type_as"})
DROPOUTS = frozenset({"alpha_dropout", "dropout", "feature_dropout"})
# Ops whose number operand beside a bfloat16 tensor (a Python float, a 0-d float32 tensor) torch
# rounds to bfloat16 before computing (`x + 0.3`, `x > 0.3`). mul, div and the activations' slopes
# keep the number in float32 (torch computes them in float32 from the number as given).
ROUNDS_NUMBERS = frozenset({"add", "atan2", "eq", "fmod", "ge", "gt", "le", "lt", "ne", "pow", "remainder", "rsub", "sub"})


@dataclass
class HeldAsFloat32:
    """What `held_as_float32` did: the caller's dtype of each bfloat16 user input (by placeholder
    name) and of each user output (by position), how many roundings it added, how many of them
    `fold_roundings` moved into their producer's store, and how many fusion left out."""

    inputs: dict = field(default_factory=dict)
    outputs: dict = field(default_factory=dict)
    rounds: int = 0
    at_store: int = 0
    in_fusion: int = 0  # dropped between two ops fused into one kernel (fusion._round_inside_fusion)

    def summary(self) -> str:
        inside = f", {self.in_fusion} left out inside fused kernels" if self.in_fusion else ""
        return (f"bfloat16 held as float32 on the device: {self.rounds} roundings to bfloat16 (where torch rounds), "
                f"{self.at_store} of them in their producer's store{inside}; the caller passes and gets bfloat16")


def round_bfloat16_reference(self):
    """torch's answer for texelflow's round_bfloat16: the float32 tensor through .bfloat16()."""
    import torch

    return self.to(torch.bfloat16).to(self.dtype)


_ROUND_OP = []


def round_op(torch):
    """torch.ops.texelflow.round_bfloat16.default, registered on first use (CPU and fake kernels,
    so that a program that keeps it on the CPU, and torch.export's fake tensors, run it)."""
    if not _ROUND_OP:
        if not hasattr(torch.ops.texelflow, "round_bfloat16"):
            lib = torch.library.Library("texelflow", "FRAGMENT")
            lib.define("round_bfloat16(Tensor self) -> Tensor")
            lib.impl("round_bfloat16", round_bfloat16_reference, "CompositeExplicitAutograd")
            lib.impl("round_bfloat16", lambda self: torch.empty_like(self), "Meta")
            _ROUND_OP.append(lib)  # the Library must outlive this call, or torch drops the op
        _ROUND_OP.append(torch.ops.texelflow.round_bfloat16.default)
    return _ROUND_OP[-1]


def _is_bf16(x, torch) -> bool:
    return isinstance(x, torch.Tensor) and x.dtype == torch.bfloat16


def _vals(node) -> list:
    val = node.meta.get("val")
    return list(val) if isinstance(val, (tuple, list)) else [val]


def reads_bfloat16(ep, torch) -> bool:
    """Whether any placeholder or node of `ep` holds a bfloat16 tensor."""
    return any(_is_bf16(v, torch) for n in ep.graph.nodes for v in _vals(n))


def held_as_float32(ep):
    """`ep` with its bfloat16 tensors held as float32 (module docstring) and what was done, or
    `ep` itself and None when it has no bfloat16 tensor or the rewrite is declined."""
    import torch

    if not reads_bfloat16(ep, torch):
        return ep, None
    sig = ep.graph_signature
    state = ep.state_dict
    if any(_is_bf16(state.get(b), torch) for b in sig.buffers_to_mutate.values()):
        return ep, None
    try:
        return _rewrite(ep, torch)
    except Exception:  # fake propagation or torch.export's verifier refused: torch's own nodes stay
        return ep, None


def _rewrite(ep, torch):
    sig = ep.graph_signature
    graph = torch.fx.Graph()
    copies: dict = {}
    out = graph.graph_copy(ep.graph, copies)
    graph.output(out)
    report = HeldAsFloat32()
    user_inputs = set(sig.user_inputs)
    op = round_op(torch)
    before = {copies[n]: n for n in ep.graph.nodes if n in copies}  # new node -> original
    for node in list(graph.nodes):
        orig = before.get(node)
        if orig is None:
            continue
        vals = _vals(orig)
        if node.op == "placeholder":
            if _is_bf16(vals[0], torch) and node.name in user_inputs:
                report.inputs[node.name] = BF16
                report.rounds += _round_after(graph, node, op)
            continue
        if node.op != "call_function":
            continue
        node.args = torch.fx.node.map_aggregate(node.args, lambda a: torch.float32 if a is torch.bfloat16 else a)
        node.kwargs = torch.fx.node.map_aggregate(node.kwargs, lambda a: torch.float32 if a is torch.bfloat16 else a)
        if _name(orig.target) in ROUNDS_NUMBERS and any(_is_bf16(a.meta.get("val"), torch) for a in orig.all_input_nodes):
            report.rounds += _round_numbers(graph, node, before, op, torch)
        if not any(_is_bf16(v, torch) for v in vals):
            continue
        if _computes(orig, torch) and _float32_cast(orig, torch):  # now float32 to float32: the rounding alone
            src = node.args[0]
            with graph.inserting_after(node):
                rounded = graph.create_node("call_function", op, (src,), name=f"{node.name}_bf16")
            node.replace_all_uses_with(rounded)
            graph.erase_node(node)
            report.rounds += 1
        elif _computes(orig, torch):
            if isinstance(orig.meta.get("val"), (tuple, list)):
                report.rounds += _round_items(graph, node, vals, op, torch)
            else:
                report.rounds += _round_after(graph, node, op)
    return _program(ep, graph, report, torch), report


def _name(target) -> str:
    return getattr(getattr(target, "_overloadpacket", None), "__name__", "")


def _round_numbers(graph, node, before: dict, op, torch) -> int:
    """Round the numbers beside bfloat16 tensors in a ROUNDS_NUMBERS op: Python floats in place, 0-d
    float32 tensors through a round_bfloat16 node (torch converts both to the common dtype)."""
    count = 0
    node.args = tuple(float(torch.tensor(a, dtype=torch.bfloat16)) if type(a) is float else a for a in node.args)
    for arg in node.all_input_nodes:
        a = before[arg].meta.get("val") if arg in before else None
        if isinstance(a, torch.Tensor) and a.dim() == 0 and a.is_floating_point() and not _is_bf16(a, torch):
            with graph.inserting_before(node):
                rounded = graph.create_node("call_function", op, (arg,), name=f"{arg.name}_bf16")
            node.replace_input_with(arg, rounded)
            count += 1
    return count


def _computes(orig, torch) -> bool:
    """Whether torch rounds `orig`'s bfloat16 result (it computes values, not only moves them)."""
    target = orig.target
    if target.__module__ == "_operator":  # getitem: rounded, if at all, by its producer
        return False
    name = _name(target)
    overload = getattr(target, "_overloadname", "")
    if name in DROPOUTS:  # in inference (train=False, or p=0): the input as it is
        train = orig.kwargs.get("train", orig.args[2] if len(orig.args) > 2 else True)
        p = orig.kwargs.get("p", orig.args[1] if len(orig.args) > 1 else 0.5)
        return not (train is False or p == 0)
    if name in CASTS:
        src = orig.args[0].meta.get("val") if orig.args and hasattr(orig.args[0], "meta") else None
        return not _is_bf16(src, torch)  # bfloat16 to bfloat16 moves; anything else is rounded
    return name not in MOVES or "scalar" in overload.lower() or overload == "value"


def _float32_cast(orig, torch) -> bool:
    """Whether `orig` casts a float32 tensor to bfloat16 (autocast's casts of weights and inputs):
    held as float32, only its rounding is left, which reads the float32 tensor itself (so a
    weight's rounding folds into a constant its linear prepacks)."""
    if _name(orig.target) not in CASTS or not orig.args or not hasattr(orig.args[0], "meta"):
        return False
    src = orig.args[0].meta.get("val")
    return isinstance(src, torch.Tensor) and src.dtype == torch.float32 and _is_bf16(orig.meta.get("val"), torch)


def _round_after(graph, node, op) -> int:
    """Insert round_bfloat16 after `node` and make every reader read it."""
    with graph.inserting_after(node):
        rounded = graph.create_node("call_function", op, (node,), name=f"{node.name}_bf16")
    node.replace_all_uses_with(rounded, delete_user_cb=lambda user: user is not rounded)
    return 1


def _round_items(graph, node, vals: list, op, torch) -> int:
    """Round the bfloat16 items of a node of several results (read through getitem)."""
    count = 0
    for user in list(node.users):
        if user.target.__module__ == "_operator" and _is_bf16(vals[user.args[1]], torch):
            count += _round_after(graph, user, op)
    return count


def _float32(x, torch):
    if not _is_bf16(x, torch):
        return x
    y = x.detach().to(torch.float32)
    return torch.nn.Parameter(y, requires_grad=False) if isinstance(x, torch.nn.Parameter) else y


def _program(ep, graph, report: HeldAsFloat32, torch):
    """The float32 ExportedProgram of the rewritten `graph`: fake values re-propagated, constants
    and example inputs widened, output names updated."""
    from torch.export.graph_signature import ExportGraphSignature, TensorArgument
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    sig = ep.graph_signature
    gm = torch.fx.GraphModule(ep.graph_module, graph)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    fake_mode = torch._guards.detect_fake_mode([n.meta.get("val") for n in placeholders])
    fakes = []
    for n in placeholders:
        val = n.meta.get("val")
        if _is_bf16(val, torch):
            with fake_mode:
                val = torch.empty_strided(tuple(val.shape), tuple(val.stride()), dtype=torch.float32)
        fakes.append(val)
    FakeTensorProp(gm, fake_mode).propagate_dont_convert_inputs(*fakes)
    output = next(n for n in gm.graph.nodes if n.op == "output")
    results = list(output.args[0])
    specs, user = [], 0
    for spec, arg in zip(sig.output_specs, results):
        if isinstance(spec.arg, TensorArgument) and isinstance(arg, torch.fx.Node):
            spec = dataclasses.replace(spec, arg=TensorArgument(name=arg.name))
        if spec.kind.name == "USER_OUTPUT":
            orig = ep.graph.output_node().args[0][len(specs)]
            if isinstance(orig, torch.fx.Node) and _is_bf16(orig.meta.get("val"), torch):
                report.outputs[user] = BF16
            user += 1
        specs.append(spec)
    gm.recompile()
    examples = getattr(ep, "example_inputs", None)
    if examples is not None:
        examples = torch.utils._pytree.tree_map(lambda x: _float32(x, torch), examples)
    return torch.export.ExportedProgram(
        root=gm, graph=gm.graph, graph_signature=ExportGraphSignature(list(sig.input_specs), specs),
        state_dict={k: _float32(v, torch) for k, v in ep.state_dict.items()},
        range_constraints=ep.range_constraints, module_call_graph=ep._module_call_graph,
        example_inputs=examples, constants={k: _float32(v, torch) for k, v in ep.constants.items()},
        verifiers=ep.verifiers)


def rounds_at_store(op_name: str, cache: dict = {}) -> bool:
    """Whether every shader variant of `op_name` can round its float32 `out` at the store (its
    template's contract has a `round_bfloat16` shape class: shaders/_prologue.glsl.j2)."""
    if op_name not in cache:
        from texelflow.generated.variants import variants_of

        found = variants_of(op_name)
        cache[op_name] = bool(found) and all(
            any(s.rule == "round_bfloat16" for s in v.spec_constants) for v in found)
    return cache[op_name]


# Device ops that move float32 values unchanged (besides the registry's identity ops): rounding
# commutes with them, so a rounding after one can move to the store of the node before it.
COMMUTES = frozenset({"permute_copy", "to_layout"})


def _moved_from(graph, v):
    """The value `v` is a move of (through COMMUTES and identity ops, each the only reader of its
    input, which is no graph output), and the moves' nodes; `v` itself and [] when none."""
    moves = []
    while True:
        node = v.producer
        if node is None or not node.on_device or not (node.op.is_identity or node.op.name in COMMUTES):
            return v, moves
        src = next((x for _, x in node.tensor_args()), None)
        if src is None or len(list(node.tensor_args())) != 1 or src.users != [node] or src in graph.outputs:
            return v, moves
        moves.append(node)
        v = src


def _rounded(v) -> bool:
    """Whether `v` already holds bfloat16 values: a round_bfloat16's, or a store that rounds."""
    node = v.producer
    return node is not None and node.on_device and (node.op.name == "round_bfloat16" or node.round_bfloat16)


def bypass(graph, node) -> None:
    """Remove round_bfloat16 `node`: its readers (and the graph's outputs) read its input."""
    src, out = node.arg("self"), node.outputs[0][1]
    for user in list(out.users):
        user.args = [(k, src if a is out else [src if x is out else x for x in a] if isinstance(a, list) else a)
                     for k, a in user.args]
        src.users.append(user)
    graph.outputs[:] = [src if v is out else v for v in graph.outputs]
    for reader, values in graph.fx_inputs.items():  # what CPU fallbacks read
        if any(v is out or isinstance(v, (list, tuple)) and any(x is out for x in v) for v in values):
            graph.fx_inputs[reader] = [src if v is out else type(v)(src if x is out else x for x in v)
                                       if isinstance(v, (list, tuple)) else v for v in values]
    specs = getattr(graph, "output_specs", None)
    if specs is not None:
        graph.output_specs = [(kind, target, src if v is out else v) for kind, target, v in specs]
    out.users.clear()
    graph.nodes.remove(node)
    graph.fx_inputs.pop(node, None)
    src.users[:] = [u for u in src.users if u is not node]


def fold_roundings(graph) -> int:
    """Move each device round_bfloat16 into a producer's store where the producer's kernels can
    round there and nothing else reads the unrounded value: one dispatch and one tensor fewer, the
    same bits (the store applies the same tf_round_bfloat16). The producer may sit before moves
    that commute with rounding (a permute, a view, dropout in inference). A rounding of a value
    already rounded is dropped. Run after fusion and kernel choice (the producer is then the
    node that dispatches). Returns how many roundings it moved or dropped."""
    count = 0
    for node in list(graph.nodes):
        if not (node.on_device and node.op.name == "round_bfloat16"):
            continue
        src, out = node.arg("self"), node.outputs[0][1]
        origin, moves = _moved_from(graph, src)
        if _rounded(origin):
            bypass(graph, node)
            count += 1
            continue
        if src.users != [node] or src in graph.outputs or src.dtype != "float32":
            continue
        producer = origin.producer
        if (producer is None or not producer.on_device or not producer.outputs or producer.outputs[0][1] is not origin
                or origin.users != ([moves[-1]] if moves else [node]) or origin in graph.outputs
                or not rounds_at_store(producer.op.name)):
            continue
        bypass(graph, node)  # the producer's store rounds: the moves after it move rounded values
        producer.round_bfloat16 = True
        producer.fused = producer.fused + [f"rounds to bfloat16 at its store ('{node.name}')"]
        count += 1
    if graph.bfloat16 is not None:
        graph.bfloat16.at_store += count
    return count
