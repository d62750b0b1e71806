"""texelflow's own decompositions (shapes, any, bitwise_not, arg extremes) equal torch's ops and lower to registry
ops only."""

from __future__ import annotations

import pytest
import torch

from texelflow.generated.ops import op_for_target
from texelflow.runtime.graph.own_decompositions import (OWN_DECOMPOSITIONS, any_, argmax, argmin, bitwise_not,
                                                        clamp_tensor, copy, gather, index, index_put, layer_norm,
                                                        max_all, max_dim, min_all, min_dim, pad, repeat, rrelu,
                                                        scatter_add, scatter_src, scatter_value, slice_scatter, sort,
                                                        split_with_sizes, std_mean, take_along_dim, topk, unbind,
                                                        unfold)


@pytest.mark.parametrize("shape, repeats", [
    ((2, 3, 5, 7), (1, 2, 1, 1)), ((2, 3, 5, 7), (2, 1, 3, 1, 2)), ((3,), (2, 2, 2)), ((2, 1, 3), (1, 4, 1)),
    ((2, 3), (1, 1)), ((1,), (5,)), ((2, 3), (2, 1, 1, 3)), ((2, 3, 4), (1, 1, 2)),
])
def test_repeat(shape, repeats):
    x = torch.randn(*shape)
    assert torch.equal(repeat(x, list(repeats)), x.repeat(*repeats))


