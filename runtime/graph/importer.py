"""Import: a model as the user brings it to an ExportedProgram that lowering reads directly.

Accepted: an nn.Module with example inputs (a GraphModule from `torch.export(...).module()` or
torchao's convert_pt2e included), or an ExportedProgram. torch.export's graph keeps composite ops
(linear, layer_norm, scaled_dot_product_attention, ...), which is what the registry implements,
so the program is not re-traced through `run_decompositions`: lowering decomposes, alone, only
the nodes that need it, and rebinds in-place ops on fresh tensors (`relu_`) itself
(`inplace.py`). The exceptions are a graph with other mutations (a buffer's `add_`, a write
seen through a view: torch.export's graph is not functional then) and one with higher-order ops
(`with torch.no_grad():` or `torch.autocast` inside forward, each a submodule call):
`run_decompositions({})` (which functionalizes, inlines those submodules, autocast as its casts,
and keeps every composite op) is run once; with own_decompositions.PROGRAM_DECOMPOSITIONS as its
table where the graph calls one of those (torch.stft, whose pieces are complex).

The user's module is never changed, not even for a moment: it is exported through a shallow
copy (its parameters and buffers shared, not copied) whose modules have `training` False.
"""

from __future__ import annotations

import copy
import time
import warnings
from typing import Sequence

from .inplace import local_functionals


# torch 2.13's own deepcopy of pytree specs (copying a GraphModule, run_decompositions) warns about
# its own deprecated LeafSpec; the user can do nothing about it
_LEAFSPEC_WARNING = r".*isinstance\(treespec, LeafSpec\)"


def export_program(model, example_inputs: Sequence = (), timings: dict | None = None):
    """An ExportedProgram of `model`, functional, with torch.export's ops kept. `timings` (when
    given) gets "export" and "decomposition" seconds."""
    import torch

    timings = {} if timings is None else timings
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)  # one bare tensor is one input, not a sequence of rows
    start = time.perf_counter()
    if isinstance(model, torch.export.ExportedProgram):
        ep = model
    elif isinstance(model, torch.nn.Module):
        module = inference_copy(model)
        try:
            ep = torch.export.export(module, tuple(example_inputs))
        except Exception as exc:  # torch's own error stays attached as __cause__
            raise _export_error("torch.export could not export the model", exc) from exc
    else:
        raise _unsupported(f"texelflow takes an nn.Module (with example inputs) or a torch.export "
                           f"ExportedProgram, not a {type(model).__name__}")
    timings["export"] = time.perf_counter() - start
    start = time.perf_counter()
    mutating = mutating_nodes(ep)
    wrapped = higher_order_nodes(ep)
    table = program_decompositions(ep)
    if table or wrapped or mutating and local_functionals(ep.graph) is None:  # else lowering rebinds them itself
        ep = _functionalize(ep, mutating or wrapped or list(table), table)
    timings["decomposition"] = timings.get("decomposition", 0.0) + time.perf_counter() - start
    return ep


def inference_copy(model):
    """A shallow copy of `model` to export: the same parameter and buffer tensors, every module's
    `training` False (set with object.__setattr__: GraphModules from torch.export or convert_pt2e
    refuse `.eval()`). Always a copy: torch.export swaps a module's parameters for fake tensors
    while it traces, which the user's module (perhaps running in another thread) must never see.
    A module that cannot be copied is exported itself when it is in inference mode already."""
    shared = {id(t): t for t in list(model.parameters()) + list(model.buffers())}
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_LEAFSPEC_WARNING, category=FutureWarning)
            clone = copy.deepcopy(model, memo=shared)
    except Exception as exc:
        if not any(m.training for m in model.modules()):
            return model
        raise _unsupported(
            f"the model is in training mode and could not be copied to export it in inference mode "
            f"({type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}); call .eval() on it first") from exc
    for m in clone.modules():
        object.__setattr__(m, "training", False)
    return clone


def mutating_nodes(ep) -> list[str]:
    """Names of the graph's nodes whose target mutates a tensor (in-place or out= ops)."""
    names = []
    for node in ep.graph.nodes:
        if node.op == "call_function":
            schema = getattr(node.target, "_schema", None)
            if schema is not None and schema.is_mutable:
                names.append(node.name)
    return names


def higher_order_nodes(ep) -> list[str]:
    """Names of the graph's higher-order ops: `with torch.no_grad():` or `torch.autocast` inside
    forward (wrap_with_set_grad_enabled, wrap_with_autocast, each calling a submodule), which
    `run_decompositions` inlines (autocast as the casts it makes), and control flow (torch.cond,
    while_loop), which stays and lowering refuses."""
    import torch

    return [n.name for n in ep.graph.nodes
            if n.op == "call_function" and isinstance(n.target, torch._ops.HigherOrderOperator)]


def program_decompositions(ep) -> dict:
    """The decomposition table of own_decompositions.PROGRAM_DECOMPOSITIONS for the targets `ep`
    calls (torch.stft: frames, a window and a complex DFT), keyed by OpOverload; empty if none."""
    from .own_decompositions import PROGRAM_DECOMPOSITIONS

    table, unfit = {}, set()
    for n in ep.graph.nodes:
        name = str(n.target) if n.op == "call_function" else ""
        if name in PROGRAM_DECOMPOSITIONS:
            fits, fn = PROGRAM_DECOMPOSITIONS[name]
            table[n.target] = fn
            if not fits(n):  # (a table entry applies to every node of its op: all or none)
                unfit.add(n.target)
    return {t: fn for t, fn in table.items() if t not in unfit}


def _functionalize(ep, mutating: list[str], table: dict | None = None):
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_LEAFSPEC_WARNING, category=FutureWarning)
            return ep.run_decompositions(dict(table or {}))
    except Exception as exc:
        what = (f"decompose {', '.join(sorted(str(t) for t in table))}" if table else
                f"functionalize the in-place ops ({', '.join(mutating[:3])})")
        raise _export_error(f"torch.export could not {what}", exc) from exc


def _unsupported(message: str):
    from texelflow.runtime.errors import UnsupportedModelError

    return UnsupportedModelError(message)


def _export_error(what: str, exc: Exception):
    first = (str(exc).strip().splitlines() or [""])[0]
    return _unsupported(f"{what}: {type(exc).__name__}: {first}")
