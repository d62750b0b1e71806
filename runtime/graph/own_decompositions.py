"""texelflow's own decompositions: of ops torch leaves whole, or breaks into pieces no kernel runs.

`decompose.decomposition_of` consults OWN_DECOMPOSITIONS (by target name) before torch's tables.
Shapes: torch decomposes `split_with_sizes` (which `split` and `chunk` become) into `as_strided`
views, which no Vulkan kernel computes, and `unbind` into a slice and a squeeze per output (two
copies where a texture's squeeze moves texels). Here each output is one `slice` or one `select`
node, so a split runs as one dispatch per piece and each piece gets its own planned
representation. `repeat` (and `tile`, which torch decomposes to it) becomes one expand and a view.
Norms: `group_norm` (always, lowering's `decompose_first`) as the input less each group's first
element, row statistics combined per group and one scale and shift per channel; `instance_norm`
as a group norm, or elementwise with running statistics; `layer_norm` over
several trailing dims as one over their product; `std_mean` as var_mean and a square root.
Ops torch keeps whole: `any` (and so `all`, which torch decomposes through it) as a max of truth
values; `bitwise_not`; `clamp` with tensor bounds; `index` with integer index tensors, as one
index_select of a flat (for several tensors, linear) index;
`topk` (k <= 16) as k rounds of an extreme and its first untaken position; `sort` (and so
`argsort`; and `topk`, `kthvalue` and `median`) of float32 lines up to 256 as one sort_lines node,
of longer ones as a bitonic network, of integer lines by ranks from a pairwise comparison; `gather` and
`take_along_dim` as index, `Tensor.unfold` by its windows' positions;
circular `pad` as a cat of wrapped ends; `max()` and `min()` of a whole tensor as amax and amin,
`aminmax` as both; `bilinear` as a matmul, a product and a sum; `logaddexp` (and base 2) as
torch's kernel computes it; `fmax` / `fmin` as a max and NaN selects;
binary ops of tensors of two dtypes (float times bool) with casts to the promoted dtype first;
a bool cast to int32 or int64 as a where between 1 and 0, a cast to bool as a compare with 0, and
a sum of bools as a sum of that;
RReLU in inference as a leaky ReLU; `copy` (a functionalized whole-tensor `copy_`) as a cast or
expand of its source; `slice_scatter` (`y[:, a:b] = src`) as a cat; `index_put`
with a bool mask and one value as a where, with one 1-D index as a where of gathered values (or,
accumulating, a one-hot product); `scatter_add` and `scatter` by a one-hot comparison of the index
with the positions along the dim (a sum of the sources it selects, or the last one);
`argmax`, `argmin`, `max.dim` and `min.dim` as a max (min) and one arg_extreme node (lines up to
4,096; longer ones: the positions of its hits and the least of them), in int32, widened by a cast
the device holds narrowed; `cummax` and `cummin` as a
running max (min) by doubling (log2 n maximums with shifted copies) and the running max of the
positions that set it. `_safe_softmax` (in torch's
attention decomposition) as a softmax and a where on the row max. `cumsum` with a dtype as a cast
and a cumsum; `number ** tensor` as a tensor pow; `round` to decimals by a scale of 10^d. `div`
with a rounding mode and `floor_divide`
(`ids // 2`) as the int32 kernel div_mode_scalar, or a float trunc of the quotient; a bool compared
with a number (`mask.tril() == 0`) as its int32 0 / 1 compared. `kthvalue` and `median` as the
element of a given rank (the stable sort's: `_line_sort`, or `_ranks`). Video: `conv3d` (and a 3-D `convolution`)
as a sum over the kernel's frames of 2-D convs of the frames it meets, folded into the batch
(lowering turns the traced 2-D `convolution` pieces into conv2d); `conv_transpose3d` as a transposed
2-D conv per kernel frame slice of every frame, interleaved (k = s along T) or spread and summed
along T; `max_pool3d`, `avg_pool3d` and
`adaptive_avg_pool3d` as box windows along T, H and W in turn, a slice per window element.
`embedding_bag` as the rows' gather and a bag-membership matrix from the offsets. Graph networks
and geometry: `scatter_reduce` (sum, mean, amax, amin) as scatter_add is built; `bucketize` and
`searchsorted` as counts of the boundaries passed; `diagonal` as a strided slice; `cdist` by the
pairwise differences; `col2im` (F.fold) as a grouped transposed conv of one-hot weights. Bitwise
ops and shifts of an integer tensor and a number as the tensor ops with a 0-d tensor. Every
broadcasting elementwise op of rank > 4 whose operand broadcasts inside WHCN's N (the leading
dims the kernels fold into one) as an expand of that operand's leading dims, then the op
(`_lead_broadcast`, wrapped round any decomposition above).
"""

from __future__ import annotations

import math


def split_with_sizes(self, split_sizes, dim=0):
    """self.split_with_sizes(split_sizes, dim) as slices along `dim`."""
    import torch

    pieces, start = [], 0
    for size in split_sizes:
        pieces.append(torch.ops.aten.slice.Tensor(self, dim, start, start + size))
        start += size
    return pieces


def unbind(self, dim=0):
    """self.unbind(dim) as one select per index along `dim`."""
    import torch

    return [torch.ops.aten.select.int(self, dim, i) for i in range(self.shape[dim])]


def repeat(self, repeats):
    """self.repeat(repeats) as one expand between two reshapes: a repeated dim of size s > 1
    becomes (1, s) expanded to (r, s), one of size 1 expands in place, and runs of dims not
    repeated merge into one, so the expand's rank stays low (<= 7 for the kernels); then the
    result is merged to r * s per dim. torch has no decomposition of repeat (tile has, to it)."""
    import torch

    aten = torch.ops.aten
    shape = [1] * (len(repeats) - self.dim()) + list(self.shape)
    split, expanded, merging = [], [], False
    for r, size in zip(repeats, shape):
        if r == 1 and merging:  # a run of dims not repeated: one dim
            split[-1] *= size
            expanded[-1] *= size
        elif r == 1 or size == 1:
            split.append(size)
            expanded.append(size * r)
        else:
            split += [1, size]
            expanded += [r, size]
        merging = r == 1
    x = aten.expand.default(aten.reshape.default(self, split), expanded)
    return aten.reshape.default(x, [r * size for r, size in zip(repeats, shape)])


def instance_norm(input, weight, bias, running_mean, running_var, use_input_stats, momentum, eps, cudnn_enabled):
    """instance_norm with the input's own statistics (nn.InstanceNorm*d without running stats,
    the default) is group_norm with one group per channel: one Vulkan op (torch decomposes it into
    a training batch norm over a reshaped input). With running statistics (track_running_stats in
    eval) it is an inference batch norm, written elementwise: torch's batch_norm traces into
    native_batch_norm, which no Vulkan op implements."""
    import torch

    aten = torch.ops.aten
    if use_input_stats:
        if input.dim() not in (3, 4):
            return aten.instance_norm.default(input, weight, bias, running_mean, running_var, use_input_stats,
                                              momentum, eps, cudnn_enabled)
        return aten.group_norm.default(input, input.shape[1], weight, bias, eps, False)
    per_channel = [input.shape[1]] + [1] * (input.dim() - 2)
    scale = aten.rsqrt.default(aten.add.Tensor(aten.reshape.default(running_var, per_channel), eps))
    if weight is not None:
        scale = aten.mul.Tensor(scale, aten.reshape.default(weight, per_channel))
    out = aten.mul.Tensor(aten.sub.Tensor(input, aten.reshape.default(running_mean, per_channel)), scale)
    return aten.add.Tensor(out, aten.reshape.default(bias, per_channel)) if bias is not None else out


def any_(self, dim=None, keepdim=False):
    """self.any(dim, keepdim) as a max over the truth values (NaN is true, as in torch), 0 / 1 as
    float32: `any` has no kernel and torch no decomposition; torch decomposes `all` through it."""
    import torch

    aten = torch.ops.aten
    truth = self if self.dtype == torch.bool else aten.ne.Scalar(self, 0)  # NaN != 0
    if dim is not None and not isinstance(dim, int) and len(dim) == 0:
        return truth  # torch: an empty dim list reduces nothing
    dims = [] if dim is None else [dim] if isinstance(dim, int) else list(dim)  # amax: [] is every dim
    ones = aten._to_copy.default(truth, dtype=torch.float32)
    return aten.ne.Scalar(aten.amax.default(ones, dims, keepdim), 0)


def bitwise_not(self):
    """~self: for bool the logical not, for integers -1 - self (two's complement: the same bits;
    -1 - x never overflows)."""
    import torch

    aten = torch.ops.aten
    if self.dtype == torch.bool:
        return aten.logical_not.default(self)
    return aten.rsub.Scalar(self, -1)


def clamp_tensor(self, min=None, max=None):
    """clamp with tensor bounds (`x.clamp(min=lo, max=hi)`, lo and hi broadcasting): maximum, then
    minimum, which propagate a NaN of either side as torch's clamp does."""
    import torch

    aten = torch.ops.aten
    out = self if min is None else aten.maximum.default(self, min)
    return out if max is None else aten.minimum.default(out, max)


def _positions(n: int, axis: int, rank: int, step: int = 1):
    """The int32 positions 0, step, .. (n - 1) step laid along `axis` of a rank-`rank` tensor (size
    1 elsewhere): made from numbers alone, so lowering folds them into a constant."""
    import torch

    shape = [1] * rank
    shape[axis] = n
    return torch.ops.aten.reshape.default(torch.ops.aten.arange.start_step(0, n * step, step, dtype=torch.int32), shape)


def _wrapped_int32(t, size: int):
    """Index tensor `t` as int32 (the device holds int64 ids so), negative entries counted from
    the end of a dim of `size`."""
    import torch

    aten = torch.ops.aten
    if t.dtype != torch.int32:
        t = aten._to_copy.default(t, dtype=torch.int32)
    return aten.where.self(aten.lt.Scalar(t, 0), aten.add.Scalar(t, size), t)


def index(self, indices):
    """self[..., idx, ...] with integer index tensors (`x[idx]`, `x[:, idx]`, CLIP's
    `x[torch.arange(B), ids.argmax(-1)]`) as one index_select of a flat index, reshaped. One
    tensor indexes its dim as it is; several (broadcast together) index the dims they name merged
    into one, by the linear index sum(i_j * stride_j) computed in int32 (the device holds int64
    ids as int32), each i_j wrapped from the end first where negative. As in torch, the index's
    dims replace the indexed ones where those are adjacent, and lead otherwise (self is then
    permuted to bring them first). A negative entry of a single index counts from the end: torch's
    index_select refuses one, but the pieces of a decomposition run on the device or not at all,
    and the kernel takes it (its template says so). A bool mask (a data-dependent shape) is not
    this (the node stays whole)."""
    import torch

    aten = torch.ops.aten
    tensors = [(k, t) for k, t in enumerate(indices) if t is not None]
    if not tensors or any(t.dtype in (torch.bool, torch.uint8) for _, t in tensors):
        raise NotImplementedError("index with a mask")
    dims = [k for k, _ in tensors]
    if len(tensors) == 1:
        k, idx = tensors[0]
        flat = idx if idx.dim() == 1 else aten.reshape.default(idx, [-1])
        out = aten.index_select.default(self, k, flat)
        if idx.dim() == 1:
            return out
        return aten.reshape.default(out, list(self.shape[:k]) + list(idx.shape) + list(self.shape[k + 1:]))
    if dims != list(range(dims[0], dims[0] + len(dims))):  # not adjacent: their dims lead
        rest = [d for d in range(self.dim()) if d not in dims]
        self = aten.permute.default(self, dims + rest)
        dims = list(range(len(dims)))
    first, sizes = dims[0], [self.shape[d] for d in dims]
    shape = list(torch.broadcast_shapes(*(t.shape for _, t in tensors)))
    linear = None
    for j, (_, t) in enumerate(tensors):
        t = _wrapped_int32(t, sizes[j])
        stride = math.prod(sizes[j + 1:])
        term = t if stride == 1 else aten.mul.Scalar(t, stride)
        linear = term if linear is None else aten.add.Tensor(linear, term)
    linear = aten.expand.default(linear, shape) if list(linear.shape) != shape else linear
    merged = aten.reshape.default(self, list(self.shape[:first]) + [math.prod(sizes)] +
                                  list(self.shape[first + len(dims):]))
    out = aten.index_select.default(merged, first, aten.reshape.default(linear, [-1]))
    return aten.reshape.default(out, list(self.shape[:first]) + shape + list(self.shape[first + len(dims):]))


def gather(self, dim, index, sparse_grad=False):
    """torch.gather as one index_select of the flattened self: element e of the result reads
    self at e's coordinates with the one along `dim` taken from index. The linear index is a
    constant (the other coordinates times self's strides, folded at lowering) plus index times
    the stride of `dim`, in int32 on the device."""
    import torch

    aten = torch.ops.aten
    if self.dim() == 0 or index.dim() == 0:
        raise NotImplementedError("gather of a 0-d tensor")
    d = dim % self.dim()
    strides = [math.prod(self.shape[k + 1:]) for k in range(self.dim())]
    base = None
    for k, n in enumerate(index.shape):
        if k == d or n == 1:
            continue
        coord = _positions(n, k, index.dim(), strides[k])
        base = coord if base is None else aten.add.Tensor(base, coord)
    picked = _wrapped_int32(index, self.shape[d])
    linear = picked if strides[d] == 1 else aten.mul.Scalar(picked, strides[d])
    if base is not None:
        linear = aten.add.Tensor(linear, base)
    flat = aten.index_select.default(aten.reshape.default(self, [-1]), 0, aten.reshape.default(linear, [-1]))
    return aten.reshape.default(flat, list(index.shape))


def _digits(shape, strides) -> list[tuple[int, int, int | None]]:
    """(stride, row-major weight, the next larger stride or None) of each dim of a view that
    moves (size > 1, stride > 0), by falling stride: a storage offset's digit along a dim is
    (offset % next larger stride) // stride, greedily, as for a permuted slice of a block."""
    weights = [math.prod(shape[k + 1:]) for k in range(len(shape))]
    moving = sorted(((st, weights[k]) for k, (n, st) in enumerate(zip(shape, strides)) if n > 1 and st > 0),
                    reverse=True)
    return [(st, w, moving[j - 1][0] if j else None) for j, (st, w) in enumerate(moving)]


def _view_index(p, shape, strides, base: int):
    """The flat (row-major) index into a view of `shape`, `strides` and storage offset `base` of
    the element at each storage position of the int array `p`, or None where some position holds
    no element of the view (_digits, then a check that the digits give p back)."""
    import numpy as np

    rel = p - base
    flat = np.zeros_like(p)
    back = np.full_like(p, base)
    sizes = {st: n for n, st in zip(shape, strides)}
    for st, w, larger in _digits(shape, strides):
        digit = (rel if larger is None else rel % larger) // st
        if (digit >= sizes[st]).any():
            return None
        flat += digit * w
        back += digit * st
    return flat if (rel >= 0).all() and np.array_equal(back, p) else None