@pytest.mark.parametrize("shape, sizes, dim", [((2, 3, 5), [1, 2], 1), ((7,), [3, 4], 0), ((2, 5, 7), [2, 2, 3], -1)])
def test_split_with_sizes(shape, sizes, dim):
    x = torch.randn(*shape)
    for got, want in zip(split_with_sizes(x, sizes, dim), x.split_with_sizes(sizes, dim), strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize("shape, dim", [((3, 2, 5), 0), ((2, 3, 1, 2, 5), 2), ((4,), -1)])
def test_unbind(shape, dim):
    x = torch.randn(*shape)
    for got, want in zip(unbind(x, dim), x.unbind(dim), strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize("dim, keepdim", [(None, False), (-1, False), (1, True), ([0, 2], False), ([], False),
                                          ([2, 0, 1], True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.bool])
def test_any(dim, keepdim, dtype):
    x = torch.tensor([[[float("nan"), 0, 0], [0, -0.0, 0]], [[1.5, float("-inf"), 2], [0, 3, 0]], [[0, 0, 0], [0, 0, 0]]])
    x = x.nan_to_num(7.0).to(dtype) if dtype != torch.float32 else x
    want = x.any() if dim is None and not keepdim else x.any(dim=dim, keepdim=keepdim)
    got = any_(x, dim, keepdim)
    assert got.dtype == torch.bool and torch.equal(got, want)


def test_bitwise_not():
    i = torch.tensor([-2**31, 2**31 - 1, 0, -1, 7], dtype=torch.int32)
    assert torch.equal(bitwise_not(i), ~i) and bitwise_not(i).dtype == torch.int32
    b = torch.tensor([True, False])
    assert torch.equal(bitwise_not(b), ~b)


def test_clamp_tensor():
    nan = float("nan")
    x = torch.tensor([[nan, 1.0, -2.0, 5.0], [0.5, -0.0, 3.0, nan]])
    lo, hi = torch.tensor([0.0, nan, -1.0, 0.0]), torch.tensor([[1.0], [2.0]])
    for kw in ({"min": lo}, {"max": hi}, {"min": lo, "max": hi}):
        torch.testing.assert_close(clamp_tensor(x, **kw), x.clamp(**kw), equal_nan=True, rtol=0, atol=0)


def test_index_with_one_index_tensor():
    x = torch.randn(5, 4, 6)
    # Non-negative here: torch's index_select refuses negative entries, which the device's kernel
    # counts from the end as x[idx] does (tests/reliability/test_more_ops.py runs those).
    i, j = torch.tensor([4, 1, 0, 2]), torch.tensor([[3, 1, 0], [2, 2, 1]])
    for indices in ([i], [None, j], [None, None, i], [None, None, j], [j]):
        torch.testing.assert_close(index(x, indices), torch.ops.aten.index.Tensor(x, indices), rtol=0, atol=0)
    with pytest.raises(NotImplementedError):  # a mask: a data-dependent shape, the node stays whole
        index(x, [x > 0])


def test_index_with_several_index_tensors():
    """Several index tensors: adjacent ones keep their place, separated ones lead; they broadcast
    together; negative entries count from the end (each wrapped before the linear index)."""
    x = torch.randn(5, 4, 6, 3)
    b, c = torch.tensor([4, -1, 0]), torch.tensor([[3], [-4]])  # broadcast to [2, 3]
    cases = ([b, torch.tensor([-1, 3, 0])], [None, c, torch.tensor([5, 0, -6])], [b, None, torch.tensor([1, 2, -1])],
             [None, c, None, torch.tensor([2, 0, -3])], [b, c % 4, torch.tensor([0, 5, 1])],
             [torch.tensor(2), None, torch.tensor([[1, 0]])], [b.int(), b.int() % 4])
    for indices in cases:
        torch.testing.assert_close(index(x, indices), torch.ops.aten.index.Tensor(x, indices), rtol=0, atol=0)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_gather_and_take_along_dim(dim):
    """gather with an index smaller than self on the other dims; take_along_dim broadcasting
    both ways, negative entries from the end, and flattened (no dim)."""
    x = torch.randn(4, 5, 6)
    g = torch.Generator().manual_seed(dim + 5)
    shape = [3, 4, 2]
    shape[dim] = 7
    idx = torch.randint(0, x.shape[dim], shape, generator=g)
    torch.testing.assert_close(gather(x, dim, idx), torch.gather(x, dim, idx), rtol=0, atol=0)
    lim = x.shape[dim]
    small = torch.randint(-lim, lim, [1 if k != dim % 3 else 3 for k in range(3)], generator=g)
    wide = small.expand([4, 5, 6][:dim % 3] + [3] + [4, 5, 6][dim % 3 + 1:]).contiguous()
    thin = x.narrow((dim + 1) % 3, 0, 1)  # broadcast against the index along another dim
    for t, i in ((x, small), (x, wide), (thin, wide), (thin, small)):
        torch.testing.assert_close(take_along_dim(t, i, dim), torch.take_along_dim(t, i, dim), rtol=0, atol=0)
    flat = torch.tensor([0, 3, 119, 7])  # flattened, torch refuses negative entries
    torch.testing.assert_close(take_along_dim(x, flat), torch.take_along_dim(x, flat), rtol=0, atol=0)


@pytest.mark.parametrize("dim, size, step", [(0, 2, 1), (1, 3, 2), (-1, 7, 1), (2, 1, 3), (-2, 5, 5)])
def test_unfold(dim, size, step):
    x = torch.randn(3, 5, 7)
    torch.testing.assert_close(unfold(x, dim, size, step), x.unfold(dim, size, step), rtol=0, atol=0)


@pytest.mark.parametrize("widths", [(1, 2, 3, 0), (0, 3, 2, 0), (5, 5, 1, 1), (2, 0, 0, 0, 1, 1)])
def test_circular_pad(widths):
    x = torch.randn(2, 3, 4, 5)
    torch.testing.assert_close(pad(x, widths, "circular"), torch.nn.functional.pad(x, widths, mode="circular"),
                               rtol=0, atol=0)
    if len(widths) <= 4 and max(widths) < 4:  # other modes: torch's composite, as before
        torch.testing.assert_close(pad(x, widths, "reflect"), torch.nn.functional.pad(x, widths, mode="reflect"),
                                   rtol=0, atol=0)


def test_max_min_of_a_whole_tensor():
    x = _ties_and_nans()
    for t in (x, x[1:, 2:, 1:], torch.tensor(3.5), torch.randint(-5, 5, (4, 3), dtype=torch.int32)):
        torch.testing.assert_close(max_all(t), t.max(), equal_nan=True, rtol=0, atol=0)
        torch.testing.assert_close(min_all(t), t.min(), equal_nan=True, rtol=0, atol=0)


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("dim, k", [(-1, 1), (-1, 3), (1, 5), (0, 3), (2, 7)])
def test_topk(largest, dim, k):
    """Values as torch's, NaN counting as the largest; indices as torch's where no values tie,
    and among ties the earliest first (torch leaves that order unspecified)."""
    x = _ties_and_nans()
    v, i = topk(x, k, dim, largest)
    wv, wi = torch.topk(x, k, dim, largest)
    torch.testing.assert_close(v, wv, equal_nan=True, rtol=0, atol=0)
    assert i.dtype == torch.int64
    torch.testing.assert_close(x.gather(dim, i), wv, equal_nan=True, rtol=0, atol=0)
    distinct = torch.randperm(3 * 5 * 7, generator=torch.Generator().manual_seed(k)).reshape(3, 5, 7).float()
    assert torch.equal(topk(distinct, k, dim, largest)[1], torch.topk(distinct, k, dim, largest)[1])
    ints = torch.randint(-4, 4, (3, 5, 7), dtype=torch.int32)
    assert torch.equal(topk(ints, k, dim, largest)[0], torch.topk(ints, k, dim, largest)[0])
    tied = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0]])
    assert topk(tied, 3, -1, largest)[1].tolist() == ([[1, 2, 4]] if largest else [[3, 0, 1]])


