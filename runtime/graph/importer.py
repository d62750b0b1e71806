"""Import: a torch model (or ExportedProgram) to an ATen graph that keeps the registry's ops.

torch.export keeps composite ops such as linear and layer_norm; the decomposition pass then
lowers everything else to core ATen, except targets the registry implements, so those reach the
partitioner whole instead of as their decomposed pieces.
"""

from __future__ import annotations

import warnings
from typing import Sequence

from texelflow.generated.ops import TARGETS


def _registry_ops():
    import torch

    found = []
    for target in TARGETS:
        ns, _, rest = target.partition(".")
        name, _, overload = rest.rpartition(".")
        packet = getattr(getattr(torch.ops, ns, None), name, None)
        op = getattr(packet, overload, None) if packet is not None else None
        if op is not None:
            found.append(op)
    return found


def decomposition_table() -> dict:
    """The default core-ATen decompositions minus every op the registry implements."""
    import torch

    table = dict(torch.export.default_decompositions())
    for op in _registry_ops():
        table.pop(op, None)
    return table


def export_program(model, example_inputs: Sequence = ()):
    """An ExportedProgram with the registry's ops kept and the rest decomposed."""
    import torch

    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)  # one bare tensor is one input, not a sequence of rows
    if isinstance(model, torch.export.ExportedProgram):
        ep = model
    else:
        try:
            with _eval_mode(model, torch):
                ep = torch.export.export(model, tuple(example_inputs))
        except Exception as exc:  # torch's own error stays attached as __cause__
            raise _export_error("torch.export could not export the model", exc) from exc
    try:
        with warnings.catch_warnings():
            # torch 2.13's own deepcopy of pytree specs warns about its own deprecated LeafSpec;
            # the user can do nothing about it
            warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)", category=FutureWarning)
            return ep.run_decompositions(decomposition_table())
    except Exception as exc:
        raise _export_error("torch.export could not decompose the exported program", exc) from exc


def _export_error(what: str, exc: Exception):
    from texelflow.runtime.errors import UnsupportedModelError

    first = (str(exc).strip().splitlines() or [""])[0]
    return UnsupportedModelError(f"{what}: {type(exc).__name__}: {first}")


class _eval_mode:
    """Export in inference mode without changing the user's model: every submodule's `training`
    flag is set directly (a GraphModule from torch.export or torchao's convert_pt2e refuses
    `.eval()`) and restored on the way out, whatever happens."""

    def __init__(self, model, torch):
        self.flags = [(m, m.training) for m in model.modules()] if isinstance(model, torch.nn.Module) else []

    def __enter__(self):
        for m, _ in self.flags:
            object.__setattr__(m, "training", False)

    def __exit__(self, *exc):
        for m, flag in self.flags:
            object.__setattr__(m, "training", flag)
        return False