def as_strided(self, size, stride, storage_offset=None):
    """x.as_strided(size, stride, offset) (Longformer's overlapping chunks, sliding windows
    written by strides) as one index_select of x flattened: output element e reads storage
    position offset + sum(e_k stride_k), which is x's element whose own position (x's storage
    offset plus its index times x's strides, a view's included: `x.t().as_strided(..)`) is that.
    The flat index is worked out from numbers alone, so lowering folds it into a constant. A read
    of a position that holds no element of x (storage outside the view) is not this."""
    import numpy as np
    import torch

    aten = torch.ops.aten
    size, stride = [int(n) for n in size], [int(s) for s in stride]
    base, shape, strides = self.storage_offset(), list(self.shape), list(self.stride())
    offset = base if storage_offset is None else int(storage_offset)
    if not size or 0 in size or self.numel() == 0:
        raise NotImplementedError("as_strided to or of an empty or 0-d tensor")
    p = np.full(size, offset, dtype=np.int64)
    for k, (n, st) in enumerate(zip(size, stride)):
        p = p + (np.arange(n) * st).reshape([n if j == k else 1 for j in range(len(size))])
    flat = _view_index(p, shape, strides, base)
    if flat is None or self.numel() >= 2 ** 31:
        raise NotImplementedError("as_strided reading storage outside its input's elements")
    # the same index as ops on numbers (folded): the storage positions, then their digits
    pos = aten.add.Scalar(aten.mul.Scalar(aten.reshape.default(
        aten.arange.start_step(0, 1, 1, dtype=torch.int32), [1] * len(size)), 0), offset)
    for k, (n, st) in enumerate(zip(size, stride)):
        if n > 1 and st != 0:
            pos = aten.add.Tensor(pos, _positions(n, k, len(size), st))
    rel = aten.sub.Scalar(pos, base)
    linear = None
    for st, w, larger in _digits(shape, strides):
        digit = aten.div.Tensor_mode(rel if larger is None else aten.remainder.Scalar(rel, larger), st,
                                     rounding_mode="floor")
        term = aten.mul.Scalar(digit, w)
        linear = term if linear is None else aten.add.Tensor(linear, term)
    if linear is None:
        linear = aten.mul.Scalar(rel, 0)
    linear = aten.expand.default(linear, size)
    picked = aten.index_select.default(aten.reshape.default(self, [-1]), 0, aten.reshape.default(linear, [-1]))
    return aten.reshape.default(picked, size)


def take_along_dim(self, indices, dim=None):
    """torch.take_along_dim: self and indices broadcast but along `dim`, then gather (negative
    entries count from the end); with no dim, both flattened."""
    import torch

    aten = torch.ops.aten
    if dim is None:
        return gather(aten.reshape.default(self, [-1]), 0, aten.reshape.default(indices, [-1]))
    d = dim % max(self.dim(), 1)
    if self.dim() != indices.dim():
        raise NotImplementedError("take_along_dim of tensors of different ranks")
    rest = list(torch.broadcast_shapes(*(tuple(1 if k == d else n for k, n in enumerate(t.shape))
                                          for t in (self, indices))))
    sized = [list(rest[:d]) + [t.shape[d]] + list(rest[d + 1:]) for t in (self, indices)]
    self = self if list(self.shape) == sized[0] else aten.expand.default(self, sized[0])
    indices = indices if list(indices.shape) == sized[1] else aten.expand.default(indices, sized[1])
    return gather(self, d, indices)


# topk decomposes into k rounds of about ten small dispatches each; past this k the node runs
# whole on the CPU, with its reason (a DETR-style top-100 would be a thousand dispatches).
TOPK_MAX_K = 16


def topk(self, k, dim=-1, largest=True, sorted=True):
    """torch.topk for k <= TOPK_MAX_K as k rounds of an extreme, the first position holding it
    among those not yet taken, and that position marked taken; values and int32 positions are
    concatenated along dim, the positions widened to int64 by a cast the device holds narrowed.
    torch's order: NaN counts as the largest (first with largest, last without). Among equal
    values (NaNs included) the earliest position comes first, where torch leaves the order
    unspecified; the result is sorted whatever `sorted` asks (torch's unsorted order is
    unspecified too). Float32 lines of at most SORT_LINE_MAX sort instead (_line_sort, one
    dispatch) and keep the first k, as does a larger k of longer float32 lines (_bitonic_sort)."""
    import torch

    aten = torch.ops.aten
    if _short_float_lines(self, dim) and 0 < k <= self.shape[dim % self.dim()]:
        values, places = _line_sort(self, dim, descending=largest)  # the first k of the sorted lines
        d = dim % self.dim()
        return aten.slice.Tensor(values, d, 0, k), aten.slice.Tensor(places, d, 0, k)
    if k > TOPK_MAX_K and self.dim() > 0 and self.dtype == torch.float32 and 0 < k <= self.shape[dim % self.dim()]:
        values, places = _bitonic_sort(self, dim, descending=largest)  # the first k of the sorted lines
        d = dim % self.dim()
        return aten.slice.Tensor(values, d, 0, k), aten.slice.Tensor(places, d, 0, k)
    if k > TOPK_MAX_K:
        raise NotImplementedError(f"topk with k = {k}, above {TOPK_MAX_K} rounds")
    if self.dim() == 0:
        v, i = topk(aten.reshape.default(self, [1]), k, 0, largest)
        return aten.reshape.default(v, []), aten.reshape.default(i, [])
    d = dim % self.dim()
    if self.dim() > 3:  # the dims before and after dim merged: the reductions take rank <= 4
        lead, trail = math.prod(self.shape[:d]), math.prod(self.shape[d + 1:])
        v, i = topk(aten.reshape.default(self, [lead, self.shape[d], trail]), k, 1, largest)
        shape = list(self.shape[:d]) + [k] + list(self.shape[d + 1:])
        return aten.reshape.default(v, shape), aten.reshape.default(i, shape)
    x = self
    n = x.shape[d]
    if k == 0 or k > n:
        raise NotImplementedError("topk of no elements")
    positions = _positions(n, d, x.dim())
    floating = x.dtype.is_floating_point
    if floating:
        far = float("-inf") if largest else float("inf")
    else:
        info = torch.iinfo(torch.int32)  # int64 ids run as int32 (narrowing.py); taken ones never hit
        far = info.min if largest else info.max
    nan = aten.ne.Tensor(x, x) if floating else None
    values, picks, taken = [], [], None
    for _ in range(k):
        hidden = taken if nan is None or largest else (nan if taken is None else aten.logical_or.default(taken, nan))
        cand = x if hidden is None else aten.where.ScalarSelf(hidden, far, x)
        ext = (aten.amax if largest else aten.amin).default(cand, [d], True)
        hit = aten.eq.Tensor(cand, ext)
        if floating and largest:  # a NaN left: amax is NaN, and the first NaN is the pick
            hit = aten.logical_or.default(hit, aten.ne.Tensor(cand, cand))
        if hidden is not None:
            hit = aten.logical_and.default(hit, aten.logical_not.default(hidden))
        pos = aten.amin.default(aten.where.ScalarOther(hit, positions, n), [d], True)
        if floating and not largest:  # nothing but NaN left: the first of those, its value NaN
            left = nan if taken is None else aten.logical_and.default(nan, aten.logical_not.default(taken))
            first_nan = aten.amin.default(aten.where.ScalarOther(left, positions, n), [d], True)
            none = aten.eq.Scalar(pos, n)
            pos = aten.where.self(none, first_nan, pos)
            ext = aten.where.ScalarSelf(none, float("nan"), ext)
        values.append(ext)
        picks.append(pos)
        mine = aten.eq.Tensor(positions, pos)
        taken = mine if taken is None else aten.logical_or.default(taken, mine)
    out_values = values[0] if k == 1 else aten.cat.default(values, d)
    out_indices = aten._to_copy.default(picks[0] if k == 1 else aten.cat.default(picks, d), dtype=torch.int64)
    return out_values, out_indices


# sort compares every pair of a line's elements: past this many pairs (over all lines) the node
# runs whole on the CPU, with its reason.
SORT_MAX_PAIRS = 1 << 22


# Integer lines this long or longer sort by a bitonic network (bitonic_step nodes) rather than by
# ranks, whatever SORT_MAX_PAIRS says: n^2 comparisons outgrow log2(n)^2 / 2 steps of n (float32
# lines past SORT_LINE_MAX take it too).
BITONIC_MIN_LENGTH = 1024
BITONIC_MAX_LENGTH = 1 << 24  # positions ride as float32 beside the values: exact below 2^24


def bitonic_step_reference(self, j, k, descending=0):
    """texelflow.bitonic_step in torch: self [L, N, 2] of (value, position) pairs, each element
    its own pair's or its partner's (i ^ j), as shaders/bitonic_step.glsl.j2 computes it."""
    import torch

    n = self.shape[1]
    i = torch.arange(n)
    p = i ^ j
    a, b = self, self[:, p]
    av, ai, bv, bi = a[..., 0], a[..., 1], b[..., 0], b[..., 1]
    an, bn = av.isnan(), bv.isnan()
    ahead = (av > bv) | (an & ~bn) if descending else (av < bv) | (~an & bn)
    first = ahead | (((av == bv) | (an & bn)) & (ai < bi))
    keep = torch.where((i < p) == ((i & k) == 0), first, ~first)
    return torch.where(keep[..., None], a, b)


_CUSTOM_OPS: dict = {}  # name -> (its torch.library.Library, which must outlive the call, or None; the op)


def _custom_op(torch, name: str, schema: str, impl, meta):
    """torch.ops.texelflow.<name>.default, defined on first use by `schema` with a CPU kernel
    `impl` and a Meta (fake) kernel `meta`: the decompositions are traced with it, and a node of it
    left on the CPU runs `impl`."""
    if name not in _CUSTOM_OPS:
        lib = None
        if not hasattr(torch.ops.texelflow, name):
            lib = torch.library.Library("texelflow", "FRAGMENT")
            lib.define(schema)
            lib.impl(name, impl, "CompositeExplicitAutograd")
            lib.impl(name, meta, "Meta")
        _CUSTOM_OPS[name] = (lib, getattr(torch.ops.texelflow, name).default)
    return _CUSTOM_OPS[name][1]


def bitonic_op(torch):
    """torch.ops.texelflow.bitonic_step.default (ops.yaml's bitonic_step)."""
    return _custom_op(torch, "bitonic_step",
                      "bitonic_step(Tensor self, int j, int k, int descending=0) -> Tensor",
                      bitonic_step_reference, lambda self, j, k, descending=0: torch.empty_like(self))


# Float32 lines up to this long sort in one invocation each (sort_lines: an insertion sort, n^2 / 2
# moves in registers, one dispatch); longer ones by the bitonic network.
SORT_LINE_MAX = 256


def sort_lines_reference(self, descending=0):
    """texelflow.sort_lines in torch: each row of self [L, n] sorted stably (NaN the largest),
    values and int32 positions, as shaders/sort_lines.glsl.j2 computes them."""
    import torch

    values, indices = torch.sort(self, dim=-1, descending=bool(descending), stable=True)
    return values, indices.to(torch.int32)


def sort_lines_op(torch):
    """torch.ops.texelflow.sort_lines.default (ops.yaml's sort_lines)."""
    def meta(self, descending=0):
        return torch.empty_like(self), torch.empty_like(self, dtype=torch.int32)

    return _custom_op(torch, "sort_lines", "sort_lines(Tensor self, int descending=0) -> (Tensor, Tensor)",
                      sort_lines_reference, meta)


def _as_rows(self, d: int):
    """(self with dim d moved last, the permutation, its lines as rows [L, n])."""
    import torch

    aten = torch.ops.aten
    order = [k for k in range(self.dim()) if k != d] + [d]
    moved = self if d == self.dim() - 1 else aten.permute.default(self, order)
    return moved, order, aten.reshape.default(moved, [math.prod(moved.shape[:-1]), self.shape[d]])


def _from_rows(rows, moved, order):
    """Rows [L, n] (of `_as_rows`) back in the input's shape and dim order."""
    import torch

    aten = torch.ops.aten
    t = aten.reshape.default(rows, list(moved.shape))
    return t if order == sorted(order) else aten.permute.default(t, [order.index(k) for k in range(len(order))])


def _line_sort(self, dim: int, descending: bool):
    """(values, int64 positions) of torch.sort of float32 `self` along `dim`, lines of at most
    SORT_LINE_MAX: the lines as rows, one sort_lines node, back. Stable, NaN the largest."""
    import torch

    aten = torch.ops.aten
    moved, order, rows = _as_rows(self, dim % self.dim())
    values, places = sort_lines_op(torch)(rows, int(descending))
    places = aten._to_copy.default(places, dtype=torch.int64)
    return _from_rows(values, moved, order), _from_rows(places, moved, order)


def _short_float_lines(self, dim) -> bool:
    """Whether `self`'s lines along dim sort on sort_lines: float32, 2 to SORT_LINE_MAX long."""
    import torch

    return self.dim() > 0 and self.dtype == torch.float32 and 2 <= self.shape[dim % self.dim()] <= SORT_LINE_MAX


def _bitonic_sort(self, dim: int, descending: bool):
    """(values, int64 positions) of torch.sort of float32 `self` along `dim` by a bitonic network:
    each line as (value, position) pairs [L, N, 2], N the next power of two, padded with pairs
    that sort last (NaN, or -inf when descending, at positions past the line: after every real
    element, NaNs included, since equal values go by position), then log2(N) (log2(N) + 1) / 2
    bitonic_step nodes, the first n pairs kept. Stable, NaN the largest, as `sort` below."""
    import torch

    aten = torch.ops.aten
    if self.dtype != torch.float32:
        raise NotImplementedError(f"a bitonic sort of {self.dtype} (positions ride as float32 beside float32 values)")
    d = dim % self.dim()
    n = self.shape[d]
    if n > BITONIC_MAX_LENGTH:
        raise NotImplementedError(f"a sort of lines of {n}, above {BITONIC_MAX_LENGTH}")
    moved, order, x = _as_rows(self, d)
    lines = x.shape[0]
    size = 1 << max(n - 1, 1).bit_length()
    if size > n:
        x = aten.constant_pad_nd.default(x, [0, size - n], float("-inf") if descending else float("nan"))
    where = aten._to_copy.default(_positions(size, 1, 2), dtype=torch.float32)
    pairs = aten.stack.default([x, aten.expand.default(where, [lines, size])], 2)
    step = bitonic_op(torch)
    k = 2
    while k <= size:
        j = k // 2
        while j >= 1:
            pairs = step(pairs, j, k, int(descending))
            j //= 2
        k *= 2
    values = aten.slice.Tensor(aten.select.int(pairs, 2, 0), 1, 0, n)
    places = aten.slice.Tensor(aten.select.int(pairs, 2, 1), 1, 0, n)
    places = aten._to_copy.default(aten._to_copy.default(places, dtype=torch.int32), dtype=torch.int64)
    return _from_rows(values, moved, order), _from_rows(places, moved, order)