def test_topk_of_rank_five_merges_the_other_dims():
    x = torch.randn(2, 3, 4, 5, 6)
    for dim in (0, 2, -1):
        v, i = topk(x, 2, dim)
        wv, wi = torch.topk(x, 2, dim)
        assert torch.equal(v, wv) and torch.equal(i, wi)


def test_topk_of_many_stays_whole():
    with pytest.raises(NotImplementedError):
        topk(torch.arange(40, dtype=torch.int32).reshape(2, 20), 17)  # (float32 lines sort: bitonic)


def test_layer_norm_over_several_dims_std_mean_and_rrelu():
    x = torch.randn(2, 3, 4, 5)
    w, b = torch.randn(4, 5), torch.randn(4, 5)
    for shape, weight, bias in (([4, 5], w, b), ([3, 4, 5], None, None), ([4, 5], w, None)):
        want = torch.nn.functional.layer_norm(x, shape, weight if weight is None else weight.expand(shape),
                                              bias if bias is None else bias.expand(shape))
        got = layer_norm(x, shape, weight if weight is None else weight.expand(shape),
                         bias if bias is None else bias.expand(shape))
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for dim, correction in ((None, None), ([1, 2], 0), (3, 1)):
        got, want = std_mean(x, dim, correction=correction), torch.std_mean(x, dim, correction=correction)
        torch.testing.assert_close(got[0], want[0])
        torch.testing.assert_close(got[1], want[1])
    torch.testing.assert_close(rrelu(x, 0.1, 0.3), torch.nn.functional.rrelu(x, 0.1, 0.3, training=False))


def test_copy_slice_scatter_and_index_put():
    x, src = torch.randn(4, 6, 3), torch.randn(4, 2, 3)
    aten = torch.ops.aten
    torch.testing.assert_close(copy(x, src[:, :1]), aten.copy.default(x, src[:, :1]), rtol=0, atol=0)
    torch.testing.assert_close(copy(x, torch.ones(6, 3, dtype=torch.int32)),
                               aten.copy.default(x, torch.ones(6, 3, dtype=torch.int32)), rtol=0, atol=0)
    for start, end in ((0, 2), (2, 4), (4, 6), (-2, None)):
        want = aten.slice_scatter.default(x, src, 1, start, end)
        torch.testing.assert_close(slice_scatter(x, src, 1, start, end), want, rtol=0, atol=0)
    with pytest.raises(NotImplementedError):
        slice_scatter(x, src, 1, 0, 4, 2)
    mask, one = x > 0, torch.tensor(2.5)
    for acc in (False, True):
        torch.testing.assert_close(index_put(x, [mask], one, acc), aten.index_put.default(x, [mask], one, acc))
        rows = torch.tensor([1, -1])
        want = aten.index_put.default(x, [None, rows], src, acc)
        torch.testing.assert_close(index_put(x, [None, rows], src, acc), want)
        two = torch.randn(2, 6, 3)
        torch.testing.assert_close(index_put(x, [rows], two, acc), aten.index_put.default(x, [rows], two, acc))
        torch.testing.assert_close(index_put(x, [None, None, torch.tensor([2])], one, acc),
                                   aten.index_put.default(x, [None, None, torch.tensor([2])], one, acc))
    dup, three = torch.tensor([0, 3, 0]), torch.randn(3, 6, 3)
    torch.testing.assert_close(index_put(x, [dup], three, True), aten.index_put.default(x, [dup], three, True))


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_scatter_add_and_scatter(dim):
    """Against torch: index entries more or fewer than the positions, src larger than index (cut),
    a number; scatter's sources with positions named once (torch leaves duplicates unspecified)."""
    g = torch.Generator().manual_seed(3 + dim)
    x = torch.randn(3, 6, 4, generator=g)
    for count in (2, 9):
        shape = list(x.shape)
        shape[dim] = count
        idx = torch.randint(0, x.shape[dim], shape, generator=g)
        src = torch.randn([n + 1 for n in shape], generator=g)
        cut = src[tuple(slice(0, n) for n in shape)]
        torch.testing.assert_close(scatter_add(x, dim, idx, src), torch.scatter_add(x, dim, idx, cut))
        torch.testing.assert_close(scatter_value(x, dim, idx, -2.5), torch.scatter(x, dim, idx, -2.5), rtol=0, atol=0)
    rows = torch.stack([torch.randperm(6, generator=g)[:4] for _ in range(3)])  # along dim 1, each once
    y, src = torch.randn(3, 6, generator=g), torch.randn(3, 5, generator=g)
    torch.testing.assert_close(scatter_src(y, 1, rows, src), torch.scatter(y, 1, rows, src[:, :4]), rtol=0, atol=0)
    with pytest.raises(NotImplementedError):  # an index narrower than self off its dim
        scatter_add(x, 0, torch.zeros(2, 5, 4, dtype=torch.int64), x)


