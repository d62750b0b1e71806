"""Complex tensors as pairs of floats, at lowering: rotary embeddings written with complex numbers.

Meta's LLaMA reference code (and the models copied from it) rotates queries and keys with
`torch.view_as_complex(x.reshape(..., -1, 2)) * freqs_cis`, then `view_as_real(...).flatten(3)`,
with `freqs_cis` a complex64 constant from `torch.polar`. No kernel takes complex data, so each
complex value is held as its `view_as_real` form, a float32 tensor with a trailing dim of 2 (real,
imaginary): `view_as_complex` and `view_as_real` become nothing, a complex constant becomes a
float constant of that form, views move the trailing pair along, and arithmetic becomes real ops
on the two parts (a complex product: four products, a difference, a sum and a stack; by a
complex constant, x A + flip(x) B with A and B folded: `_rotation`). Each complex node is traced
into those real ops (`_real_form`) and lowered like a decomposition; a complex node of constants
alone is computed once, with torch. Fourier transforms (FNet's `fftn(x).real`, GFNet's rfft2 /
irfft2 filter) become one `linear` a transformed dim by a DFT matrix on the interleaved pairs
(`_dft`); an FFT read only through `.real` computes only the real parts (`RealPart`).

All or nothing: a graph is rewritten only when `rewritable` finds every complex node among the
forms below, no complex user input and no complex output (the user gets torch's dtypes back);
otherwise its complex nodes stay CPU nodes with their reasons, as before.
"""

from __future__ import annotations

from .constant_folding import RECIPE
from .fx_build import Built
from .ir import Role, Value

VIEWS = frozenset({
    "aten.slice.Tensor", "aten.select.int", "aten.view.default", "aten.reshape.default", "aten._unsafe_view.default",
    "aten.unsqueeze.default", "aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default", "aten.permute.default",
    "aten.transpose.int", "aten.t.default", "aten.expand.default", "aten.flatten.using_ints", "aten.clone.default",
    "aten.alias.default", "aten.contiguous.default", "aten.cat.default", "aten.stack.default",
    "aten._to_copy.default", "aten.to.dtype", "aten.type_as.default", "aten.lift_fresh_copy.default",
})
ARITHMETIC = frozenset({
    "aten.mul.Tensor", "aten.mul.Scalar", "aten.add.Tensor", "aten.sub.Tensor", "aten.div.Tensor", "aten.div.Scalar",
    "aten.neg.default", "aten.conj.default", "aten._conj.default", "aten.conj_physical.default",
    "aten.resolve_conj.default", "aten.abs.default", "aten.angle.default", "aten.real.default", "aten.imag.default",
    "aten.polar.default", "aten.complex.default", "aten.exp.default", "aten.sum.dim_IntList", "aten.mean.dim",
    "aten.view_as_complex.default", "aten.view_as_real.default",
})
# Discrete Fourier transforms (FNet's token mixing: fftn(x).real), as products with the DFT's cos
# and sin matrices, folded constants (`_dft`)
FFTS = frozenset({
    "aten.fft_fft.default", "aten.fft_ifft.default", "aten.fft_rfft.default", "aten.fft_irfft.default",
    "aten.fft_fftn.default", "aten.fft_ifftn.default", "aten.fft_fft2.default", "aten.fft_ifft2.default",
    "aten.fft_rfftn.default", "aten.fft_irfftn.default", "aten.fft_rfft2.default", "aten.fft_irfft2.default",
})
FFT_NORMS = (None, "backward", "ortho", "forward")
FORMS = VIEWS | ARITHMETIC | FFTS
CASTS = frozenset({"aten._to_copy.default", "aten.to.dtype", "aten.type_as.default"})
# Nodes whose result holds the same numbers as their first input: no dispatch at all
SAME_DATA = CASTS | {"aten.view_as_complex.default", "aten.view_as_real.default", "aten.clone.default",
                     "aten.alias.default", "aten.contiguous.default", "aten.lift_fresh_copy.default",
                     "aten.resolve_conj.default"}


class Pair:
    """A complex value held as `value`, its float32 view_as_real form ([..., 2])."""

    def __init__(self, value: Value):
        self.value = value

    @property
    def numel(self) -> int:
        return self.value.numel


