"""texelflow's own decompositions: of ops torch leaves whole, or breaks into pieces no kernel runs.

`decompose.decomposition_of` consults OWN_DECOMPOSITIONS (by target name) before torch's tables.
Shapes: torch decomposes `split_with_sizes` (which `split` and `chunk` become) into `as_strided`
views, which no Vulkan kernel computes, and `unbind` into a slice and a squeeze per output (two
copies where a texture's squeeze moves texels). Here each output is one `slice` or one `select`
node, so a split runs as one dispatch per piece and each piece gets its own planned
representation. `repeat` (and `tile`, which torch decomposes to it) becomes one expand and a view.
Norms: `instance_norm` as a group norm, or elementwise with running statistics.
Ops torch keeps whole: `any` (and so `all`, which torch decomposes through it) as a max of truth
values; `bitwise_not`; `clamp` with tensor bounds; `index` with one index tensor, as index_select;
`argmax`, `argmin`, `max.dim` and `min.dim` as a max (min), the positions of its hits and the
least of them, in int32, widened by a cast the device holds narrowed. `_safe_softmax` (in torch's
attention decomposition) as a softmax and a where on the row max. `cumsum` with a dtype as a cast
and a cumsum; `number ** tensor` as a tensor pow.
"""

from __future__ import annotations


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


def index(self, indices):
    """self[..., idx, ...] with one integer index tensor (`x[idx]`, `x[:, idx]`, any shape of idx)
    as index_select of the flattened index, reshaped: the index's dims replace the indexed dim.
    A negative entry counts from the end, as in x[idx]: torch's index_select refuses one, but the
    pieces of a decomposition run on the device or not at all, and the kernel takes it (its
    template says so). Several index tensors, or a bool mask, are not this (the node stays whole)."""
    import torch

    aten = torch.ops.aten
    tensors = [(k, t) for k, t in enumerate(indices) if t is not None]
    if len(tensors) != 1 or tensors[0][1].dtype == torch.bool:
        raise NotImplementedError("index with several index tensors or a mask")
    k, idx = tensors[0]
    flat = idx if idx.dim() == 1 else aten.reshape.default(idx, [-1])
    out = aten.index_select.default(self, k, flat)
    if idx.dim() == 1:
        return out
    return aten.reshape.default(out, list(self.shape[:k]) + list(idx.shape) + list(self.shape[k + 1:]))


def _arg_extreme(self, dim, keepdim: bool, largest: bool):
    """(extreme values, int64 indices) of self along `dim` (None: the flattened tensor), as torch:
    the first index of the max (min), NaN counting as the extreme. The indices are found on the
    device in int32 (the position of each hit, the rest pushed past the end, the least taken) and
    widened by one int32 -> int64 cast, which the device holds narrowed (narrowing.py)."""
    import torch

    aten = torch.ops.aten
    x = aten.reshape.default(self, [-1]) if dim is None else self
    d = 0 if dim is None else dim % max(x.dim(), 1)
    n = x.shape[d] if x.dim() else 1
    extreme = (aten.amax if largest else aten.amin).default(x, [d] if x.dim() else [], True)
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
    the input cast to it, then a cumsum that keeps its dtype. torch's kernel adds in that dtype too."""
    import torch

    if dtype is None or dtype == self.dtype or dtype not in (torch.float32, torch.float16):
        raise ValueError("only a cast to a float dtype the device sums in helps")  # (the trace fails: no pieces)
    return torch.ops.aten.cumsum.default(torch.ops.aten._to_copy.default(self, dtype=dtype), dim)


def pow_scalar(self, exponent):
    """number ** tensor (`10000 ** (2 * i / d)` of sinusoidal position encodings) as the tensor
    pow of a one-element constant: torch computes pow(self, exponent) per element either way."""
    import torch

    aten = torch.ops.aten
    base = aten.full.default([], self, dtype=exponent.dtype, device=exponent.device)
    return aten.pow.Tensor_Tensor(base, exponent)


OWN_DECOMPOSITIONS = {
    "aten.cumsum.default": cumsum,
    "aten.pow.Scalar": pow_scalar,
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
    "aten.instance_norm.default": instance_norm,
    "aten.repeat.default": repeat,
    "aten.split_with_sizes.default": split_with_sizes,
    "aten.split_with_sizes_copy.default": split_with_sizes,
    "aten.unbind.int": unbind,
    "aten.unbind_copy.int": unbind,
}