@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_sort_by_ranks_is_torchs_stable_sort(dim, descending):
    """Values and indices as torch.sort(stable=True): NaN the largest, equal values (ties and
    NaNs) in their order; integers too; argsort follows (torch decomposes it to sort)."""
    x = _ties_and_nans()
    got, want = sort(x, dim, descending), torch.sort(x, dim=dim, descending=descending, stable=True)
    torch.testing.assert_close(got[0], want[0], equal_nan=True, rtol=0, atol=0)
    assert got[1].dtype == torch.int64 and torch.equal(got[1], want[1])
    ints = torch.randint(-3, 3, (4, 5, 6), dtype=torch.int32)
    got, want = sort(ints, dim, descending), torch.sort(ints, dim=dim, descending=descending, stable=True)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_sort_of_long_lines_stays_whole():
    with pytest.raises(NotImplementedError):
        sort(torch.arange(8 * 2048, dtype=torch.int32).reshape(8, 2048), -1)  # (float32 lines sort: bitonic)


def _ties_and_nans():
    x = torch.randn(3, 5, 7)
    x[0, 1, 2] = x[0, 1, 5] = float("nan")  # the first NaN is the extreme, for max and min
    x[1, 2, :3] = 5.0  # ties: the first index wins
    x[2] = -1.0
    return x


@pytest.mark.parametrize("dim, keepdim", [(None, False), (None, True), (0, False), (1, True), (-1, False), (2, True)])
def test_argmax_argmin(dim, keepdim):
    x = _ties_and_nans()
    for ours, theirs in ((argmax, torch.argmax), (argmin, torch.argmin)):
        want = theirs(x, dim, keepdim) if dim is not None else theirs(x, keepdim=keepdim)
        got = ours(x, dim, keepdim)
        assert got.dtype == torch.int64 and torch.equal(got, want), (ours.__name__, got, want)
    i = torch.randint(-3, 3, (4, 6), dtype=torch.int32)
    assert torch.equal(argmax(i, 1), torch.argmax(i, 1)) and torch.equal(argmin(i), torch.argmin(i))
    s = torch.tensor(2.0)
    assert torch.equal(argmax(s), torch.argmax(s)) and torch.equal(argmin(s, 0, True), torch.argmin(s, 0, True))


@pytest.mark.parametrize("dim, keepdim", [(0, False), (1, True), (-1, False)])
def test_max_min_dim(dim, keepdim):
    x = _ties_and_nans()
    for ours, theirs in ((max_dim, torch.max), (min_dim, torch.min)):
        (v, i), (wv, wi) = ours(x, dim, keepdim), theirs(x, dim, keepdim)
        torch.testing.assert_close(v, wv, equal_nan=True, rtol=0, atol=0)
        assert torch.equal(i, wi) and i.dtype == torch.int64


def test_pieces_are_registry_ops():
    """Each decomposition, traced, calls only ops the registry implements (or views of them)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    x = torch.randn(2, 3, 5, 7)
    calls = [lambda t: repeat(t, [2, 1, 3, 1]), lambda t: split_with_sizes(t, [1, 2], 1), lambda t: unbind(t, 1),
             lambda t: any_(t, [1, 2], True), lambda t: bitwise_not(t > 0), lambda t: bitwise_not(t.int()),
             lambda t: max_dim(t, 1, False), lambda t: clamp_tensor(t, t[:1], t[:, :, :1]),
             lambda t: index(t, [None, torch.tensor([[2, 0], [1, 1]])]),
             lambda t: index(t, [torch.tensor([1, 0]), None, torch.tensor([[-1], [4]])]),
             lambda t: gather(t, 2, torch.tensor([[[[1, 0]]]]).expand(2, 3, 2, 2)),
             lambda t: take_along_dim(t, torch.tensor([[[[-1]]]]), 3), lambda t: unfold(t, 2, 2, 1),
             lambda t: pad(t, [1, 2, 0, 3], "circular"), lambda t: max_all(t), lambda t: topk(t, 2, 1),
             lambda t: topk(t, 2, -1, False)]
    ignored = {"aten.arange.start_step", "aten.scalar_tensor.default",  # constants, folded at lowering
               "<built-in function getitem>"}  # the results of a node of several (sort_lines), read in lowering
    for call in calls:
        gm = make_fx(call)(x)
        targets = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"} - ignored
        assert targets and all(op_for_target(t) is not None for t in targets), targets
    assert set(OWN_DECOMPOSITIONS) >= {"aten.split_with_sizes.default", "aten.unbind.int", "aten.repeat.default"}
