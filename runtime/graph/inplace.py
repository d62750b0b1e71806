"""In-place ops that lowering can make functional by itself, without re-tracing the program.

torch.export's graph keeps in-place ops (`relu_` of `ReLU(inplace=True)`, `add_` of `out += x`).
When such an op writes a tensor that an earlier op of the graph created (not an input, parameter
or buffer) and that no view shares, it is exactly its functional op (`relu`) whose result every
later use of the written tensor reads: lowering does that rebinding. Anything else (a buffer's
`add_`, a write through a view, an `out=` op) needs torch's functionalization: the importer runs
`run_decompositions({})` once for those graphs.
"""

from __future__ import annotations

import operator


def local_functionals(graph) -> dict[str, object] | None:
    """fx node name -> the functional OpOverload of each in-place node lowering can rebind by
    itself; {} for a graph without mutation; None when some mutation needs functionalization."""
    import torch

    fresh: set = set()  # nodes whose tensor no earlier node aliases
    group: dict = {}  # a written tensor's nodes (its creator and each in-place op on it) -> creator
    out: dict[str, object] = {}
    for n in graph.nodes:
        if n.op != "call_function":
            continue
        if n.target is operator.getitem:
            if n.args[0] in fresh:
                fresh.add(n)
            continue
        schema = getattr(n.target, "_schema", None)
        if schema is None:
            continue
        if not schema.is_mutable:
            if not any(r.alias_info is not None for r in schema.returns):
                fresh.add(n)
            continue
        functional = _functional_of(n.target, torch)
        written = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
        src = n.args[0] if n.args else None
        if functional is None or written != [schema.arguments[0].name] or not isinstance(src, torch.fx.Node):
            return None
        root = group.get(src, src)
        if root not in fresh:
            return None  # writes an input, parameter, buffer or view: torch must functionalize
        group[src] = group[n] = root
        out[n.name] = functional
    for member in group:
        for user in member.users:
            if user.op != "call_function" or user.name in out or user.target is operator.getitem:
                continue
            schema = getattr(user.target, "_schema", None)
            if schema is None or any(a.alias_info is not None for a in schema.arguments):
                return None  # a view of a written tensor would see the write
    return out


def _functional_of(target, torch):
    """aten.relu_.default -> aten.relu.default (same arguments, not mutable), or None."""
    if not isinstance(target, torch._ops.OpOverload):
        return None
    ns, _, name = target._schema.name.partition("::")
    if not name.endswith("_") or name.endswith("__"):
        return None
    packet = getattr(getattr(torch.ops, ns, None), name[:-1], None)
    functional = getattr(packet, target._overloadname, None) if packet is not None else None
    if functional is None or functional._schema.is_mutable:
        return None
    if [a.name for a in functional._schema.arguments] != [a.name for a in target._schema.arguments]:
        return None
    return functional