class RealPart:
    """A complex value of which only the real part is computed, `value` (an FFT whose readers all
    take `.real`): its `aten.real` reader is `value`; nothing else may read it."""

    def __init__(self, value: Value):
        self.value = value

    @property
    def numel(self) -> int:
        return self.value.numel


def is_complex(val, torch) -> bool:
    return isinstance(val, torch.Tensor) and val.dtype.is_complex


def rewritable(ep, torch) -> bool:
    """Whether the complex nodes of `ep` can all be held as pairs (module docstring); False when
    it has none."""
    sig = ep.graph_signature
    user_inputs = set(sig.user_inputs)
    found = False
    for node in ep.graph.nodes:
        val = node.meta.get("val")
        vals = list(val) if isinstance(val, (tuple, list)) else [val]
        complex_out = any(is_complex(v, torch) for v in vals)
        if node.op == "placeholder":
            if complex_out and (node.name in user_inputs or val.dtype != torch.complex64):
                return False
            found |= complex_out
        elif node.op == "call_function":
            reads = any(is_complex(a.meta.get("val"), torch) for a in node.all_input_nodes)
            if not (complex_out or reads):
                continue
            found = True
            if complex_out and any(v.dtype != torch.complex64 for v in vals if is_complex(v, torch)):
                return False
            if str(node.target) not in FORMS or not _form_fits(node, torch, complex_out):
                return False
        elif node.op == "output":
            if any(is_complex(a.meta.get("val"), torch) for a in node.all_input_nodes):
                return False
    return found


def _form_fits(node, torch, complex_out: bool) -> bool:
    """Whether `_real_form` takes this node's arguments: no complex Python number, a cast only
    between complex64 values, a cat or stack of complex tensors only, no real over complex."""
    flat = []
    torch.fx.node.map_aggregate((node.args, node.kwargs), flat.append)
    if any(isinstance(a, complex) for a in flat):
        return False
    target = str(node.target)
    if target in FFTS:
        return _fft_plan(node) is not None
    ins = [is_complex(a.meta.get("val"), torch) for a in node.all_input_nodes]
    if target in CASTS:
        return complex_out and all(ins)
    if target in ("aten.cat.default", "aten.stack.default"):
        return all(ins)
    if target in ("aten.div.Tensor", "aten.div.Scalar"):
        return isinstance(node.args[0], torch.fx.Node) and is_complex(node.args[0].meta.get("val"), torch)
    return True


def constant(graph, name: str, data, shape) -> Pair:
    """A complex64 constant as the float constant of its view_as_real form."""
    import torch

    real = torch.view_as_real(data.resolve_conj()).contiguous()
    return Pair(graph.add_derived(name, tuple(shape) + (2,), "float32", RECIPE, (), data=real))


def lower(ctx, node, name: str, ins: list):
    """The value(s) of complex fx `node` (or of a node reading one), its complex inputs Pairs:
    computed with torch when it reads constants alone, else traced into real ops and lowered."""
    torch = ctx.torch
    val = node.meta["val"]
    if all(_const(v) for v in ins) and ins:
        data = _computed(ctx, node, ins)
        if data is not None:
            return constant(ctx.graph, name, data, val.shape) if is_complex(val, torch) else \
                ctx.folder.add(ctx.graph, node, name, [data])
    target = str(node.target)
    if target == "aten.real.default" and isinstance(ins[0], RealPart):
        return ins[0].value
    if target in SAME_DATA and ins:  # nothing to compute: the real form is the value
        if target in CASTS and val.dtype != torch.complex64:
            raise _unsupported(f"node '{node.name}' casts complex data to {val.dtype}")
        x = ins[0]
        if target == "aten.view_as_complex.default":
            return Pair(x)
        return x.value if target == "aten.view_as_real.default" else x
    if target in FFTS:
        return _dft(ctx, node, name, ins)
    rotated = _rotation(ctx, node, name, ins)
    if rotated is not None:
        return rotated
    gm = _trace(ctx, node, ins)
    return _lower_traced(ctx, gm, name, [v.value if isinstance(v, Pair) else v for v in ins],
                         complex_out=is_complex(val, torch))