def _long_lines(self, dim) -> bool:
    """Whether torch.sort of `self` along `dim` takes the bitonic network: float32 lines past
    SORT_LINE_MAX, lines of at least BITONIC_MIN_LENGTH, or more pairs than the ranks may compare."""
    import torch

    if self.dim() == 0:
        return False
    d = dim % self.dim()
    n = self.shape[d]
    if self.dtype == torch.float32 and n > SORT_LINE_MAX:
        return True
    return n >= BITONIC_MIN_LENGTH or self.numel() * n > SORT_MAX_PAIRS


def sort(self, dim=-1, descending=False, stable=False):
    """torch.sort: float32 lines of 2 to SORT_LINE_MAX as one sort_lines node (_line_sort), longer
    ones by a bitonic network (_long_lines), the rest by ranks: element i's place is the count of
    elements that come before it (less, or greater when descending; NaN counts as the largest;
    equal ones by position, so the order is stable), then each place gathers the element ranked
    there. The pairwise comparison is n x n per line (SORT_MAX_PAIRS in all). The indices are int32 on the device, widened to
    int64 by a cast the device holds narrowed. torch's unstable order among equal values is
    unspecified; this one is always the stable one."""
    import torch

    aten = torch.ops.aten
    if self.dim() == 0:
        return aten.alias.default(self), aten.zeros_like.default(self, dtype=torch.int64)
    if _short_float_lines(self, dim):
        return _line_sort(self, dim, descending)
    if _long_lines(self, dim):
        return _bitonic_sort(self, dim, descending)
    n, x = _lines(self, dim, "sort")
    rank = _ranks(x, descending)
    i, j = _positions(n, 1, 4), _positions(n, 2, 4)
    placed = aten.eq.Tensor(aten.unsqueeze.default(rank, 1), i)  # [lead, place, i, trail]
    source = aten.amax.default(aten.where.ScalarOther(placed, j, -1), [2])  # [lead, place, trail]
    values = gather(x, 1, source)
    indices = aten._to_copy.default(source, dtype=torch.int64)
    return aten.reshape.default(values, list(self.shape)), aten.reshape.default(indices, list(self.shape))


def _lines(self, dim: int, what: str):
    """(n, self as [lead, n, trail]): its lines of n along dim, for the pairwise ranks; refused
    past SORT_MAX_PAIRS pairs."""
    import torch

    d = dim % self.dim()
    n = self.shape[d]
    lead, trail = math.prod(self.shape[:d]), math.prod(self.shape[d + 1:])
    if lead * n * n * trail > SORT_MAX_PAIRS:
        raise NotImplementedError(f"{what} of {lead * trail} lines of {n} (above {SORT_MAX_PAIRS} pairs)")
    return n, torch.ops.aten.reshape.default(self, [lead, n, trail])


def _ranks(x, descending: bool = False):
    """Each element's place in the stable sort of its line, int32: x is [lead, n, trail], sorted
    along dim 1. The count of elements that come before it: less (greater when descending; NaN
    counts as the largest), or equal and earlier."""
    import torch

    aten = torch.ops.aten
    n = x.shape[1]
    a, b = aten.unsqueeze.default(x, 2), aten.unsqueeze.default(x, 1)  # i along dim 1, j along dim 2
    ahead = (aten.gt if descending else aten.lt).Tensor(b, a)
    tie = aten.eq.Tensor(b, a)
    if x.dtype.is_floating_point:
        nan_a, nan_b = aten.ne.Tensor(a, a), aten.ne.Tensor(b, b)
        first, second = (nan_b, nan_a) if descending else (nan_a, nan_b)
        ahead = aten.logical_or.default(ahead, aten.logical_and.default(first, aten.logical_not.default(second)))
        tie = aten.logical_or.default(tie, aten.logical_and.default(nan_a, nan_b))
    i, j = _positions(n, 1, 4), _positions(n, 2, 4)
    before = aten.logical_or.default(ahead, aten.logical_and.default(tie, aten.lt.Tensor(j, i)))
    return aten._to_copy.default(aten.sum.dim_IntList(to_copy(before, dtype=torch.int32), [2]), dtype=torch.int32)


def kthvalue(self, k, dim=-1, keepdim=False):
    """torch.kthvalue: the element ranked k - 1 in the stable sort of its line (`_line_sort` for
    float32 lines of at most SORT_LINE_MAX, else `_ranks`; NaN counts as the largest) and its
    position. Among equal values torch's index is unspecified (a selection, not a sort); this one
    is the stable sort's."""
    import torch

    aten = torch.ops.aten
    if self.dim() == 0:
        return aten.alias.default(self), aten.zeros_like.default(self, dtype=torch.int64)
    d = dim % self.dim()
    if _short_float_lines(self, d) and 1 <= k <= self.shape[d]:  # the sorted lines' k-th
        values, places = (aten.slice.Tensor(t, d, k - 1, k) for t in _line_sort(self, d, False))
        if not keepdim:
            values, places = aten.squeeze.dim(values, d), aten.squeeze.dim(places, d)
        return values, places
    n, x = _lines(self, d, "kthvalue")
    if not 1 <= k <= n:
        raise NotImplementedError(f"kthvalue with k = {k} of lines of {n} (torch raises)")
    hit = aten.eq.Scalar(_ranks(x), k - 1)
    source = aten.amax.default(aten.where.ScalarOther(hit, _positions(n, 1, 3), -1), [1], True)  # [lead, 1, trail]
    shape = list(self.shape)
    shape[d] = 1
    if not keepdim:
        del shape[d]
    values = aten.reshape.default(gather(x, 1, source), shape)
    return values, aten.reshape.default(aten._to_copy.default(source, dtype=torch.int64), shape)


