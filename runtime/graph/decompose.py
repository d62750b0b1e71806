"""Decompose one exported node, alone, into the ops torch's own decomposition of it calls.

Lowering asks for this only for a node that cannot run on Vulkan whole, instead of re-tracing the
whole program with `ExportedProgram.run_decompositions`. The node's target is traced over fake
tensors shaped like its inputs (`meta['val']`), one level deep: a composite op
(CompositeImplicitAutograd) through its own kernel, any other through torch's core-ATen
decomposition. Lowering lowers the pieces, decomposing again where needed, and splices them only
when every piece runs on Vulkan. Traces are cached by target and input signature (a ViT's twelve
blocks trace each distinct node once), so a second plan of the same model traces nothing.
"""

from __future__ import annotations

import threading

_CACHE: dict = {}
_CACHE_LIMIT = 2048
_LOCK = threading.Lock()  # make_fx and fake modes are process-wide state: one trace at a time
_CORE: list = []  # torch's core-ATen decomposition table, loaded once


def _core_table() -> dict:
    """Decompositions to core ATen of non-composite ops (the composite ones decompose through
    their own kernel). torch's private post-autograd table loads in milliseconds; the public
    core_aten_decompositions() (the same entries plus every composite op) takes a fifth of a second."""
    if not _CORE:
        import torch._decomp

        table = getattr(torch._decomp, "_core_aten_decompositions_post_autograd", None)
        _CORE.append(dict(table()) if table is not None else dict(torch._decomp.core_aten_decompositions().items()))
    return _CORE[0]


def decomposition_of(target):
    """The callable that decomposes `target` (an OpOverload), or None when torch has none."""
    import torch

    if not isinstance(target, torch._ops.OpOverload):
        return None
    from .own_decompositions import OWN_DECOMPOSITIONS

    if str(target) in OWN_DECOMPOSITIONS:  # texelflow's own (own_decompositions.py)
        return OWN_DECOMPOSITIONS[str(target)]
    if torch._C._dispatch_has_kernel_for_dispatch_key(target.name(), torch._C.DispatchKey.CompositeImplicitAutograd):
        return target  # traced below autograd, a composite op runs its own kernel: its pieces
    return _core_table().get(target)


def decompose(node, target=None):
    """A GraphModule computing fx `node` (as `target`, default its own) from its tensor inputs
    (placeholders in the order of `node.all_input_nodes`) with the ops its decomposition calls,
    or None when torch has no decomposition, the trace fails, or the pieces would mutate."""
    target = target or node.target
    fn = decomposition_of(target)
    if fn is None:
        return None
    inputs = node.all_input_nodes
    key = _signature(node, target, inputs)
    if key is None:
        return None
    with _LOCK:
        if key not in _CACHE:
            if len(_CACHE) >= _CACHE_LIMIT:
                _CACHE.clear()
            _CACHE[key] = _trace(fn, node, inputs)
        return _CACHE[key]


def _signature(node, target, inputs):
    """A hashable key for the trace: target, input shapes/strides/dtypes, the other arguments."""
    import torch

    metas = []
    for a in inputs:
        v = a.meta.get("val")
        if not isinstance(v, torch.Tensor):
            return None
        metas.append((tuple(v.shape), tuple(v.stride()), v.dtype, v.device.type))
    index = {a: i for i, a in enumerate(inputs)}
    shape = torch.fx.node.map_arg((node.args, node.kwargs), lambda a: ("input", index[a]))
    try:
        hash(repr(shape))
    except Exception:
        return None
    return (str(target), tuple(metas), repr(shape))


def _trace(fn, node, inputs):
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    mode = FakeTensorMode()
    with mode:
        fakes = [torch.empty_strided(tuple(a.meta["val"].shape), tuple(a.meta["val"].stride()),
                                     dtype=a.meta["val"].dtype) for a in inputs]

    def call(*tensors):
        by_node = dict(zip(inputs, tensors))
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda a: by_node[a])
        return fn(*args, **kwargs)

    try:
        with mode:  # tensors the decomposition makes from numbers (arange, full) are fake too
            gm = make_fx(call, tracing_mode="real")(*fakes)
    except Exception:  # a decomposition that cannot run on these arguments: the node stays whole
        return None
    gm.graph.eliminate_dead_code()
    for n in gm.graph.nodes:
        if n.op == "call_function" and getattr(getattr(n.target, "_schema", None), "is_mutable", False):
            return None
        if n.op in ("call_module", "call_method", "get_attr"):
            return None
    return gm
