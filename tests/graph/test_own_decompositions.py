"""texelflow's own decompositions (shapes, any, bitwise_not, arg extremes) equal torch's ops and lower to registry
ops only."""

from __future__ import annotations

import pytest
import torch

from texelflow.generated.ops import op_for_target
from texelflow.runtime.graph.own_decompositions import (OWN_DECOMPOSITIONS, any_, argmax, argmin, bitwise_not,
                                                        clamp_tensor, index, max_dim, min_dim, repeat,
                                                        split_with_sizes, unbind)


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
    for refused in ([i, i[:1]], [x > 0]):  # several index tensors, a mask: the node stays whole
        with pytest.raises(NotImplementedError):
            index(x, refused)


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
             lambda t: index(t, [None, torch.tensor([[2, 0], [1, 1]])])]
    ignored = {"aten.arange.start_step", "aten.scalar_tensor.default"}  # constants, folded at lowering
    for call in calls:
        gm = make_fx(call)(x)
        targets = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"} - ignored
        assert targets and all(op_for_target(t) is not None for t in targets), targets
    assert set(OWN_DECOMPOSITIONS) >= {"aten.split_with_sizes.default", "aten.unbind.int", "aten.repeat.default"}
