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

import contextlib
import operator
import threading

_CACHE: dict = {}
# Trace key -> why texelflow's own decomposition refused those arguments (its NotImplementedError:
# `topk with k = 17, above 16 rounds`), for the node's fallback reason (`refusal`).
_REFUSALS: dict = {}
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


def _second_decomposition(target, first):
    """torch's full decomposition table's entry for `target` where it differs from `first`: the
    reference decompositions inductor uses. A composite RNN op's own kernel either cannot be traced
    over fake tensors (`aten.gru.input`) or calls a fused CPU kernel (`aten.lstm.input`:
    `mkldnn_rnn_layer`); the table's entry unrolls its loop into linear ops."""
    import torch._decomp

    fn = torch._decomp.decomposition_table.get(target)
    return None if fn is None or fn is first else fn


def decompose(node, target=None, alternative: bool = False):
    """A GraphModule computing fx `node` (as `target`, default its own) from its tensor inputs
    (placeholders in the order of `node.all_input_nodes`) with the ops a decomposition of it
    calls: texelflow's own, the composite kernel's or core ATen's; with `alternative`, torch's full
    table's where it differs (lowering asks for it when the first's pieces do not all run on
    Vulkan). None when there is no such decomposition, the trace fails, or the pieces would
    mutate (or, for the alternative, draw random numbers or call prims)."""
    target = target or node.target
    fn = decomposition_of(target)
    if fn is None:
        return None
    if alternative:
        fn = _second_decomposition(target, fn)
        if fn is None:
            return None
    inputs = node.all_input_nodes
    key = _signature(node, target, inputs)
    if key is None:
        return None
    key = key + (alternative,)
    with _LOCK:
        if key not in _CACHE:
            if len(_CACHE) >= _CACHE_LIMIT:
                _CACHE.clear()
                _REFUSALS.clear()
            gm = _trace(fn, node, inputs)
            if isinstance(gm, str):
                _REFUSALS[key] = gm
                gm = None
            if gm is not None and alternative and (_random(gm) or _primitive(gm)):
                gm = None  # dropout's pieces are random too (native_dropout), and torch's references
                # of elementwise ops reach prims no kernel runs: the node's reason stays its own
            _CACHE[key] = gm
        return _CACHE[key]


def refusal(node, target=None) -> str | None:
    """Why texelflow's own decomposition of fx `node` refused its arguments, when it did (after
    `decompose` tried it); None otherwise."""
    key = _signature(node, target or node.target, node.all_input_nodes)
    with _LOCK:
        return None if key is None else _REFUSALS.get(key + (False,))


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


def _primitive(gm) -> bool:
    """Whether a traced decomposition calls torch's prims (the reference implementations)."""
    return any(n.op == "call_function" and str(getattr(n.target, "namespace", "")) == "prims" for n in gm.graph.nodes)


def _random(gm) -> bool:
    """Whether a traced decomposition draws random numbers."""
    import torch

    return any(n.op == "call_function" and torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ())
               for n in gm.graph.nodes)


@contextlib.contextmanager
def _onednn_off(torch):
    """oneDNN off for one trace, only that flag touched (torch.backends.mkldnn.flags() also resets
    TF32 and determinism, and warns about TF32 on every call). Traces hold _LOCK; the flag is
    process-wide, so an eager CPU op on another thread meanwhile runs torch's own kernels: slower
    for those milliseconds, the same values."""
    enabled = torch._C._get_mkldnn_enabled()
    torch._C._set_mkldnn_enabled(False)
    try:
        yield
    finally:
        torch._C._set_mkldnn_enabled(enabled)


def _storage_readers():
    import torch

    return frozenset({torch.ops.aten.as_strided.default, torch.ops.aten.as_strided_copy.default})


def _at_offset(torch, fake, offset: int):
    """`fake` as a view `offset` elements into a storage of its own (as_strided reads a view's
    storage offset; empty_strided makes none)."""
    if not offset:
        return fake
    span = 1 + sum((n - 1) * s for n, s in zip(fake.shape, fake.stride())) if fake.numel() else 0
    return torch.empty(offset + span, dtype=fake.dtype).as_strided(fake.shape, fake.stride(), offset)


