"""The end of a CompiledProgram call: the caller's outputs, and mutations written back as torch does.

`lower` records, for each output of the exported graph, whether it is returned to the caller, a
new value for a module buffer, or a new value for a user input (an in-place op in forward). After
a call, buffers and inputs are updated in place (`copy_`), so the user's tensors and the module's
buffers change exactly as in eager PyTorch; returned parameters and buffers are the live tensors.
"""

from __future__ import annotations

from texelflow.runtime.graph.ir import Value


def finish_call(prog, flat: list, env: dict):
    """The pytree of user outputs of one call of `prog`, after writing mutations back."""
    torch = prog._torch
    graph = prog.plan.graph
    specs = getattr(graph, "output_specs", None)
    if specs is None:  # a graph built without lowering's output specs: every output is returned
        specs = [("user", None, v) for v in graph.outputs]
    results, writes = [], []
    for kind, target, v in specs:
        value = output_value(prog, v, env)
        if kind == "user":
            results.append(value)
        else:
            writes.append((kind, target, value))
    with torch.no_grad():
        for kind, target, value in writes:
            dest = prog._state[target] if kind == "buffer" else flat[target]
            if dest is not value:
                dest.copy_(value)
    out_spec = getattr(prog, "_out_spec", None)  # read once at build (call_spec is slow to read)
    if out_spec is None:
        out_spec = prog.exported.call_spec.out_spec
    return torch.utils._pytree.tree_unflatten(results, out_spec)


def output_value(prog, v, env: dict):
    """The host value of one graph output: a computed tensor, an input, a constant or a literal."""
    if not isinstance(v, Value):
        return v
    value = prog._value_of(v, env)
    if isinstance(value, prog._torch.Tensor) and tuple(value.shape) != tuple(v.shape):
        value = value.reshape(v.shape)
    return value