def _const(v) -> bool:
    v = v.value if isinstance(v, Pair) else v
    return isinstance(v, Value) and v.role is Role.CONST


def _computed(ctx, node, ins: list):
    """`node` computed with torch from its constant inputs, or None when one has no data here."""
    torch = ctx.torch
    tensors = {}
    for a, v in zip(node.all_input_nodes, ins):
        t = ctx.folder.tensor(v.value if isinstance(v, Pair) else v)
        if t is None:
            return None
        tensors[a] = torch.view_as_complex(t.contiguous()) if isinstance(v, Pair) else t
    try:
        with torch.no_grad():
            args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda a: tensors[a])
            return node.target(*args, **kwargs).contiguous()
    except Exception:  # an op that fails on these tensors here: its real form is lowered instead
        return None


def _trace(ctx, node, ins: list):
    """A GraphModule of real ops computing `node` from its inputs' real forms."""
    import torch

    inputs = node.all_input_nodes
    pairs = {a for a, v in zip(inputs, ins) if isinstance(v, Pair)}
    specs = [(tuple(a.meta["val"].shape) + (2,), torch.float32) if a in pairs else
             (tuple(a.meta["val"].shape), a.meta["val"].dtype) for a in inputs]

    def call(*tensors):
        by_node = dict(zip(inputs, tensors))
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda a: by_node[a])
        flags = torch.fx.node.map_arg(node.args, lambda a: a in pairs)
        return _real_form(torch, str(node.target), node, args, kwargs, flags)

    return _traced(node, call, specs)