def median_dim(self, dim=-1, keepdim=False):
    """torch.median along a dim: the lower median, kthvalue's (n + 1) // 2-th; a line with a NaN
    gives NaN at its first NaN, as torch does."""
    import torch

    aten = torch.ops.aten
    if self.dim() == 0:
        return kthvalue(self, 1)
    d = dim % self.dim()
    values, indices = kthvalue(self, (self.shape[d] + 1) // 2, d, keepdim)
    if not self.dtype.is_floating_point:
        return values, indices
    nan = aten.ne.Tensor(self, self)
    has_nan = aten.amax.default(to_copy(nan, dtype=torch.int32), [d], keepdim)
    first_nan = aten.argmax.default(to_copy(nan, dtype=torch.int32), d, keepdim)
    flagged = aten.gt.Scalar(has_nan, 0)
    return (aten.masked_fill.Scalar(values, flagged, float("nan")), aten.where.self(flagged, first_nan, indices))


def median_all(self):
    """torch.median of a whole tensor: the median of its flattened elements."""
    import torch

    return median_dim(torch.ops.aten.reshape.default(self, [-1]), 0)[0]


def sort_stable(self, *, stable=None, dim=-1, descending=False):
    return sort(self, dim, descending, bool(stable))


def unfold(self, dimension, size, step):
    """Tensor.unfold (sliding windows along a dim, the window last) as one index_select of the
    windows' positions, a constant folded at lowering, then a permute of the window dim to the end."""
    import torch

    aten = torch.ops.aten
    if self.dim() == 0:
        raise NotImplementedError("unfold of a 0-d tensor")
    d = dimension % self.dim()
    windows = (self.shape[d] - size) // step + 1
    positions = aten.add.Tensor(_positions(windows, 0, 2, step), _positions(size, 1, 2))
    out = aten.index_select.default(self, d, aten.reshape.default(positions, [-1]))
    out = aten.reshape.default(out, list(self.shape[:d]) + [windows, size] + list(self.shape[d + 1:]))
    order = list(range(d + 1)) + list(range(d + 2, self.dim() + 1)) + [d + 1]
    return out if d == self.dim() - 1 else aten.permute.default(out, order)


def pad(self, pad, mode="constant", value=None):
    """F.pad: the circular mode as a cat of each padded dim's wrapped ends and itself (torch's
    composite builds it in an uninitialised tensor, which no kernel fills); the other modes as
    torch's composite kernel (constant_pad_nd, reflection_pad*, replication_pad*)."""
    import torch

    aten = torch.ops.aten
    if mode != "circular":
        return aten.pad.default(self, pad, mode, value)
    if any(p < 0 for p in pad) or len(pad) % 2 or len(pad) // 2 > self.dim():
        raise NotImplementedError("circular pad that crops")
    out = self
    for j in range(len(pad) // 2):
        d, (left, right) = self.dim() - 1 - j, pad[2 * j:2 * j + 2]
        n = out.shape[d]
        if left > n or right > n:
            raise NotImplementedError("circular pad wider than the dim")
        pieces = ([aten.slice.Tensor(out, d, n - left, n)] if left else []) + [out] + \
                 ([aten.slice.Tensor(out, d, 0, right)] if right else [])
        out = out if len(pieces) == 1 else aten.cat.default(pieces, d)
    return out


def _whole(self, largest: bool):
    """x.max() / x.min() with no dim: the amax (amin) over every dim, NaN propagating as torch's."""
    import torch

    aten = torch.ops.aten
    if not self.dim():
        return aten.clone.default(self)
    return (aten.amax if largest else aten.amin).default(self, list(range(self.dim())))


def max_all(self):
    return _whole(self, largest=True)


def min_all(self):
    return _whole(self, largest=False)


def arg_extreme_reference(self, dim, keepdim=False, largest=1):
    """texelflow.arg_extreme in torch: the int32 argmax (argmin) along dim, as
    shaders/arg_extreme.glsl.j2 computes it."""
    import torch

    return (torch.argmax if largest else torch.argmin)(self, dim, keepdim).to(torch.int32)


# Lines up to this long take arg_extreme's one pass (well inside the loop limit of one invocation,
# shaders/node_rules.py LOOP_TRIPS_LIMIT); longer ones the reductions below, which split.
ARG_EXTREME_MAX_LINE = 4096


def arg_extreme_op(torch):
    """torch.ops.texelflow.arg_extreme.default (ops.yaml's arg_extreme)."""
    return _custom_op(torch, "arg_extreme",
                      "arg_extreme(Tensor self, int dim, bool keepdim=False, int largest=1) -> Tensor",
                      arg_extreme_reference, arg_extreme_reference)


def _arg_extreme(self, dim, keepdim: bool, largest: bool):
    """(extreme values, int64 indices) of self along `dim` (None: the flattened tensor), as torch:
    the first index of the max (min), NaN counting as the extreme. The indices are found on the
    device in int32 and widened by one int32 -> int64 cast, which the device holds narrowed
    (narrowing.py): by one arg_extreme node (float32, float16, int32 or narrowed int64, rank 1 to
    4, lines up to ARG_EXTREME_MAX_LINE), else as the position of each hit, the rest pushed past
    the end, the least taken."""
    import torch

    aten = torch.ops.aten
    x = aten.reshape.default(self, [-1]) if dim is None else self
    d = 0 if dim is None else dim % max(x.dim(), 1)
    n = x.shape[d] if x.dim() else 1
    extreme = (aten.amax if largest else aten.amin).default(x, [d] if x.dim() else [], True)
    if 1 <= x.dim() <= 4 and x.dtype in (torch.float32, torch.float16, torch.int32, torch.int64) and n <= ARG_EXTREME_MAX_LINE:
        first = arg_extreme_op(torch)(x, d, keepdim, int(largest))
    else:
        hit = aten.eq.Tensor(x, extreme)
        if x.dtype.is_floating_point:
            hit = aten.logical_or.default(hit, aten.ne.Tensor(x, x))  # NaN: torch's arg extreme
        shape = [1] * x.dim()
        if shape:
            shape[d] = n
        positions = aten.reshape.default(aten.arange.start_step(0, n, dtype=torch.int32), shape)
        first = aten.amin.default(aten.where.ScalarOther(hit, positions, n), [d] if x.dim() else [], keepdim)
    indices = aten._to_copy.default(first, dtype=torch.int64)
    if dim is None and keepdim:
        indices = aten.reshape.default(indices, [1] * self.dim())
    values = extreme if keepdim else aten.squeeze.dims(extreme, [d]) if x.dim() else extreme
    return values, indices


def argmax(self, dim=None, keepdim=False):
    return _arg_extreme(self, dim, keepdim, largest=True)[1]


def argmin(self, dim=None, keepdim=False):
    return _arg_extreme(self, dim, keepdim, largest=False)[1]


def max_dim(self, dim, keepdim=False):
    return _arg_extreme(self, dim, keepdim, largest=True)


def min_dim(self, dim, keepdim=False):
    return _arg_extreme(self, dim, keepdim, largest=False)


def _running(x, dim: int, largest: bool):
    """The running max (min) of x along `dim` by doubling: after the step of shift k (1, 2, 4, ...)
    each element holds the extreme of the 2k elements up to it, so ceil(log2 n) steps of a
    maximum (minimum) with a shifted copy cover the line. The copy's first k places hold the
    line's first element, which the extreme of every prefix already counts (so they change
    nothing): moves only (slice, expand, cat), so int64 ids the device holds narrowed stay so.
    NaN propagates forward, as maximum and minimum propagate it."""
    import torch

    aten = torch.ops.aten
    n, k = x.shape[dim], 1
    pick = aten.maximum.default if largest else aten.minimum.default
    while k < n:
        size = list(x.shape)
        size[dim] = k
        first = aten.expand.default(aten.slice.Tensor(x, dim, 0, 1), size)
        x = pick(x, aten.cat.default([first, aten.slice.Tensor(x, dim, 0, n - k)], dim))
        k *= 2
    return x


def _cum_extreme(self, dim: int, largest: bool):
    """torch.cummax / cummin: the running extreme (_running), and the index of the last element
    that set it: torch's kernel takes x where x >= the running max (so ties take the later index)
    or x is NaN (and after a NaN only another NaN). The element that set the value equals it, or is
    NaN, so the indices are the running max of its position where it does and -1 elsewhere, in
    int32, widened by a cast the device holds narrowed (narrowing.py)."""
    import torch

    aten = torch.ops.aten
    if self.dim() == 0:
        return aten.clone.default(self), aten._to_copy.default(aten.mul.Scalar(self, 0), dtype=torch.int64)
    d = dim % self.dim()
    n = self.shape[d]
    floating = self.dtype.is_floating_point
    if not floating and self.dtype not in (torch.int32, torch.int64):
        raise ValueError("a running extreme of floats or int32 / int64")
    values = _running(self, d, largest)
    hit = aten.eq.Tensor(self, values)
    if floating:
        hit = aten.logical_or.default(hit, aten.ne.Tensor(self, self))
    shape = [1] * self.dim()
    shape[d] = n
    positions = aten.reshape.default(aten.arange.start_step(0, n, dtype=torch.int32), shape)
    last = _running(aten.where.ScalarOther(hit, positions, -1), d, True)
    return values, aten._to_copy.default(last, dtype=torch.int64)


def cummax(self, dim):
    return _cum_extreme(self, dim, largest=True)


def cummin(self, dim):
    return _cum_extreme(self, dim, largest=False)


def safe_softmax(self, dim, dtype=None):
    """torch's _safe_softmax (the softmax of its attention decomposition): softmax, except that
    a row whose entries are all -inf (fully masked) is 0, not NaN. torch decomposes it through
    zeros_like (full_like, which no kernel computes); here the row test is its max being -inf (a
    row holding a NaN has a NaN max, so it stays NaN, as in torch) and the 0 a where's number."""
    import torch

    aten = torch.ops.aten
    x = self if dtype is None else aten._to_copy.default(self, dtype=dtype)
    out = aten._softmax.default(x, dim, False)
    masked = aten.eq.Scalar(aten.amax.default(x, [dim], True), float("-inf"))
    return aten.where.ScalarSelf(masked, 0.0, out)


def cumsum(self, dim, dtype=None):
    """cumsum with a `dtype` (DETR's `(~mask).cumsum(1, dtype=torch.float32)` position encoding):
    the input cast to it, then a cumsum that keeps its dtype. torch's kernel adds in that dtype too.
    Without one, a line too long for one invocation runs in blocks (cumsum_long)."""
    import torch

    if dtype is None or dtype == self.dtype:
        return cumsum_long(self, dim)  # (a long line in blocks; else the node keeps its reason)
    if dtype not in (torch.float32, torch.float16):
        raise ValueError("only a cast to a float dtype the device sums in helps")  # (the trace fails: no pieces)
    return torch.ops.aten.cumsum.default(torch.ops.aten._to_copy.default(self, dtype=dtype), dim)


def pow_scalar(self, exponent):
    """number ** tensor (`10000 ** (2 * i / d)` of sinusoidal position encodings) as the tensor
    pow of a one-element constant: torch computes pow(self, exponent) per element either way."""
    import torch

    aten = torch.ops.aten
    base = aten.full.default([], self, dtype=exponent.dtype, device=exponent.device)
    return aten.pow.Tensor_Tensor(base, exponent)


def aminmax(self, *, dim=None, keepdim=False):
    """torch.aminmax as its amin and amax (over `dim`, or the whole tensor)."""
    import torch

    aten = torch.ops.aten
    dims = [] if dim is None else [dim]
    return aten.amin.default(self, dims, keepdim), aten.amax.default(self, dims, keepdim)


def bilinear(input1, input2, weight, bias=None):
    """nn.Bilinear, y[..., o] = x1 W[o] x2 + b[o], as one matmul of x1 with the weight laid out
    [I, O J], then a product with x2 and a sum over J: the weight's layout is folded at lowering."""
    import torch

    aten = torch.ops.aten
    out_f, in1, in2 = weight.shape
    lead = list(input1.shape[:-1])
    wide = aten.reshape.default(aten.permute.default(weight, [1, 0, 2]), [in1, out_f * in2])
    t = aten.mm.default(aten.reshape.default(input1, [-1, in1]), wide)
    t = aten.reshape.default(t, [-1, out_f, in2])
    y = aten.sum.dim_IntList(aten.mul.Tensor(t, aten.reshape.default(input2, [-1, 1, in2])), [2])
    if bias is not None:
        y = aten.add.Tensor(y, bias)
    return aten.reshape.default(y, lead + [out_f])


def _log_add_exp(a, b, base2: bool):
    """log(e^a + e^b) (or log2(2^a + 2^b)) as torch's CPU kernel computes it: max(a, b) plus
    log1p(exp(-|a - b|)), and a itself where a and b are the same infinity (no inf - inf)."""
    import torch

    aten = torch.ops.aten
    top = aten.maximum.default(a, b)
    gap = aten.neg.default(aten.abs.default(aten.sub.Tensor(a, b)))
    if base2:
        tail = aten.div.Tensor(aten.log1p.default(aten.exp.default(aten.mul.Tensor(gap, math.log(2.0)))), math.log(2.0))
    else:
        tail = aten.log1p.default(aten.exp.default(gap))
    same_inf = aten.logical_and.default(aten.isinf.default(a), aten.eq.Tensor(a, b))
    return aten.where.self(same_inf, a, aten.add.Tensor(top, tail))


def logaddexp(self, other):
    """torch.logaddexp (_log_add_exp)."""
    return _log_add_exp(self, other, base2=False)


def logaddexp2(self, other):
    """torch.logaddexp2 (_log_add_exp)."""
    return _log_add_exp(self, other, base2=True)


def _nan_ignoring(largest: bool):
    """torch.fmax / fmin: the other operand where one is NaN, else the max (min)."""
    def extreme(self, other):
        import torch

        aten = torch.ops.aten
        both = (aten.maximum if largest else aten.minimum).default(self, other)
        return aten.where.self(aten.isnan.default(self), other, aten.where.self(aten.isnan.default(other), self, both))

    extreme.__name__ = "fmax" if largest else "fmin"
    return extreme


def round_decimals(self, *, decimals=0):
    """torch.round(x, decimals=d) as torch's CPU kernel computes it, in x's dtype: round half to
    even of x 10^d, divided by 10^d (for d < 0: of x / 10^-d, times 10^-d)."""
    import torch

    aten = torch.ops.aten
    if decimals == 0:
        return aten.round.default(self)
    scale = float(10.0 ** abs(decimals))
    if decimals > 0:
        return aten.div.Tensor(aten.round.default(aten.mul.Tensor(self, scale)), scale)
    return aten.mul.Tensor(aten.round.default(aten.div.Tensor(self, scale)), scale)


class NotApplicable(NotImplementedError):
    """A decomposition that does not apply to these arguments at all (equal dtypes for a
    promotion): the node keeps its own reason, with nothing added (decompose._own_refusal)."""


def to_copy(self, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    """A bool cast to an integer dtype (`mask.int()`, `mask.long()`) as where(mask, 1, 0): the
    ones a constant folded at lowering (int64 ones held narrowed), the choice an int32 where. A
    cast to bool (`mask.bool()` of an integer or float mask) as self != 0 (NaN is true, as torch)."""
    import torch

    aten = torch.ops.aten
    if dtype == torch.bool and self.dtype != torch.bool:
        return aten.ne.Scalar(self, 0)
    if self.dtype != torch.bool or dtype not in (torch.int32, torch.int64):
        raise NotApplicable("not a bool to integer cast")
    return aten.where.ScalarOther(self, aten.full_like.default(self, 1, dtype=dtype), 0)


def sum_of_bools(self, dim=None, keepdim=False, dtype=None):
    """A count of true elements (`mask.sum(-1)`, int64 in torch) as the sum of the mask cast to
    int32: lowering bounds the count by the elements summed and runs it in int32 (int_ranges.py)."""
    import torch

    aten = torch.ops.aten
    if self.dtype != torch.bool or dtype is not None:
        raise NotApplicable("not a sum of bools")
    ints = to_copy(self, dtype=torch.int32)
    return aten.sum.dim_IntList(ints, dim, keepdim) if dim is not None else aten.sum.default(ints)


# Reductions longer than a kernel may loop in one invocation (shaders/node_rules.py's loop_trips:
# lavapipe cuts loops short past 65535 iterations) run in two rounds: blocks of SPLIT_BLOCK
# elements, then the blocks' results.
SPLIT_BLOCK = 4096


def _split_block(e: int) -> int:
    """The block of a split reduction over e elements: the largest divisor of e from SPLIT_BLOCK
    down to SPLIT_BLOCK / 4, so that the line splits into whole blocks with no padding (a
    vocabulary of 50,257 = 29 x 1,733; 32,000 = 8 x 4,000), else SPLIT_BLOCK and a padded last
    block. The pad is a copy of the whole line, as long as the reductions that follow."""
    for block in range(SPLIT_BLOCK, SPLIT_BLOCK // 4 - 1, -1):
        if e % block == 0:
            return block
    return SPLIT_BLOCK


def _split_reduce(kind: str, self, dim, keepdim: bool):
    """sum, mean, amax or amin of `self` over `dim` (None or []: every dim) in two rounds: the
    reduced dims moved last and merged into one of e elements, cut into whole blocks
    (_split_block; where none divides e, padded to whole blocks of SPLIT_BLOCK with the
    reduction's identity, 0, -inf or +inf, NaN still spreading), each block reduced, then the
    blocks' results (a mean is the sum over e). Only for more than SPLIT_BLOCK elements, else the
    node keeps its own reason."""
    import torch

    aten = torch.ops.aten
    rank = self.dim()
    dims = list(range(rank)) if dim is None or dim == [] else [dim] if isinstance(dim, int) else list(dim)
    dims = sorted({d % rank for d in dims}) if rank else []
    e = math.prod(self.shape[d] for d in dims)
    if e <= SPLIT_BLOCK:
        raise NotApplicable("a reduction short enough for one round")
    kept = [d for d in range(rank) if d not in dims]
    x = self if kept + dims == list(range(rank)) else aten.permute.default(self, kept + dims)
    lines = math.prod(self.shape[d] for d in kept)
    x = aten.reshape.default(x, [lines, e])
    block = _split_block(e)
    blocks = -(-e // block)
    if blocks * block > e:
        if self.dtype.is_floating_point:
            fill = {"amax": float("-inf"), "amin": float("inf")}.get(kind, 0.0)
        else:  # (int32 values past +-2^30 would lose to the padding: none of the ids and counts seen)
            fill = {"amax": -(2 ** 30), "amin": 2 ** 30}.get(kind, 0)  # exact as the pad kernel's float
        x = aten.constant_pad_nd.default(x, [0, blocks * block - e], fill)
    x = aten.reshape.default(x, [lines, blocks, block])
    if kind in ("sum", "mean"):
        total = aten.sum.dim_IntList(aten.sum.dim_IntList(x, [2]), [1])
        if kind == "mean":
            total = aten.div.Scalar(total, e)
    else:
        op = aten.amax.default if kind == "amax" else aten.amin.default
        total = op(op(x, [2]), [1])
    shape = [1 if d in dims else n for d, n in enumerate(self.shape)] if keepdim else [self.shape[d] for d in kept]
    return aten.reshape.default(total, shape)


def sum_dim(self, dim=None, keepdim=False, dtype=None):
    """A sum of bools (sum_of_bools), or a long one in two rounds (_split_reduce)."""
    import torch

    if self.dtype == torch.bool:
        return sum_of_bools(self, dim, keepdim, dtype)
    if dtype is not None and dtype != self.dtype:
        raise NotApplicable("a sum into another dtype")
    return _split_reduce("sum", self, dim, keepdim)


def sum_all(self, dtype=None):
    return sum_dim(self, None, False, dtype)


def mean_dim(self, dim=None, keepdim=False, dtype=None):
    """A long mean in two rounds (_split_reduce)."""
    if dtype is not None and dtype != self.dtype:
        raise NotApplicable("a mean into another dtype")
    return _split_reduce("mean", self, dim, keepdim)


def mean_all(self, dtype=None):
    return mean_dim(self, None, False, dtype)


def amax_split(self, dim=(), keepdim=False):
    return _split_reduce("amax", self, list(dim), keepdim)


def amin_split(self, dim=(), keepdim=False):
    return _split_reduce("amin", self, list(dim), keepdim)


def _long(n: int) -> None:
    """Refuse (the node keeps its own reason) a line short enough for its own kernel."""
    if n <= SPLIT_BLOCK:
        raise NotApplicable("a line short enough for its own kernel")


def _softmax_pieces(x, dim: int, log: bool):
    """softmax or log_softmax of a long line as torch defines them, from reductions that split:
    m = amax, e = exp(x - m), then e / sum(e) or x - m - log(sum(e)). A row of -inf gives NaN,
    an inf or a NaN spreads over its row, as torch's kernels."""
    import torch

    aten = torch.ops.aten
    m = aten.amax.default(x, [dim], True)
    shifted = aten.sub.Tensor(x, m)
    total = aten.sum.dim_IntList(aten.exp.default(shifted), [dim], True)
    if log:
        return aten.sub.Tensor(shifted, aten.log.default(total))
    return aten.div.Tensor(aten.exp.default(shifted), total)


def softmax_long(self, dim, half_to_float=False, dtype=None):
    """softmax along a line longer than one invocation may loop (shaders/node_rules.py's
    loop_trips: the vocabulary of a language model's head) from reductions that split."""
    if self.dim() == 0 or half_to_float or dtype not in (None, self.dtype):
        raise NotApplicable("a softmax of a scalar or into another dtype")
    _long(self.shape[dim % self.dim()])
    return _softmax_pieces(self, dim % self.dim(), log=False)


def log_softmax_long(self, dim, half_to_float=False, dtype=None):
    if self.dim() == 0 or half_to_float or dtype not in (None, self.dtype):
        raise NotApplicable("a log_softmax of a scalar or into another dtype")
    _long(self.shape[dim % self.dim()])
    return _softmax_pieces(self, dim % self.dim(), log=True)


def _moments(x, dims: list, correction):
    """(variance with `correction`, mean) of x over dims, keepdim, from sums that split."""
    import torch

    aten = torch.ops.aten
    n = math.prod(x.shape[d] for d in dims)
    mean = aten.mean.dim(x, dims, True)
    d = aten.sub.Tensor(x, mean)
    var = aten.div.Scalar(aten.sum.dim_IntList(aten.mul.Tensor(d, d), dims, True), max(n - correction, 0))
    return var, mean


def _dims(x, dim) -> list:
    rank = x.dim()
    dims = list(range(rank)) if dim is None or dim == [] else [dim] if isinstance(dim, int) else list(dim)
    return sorted({d % rank for d in dims})


def var_mean_long(self, dim=None, *, correction=None, keepdim=False):
    """var_mean over more elements than one invocation may loop: the mean, then the sum of
    squared deviations over (N - correction), each a reduction that splits."""
    import torch

    if self.dim() == 0:
        raise NotApplicable("a scalar's moments")
    dims = _dims(self, dim)
    _long(math.prod(self.shape[d] for d in dims))
    var, mean = _moments(self, dims, 1 if correction is None else correction)
    if not keepdim:
        shape = [n for d, n in enumerate(self.shape) if d not in dims]
        var, mean = torch.ops.aten.reshape.default(var, shape), torch.ops.aten.reshape.default(mean, shape)
    return var, mean


def var_long(self, dim=None, *, correction=None, keepdim=False):
    return var_mean_long(self, dim, correction=correction, keepdim=keepdim)[0]


def std_long(self, dim=None, *, correction=None, keepdim=False):
    import torch

    return torch.ops.aten.sqrt.default(var_long(self, dim, correction=correction, keepdim=keepdim))


def _normalized(x, dims: list, eps: float):
    """(x - mean) * rsqrt(var + eps) over dims (biased variance), with mean and rstd (keepdim)."""
    import torch

    aten = torch.ops.aten
    var, mean = _moments(x, dims, 0)
    rstd = aten.rsqrt.default(aten.add.Scalar(var, eps))
    return aten.mul.Tensor(aten.sub.Tensor(x, mean), rstd), mean, rstd


def layer_norm_long(input, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    """layer_norm over a last dim longer than one invocation may loop: its moments from
    reductions that split, then (x - mean) * rstd * weight + bias."""
    import torch

    aten = torch.ops.aten
    if len(normalized_shape) != 1:
        return layer_norm(input, normalized_shape, weight, bias, eps, cudnn_enable)
    _long(input.shape[-1])
    y, _, _ = _normalized(input, [input.dim() - 1], eps)
    if weight is not None:
        y = aten.mul.Tensor(y, weight)
    return y if bias is None else aten.add.Tensor(y, bias)


def _groups_fit(input, num_groups: int) -> None:
    """Refuse (the node keeps the group_norm kernel) fewer than 2 dims, channels that do not split
    into whole groups, or a dtype the pieces do not take."""
    import torch

    if input.dim() < 2 or input.shape[1] % num_groups or input.dtype not in (torch.float32, torch.float16):
        raise NotApplicable("a group_norm of fewer than 2 dims, uneven groups or an integer input")


def _group_pilots(input, num_groups: int):
    """Each group's first element (sample n, the group's first channel, spatial index 0) at every
    channel of the group: [N, C, 1, ...], input's rank. Subtracting it leaves a group's statistics
    but its mean unchanged and keeps the sums that follow small."""
    import torch

    aten = torch.ops.aten
    n, c = input.shape[0], input.shape[1]
    first = input
    for d in range(2, input.dim()):  # spatial index 0 first: the channel slice then moves N C words
        first = aten.slice.Tensor(first, d, 0, 1)
    first = aten.slice.Tensor(first, 1, 0, c, c // num_groups)  # [N, G, 1, ...]
    pilots = aten.expand.default(aten.reshape.default(first, [n, num_groups, 1]), [n, num_groups, c // num_groups])
    return aten.reshape.default(pilots, [n, c] + [1] * (input.dim() - 2))


def _group_scale_shift(shifted, num_groups: int, weight, bias, eps: float):
    """group_norm's per-(sample, channel) scale and shift, [N, C], for `shifted`, the input less
    its group pilots (_group_pilots), with its group statistics: mean (of `shifted`) and rstd,
    [N, G, 1]. y = shifted scale + shift, scale = rstd weight, shift = bias - mean scale: torch's
    CPU formula on the shifted input. The statistics come from each row's mean and biased
    variance (a reduction along the last dim, two passes over rows of W elements), combined by
    the law of total variance: a group's rows are blocks of equal size, so its variance is the
    mean of theirs plus the variance of their means. The pilots keep every sum near zero: a map
    whose mean is large against its spread loses nothing to the sums' rounding, which the
    kernels' running sums would (15-25x torch's pairwise error at a mean of 500)."""
    import torch

    aten = torch.ops.aten
    n, c = shifted.shape[0], shifted.shape[1]
    if shifted.dim() > 2:
        var_r, mean_r = aten.var_mean.correction(shifted, [shifted.dim() - 1], correction=0, keepdim=False)
    else:
        var_r, mean_r = None, shifted  # [N, C]: one element per channel
    per = mean_r.numel() // (n * num_groups)  # rows in a group
    means = aten.reshape.default(mean_r, [n, num_groups, per])
    var_of_means, mean = aten.var_mean.correction(means, [2], correction=0, keepdim=True)
    var = var_of_means if var_r is None else aten.add.Tensor(
        aten.mean.dim(aten.reshape.default(var_r, [n, num_groups, per]), [2], True), var_of_means)
    rstd = aten.rsqrt.default(aten.add.Scalar(var, eps))
    channels = c // num_groups
    scale = aten.reshape.default(aten.expand.default(rstd, [n, num_groups, channels]), [n, c])
    if weight is not None:
        scale = aten.mul.Tensor(scale, weight)
    mean_c = aten.reshape.default(aten.expand.default(mean, [n, num_groups, channels]), [n, c])
    shift = aten.neg.default(aten.mul.Tensor(mean_c, scale))
    if bias is not None:
        shift = aten.add.Tensor(shift, bias)
    return scale, shift, mean, rstd


def _scaled_shifted(input, scale, shift):
    """input (N, C, ...) * scale + shift, both [N, C], broadcast over the spatial dims."""
    import torch

    aten = torch.ops.aten
    lanes = [input.shape[0], input.shape[1]] + [1] * (input.dim() - 2)
    return aten.add.Tensor(aten.mul.Tensor(input, aten.reshape.default(scale, lanes)),
                           aten.reshape.default(shift, lanes))


def group_norm_by_rows(input, num_groups, weight=None, bias=None, eps=1e-5, cudnn_enabled=True):
    """group_norm as the input less its group pilots, per-row statistics, their combination per
    group, then one scale and shift per (sample, channel) (_group_scale_shift): a row reduction
    and three passes over the input, where the group_norm kernel recomputes a group's statistics
    for each of its rows (and cannot loop over a group past lavapipe's loop limit)."""
    import torch

    _groups_fit(input, num_groups)
    shifted = torch.ops.aten.sub.Tensor(input, _group_pilots(input, num_groups))
    scale, shift, _, _ = _group_scale_shift(shifted, num_groups, weight, bias, eps)
    return _scaled_shifted(shifted, scale, shift)


def native_group_norm_by_rows(input, weight, bias, N, C, HxW, group, eps):
    """native_group_norm (out, mean [N, G], rstd [N, G]) as group_norm_by_rows computes it."""
    import torch

    aten = torch.ops.aten
    _groups_fit(input, group)
    pilots = _group_pilots(input, group)
    shifted = aten.sub.Tensor(input, pilots)
    scale, shift, mean, rstd = _group_scale_shift(shifted, group, weight, bias, eps)
    n, c = input.shape[0], input.shape[1]
    group_pilots = aten.slice.Tensor(aten.reshape.default(pilots, [n, group, c // group]), 2, 0, 1)  # [N, G, 1]
    mean = aten.add.Tensor(mean, group_pilots)  # the input's mean: the shifted one plus the pilot
    return (_scaled_shifted(shifted, scale, shift), aten.reshape.default(mean, [n, group]),
            aten.reshape.default(rstd, [n, group]))


def cumsum_long(self, dim, dtype=None):
    """cumsum along a line longer than one invocation may loop, in blocks: each block's running
    sum, plus the running sum of the blocks before it (a cumsum of the blocks' totals, shifted
    by one block)."""
    import torch

    aten = torch.ops.aten
    if self.dim() == 0 or (dtype is not None and dtype != self.dtype):
        raise NotApplicable("a scalar's or another dtype's cumsum")
    d = dim % self.dim()
    n = self.shape[d]
    _long(n)
    order = [k for k in range(self.dim()) if k != d] + [d]
    moved = self if d == self.dim() - 1 else aten.permute.default(self, order)
    lines = math.prod(moved.shape[:-1])
    blocks = -(-n // SPLIT_BLOCK)
    x = aten.reshape.default(moved, [lines, n])
    if blocks * SPLIT_BLOCK > n:
        x = aten.constant_pad_nd.default(x, [0, blocks * SPLIT_BLOCK - n], 0)
    x = aten.reshape.default(x, [lines, blocks, SPLIT_BLOCK])
    inner = aten.cumsum.default(x, 2)
    totals = aten.slice.Tensor(inner, 2, SPLIT_BLOCK - 1, SPLIT_BLOCK)  # [lines, blocks, 1]
    before = aten.sub.Tensor(aten.cumsum.default(totals, 1), totals)  # the blocks before each
    out = aten.add.Tensor(inner, before)
    out = aten.slice.Tensor(aten.reshape.default(out, [lines, blocks * SPLIT_BLOCK]), 1, 0, n)
    out = aten.reshape.default(out, list(moved.shape))
    return out if d == self.dim() - 1 else aten.permute.default(out, [order.index(k) for k in range(self.dim())])


def vector_norm_long(self, ord=2, dim=None, keepdim=False, *, dtype=None):
    """torch.linalg.vector_norm over more elements than one invocation may loop, from reductions
    that split: max / min of |x| for +-inf, the count of non-zeros for 0, sqrt of the sum of
    squares for 2, else the sum of |x|^ord to the 1 / ord."""
    import torch

    aten = torch.ops.aten
    if self.dim() == 0 or (dtype is not None and dtype != self.dtype):
        raise NotApplicable("a scalar's norm or one into another dtype")
    dims = _dims(self, dim)
    _long(math.prod(self.shape[d] for d in dims))
    a = aten.abs.default(self)
    if ord == float("inf"):
        return aten.amax.default(a, dims, keepdim)
    if ord == float("-inf"):
        return aten.amin.default(a, dims, keepdim)
    if ord == 0:
        return aten.sum.dim_IntList(aten._to_copy.default(aten.ne.Scalar(self, 0), dtype=self.dtype), dims, keepdim)
    if ord == 2:
        return aten.sqrt.default(aten.sum.dim_IntList(aten.mul.Tensor(self, self), dims, keepdim))
    if ord == 1:
        return aten.sum.dim_IntList(a, dims, keepdim)
    return aten.pow.Tensor_Scalar(aten.sum.dim_IntList(aten.pow.Tensor_Scalar(a, ord), dims, keepdim), 1.0 / ord)


def adaptive_avg_pool2d(self, output_size):
    """adaptive_avg_pool2d to 1 x 1 (global average pooling) as a mean over H and W, which a
    long window takes in two rounds; other output sizes keep the node's own reason."""
    import torch

    if [int(n) for n in output_size] != [1, 1] or self.dim() not in (3, 4):
        raise NotApplicable("adaptive pooling to more than one element")
    return torch.ops.aten.mean.dim(self, [-2, -1], True)


def matmul_split_k(self, other):
    """A matmul of a long K (past the loops one invocation may run, shaders/node_rules.py) as the
    sum of matmuls of K slices of SPLIT_K."""
    import torch

    aten = torch.ops.aten
    k = self.shape[-1]
    if self.dim() < 2 or other.dim() < 2 or k <= SPLIT_K:
        raise NotApplicable("a matmul of a short K")
    out = None
    for start in range(0, k, SPLIT_K):
        end = min(start + SPLIT_K, k)
        part = aten.matmul.default(aten.slice.Tensor(self, -1, start, end), aten.slice.Tensor(other, -2, start, end))
        out = part if out is None else aten.add.Tensor(out, part)
    return out


def conv_transpose_split(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """A transposed conv of more input channels than one invocation may loop over (a wide
    decoder's or vocoder's upsampling; node_rules.conv_transpose_trips) as the sum of transposed
    convs of input-channel slices of equal size (input and the constant weight sliced alike),
    the bias added once."""
    import torch

    from texelflow.shaders.node_rules import LOOP_TRIPS_LIMIT, conv_transpose_trips

    aten = torch.ops.aten
    n = input.dim() - 2
    lists = [[v] * n if isinstance(v, int) else list(v) for v in (stride, padding, output_padding, dilation)]
    lists = [v * n if len(v) == 1 else v for v in lists]
    kernel = tuple(weight.shape[2:])
    per_channel = conv_transpose_trips(kernel, lists[0], lists[3], 1) - conv_transpose_trips(kernel, lists[0],
                                                                                            lists[3], 0)
    most = max(1, (LOOP_TRIPS_LIMIT - conv_transpose_trips(kernel, lists[0], lists[3], 0)) // per_channel)
    if groups != 1 or input.shape[1] <= most:
        raise NotApplicable("a transposed conv of few input channels, or of groups")
    chunk = -(-input.shape[1] // -(-input.shape[1] // most))  # equal slices, each at most `most`
    op = aten.conv_transpose2d.input
    if n == 1:  # a 1-D one as a 2-D one of height 1 (torch traces conv_transpose1d as convolution)
        (s,), (p,), (o,), (d,) = lists
        out = conv_transpose_split(aten.unsqueeze.default(input, 2), aten.unsqueeze.default(weight, 2), bias,
                                   [1, s], [0, p], [0, o], groups, [1, d])
        return aten.squeeze.dim(out, 2)
    out = None
    for start in range(0, input.shape[1], chunk):
        end = min(start + chunk, input.shape[1])
        part = op(aten.slice.Tensor(input, 1, start, end), aten.slice.Tensor(weight, 0, start, end),
                  bias if out is None else None, lists[0], lists[1], lists[2], 1, lists[3])
        out = part if out is None else aten.add.Tensor(out, part)
    return out


SPLIT_K = 16384


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    """A LayerNorm over several trailing dims (`nn.LayerNorm([C, H, W])`) as one over their
    product: the input, weight and bias reshaped (the latter two are constants, folded), the
    kernel's last-dim norm, the result reshaped back."""
    import torch

    aten = torch.ops.aten
    dims = list(normalized_shape)
    if len(dims) <= 1:
        raise NotApplicable("a norm over the last dim")
    lead, flat = list(input.shape[:input.dim() - len(dims)]), math.prod(dims)
    x = aten.reshape.default(input, lead + [flat])
    w = None if weight is None else aten.reshape.default(weight, [flat])
    b = None if bias is None else aten.reshape.default(bias, [flat])
    return aten.reshape.default(aten.layer_norm.default(x, [flat], w, b, eps), list(input.shape))


def std_mean(self, dim=None, *, correction=None, keepdim=False):
    """torch.std_mean as var_mean (one kernel) and a square root."""
    import torch

    aten = torch.ops.aten
    var, mean = aten.var_mean.correction(self, dim, correction=correction, keepdim=keepdim)
    return aten.sqrt.default(var), mean


def rrelu(self, lower=0.125, upper=1.0 / 3.0, training=False, generator=None):
    """RReLU in inference: a leaky ReLU whose slope is the mean of lower and upper (training
    draws random slopes: not this)."""
    import torch

    if training:
        raise NotImplementedError("rrelu in training (random slopes)")
    return torch.ops.aten.leaky_relu.default(self, (lower + upper) / 2)


def copy(self, src, non_blocking=False):
    """aten.copy (a functionalized `dst.copy_(src)` or `dst[...] = src` over the whole of dst:
    transformers' causal-mask update) as src in dst's dtype and shape: a cast where the dtypes
    differ, an expand where src broadcasts, else src itself."""
    import torch

    aten = torch.ops.aten
    out = src if src.dtype == self.dtype else aten._to_copy.default(src, dtype=self.dtype)
    if list(out.shape) != list(self.shape):
        return aten.expand.default(out, list(self.shape))
    return aten.alias.default(out)


def slice_scatter(self, src, dim=0, start=None, end=None, step=1):
    """`y[:, a:b] = src` (functionalized) as a cat of self's part before the slice, src and
    self's part after it."""
    import torch

    aten = torch.ops.aten
    d = dim % self.dim()
    taken = range(self.shape[d])[slice(start, end, step)]
    if step != 1 or len(taken) != src.shape[d]:
        raise NotImplementedError("slice_scatter with a step")
    if not len(taken):
        return aten.alias.default(self)
    first, last = taken[0], taken[-1] + 1
    pieces = ([aten.slice.Tensor(self, d, 0, first)] if first else []) + [src] + \
             ([aten.slice.Tensor(self, d, last, self.shape[d])] if last < self.shape[d] else [])
    return aten.cat.default(pieces, d) if len(pieces) > 1 else aten.alias.default(src)


def index_put(self, indices, values, accumulate=False):
    """`y[mask] = v` and `y[mask] += v` with a bool mask and a value that broadcasts (one
    element: no data-dependent shape) as a where; `y[:, idx] = v` (`+= v` with accumulate) with one
    1-D integer index tensor as a where of the gathered values at the positions idx names (the
    last k naming a position wins; torch leaves duplicates unspecified) or their sum (a one-hot
    matrix product). Negative entries count from the end."""
    import torch

    aten = torch.ops.aten
    tensors = [(k, t) for k, t in enumerate(indices) if t is not None]
    if len(tensors) != 1:
        raise NotImplementedError("index_put with several index tensors")
    d, idx = tensors[0]
    if idx.dtype == torch.bool:
        if values.numel() != 1 or d != 0 or list(idx.shape) != list(self.shape[:idx.dim()]):
            raise NotImplementedError("index_put of a mask with more than one value")
        mask = idx if idx.dim() == self.dim() else aten.reshape.default(
            idx, list(idx.shape) + [1] * (self.dim() - idx.dim()))
        value = aten.reshape.default(values, [])
        new = aten.add.Tensor(self, value) if accumulate else value
        return aten.where.self(mask, new, self)
    if idx.dim() != 1 or self.dim() == 0:
        raise NotImplementedError("index_put with a multi-dim index")
    n, count = self.shape[d], idx.shape[0]
    shape = list(self.shape)
    shape[d] = count
    if list(values.shape) != shape:
        values = aten.expand.default(values, shape)
    ks, positions = _positions(count, 0, 2), _positions(n, 1, 2)
    hits = aten.eq.Tensor(aten.reshape.default(_wrapped_int32(idx, n), [count, 1]), positions)  # [count, n]
    if accumulate:
        moved = aten.movedim.int(values, d, -1) if d != self.dim() - 1 else values
        onehot = aten.where.ScalarOther(hits, aten.full_like.default(hits, 1.0, dtype=values.dtype), 0.0)
        added = aten.matmul.default(moved, onehot)  # [..., n]: each position's sum
        added = aten.movedim.int(added, -1, d) if d != self.dim() - 1 else added
        return aten.add.Tensor(self, added)
    last = aten.amax.default(aten.where.ScalarOther(hits, ks, -1), [0])  # [n]: the last k per position
    along = [1] * self.dim()
    along[d] = n
    named = aten.ge.Scalar(last, 0)
    picked = aten.index_select.default(values, d, aten.where.ScalarOther(named, last, 0))
    return aten.where.self(aten.reshape.default(named, along), picked, self)


# The one-hot comparison a scatter decomposes into holds index.numel() x self.shape[dim] truth
# values; past this it would cost more memory than the scatter is worth, so the node runs whole on
# the CPU with its reason.
SCATTER_MAX_HITS = 1 << 22
# cdist's pairwise differences: B x P x R x M elements written once (64 MiB in float32)
CDIST_MAX_ELEMENTS = 1 << 24


def _scatter_hits(self, dim, index):
    """(dim, hits, last): hits [.., K, n, ..] (index entry k names position p along dim, the
    pair's axes at dim and dim + 1) and last [.., n, ..], the last k naming each position or -1."""
    import torch

    aten = torch.ops.aten
    if self.dim() == 0 or index.dim() != self.dim():
        raise NotImplementedError("scatter of a 0-d tensor")
    d = dim % self.dim()
    if any(index.shape[k] != self.shape[k] for k in range(self.dim()) if k != d):
        raise NotImplementedError("scatter with an index smaller than self off its dim")
    n, count = self.shape[d], index.shape[d]
    if index.numel() * n > SCATTER_MAX_HITS:
        raise NotImplementedError(f"scatter of {index.numel()} entries over {n} positions (above {SCATTER_MAX_HITS})")
    hits = aten.eq.Tensor(aten.unsqueeze.default(_wrapped_int32(index, n), d + 1), _positions(n, d + 1, self.dim() + 1))
    ks = _positions(count, d, self.dim() + 1)
    last = aten.amax.default(aten.where.ScalarOther(hits, ks, -1), [d])
    return d, hits, last


def _sources(src, index):
    """src cut to index's shape (torch reads src only where index has entries)."""
    import torch

    for k, n in enumerate(index.shape):
        if src.shape[k] != n:
            src = torch.ops.aten.slice.Tensor(src, k, 0, n)
    return src


def scatter_add(self, dim, index, src):
    """Tensor.scatter_add as a one-hot comparison of index with the positions along dim and a sum
    of the sources it selects (summed in another order than torch's loop: rounding only)."""
    import torch

    aten = torch.ops.aten
    d, hits, _ = _scatter_hits(self, dim, index)
    picked = aten.where.ScalarOther(hits, aten.unsqueeze.default(_sources(src, index), d + 1), 0.0) \
        if src.dtype.is_floating_point else None
    if picked is None:
        raise NotImplementedError("scatter_add of integers")
    return aten.add.Tensor(self, aten.sum.dim_IntList(picked, [d]))


def scatter_src(self, dim, index, src):
    """Tensor.scatter (no reduction): each position named by index takes the source of the last
    entry naming it (torch leaves duplicates unspecified), the others keep self."""
    import torch

    aten = torch.ops.aten
    d, _, last = _scatter_hits(self, dim, index)
    named = aten.ge.Scalar(last, 0)
    picked = gather(_sources(src, index), d, aten.where.ScalarOther(named, last, 0))
    return aten.where.self(named, picked, self)


def scatter_value(self, dim, index, value):
    """Tensor.scatter with a number: the positions index names take it, the others keep self."""
    import torch

    aten = torch.ops.aten
    d, _, last = _scatter_hits(self, dim, index)
    return aten.where.ScalarSelf(aten.ge.Scalar(last, 0), value, self)


def scatter_reduce(self, dim, index, src, reduce, *, include_self=True):
    """Tensor.scatter_reduce (graph networks' message aggregation) of floats as scatter_add is
    built: the one-hot hits of index and positions select the sources, reduced along the entries
    (sum, mean, amax, amin); positions no entry names keep self. A product has no reduction
    kernel and integers divide otherwise in torch's mean: both are refused."""
    import torch

    aten = torch.ops.aten
    if reduce not in ("sum", "mean", "amax", "amin") or not src.dtype.is_floating_point:
        raise NotImplementedError(f"scatter_reduce with reduce={reduce!r} of {src.dtype}")
    d, hits, last = _scatter_hits(self, dim, index)
    named = aten.ge.Scalar(last, 0)
    sources = aten.unsqueeze.default(_sources(src, index), d + 1)
    if reduce in ("amax", "amin"):
        empty = float("-inf") if reduce == "amax" else float("inf")
        extreme = aten.amax if reduce == "amax" else aten.amin
        found = extreme.default(aten.where.ScalarOther(hits, sources, empty), [d])
        if include_self:
            found = (aten.maximum if reduce == "amax" else aten.minimum).default(self, found)
        return aten.where.self(named, found, self)
    total = aten.sum.dim_IntList(aten.where.ScalarOther(hits, sources, 0.0), [d])
    if reduce == "sum":
        return aten.add.Tensor(self, total) if include_self else aten.where.self(named, total, self)
    count = aten._to_copy.default(aten.sum.dim_IntList(to_copy(hits, dtype=torch.int32), [d]), dtype=self.dtype)
    if include_self:
        return aten.div.Tensor(aten.add.Tensor(self, total), aten.add.Scalar(count, 1.0))
    return aten.where.self(named, aten.div.Tensor(total, aten.clamp.default(count, 1.0)), self)


def _sorted_count(seq, values, right: bool, out_int32: bool):
    """The count of seq's elements (its last dim, sorted) that come before each value: those not
    above it (right) or below it, where a NaN value comes after all, as torch's binary search."""
    import torch

    aten = torch.ops.aten
    if seq.dim() == 1:
        s, v = seq, aten.unsqueeze.default(values, -1)
    elif values.dim() == seq.dim() and values.shape[:-1] == seq.shape[:-1]:
        s, v = aten.unsqueeze.default(seq, -2), aten.unsqueeze.default(values, -1)
    else:
        raise NotImplementedError("searchsorted of a sequence whose leading dims differ from the values'")
    before = aten.logical_not.default((aten.lt if right else aten.le).Tensor(v, s))
    count = aten.sum.dim_IntList(to_copy(before, dtype=torch.int32), [-1])  # int64, as torch sums ints
    return aten._to_copy.default(count, dtype=torch.int32) if out_int32 else count


def bucketize(self, boundaries, *, out_int32=False, right=False):
    """torch.bucketize as a count of the boundaries each value passes (a comparison per pair)."""
    if boundaries.dim() != 1 or self.dim() == 0:
        raise NotApplicable("not a tensor bucketed by 1-D boundaries")
    return _sorted_count(boundaries, self, right, out_int32)


def searchsorted(sorted_sequence, self, *, out_int32=False, right=False, side=None, sorter=None):
    """torch.searchsorted as _sorted_count (side="right" is right=True); a sorter is refused."""
    if sorter is not None or self.dim() == 0:
        raise NotImplementedError("searchsorted with a sorter or of a number")
    return _sorted_count(sorted_sequence, self, right or side == "right", out_int32)


def diagonal(self, offset=0, dim1=0, dim2=1):
    """torch.diagonal (and so trace) as a strided slice of the two dims flattened: element
    (i, i + offset) of an n x m matrix is word i (m + 1) + offset (- offset m below the main one)."""
    import torch

    aten = torch.ops.aten
    if self.dim() < 2:
        raise NotApplicable("not a matrix")
    d1, d2 = dim1 % self.dim(), dim2 % self.dim()
    rest = [k for k in range(self.dim()) if k not in (d1, d2)]
    x = aten.permute.default(self, rest + [d1, d2])
    n, m = self.shape[d1], self.shape[d2]
    count = min(n, m - offset) if offset >= 0 else min(n + offset, m)
    if count <= 0:
        raise NotImplementedError("an empty diagonal")
    start = offset if offset >= 0 else -offset * m
    flat = aten.reshape.default(x, [*x.shape[:-2], n * m])
    return aten.slice.Tensor(flat, -1, start, start + (m + 1) * (count - 1) + 1, m + 1)


def cdist(x1, x2, p=2.0, compute_mode=None):
    """torch.cdist as the norms of the pairwise differences (x1[..., :, None] - x2[..., None, :]):
    p = 2 by the sum of squares and a square root, 1 by absolute values, inf by their maximum,
    others by |d|^p; up to CDIST_MAX_ELEMENTS differences. torch's own p = 2 takes a matmul form
    for more than 25 rows, which cancels where this one does not."""
    import torch

    aten = torch.ops.aten
    if x1.dim() < 2 or x1.dim() != x2.dim() or x1.shape[:-2] != x2.shape[:-2]:
        raise NotImplementedError("cdist of broadcast batches")
    if x1.numel() // x1.shape[-1] * x2.shape[-2] * x1.shape[-1] > CDIST_MAX_ELEMENTS:
        raise NotImplementedError(f"cdist of more than {CDIST_MAX_ELEMENTS} differences")
    diff = aten.abs.default(aten.sub.Tensor(aten.unsqueeze.default(x1, -2), aten.unsqueeze.default(x2, -3)))
    if p == 2:
        return aten.sqrt.default(aten.sum.dim_IntList(aten.mul.Tensor(diff, diff), [-1]))
    if p == 1:
        return aten.sum.dim_IntList(diff, [-1])
    if p == float("inf"):
        return aten.amax.default(diff, [-1])
    if p > 0:
        return aten.pow.Tensor_Scalar(aten.sum.dim_IntList(aten.pow.Tensor_Scalar(diff, p), [-1]), 1.0 / p)
    raise NotImplementedError(f"cdist with p = {p}")


def cdist_forward(x1, x2, p, compute_mode):
    return cdist(x1, x2, p, compute_mode)


def col2im(self, output_size, kernel_size, dilation, padding, stride):
    """F.fold (col2im) as a grouped transposed convolution whose weights are one-hot: block entry
    (c, q) lands on output channel c at kernel offset q, and overlapping blocks add, as fold adds."""
    import torch

    aten = torch.ops.aten
    batched = self.dim() == 3
    x = self if batched else aten.unsqueeze.default(self, 0)
    (kh, kw), (dh, dw), (ph, pw), (sh, sw) = (_triple(v, 2) for v in (kernel_size, dilation, padding, stride))
    out_h, out_w = _triple(output_size, 2)
    k = kh * kw
    channels = x.shape[1] // k
    blocks_h = (out_h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    blocks_w = (out_w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    if channels * k != x.shape[1] or blocks_h * blocks_w != x.shape[2]:
        raise NotImplementedError("col2im of blocks that do not tile the output (torch raises)")
    grid = aten.reshape.default(x, [x.shape[0], channels * k, blocks_h, blocks_w])
    # word f of the [channels k, 1, kh, kw] weight is row f // k at kernel offset f % k: one when the
    # row's own offset (f // k) % k is it. Built from one arange of the weight's size, so each step
    # is no larger than its input and lowering folds the weight into a constant.
    words = _positions(channels * k * k, 0, 1)
    hot = aten.eq.Tensor(aten.remainder.Scalar(words, k),
                         aten.remainder.Scalar(aten.div.Scalar_mode(words, k, rounding_mode="floor"), k))
    weight = aten.reshape.default(aten._to_copy.default(hot, dtype=self.dtype), [channels * k, 1, kh, kw])
    extra = [out - ((b - 1) * s - 2 * p + d * (kk - 1) + 1)
             for out, b, s, p, d, kk in ((out_h, blocks_h, sh, ph, dh, kh), (out_w, blocks_w, sw, pw, dw, kw))]
    out = aten.conv_transpose2d.input(grid, weight, None, [sh, sw], [ph, pw], extra, channels, [dh, dw])
    return out if batched else aten.squeeze.dim(out, 0)


def _with_number(name: str):
    """A bitwise op or shift of an integer tensor and a number (`ids & 3`, `x >> 4`) as the op of
    two tensors with the number as a 0-d tensor of the tensor's dtype: the kernels broadcast it."""

    def decomposition(self, other):
        import torch

        if not isinstance(other, (int, bool)) or self.dtype.is_floating_point or \
                (self.dtype == torch.bool and not isinstance(other, bool)):  # bool & 3 is int64 in torch
            raise NotApplicable("not an integer tensor and an integer")
        number = torch.ops.aten.scalar_tensor.default(other, dtype=self.dtype)
        return getattr(torch.ops.aten, name).Tensor(self, number)

    decomposition.__name__ = f"{name}_number"
    return decomposition


def div_rounded(self, other, *, rounding_mode=None):
    """torch.div with a rounding mode, and floor_divide (`ids // 2`). An integer tensor by a
    number is div_mode_scalar (an int32 kernel; int64 runs narrowed where its values are bounded).
    A float tensor rounded toward zero is trunc(self / other), which is how torch computes it. A
    float floor division and an integer division by a tensor are refused: torch floors the quotient
    of an exact fmod, which the device's division does not give, and no kernel divides integers
    elementwise by a tensor."""
    import torch

    aten = torch.ops.aten
    if rounding_mode is None:
        return aten.div.Tensor(self, other)
    number = isinstance(other, (int, float)) and not isinstance(other, bool)
    if self.dtype.is_floating_point or (number and isinstance(other, float)):
        if rounding_mode == "trunc":
            return aten.trunc.default(aten.div.Tensor(self, other))
        raise NotImplementedError("a float floor division rounds as torch's fmod-exact quotient, which the "
                                  "device's division does not give")
    if not number:
        raise NotImplementedError("no kernel divides integers elementwise by a tensor")
    if other == 0:
        raise NotImplementedError("an integer division by zero (torch raises)")
    return aten.div.Scalar_mode(self, other, rounding_mode=rounding_mode)


def floor_divide(self, other):
    """floor_divide (Python's `//` of tensors) as div with rounding_mode="floor"."""
    return div_rounded(self, other, rounding_mode="floor")


def _bool_compared(name: str):
    """A bool tensor compared with a number (`mask.tril() == 0`, count_nonzero's `!= 0`) as its
    0 / 1 in int32 compared: the comparison kernels take float32 and int32."""

    def decomposition(self, other):
        import torch

        if self.dtype != torch.bool:
            raise NotApplicable("not a bool tensor")
        return getattr(torch.ops.aten, name).Scalar(to_copy(self, dtype=torch.int32), other)

    decomposition.__name__ = f"bool_{name}"
    return decomposition


def _triple(v, n: int = 3) -> list[int]:
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return v * n if len(v) == 1 else v


def conv3d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """A 3-D convolution (video models: I3D, X3D, a VideoMAE patch embedding) by 2-D convolutions,
    the kernel family the device has: the input laid out [N, T, C, H, W] once (frames padded),
    and for each of the kernel's kt frame slices a conv2d of the frames it meets, folded into the
    batch, the kt results summed. (Stacking the slices along the channels into one conv2d costs a
    rank-5 cat, which measured slower on lavapipe than the kt - 1 adds.)"""
    import torch

    aten = torch.ops.aten
    if input.dim() != 5:
        raise NotApplicable("not a batched 3-D convolution")
    (st, sh, sw), (dt, dh, dw) = _triple(stride), _triple(dilation)
    if isinstance(padding, str):
        if padding == "valid":
            padding = [0, 0, 0]
        elif all(d * (k - 1) % 2 == 0 for d, k in zip((dt, dh, dw), weight.shape[2:])):
            padding = [d * (k - 1) // 2 for d, k in zip((dt, dh, dw), weight.shape[2:])]
        else:
            raise NotImplementedError("padding='same' with an even kernel pads unevenly")
    pt, ph, pw = _triple(padding)
    n, kt = input.shape[0], weight.shape[2]
    x = aten.permute.default(input, [0, 2, 1, 3, 4])  # [N, T, C, H, W]
    if pt:
        x = aten.constant_pad_nd.default(x, [0, 0, 0, 0, 0, 0, pt, pt], 0.0)
    frames = (x.shape[1] - dt * (kt - 1) - 1) // st + 1
    if frames < 1:
        raise NotImplementedError("a 3-D convolution whose kernel is longer than the padded frames (torch raises)")
    slices = [x if frames == x.shape[1] else aten.slice.Tensor(x, 1, i * dt, i * dt + st * (frames - 1) + 1, st)
              for i in range(kt)]

    def conv(stack, w, b):
        flat = aten.reshape.default(stack, [n * frames, stack.shape[2], stack.shape[3], stack.shape[4]])
        return aten.conv2d.default(flat, w, b, [sh, sw], [ph, pw], [dh, dw], groups)

    out = None
    for i in range(kt):
        part = conv(slices[i], aten.select.int(weight, 2, i), bias if i == 0 else None)
        out = part if out is None else aten.add.Tensor(out, part)
    return aten.permute.default(aten.reshape.default(out, [n, frames, *out.shape[1:]]), [0, 2, 1, 3, 4])


def conv3d_padding(input, weight, bias=None, stride=1, padding="valid", dilation=1, groups=1):
    return conv3d(input, weight, bias, stride, padding, dilation, groups)


def convolution_3d(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    """The decomposed convolution of a 3-D one (run_decompositions' graphs) as conv3d or
    conv_transpose3d."""
    if weight.dim() != 5:
        raise NotApplicable("not a 3-D convolution")
    if transposed:
        return conv_transpose3d(input, weight, bias, stride, padding, output_padding, groups, dilation)
    return conv3d(input, weight, bias, stride, padding, dilation, groups)


def conv_transpose3d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """A transposed 3-D convolution (a 3-D U-Net's or V-Net's up-sampling) by transposed 2-D ones:
    the input laid out [N, T, C, H, W] once, frames folded into the batch, and the kernel's kt
    frame slices one conv_transpose2d of every frame (groups 1: one of kt x Cout output channels;
    else one per slice), which the fusion pass runs as phase convs (runtime/graph/conv_transpose.py).
    Frame t's result for slice i belongs at frame t * st + i * dt of the uncropped output: with
    kt = st and dt = 1 (k 2 s 2) the slices interleave ([N, T, kt, ..] viewed as [N, T kt, ..];
    a stack along a new dim where groups > 1); otherwise each is spread by zero frames
    (a pad of a new dim), shifted into place (a pad along T) and the kt summed. Then the crop of
    padding / output_padding along T (a pad, negative where it crops), the bias, the layout back."""
    import torch

    aten = torch.ops.aten
    if input.dim() != 5:
        raise NotApplicable("not a batched 3-D convolution")
    (st, sh, sw), (pt, ph, pw), (ot, oh, ow), (dt, dh, dw) = (
        _triple(v) for v in (stride, padding, output_padding, dilation))
    n, t = input.shape[0], input.shape[2]
    kt = weight.shape[2]
    x = aten.permute.default(input, [0, 2, 1, 3, 4])  # [N, T, C, H, W]
    flat = aten.reshape.default(x, [n * t, x.shape[2], x.shape[3], x.shape[4]])
    interleave = kt == st and dt == 1
    if groups == 1:  # one transposed conv for all kt slices: output channel i * Cout + co
        cin, cout = weight.shape[0], weight.shape[1]
        merged = aten.reshape.default(aten.permute.default(weight, [0, 2, 1, 3, 4]),
                                      [cin, kt * cout, weight.shape[3], weight.shape[4]])
        y = aten.conv_transpose2d.input(flat, merged, None, [sh, sw], [ph, pw], [oh, ow], 1, [dh, dw])
        y = aten.reshape.default(y, [n, t, kt, cout, *y.shape[2:]])  # [N, T, kt, Cout, H', W']
        frame = [cout, *y.shape[4:]]
        parts = None if interleave else [aten.select.int(y, 2, i) for i in range(kt)]
    else:
        parts = []
        for i in range(kt):
            y = aten.conv_transpose2d.input(flat, aten.select.int(weight, 2, i), None, [sh, sw], [ph, pw], [oh, ow],
                                            groups, [dh, dw])
            parts.append(aten.reshape.default(y, [n, t, *y.shape[1:]]))
        frame = list(parts[0].shape[2:])  # [Cout, H', W']
        if interleave:
            y = aten.stack.default(parts, 2)
    if interleave:  # frame t's slice i is output frame t * st + i: [N, T, kt, ..] is [N, T * st, ..]
        full = aten.reshape.default(y, [n, t * st, *frame])
    else:
        length = (t - 1) * st + dt * (kt - 1) + 1
        full = None
        for i, y in enumerate(parts):
            spread = y
            if st > 1:  # frame t at t * st, zero frames between
                spread = aten.constant_pad_nd.default(aten.unsqueeze.default(y, 2), [0, 0] * 3 + [0, st - 1], 0.0)
                spread = aten.reshape.default(spread, [n, t * st, *frame])
            shift = aten.constant_pad_nd.default(spread, [0, 0] * 3 + [i * dt, length - i * dt - t * st], 0.0)
            full = shift if full is None else aten.add.Tensor(full, shift)
    out_t = (t - 1) * st - 2 * pt + dt * (kt - 1) + ot + 1
    if pt or out_t != full.shape[1]:
        full = aten.constant_pad_nd.default(full, [0, 0] * 3 + [-pt, out_t + pt - full.shape[1]], 0.0)
    if bias is not None:
        full = aten.add.Tensor(full, aten.reshape.default(bias, [-1, 1, 1]))
    return aten.permute.default(full, [0, 2, 1, 3, 4])


def _window_reduce(x, dim: int, k: int, s: int, d: int, before: int, after: int, combine, pad_value: float):
    """Windows of k elements (stride s, dilation d) along `dim` of x, padded by `before` / `after`
    elements of pad_value, combined with `combine`: one slice per window element. A box window's
    maximum or sum is these, dim after dim."""
    import torch

    aten = torch.ops.aten
    if before or after:
        pad = [0, 0] * (x.dim() - 1 - dim) + [before, after]
        x = aten.constant_pad_nd.default(x, pad, pad_value)
    count = (x.shape[dim] - d * (k - 1) - 1) // s + 1
    out = None
    for i in range(k):
        part = aten.slice.Tensor(x, dim, i * d, i * d + s * (count - 1) + 1, s)
        out = part if out is None else combine(out, part)
    return out


def _pool_args(self, kernel_size, stride, padding, dilation=1):
    k, p, d = _triple(kernel_size), _triple(padding), _triple(dilation)
    s = _triple(stride) if stride else k
    if self.dim() not in (4, 5):
        raise NotImplementedError("a 3-D pool of a tensor that is not [N,] C, T, H, W")
    return k, s, p, d


def _ceil_extra(size: int, k: int, s: int, d: int, p: int) -> int:
    """Padding past the end that ceil_mode's last window needs (it starts inside the input or
    the left padding, as torch's rule)."""
    span = d * (k - 1) + 1
    out = -(-(size + 2 * p - span) // s) + 1
    if (out - 1) * s >= size + p:
        out -= 1
    return max((out - 1) * s + span - (size + 2 * p), 0)


def max_pool3d(self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    """max_pool3d as windows along T, H and W in turn (`_window_reduce`, padding of -inf, which
    torch's pool ignores alike): a box window's maximum is separable. NaN spreads as in torch."""
    import torch

    k, s, p, d = _pool_args(self, kernel_size, stride, padding, dilation)
    x = self
    for axis in range(3):
        dim = self.dim() - 3 + axis
        extra = _ceil_extra(self.shape[dim], k[axis], s[axis], d[axis], p[axis]) if ceil_mode else 0
        x = _window_reduce(x, dim, k[axis], s[axis], d[axis], p[axis], p[axis] + extra,
                           torch.ops.aten.maximum.default, float("-inf"))
    return x


def avg_pool3d(self, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    """avg_pool3d as window sums along T, H and W in turn (zero padding), divided by the window's
    size, or by divisor_override, or (count_include_pad=False) by the same sums of ones: the
    count of the window's elements inside the input."""
    import torch

    aten = torch.ops.aten
    if ceil_mode:
        raise NotImplementedError("avg_pool3d with ceil_mode")
    k, s, p, _ = _pool_args(self, kernel_size, stride, padding)
    x, ones = self, aten.ones_like.default(self)
    for axis in range(3):
        dim = self.dim() - 3 + axis
        x = _window_reduce(x, dim, k[axis], s[axis], 1, p[axis], p[axis], aten.add.Tensor, 0.0)
        if not count_include_pad and divisor_override is None and any(p):
            ones = _window_reduce(ones, dim, k[axis], s[axis], 1, p[axis], p[axis], aten.add.Tensor, 0.0)
    if divisor_override is not None:
        return aten.div.Scalar(x, divisor_override)
    if not count_include_pad and any(p):
        return aten.div.Tensor(x, ones)
    return aten.div.Scalar(x, k[0] * k[1] * k[2])


def adaptive_avg_pool3d(self, output_size):
    """adaptive_avg_pool3d to one value (a video model's head) as a mean over the flattened frames
    and pixels; to sizes that divide the input's, an avg_pool3d of kernel = stride."""
    import torch

    aten = torch.ops.aten
    size = [s if s is not None else d for s, d in zip(_triple(output_size), self.shape[-3:])]
    lead = list(self.shape[:-3])
    if size == [1, 1, 1]:
        flat = aten.reshape.default(self, [*lead, -1])
        return aten.reshape.default(aten.mean.dim(flat, [-1], True), [*lead, 1, 1, 1])
    if self.dim() != 5 or any(d % s for d, s in zip(self.shape[-3:], size)):
        raise NotImplementedError("adaptive_avg_pool3d to sizes that do not divide the input's")
    kernel = [d // s for d, s in zip(self.shape[-3:], size)]
    return avg_pool3d(self, kernel, kernel)


def embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                  per_sample_weights=None, include_last_offset=False, padding_idx=None):
    """nn.EmbeddingBag (DLRM's sparse features) as a gather of the rows and a bag-membership
    matrix: bag b holds the positions offsets[b] <= i < offsets[b + 1] (a comparison of the folded
    positions with the offsets, which may be an input; the offsets rise, as torch requires), less
    those of padding_idx. Sum: the membership (times per_sample_weights) times the rows, a matmul;
    mean: that over the count; max: the rows' maximum where a bag holds them. Empty bags give 0,
    as in torch. Of the other outputs only bag_size is torch's; offset2bag and max_indices are
    zeros, placeholders: nn.EmbeddingBag and F.embedding_bag never return them."""
    import torch

    aten = torch.ops.aten
    if indices.dim() != 1 or offsets.dim() != 1:
        raise NotApplicable("not the 1-D indices and offsets nn.EmbeddingBag passes")
    n, bags = indices.shape[0], offsets.shape[0] - (1 if include_last_offset else 0)
    rows = aten.embedding.default(weight, indices)  # [n, D]
    pos = aten.unsqueeze.default(_positions(n, 0, 1), 0)  # [1, n]
    starts = aten.unsqueeze.default(aten.slice.Tensor(offsets, 0, 0, bags), 1)  # [bags, 1]
    member = aten.ge.Tensor(pos, starts)
    if include_last_offset:
        ends = aten.slice.Tensor(offsets, 0, 1, bags + 1)
        member = aten.logical_and.default(member, aten.lt.Tensor(pos, aten.unsqueeze.default(ends, 1)))
    elif bags > 1:  # the last bag runs to n: position i is in the last bag whose start it reaches
        last = aten.sub.Scalar(aten.sum.dim_IntList(to_copy(member, dtype=torch.int32), [0]), 1)  # [n]
        member = aten.eq.Tensor(aten.unsqueeze.default(last, 0), _positions(bags, 0, 2))
    if padding_idx is not None and padding_idx >= 0:
        member = aten.logical_and.default(member, aten.unsqueeze.default(aten.ne.Scalar(indices, padding_idx), 0))
    count = aten.sum.dim_IntList(to_copy(member, dtype=torch.int32), [1])  # [bags]
    if mode == 2:
        picked = aten.where.self(aten.unsqueeze.default(member, 2), aten.unsqueeze.default(rows, 0),
                                 aten.full.default([], float("-inf"), dtype=rows.dtype))
        out = aten.masked_fill.Scalar(aten.amax.default(picked, [1]),
                                      aten.unsqueeze.default(aten.eq.Scalar(count, 0), 1), 0.0)
    else:
        weights = aten.where.ScalarOther(member, aten.full_like.default(member, 1, dtype=rows.dtype), 0.0)
        if per_sample_weights is not None:
            weights = aten.mul.Tensor(weights, aten.unsqueeze.default(per_sample_weights, 0))
        out = aten.mm.default(weights, rows)
        if mode == 1:
            out = aten.div.Tensor(out, aten.unsqueeze.default(aten.clamp.default(
                aten._to_copy.default(count, dtype=rows.dtype), 1.0), 1))
    size = aten._to_copy.default(count, dtype=torch.int64)
    placeholder = aten._to_copy.default(aten.mul.Scalar(count, 0), dtype=torch.int64)
    return out, placeholder, size, placeholder


def _to_common_dtype(a, b):
    """a and b cast to torch's promoted dtype of the two (the one already in it left as it is);
    NotApplicable where their dtypes are equal (the node's reason stays its own)."""
    import torch

    if a.dtype == b.dtype:
        raise NotApplicable("no dtypes to promote")
    common = torch.result_type(a, b)
    return tuple(t if t.dtype == common else torch.ops.aten._to_copy.default(t, dtype=common) for t in (a, b))


def _promoted(name: str, overload: str = "Tensor"):
    """A binary op of tensors of different dtypes (`weights * (ids == e)`, float times bool) as
    torch computes it: each tensor cast to the promoted dtype first (a bool or int32 to float is
    exact), then the op on equal dtypes. Consulted only for a node that cannot run whole (the
    kernels take one dtype); equal dtypes are not this (the node's reason stays its own)."""

    def decomposition(self, other, *args, **kwargs):
        import torch

        if not (isinstance(self, torch.Tensor) and isinstance(other, torch.Tensor)):
            raise NotApplicable("no dtypes to promote")
        return getattr(getattr(torch.ops.aten, name), overload)(*_to_common_dtype(self, other), *args, **kwargs)

    decomposition.__name__ = f"promoted_{name}"
    return decomposition


PROMOTED_BINARY = ("add", "sub", "mul", "div", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge")


def promoted_where(condition, self, other):
    """torch.where of values of two dtypes (heaviside's decomposition: where(x == 0, values,
    where(x < 0, 0, 1)), a float and an int64) with both cast to the promoted dtype first."""
    import torch

    return torch.ops.aten.where.self(condition, *_to_common_dtype(self, other))


def _lead_broadcast(target: str, inner=None):
    """An elementwise op of rank > 4 whose operand broadcasts inside WHCN's N (the dims but the last
    3, which the kernels fold into one: a [1, 3, 1, 1, 6] scale of a [2, 3, 4, 5, 6] video tensor)
    with that operand's leading dims expanded first (one expand dispatch), then the op itself,
    which broadcasts the rest. Other arguments go to `inner` (the dtype promotion), if any."""
    import torch

    ns, name, overload = target.split(".")
    op = getattr(getattr(getattr(torch.ops, ns), name), overload)

    def decomposition(*args, **kwargs):
        aten = torch.ops.aten
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        shape = tuple(torch.broadcast_shapes(*(t.shape for t in tensors))) if tensors else ()
        folded = len(shape) - 3
        widened, changed = [], False
        for a in args:
            if isinstance(a, torch.Tensor) and folded >= 2:
                padded = (1,) * (len(shape) - a.dim()) + tuple(a.shape)
                if padded[:folded] != shape[:folded] and any(d != 1 for d in padded[:folded]):
                    lead = list(shape[:folded] + padded[folded:])
                    a = aten.expand.default(aten.reshape.default(a, list(padded)), lead)
                    changed = True
            widened.append(a)
        if changed:
            return op(*widened, **kwargs)
        if inner is not None:
            return inner(*args, **kwargs)
        raise NotApplicable("no operand broadcasts inside WHCN's N")

    decomposition.__name__ = f"lead_broadcast_{name}"
    return decomposition


OWN_DECOMPOSITIONS = {
    "aten.div.Tensor_mode": div_rounded,
    "aten.div.Scalar_mode": div_rounded,
    "aten.floor_divide.default": floor_divide,
    "aten.floor_divide.Scalar": floor_divide,
    "aten.cumsum.default": cumsum,
    "aten.pow.Scalar": pow_scalar,
    "aten.round.decimals": round_decimals,
    "aten.logaddexp.default": logaddexp,
    "aten.logaddexp2.default": logaddexp2,
    "aten.fmax.default": _nan_ignoring(largest=True),
    "aten.fmin.default": _nan_ignoring(largest=False),
    "aten.bilinear.default": bilinear,
    "aten.aminmax.default": aminmax,
    "aten.cummax.default": cummax,
    "aten.cummin.default": cummin,
    "aten._safe_softmax.default": safe_softmax,
    "aten.argmax.default": argmax,
    "aten.argmin.default": argmin,
    "aten.max.dim": max_dim,
    "aten.min.dim": min_dim,
    "aten.any.default": any_,
    "aten.any.dim": any_,
    "aten.any.dims": any_,
    "aten.bitwise_not.default": bitwise_not,
    "aten.clamp.Tensor": clamp_tensor,
    "aten.index.Tensor": index,
    "aten.gather.default": gather,
    **{f"aten.{n}.{'default' if n in ('maximum', 'minimum') else 'Tensor'}":
       _promoted(n, "default" if n in ("maximum", "minimum") else "Tensor") for n in PROMOTED_BINARY},
    **{f"aten.{n}.Scalar": _bool_compared(n) for n in ("eq", "ne", "lt", "le", "gt", "ge")},
    "aten.where.self": promoted_where,
    "aten.unfold.default": unfold,
    "aten._to_copy.default": to_copy,
    "aten.copy.default": copy,
    "aten.slice_scatter.default": slice_scatter,
    "aten.index_put.default": index_put,
    "aten.scatter_add.default": scatter_add,
    "aten.scatter.src": scatter_src,
    "aten.scatter.value": scatter_value,
    "aten.scatter_reduce.two": scatter_reduce,
    "aten.bucketize.Tensor": bucketize,
    **{f"aten.{op}.Scalar": _with_number(f"bitwise_{kind}")
       for op, kind in (("bitwise_and", "and"), ("bitwise_or", "or"), ("bitwise_xor", "xor"), ("__and__", "and"),
                        ("__or__", "or"), ("__xor__", "xor"))},
    "aten.__lshift__.Scalar": _with_number("bitwise_left_shift"),
    "aten.__rshift__.Scalar": _with_number("bitwise_right_shift"),
    "aten.bitwise_left_shift.Tensor_Scalar": _with_number("bitwise_left_shift"),
    "aten.bitwise_right_shift.Tensor_Scalar": _with_number("bitwise_right_shift"),
    "aten.diagonal.default": diagonal,
    "aten.cdist.default": cdist,
    "aten._cdist_forward.default": cdist_forward,
    "aten.col2im.default": col2im,
    "aten.searchsorted.Tensor": searchsorted,
    "aten.layer_norm.default": layer_norm_long,
    "aten.softmax.int": softmax_long,
    "aten._softmax.default": softmax_long,
    "aten.log_softmax.int": log_softmax_long,
    "aten._log_softmax.default": log_softmax_long,
    "aten.var.correction": var_long,
    "aten.std.correction": std_long,
    "aten.var_mean.correction": var_mean_long,
    "aten.group_norm.default": group_norm_by_rows,
    "aten.native_group_norm.default": native_group_norm_by_rows,
    "aten.linalg_vector_norm.default": vector_norm_long,
    "aten.std_mean.correction": std_mean,
    "aten.rrelu.default": rrelu,
    "aten.sum.dim_IntList": sum_dim,
    "aten.sum.default": sum_all,
    "aten.mean.dim": mean_dim,
    "aten.mean.default": mean_all,
    "aten.amax.default": amax_split,
    "aten.amin.default": amin_split,
    "aten.adaptive_avg_pool2d.default": adaptive_avg_pool2d,
    "aten._adaptive_avg_pool2d.default": adaptive_avg_pool2d,
    "aten.matmul.default": matmul_split_k,
    "aten.mm.default": matmul_split_k,
    "aten.bmm.default": matmul_split_k,
    "aten.conv_transpose2d.input": conv_transpose_split,
    "aten.conv_transpose1d.default": conv_transpose_split,
    "aten.topk.default": topk,
    "aten.sort.default": sort,
    "aten.sort.stable": sort_stable,
    "aten.kthvalue.default": kthvalue,
    "aten.embedding_bag.padding_idx": embedding_bag,
    "aten.embedding_bag.default": embedding_bag,
    "aten.conv3d.default": conv3d,
    "aten.conv3d.padding": conv3d_padding,
    "aten.conv_transpose3d.input": conv_transpose3d,
    "aten.convolution.default": convolution_3d,
    "aten.max_pool3d.default": max_pool3d,
    "aten.avg_pool3d.default": avg_pool3d,
    "aten.adaptive_avg_pool3d.default": adaptive_avg_pool3d,
    "aten.median.dim": median_dim,
    "aten.median.default": median_all,
    "aten.pad.default": pad,
    "aten.max.default": max_all,
    "aten.min.default": min_all,
    "aten.take_along_dim.default": take_along_dim,
    "aten.as_strided.default": as_strided,
    "aten.as_strided_copy.default": as_strided,
    "aten.instance_norm.default": instance_norm,
    "aten.repeat.default": repeat,
    "aten.split_with_sizes.default": split_with_sizes,
    "aten.split_with_sizes_copy.default": split_with_sizes,
    "aten.unbind.int": unbind,
    "aten.unbind_copy.int": unbind,
}


def stft_frames(self, n_fft, hop_length=None, win_length=None, window=None, normalized=False, onesided=None,
                return_complex=None, align_to_window=None):
    """torch.stft of a real signal as torch defines it: frames of n_fft every hop_length (unfold),
    times the window (ones where None; one shorter than n_fft centred by zeros), the DFT of each
    frame (rfft where onesided, as by default), scaled by n_fft^-1/2 where normalized, frequencies
    before frames. torch.stft's centring (a reflect or constant pad) comes before aten.stft and
    stays its own node. Applied to the whole program before lowering (importer.py), since the
    pieces are complex: the DFT runs as complex_pairs' real GEMM."""
    import torch

    hop = hop_length or n_fft // 4
    length = win_length or n_fft
    frames = self.unfold(-1, n_fft, hop)
    if window is None:
        window = torch.ones(length, dtype=self.dtype)
    if length < n_fft:
        left = (n_fft - length) // 2
        window = torch.nn.functional.pad(window, (left, n_fft - length - left))
    frames = frames * window
    spec = torch.fft.rfft(frames, dim=-1) if onesided is not False else torch.fft.fft(frames, dim=-1)
    if normalized:
        spec = spec * n_fft ** -0.5
    spec = spec.transpose(-1, -2)
    return spec if return_complex else torch.view_as_real(spec)


def stft_fits(node) -> bool:
    """Whether stft_frames takes this aten.stft node: a real float32 signal and window, not
    aligned to the window."""
    import torch

    def real(a):
        val = a.meta.get("val") if isinstance(a, torch.fx.Node) else None
        return val is None if a is None else (val is not None and val.dtype == torch.float32)

    args = dict(zip(("self", "n_fft", "hop_length", "win_length", "window", "normalized", "onesided",
                     "return_complex", "align_to_window"), node.args), **node.kwargs)
    return real(args["self"]) and real(args.get("window")) and not args.get("align_to_window")


# Ops that run whole on the device but faster as their decomposition here, on every device, with
# the reason the plan gives (lowering's `decompose_first`; the whole op stays where a piece cannot).
DECOMPOSE_FIRST = {
    target: "the input less each group's first element, statistics per row, then one scale and shift "
            "per channel: the group_norm kernel recomputes its group's statistics for every row it writes"
    for target in ("aten.group_norm.default", "aten.native_group_norm.default")
}


# Whole-program decompositions (importer.py runs them through run_decompositions before lowering),
# each with the test of a node it takes: ops whose pieces are complex, which complex_pairs rewrites
# as a program, not node by node.
PROGRAM_DECOMPOSITIONS = {"aten.stft.default": (stft_fits, stft_frames)}


def _with_lead_broadcasts(table: dict) -> dict:
    """`table` with every target of a registry op that checks `broadcast_foldable` wrapped by
    _lead_broadcast (its own decomposition, if any, kept for the other cases)."""
    from texelflow.generated.ops import OPS

    out = dict(table)
    for entry in OPS.values():
        if any(c.rule == "broadcast_foldable" for c in entry.checks):
            for target in entry.targets:
                if target.startswith("aten."):
                    out[target] = _lead_broadcast(target, table.get(target))
    return out


OWN_DECOMPOSITIONS = _with_lead_broadcasts(OWN_DECOMPOSITIONS)