def _trace(fn, node, inputs):
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    with mode:
        fakes = [torch.empty_strided(tuple(a.meta["val"].shape), tuple(a.meta["val"].stride()),
                                     dtype=a.meta["val"].dtype) for a in inputs]
        if node.target in _storage_readers():  # ops that read the storage, not the elements: a view's offset too
            fakes = [_at_offset(torch, f, a.meta["val"].storage_offset()) for f, a in zip(fakes, inputs)]

    def call(*tensors):
        by_node = dict(zip(inputs, tensors))
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda a: by_node[a])
        return fn(*args, **kwargs)

    gm = _make_fx(torch, mode, call, fakes)
    if isinstance(gm, str):
        return gm
    if gm is not None and _mutates(gm):
        _functional_intermediates(torch, gm)
    if gm is None or _mutates(gm):  # (a decomposition that writes one of its inputs stays whole)
        return None
    for n in gm.graph.nodes:
        if n.op in ("call_module", "call_method", "get_attr"):
            return None
        if n.op == "call_function" and not isinstance(n.target, torch._ops.OpOverload) and n.target is not operator.getitem:
            return None  # a Python callable in the trace (the named tuple torch's aminmax returns): no op's pieces
    return gm


def _functional_intermediates(torch, gm) -> None:
    """An in-place op on a value the decomposition made itself (rms_norm's `mean(x^2).add_(eps)`)
    becomes its functional form, and the readers of that value after it read its result: the
    same numbers, with no write. In-place ops on the inputs stay (the trace is then refused)."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    for n in list(gm.graph.nodes):
        schema = getattr(n.target, "_schema", None)
        if n.op != "call_function" or schema is None or not schema.is_mutable or not n.args:
            continue
        written = n.args[0]
        if not isinstance(written, torch.fx.Node) or written.op != "call_function":
            continue
        if not schema.arguments[0].alias_info or not schema.arguments[0].alias_info.is_write:
            continue
        if not schema.name.startswith("aten::"):
            continue
        packet = getattr(torch.ops.aten, schema.name.split("::")[-1].rstrip("_"), None)
        functional = getattr(packet, n.target._overloadname, None) if packet is not None else None
        if functional is None or functional._schema.is_mutable:
            continue
        for user in list(written.users):
            if user is not n and order[user] > order[n]:
                user.replace_input_with(written, n)
        n.target = functional
    gm.recompile()


def _make_fx(torch, mode, call, fakes):
    """The traced GraphModule of `call` over `fakes`, dead code removed; None when it fails, or
    the reason texelflow's own decomposition gave for refusing (its NotImplementedError)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    try:
        # Fake tensors in (tensors the decomposition makes from numbers, arange or full, are fake
        # too), and oneDNN off: with it on, torch's LSTM decomposition picks its fused CPU kernel
        # (mkldnn_rnn_layer) rather than the unrolled linear ops a device can run.
        with mode, _onednn_off(torch):
            gm = make_fx(call, tracing_mode="real")(*fakes)
    except NotImplementedError as exc:  # own_decompositions' refusal, or torch's: the node stays whole
        first = (str(exc).splitlines() or [""])[0]
        return first if _own_refusal(exc) else None
    except Exception:  # a decomposition that cannot run on these arguments: the node stays whole
        return None
    gm.graph.eliminate_dead_code()
    return gm


def _own_refusal(exc) -> bool:
    """Whether `exc` was raised by texelflow's own decompositions (own_decompositions.py)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    from .own_decompositions import NotApplicable

    return tb is not None and tb.tb_frame.f_code.co_filename.endswith("own_decompositions.py") and \
        not isinstance(exc, NotApplicable)


def _mutates(gm) -> bool:
    return any(n.op == "call_function" and getattr(getattr(n.target, "_schema", None), "is_mutable", False)
               for n in gm.graph.nodes)