def _traced(node, call, specs):
    """make_fx of `call` over fake tensors of `specs` ([(shape, dtype)])."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from .decompose import _LOCK, _make_fx

    mode = FakeTensorMode()
    with mode:
        fakes = [torch.empty(shape, dtype=dtype) for shape, dtype in specs]
    with _LOCK:
        gm = _make_fx(torch, mode, call, fakes)
    if gm is None or isinstance(gm, str):
        raise _unsupported(f"node '{node.name}' ({node.target}) on complex values: its float form does not trace")
    return gm


def _rotation(ctx, node, name: str, ins: list):
    """x times a complex constant c (a rotary embedding's freqs_cis), as x A + swap(x) B with A =
    (c_re, c_re) and B = (-c_im, c_im) folded into float constants, swap(x) = (x_im, x_re): a flip,
    two products and a sum on x's own layout instead of splitting and restacking its parts. The
    same float operations as the complex product (x_re c_re + x_im (-c_im), x_im c_re + x_re c_im),
    so the same numbers. None unless exactly one factor is a constant and both are complex."""
    import torch

    if str(node.target) != "aten.mul.Tensor" or len(ins) != 2 or not all(isinstance(v, Pair) for v in ins):
        return None
    consts = [i for i, v in enumerate(ins) if _const(v)]
    if len(consts) != 1:
        return None
    c = ctx.folder.tensor(ins[consts[0]].value)
    x = ins[1 - consts[0]].value
    if c is None:
        return None
    folded = len(x.shape) - 3  # c's leading dims widened to x's (WHCN's N holds both alike)
    if folded >= 2 and len(c.shape) <= len(x.shape):
        c = c.reshape((1,) * (len(x.shape) - len(c.shape)) + tuple(c.shape))
        if all(cd in (1, xd) for cd, xd in zip(c.shape[:folded], x.shape[:folded])):
            c = c.expand(tuple(x.shape[:folded]) + tuple(c.shape[folded:]))
    re, im = c[..., 0], c[..., 1]
    a = ctx.graph.add_derived(f"{name}_cos", tuple(c.shape), "float32", RECIPE, (),
                              data=torch.stack([re, re], -1).contiguous())
    b = ctx.graph.add_derived(f"{name}_sin", tuple(c.shape), "float32", RECIPE, (),
                              data=torch.stack([-im, im], -1).contiguous())
    aten = torch.ops.aten

    def call(xs, cos, sin):
        return aten.add.Tensor(aten.mul.Tensor(xs, cos), aten.mul.Tensor(aten.flip.default(xs, [-1]), sin))

    gm = _traced(node, call, [(x.shape, torch.float32), (a.shape, torch.float32), (b.shape, torch.float32)])
    return _lower_traced(ctx, gm, name, [x, a, b], complex_out=True)


def _node_args(node) -> dict:
    """`node`'s arguments by schema name, defaults filled in."""
    out = {}
    for i, a in enumerate(node.target._schema.arguments):
        if i < len(node.args):
            out[a.name] = node.args[i]
        elif a.name in node.kwargs:
            out[a.name] = node.kwargs[a.name]
        else:
            out[a.name] = a.default_value if a.has_default_value() else None
    return out


def _fft_plan(node):
    """(steps, norm) of an FFT node, steps [(dim, kind, length, size)] in order: kind 'c2c' or
    'ic2c' (forward or inverse complex), 'r2c' (rfft's onesided half: the first of rfftn's steps,
    on its last dim), 'c2r' (irfft: the last of irfftn's); length the transform's (n or s, else
    the input's own; irfft's default 2 (size - 1)), size the input's along the dim: a longer input
    is trimmed, a shorter one padded with zeros, as torch does. None when the node's arguments
    are outside these forms (a norm torch does not name, repeated dims, a length below 1)."""
    target = str(node.target).split(".")[1]
    a = _node_args(node)
    shape = tuple(node.all_input_nodes[0].meta["val"].shape)
    rank = len(shape)
    if a.get("norm") not in FFT_NORMS or rank == 0:
        return None
    if target.endswith("n") or target.endswith("2"):  # fftn, fft2, rfftn, irfft2, ...
        dims = a.get("dim")
        dims = list(range(rank)) if dims is None else [dims] if isinstance(dims, int) else list(dims)
        dims = [d % rank for d in dims]
        lengths = a.get("s")
        if lengths is not None and len(lengths) != len(dims):
            return None
    else:
        dims = [a.get("dim", -1) % rank]
        lengths = None if a.get("n") is None else [a.get("n")]
    if len(set(dims)) != len(dims):
        return None
    own = [shape[d] for d in dims]
    inverse_real = target.startswith("fft_irfft")
    if lengths is None:
        lengths = own[:-1] + [2 * (own[-1] - 1)] if inverse_real else own
    if any(n < 1 for n in lengths):
        return None
    if inverse_real:
        return [(d, "ic2c", n, m) for d, n, m in zip(dims[:-1], lengths[:-1], own[:-1])] + [
            (dims[-1], "c2r", lengths[-1], own[-1])], a.get("norm")
    if target.startswith("fft_rfft"):
        return [(dims[-1], "r2c", lengths[-1], own[-1])] + [
            (d, "c2c", n, m) for d, n, m in zip(dims[:-1], lengths[:-1], own[:-1])], a.get("norm")
    kind = "ic2c" if target.startswith("fft_ifft") else "c2c"
    steps = [(d, kind, n, m) for d, n, m in zip(dims, lengths, own)]
    if not is_complex(node.all_input_nodes[0].meta["val"], _torch()):  # the real first step is the
        steps.sort(key=lambda step: -step[3])  # cheaper (n in, not 2n): give it the longest dim
    return steps, a.get("norm")


def _torch():
    import torch

    return torch


def _dft_matrix(kind: str, length: int, size: int, norm, real_in: bool, real_out: bool = False):
    """The DFT along one dim as one real matrix on the interleaved (real, imaginary) pairs of the
    view_as_real form: [rows in, cols out], rows (n, part) for a complex input ((n) for a real one)
    over the input's `size` along the dim, columns (k, part) for a complex output ((t) for irfft's
    real one). With C and S the cos and sin of 2 pi k n / length (angles reduced exactly, k n mod
    length, in float64) and the norm's scale ("backward" (None) divides the inverse by length,
    "ortho" both by its square root, "forward" the forward transform): forward re' = re C + im S,
    im' = im C - re S; inverse re' = re C - im S, im' = im C + re S; irfft sums w_k (re_k C -
    im_k S) over the onesided half, w_k = 2 but for k = 0 and length / 2 (its conjugate mirror
    halves stand for themselves). Input rows past what the transform reads (length, or irfft's
    length // 2 + 1) are zero: torch trims the input there; a shorter input has fewer rows, as
    if padded with zeros."""
    import torch

    inverse = kind in ("ic2c", "c2r")
    scale = {None: 1.0 / length if inverse else 1.0, "backward": 1.0 / length if inverse else 1.0,
             "ortho": length ** -0.5, "forward": 1.0 if inverse else 1.0 / length}[norm]
    if kind == "c2r":  # [2 size, length]: rows (k, part) of the onesided input
        half = length // 2 + 1
        k = torch.arange(size, dtype=torch.int64)[:, None]
        t = torch.arange(length, dtype=torch.int64)[None, :]
        angle = (2 * torch.pi / length) * ((k * t) % length).to(torch.float64)
        weight = torch.full((size, 1), 2.0, dtype=torch.float64)
        weight[0] = 1.0
        if length % 2 == 0 and half - 1 < size:
            weight[half - 1] = 1.0
        weight[half:] = 0.0  # trimmed
        cos, sin = torch.cos(angle) * scale * weight, torch.sin(angle) * scale * weight
        return torch.stack([cos, -sin], 1).reshape(2 * size, length).float().contiguous()
    cols = length // 2 + 1 if kind == "r2c" else length
    n = torch.arange(size, dtype=torch.int64)[:, None]
    k = torch.arange(cols, dtype=torch.int64)[None, :]
    angle = (2 * torch.pi / length) * ((k * n) % length).to(torch.float64)  # [n, k]
    keep = (n < length).to(torch.float64) * scale  # trimmed rows are zero
    c, s = torch.cos(angle) * keep, torch.sin(angle) * keep
    sign = 1.0 if inverse else -1.0  # the sign of S in im' from re
    re_row = torch.stack([c, sign * s], -1)  # re_n -> (re'_k, im'_k)
    im_row = torch.stack([-sign * s, c], -1)  # im_n -> (re'_k, im'_k)
    if real_out:  # only the real parts are read (FNet's fftn(x).real): the re' columns alone
        re_row, im_row = re_row[..., :1], im_row[..., :1]
    width = re_row.shape[1] * re_row.shape[2]
    if real_in:
        return re_row.reshape(size, width).float().contiguous()
    return torch.stack([re_row.reshape(size, width), im_row.reshape(size, width)], 1).reshape(
        2 * size, width).float().contiguous()


def _dft(ctx, node, name: str, ins: list):
    """An FFT node as one product a transformed dim with a DFT matrix on the view_as_real pairs
    (_dft_matrix, a folded constant): the dim moved last beside the pair dim (a permute, unless
    it is last already), the pairs flattened, one `linear` by the matrix (prepacked at load as any
    constant weight, linear_packed on lavapipe), the pairs restored. Built as aten calls directly,
    not traced: a trace would break `linear` into mm, which takes no prepacked weight. Matmuls in
    float32: errors grow as the length does (about length x float32 epsilon of the largest input),
    not as torch's FFT; O(length^2) work a dim, where an FFT does O(length log length)."""
    import torch

    steps, norm = _fft_plan(node)
    x = ins[0]
    xv = x.value if isinstance(x, Pair) else x
    rank = len(node.all_input_nodes[0].meta["val"].shape)
    real_in = not isinstance(x, Pair)
    real_out = bool(node.users) and all(str(u.target) == "aten.real.default" for u in node.users)
    mats = []
    for i, (d, kind, length, size) in enumerate(steps):
        last = i == len(steps) - 1
        m = _dft_matrix(kind, length, size, norm, real_in=real_in and i == 0,
                        real_out=real_out and last and kind != "c2r").t().contiguous()  # linear's [out, in]
        mats.append(ctx.graph.add_derived(f"{name}_dft{d}", tuple(m.shape), "float32", RECIPE, (), data=m))
    aten = torch.ops.aten
    built = Built([(tuple(xv.shape), torch.float32)] + [(v.shape, torch.float32) for v in mats])
    t, paired = built.inputs[0], not real_in
    for i, ((d, kind, _, _), m) in enumerate(zip(steps, built.inputs[1:])):
        order = [i for i in range(rank) if i != d] + [d]
        if d != rank - 1:
            t = built.call(aten.permute.default, t, order + ([rank] if paired else []))
        lead = list(built.shape(t)[:rank - 1])
        t = built.call(aten.linear.default, built.call(aten.reshape.default, t, lead + [-1]), m)
        paired = kind != "c2r" and not (real_out and i == len(steps) - 1)
        t = built.call(aten.reshape.default, t, lead + ([-1, 2] if paired else [-1]))
        if d != rank - 1:
            back = sorted(range(rank), key=lambda i: order[i])
            t = built.call(aten.permute.default, t, back + ([rank] if paired else []))
    value = _lower_traced(ctx, built.module(t), name, [xv] + mats, complex_out=paired)
    return RealPart(value) if real_out and steps[-1][1] != "c2r" else value


def _lower_traced(ctx, gm, name: str, ins: list, complex_out: bool):
    """Lower the real ops as a decomposition's pieces (lowering's _lower_pieces), a piece that needs
    the CPU kept as a CPU node of real tensors; the output a Pair where it is complex."""
    out, why = ctx._lower_pieces(gm, name, ins, 1, keep_cpu=True)
    if why is not None:
        raise _unsupported(f"node '{name}' on complex values: its float form cannot be lowered ({why})")
    return Pair(out) if complex_out else out


def _unsupported(message: str):
    from texelflow.runtime.errors import UnsupportedModelError

    return UnsupportedModelError(message)


def _real_form(torch, target: str, node, args, kwargs, flags):
    """The real ops computing `target` of (args, kwargs), where flags[i] marks the args holding a
    complex value's real form ([..., 2]); the result in real form when it is complex."""
    aten = torch.ops.aten
    x = args[0]
    first = node.all_input_nodes[0].meta["val"] if node.all_input_nodes else None
    rank = first.dim() if first is not None else 0  # the logical (complex) rank of the first input

    def parts(t):
        return aten.select.int(t, -1, 0), aten.select.int(t, -1, 1)

    def pair(re, im):
        shape = list(torch.broadcast_shapes(re.shape, im.shape))
        return aten.stack.default([aten.expand.default(re, shape), aten.expand.default(im, shape)], -1)

    if target == "aten.slice.Tensor":
        dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
        return aten.slice.Tensor(x, dim % rank, *args[2:])
    if target == "aten.select.int":
        return aten.select.int(x, args[1] % rank, args[2])
    if target in ("aten.view.default", "aten.reshape.default", "aten._unsafe_view.default"):
        return aten.reshape.default(x, list(args[1]) + [2])
    if target == "aten.unsqueeze.default":
        return aten.unsqueeze.default(x, args[1] % (rank + 1))
    if target == "aten.squeeze.dim":
        return aten.squeeze.dims(x, [args[1] % rank])
    if target == "aten.squeeze.dims":
        return aten.squeeze.dims(x, [d % rank for d in args[1]])
    if target == "aten.squeeze.default":
        return aten.squeeze.dims(x, [d for d in range(rank) if first.shape[d] == 1])
    if target == "aten.permute.default":
        return aten.permute.default(x, [d % rank for d in args[1]] + [rank])
    if target == "aten.transpose.int":
        return aten.transpose.int(x, args[1] % rank, args[2] % rank)
    if target == "aten.t.default":
        return aten.transpose.int(x, 0, 1) if rank == 2 else aten.clone.default(x)
    if target == "aten.expand.default":
        return aten.expand.default(x, list(args[1]) + [2])
    if target == "aten.flatten.using_ints":
        start = args[1] if len(args) > 1 else 0
        end = args[2] if len(args) > 2 else -1
        return aten.flatten.using_ints(x, start % rank, end % rank)
    if target in ("aten.cat.default", "aten.stack.default"):
        if not all(flags[0]):
            raise NotImplementedError("a cat of complex and real tensors")
        dim = args[1] if len(args) > 1 else 0
        if target == "aten.cat.default":
            return aten.cat.default(list(x), dim % rank)
        return aten.stack.default(list(x), dim % (rank + 1))
    if target in ("aten.sum.dim_IntList", "aten.mean.dim"):
        dims = [d % rank for d in (args[1] or range(rank))]
        keep = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
        op = aten.sum.dim_IntList if target == "aten.sum.dim_IntList" else aten.mean.dim
        return op(x, dims, keep)
    if target == "aten.neg.default":
        return aten.neg.default(x)
    if target in ("aten.conj.default", "aten._conj.default", "aten.conj_physical.default"):
        re, im = parts(x)
        return pair(re, aten.neg.default(im))
    if target == "aten.real.default":
        return aten.clone.default(parts(x)[0])
    if target == "aten.imag.default":
        return aten.clone.default(parts(x)[1])
    if target == "aten.abs.default":
        re, im = parts(x)
        return aten.sqrt.default(aten.add.Tensor(aten.mul.Tensor(re, re), aten.mul.Tensor(im, im)))
    if target == "aten.angle.default":
        re, im = parts(x)
        return aten.atan2.default(im, re)
    if target == "aten.polar.default":  # real abs and angle in, complex out
        return pair(aten.mul.Tensor(x, aten.cos.default(args[1])), aten.mul.Tensor(x, aten.sin.default(args[1])))
    if target == "aten.complex.default":
        return pair(x, args[1])
    if target == "aten.exp.default":
        re, im = parts(x)
        e = aten.exp.default(re)
        return pair(aten.mul.Tensor(e, aten.cos.default(im)), aten.mul.Tensor(e, aten.sin.default(im)))
    if target in ("aten.mul.Tensor", "aten.mul.Scalar", "aten.div.Tensor", "aten.div.Scalar"):
        a, b = args[0], args[1]
        divide = target.startswith("aten.div")
        if isinstance(b, complex) or isinstance(a, complex):
            raise NotImplementedError("a complex Python number")
        if not flags[0]:  # real times complex: commute
            if divide:
                raise NotImplementedError("a real tensor divided by a complex one")
            a, b, fa, fb = b, a, True, False
        else:
            fa, fb = True, isinstance(b, torch.Tensor) and flags[1]
        if not fb:  # a complex value times (or over) a real tensor or number: both parts
            scale = aten.unsqueeze.default(b, -1) if isinstance(b, torch.Tensor) else b
            return (aten.div.Tensor if divide else aten.mul.Tensor)(a, scale)
        ar, ai = parts(a)
        br, bi = parts(b)
        if not divide:
            return pair(aten.sub.Tensor(aten.mul.Tensor(ar, br), aten.mul.Tensor(ai, bi)),
                        aten.add.Tensor(aten.mul.Tensor(ar, bi), aten.mul.Tensor(ai, br)))
        den = aten.add.Tensor(aten.mul.Tensor(br, br), aten.mul.Tensor(bi, bi))
        return pair(aten.div.Tensor(aten.add.Tensor(aten.mul.Tensor(ar, br), aten.mul.Tensor(ai, bi)), den),
                    aten.div.Tensor(aten.sub.Tensor(aten.mul.Tensor(ai, br), aten.mul.Tensor(ar, bi)), den))
    if target in ("aten.add.Tensor", "aten.sub.Tensor"):
        a, b = args[0], args[1]
        alpha = kwargs.get("alpha", args[2] if len(args) > 2 else 1)
        if isinstance(b, complex) or isinstance(a, complex) or isinstance(alpha, complex):
            raise NotImplementedError("a complex Python number")
        op = aten.add.Tensor if target == "aten.add.Tensor" else aten.sub.Tensor
        fa = isinstance(a, torch.Tensor) and flags[0]
        fb = isinstance(b, torch.Tensor) and flags[1]
        if alpha != 1 and isinstance(b, torch.Tensor):
            b = aten.mul.Tensor(b, alpha)
        elif alpha != 1:
            b = b * alpha
        if fa and fb:
            return op(a, b)
        if fa:  # complex +- real: the real part only
            re, im = parts(a)
            return pair(op(re, b), im)
        re, im = parts(b)  # real +- complex
        return pair(op(a, re), im if op is aten.add.Tensor else aten.neg.default(im))
    raise NotImplementedError(f"{target} on complex values")
