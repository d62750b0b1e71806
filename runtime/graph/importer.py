"""Import: a torch model (or ExportedProgram) to an ATen graph that keeps the registry's ops.

torch.export keeps composite ops such as linear and layer_norm; the decomposition pass then
lowers everything else to core ATen, except targets the registry implements, so those reach the
partitioner whole instead of as their decomposed pieces.
"""

from __future__ import annotations

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

    if isinstance(model, torch.export.ExportedProgram):
        ep = model
    else:
        if isinstance(model, torch.nn.Module):
            model = model.eval()
        ep = torch.export.export(model, tuple(example_inputs))
    return ep.run_decompositions(decomposition_table())
