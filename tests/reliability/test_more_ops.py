"""Common ops of third-party models that used to fall back to the CPU, now run whole on Vulkan.

Each model is exported and planned through the public API: the plan must have no fallback, and
the compiled program must give torch's result, NaN, +-inf and the sign of zero included where the
op defines them. The kernel test (tests/kernels/test_registry_ops.py) runs each op alone in every
representation; here the exported targets (var.dim, std.dim, F.normalize's linalg_vector_norm,
...) are checked to reach those kernels, and the arguments they cannot take to fall back with a
reason.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import texelflow

from .models import Call

INF, NAN = float("inf"), float("nan")
# Specials, signed zeros, exact halves (round's ties) and ordinary values: 35 elements.
SPECIAL = torch.tensor([NAN, INF, -INF, 0.0, -0.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 0.3, -0.3, 7.0, -1.0,
                        3.25, -3.75, 0.999, -1e-3, 1e-30, 1e30, -1e30, 2.0, 4.5, -4.5, 0.75, -0.25, 6.5,
                        -7.5, 100.0, 1e-6, -5.0, 0.1, 9.0, 1.0])


def _special(shape=(5, 7)):
    return SPECIAL[:torch.Size(shape).numel()].reshape(shape).clone()


def _random(*shape, seed=0, low=-3.0, high=3.0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(*shape, generator=g) * (high - low) + low


def _run(device, fn, *inputs):
    """fn compiled whole (no fallback) and run on the device; returns (got, torch's)."""
    model = Call(fn)
    with torch.no_grad():
        want = model(*inputs)
        prog = texelflow.compile(model, inputs, device=device)
    try:
        assert prog.plan.fallbacks == [], prog.plan.fallbacks
        got = prog(*inputs)
    finally:
        prog.close()
    return got, want


def _same_bits(got, want):
    """Equal, NaN where torch has NaN and with torch's sign of every zero."""
    torch.testing.assert_close(got, want, equal_nan=True, rtol=0, atol=0)
    assert torch.equal(torch.signbit(got), torch.signbit(want)), (got, want)


# ---- unary ops: exact ones (rounding, sign, selects) bit for bit, the others to a tolerance ---------
EXACT_UNARY = {
    "floor": torch.floor,
    "ceil": torch.ceil,
    "round": torch.round,
    "trunc": torch.trunc,
    "sign": torch.sign,
    "hardshrink": F.hardshrink,
    "hardshrink_1": lambda x: F.hardshrink(x, 1.5),
    "softshrink": F.softshrink,
    "softshrink_2": lambda x: F.softshrink(x, 2.0),
    "nan_to_num": torch.nan_to_num,
    "nan_to_num_args": lambda x: torch.nan_to_num(x, nan=-9.0, posinf=5.0, neginf=-6.0),
    "nan_to_num_posinf": lambda x: torch.nan_to_num(x, posinf=1.0),
}
APPROX_UNARY = {
    "log": torch.log,
    "log2": torch.log2,
    "log10": torch.log10,
    "sin": torch.sin,
    "cos": torch.cos,
    "square": torch.square,
}
BOOL_UNARY = {"isnan": torch.isnan, "isinf": torch.isinf, "isfinite": torch.isfinite}


@pytest.mark.parametrize("name", sorted(EXACT_UNARY))
def test_exact_unary_op_matches_torch_bit_for_bit(device, name):
    got, want = _run(device, EXACT_UNARY[name], _special((5, 7)))
    _same_bits(got, want)


@pytest.mark.parametrize("name", sorted(APPROX_UNARY))
def test_unary_op_matches_torch(device, name):
    x = torch.cat([_special((5, 7)).reshape(-1), _random(2 * 3 * 5 * 7 - 35, low=-0.5, high=9.0)]).reshape(2, 3, 5, 7)
    got, want = _run(device, APPROX_UNARY[name], x)
    torch.testing.assert_close(got, want, equal_nan=True, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(BOOL_UNARY))
def test_classification_gives_bool(device, name):
    got, want = _run(device, BOOL_UNARY[name], _special((5, 7)))
    assert got.dtype == torch.bool
    assert torch.equal(got, want)


def test_isfinite_feeds_a_where(device):
    """A bool output is a condition downstream (masking non-finite values), all on Vulkan."""
    got, want = _run(device, lambda x: torch.where(torch.isfinite(x), x, torch.zeros_like(x)), _special((7, 5)))
    _same_bits(got, want)


# ---- reductions ---------------------------------------------------------------------------------------
class Stats(torch.nn.Module):
    """var / std / var_mean in the forms models write (.dim overloads, correction=, all dims)."""

    def forward(self, x):
        return (x.var(1), x.std(1, unbiased=False), torch.var(x, dim=(2, 3), keepdim=True, correction=0),
                torch.std(x), x.var(dim=-1, keepdim=True), torch.std(x, dim=[0, 2], correction=2),
                *torch.var_mean(x, dim=(2, 3), keepdim=True), *torch.var_mean(x, 1, unbiased=False))


class Norms(torch.nn.Module):
    """F.normalize and the vector norms models use: 2 (default), 1, inf, -inf, 3, over dims."""

    def forward(self, x):
        return (F.normalize(x, dim=1), F.normalize(x, p=1.0, dim=-1), x.norm(dim=-1),
                torch.linalg.vector_norm(x, ord=1, dim=(1, 2)), torch.linalg.vector_norm(x, ord=INF, dim=0),
                torch.linalg.vector_norm(x, ord=-INF, dim=(2, 3), keepdim=True),
                torch.linalg.vector_norm(x, ord=3, dim=1), torch.linalg.vector_norm(x))


class LogSumExp(torch.nn.Module):
    def forward(self, x):
        return torch.logsumexp(x, dim=1), torch.logsumexp(x, dim=(-1, -2), keepdim=True), torch.logsumexp(x, 0)


@pytest.mark.parametrize("model,shape,low,high", [
    (Stats(), (2, 3, 5, 7), -2.0, 4.0),
    (Stats(), (2, 6, 1, 5), -2.0, 4.0),
    (Norms(), (2, 3, 5, 7), -3.0, 3.0),
    (Norms(), (1, 5, 3, 3), -3.0, 3.0),
    (LogSumExp(), (2, 3, 5, 7), -100.0, 100.0),
    (LogSumExp(), (2, 7, 3, 1), -3.0, 3.0),
], ids=["stats", "stats-size1", "norms", "norms-batch1", "logsumexp-wide", "logsumexp"])
@pytest.mark.filterwarnings("ignore:std\\(\\). degrees of freedom")  # stats-size1: correction 2 of N = 2, +inf
def test_reduction_model_runs_whole(device, model, shape, low, high):
    got, want = _run(device, model, _random(*shape, seed=1, low=low, high=high))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, equal_nan=True, rtol=1e-4, atol=1e-5)


def test_reductions_spread_nan_and_inf_as_torch(device):
    """A NaN or an infinity in a row: var NaN, norms inf / NaN, logsumexp +inf, all -inf rows."""
    x = _random(3, 4, 5, seed=2)
    x[0, 1, 2] = NAN
    x[1, 2, 3] = INF
    x[2, 3, :] = -INF
    fn = lambda t: (t.var(-1), t.std(-1), *torch.var_mean(t, -1), t.norm(dim=-1), torch.linalg.vector_norm(t, INF, -1),
                    torch.logsumexp(t, -1), F.normalize(t, dim=-1))
    got, want = _run(device, fn, x)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, equal_nan=True, rtol=1e-4, atol=1e-5)


def test_var_without_degrees_of_freedom_is_nan_or_inf(device):
    """N - correction <= 0: 0 / 0 = NaN for N = 1, sum / 0 = +inf for N = 2 and correction 2."""
    x = _random(2, 3, 4, seed=3)
    fn = lambda t: (t[:1].var(0), torch.var(t, 0, correction=2), torch.std(t[:1], 0))
    with pytest.warns(UserWarning):
        got, want = _run(device, fn, x)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, equal_nan=True, rtol=1e-5, atol=1e-6)


# ---- arguments the kernels cannot take: a fallback with the reason --------------------------------------
@pytest.mark.parametrize("fn,reason", [
    (lambda x: torch.special.erfcx(x), "aten.special_erfcx.default"),
    (lambda x: torch.linalg.vector_norm(x, dim=1, dtype=torch.float64), "dtype float64"),
    (lambda x: torch.i0(x), "aten.i0.default"),
], ids=["erfcx", "norm-dtype", "i0"])
def test_unsupported_forms_fall_back_with_a_reason(fn, reason):
    plan = texelflow.plan(Call(fn), (_random(2, 3, 5, 7),))
    assert plan.fallbacks, "expected a CPU fallback"
    assert all(isinstance(why, str) and why and "\n" not in why for _, why in plan.fallbacks), plan.fallbacks
    assert any(reason in why for _, why in plan.fallbacks), plan.fallbacks


@pytest.mark.parametrize("fn", [torch.sin, torch.cos], ids=["sin", "cos"])
def test_sin_cos_of_huge_arguments(device, fn):
    """Beyond ~1e7 the built-ins' range reduction fails on lavapipe; the exact one keeps torch's
    values up to float32's largest."""
    g = torch.Generator().manual_seed(4)
    x = torch.sign(torch.rand(7, 5, generator=g) - 0.5) * 10.0 ** (torch.rand(7, 5, generator=g) * 38.5)
    x[0, 0] = torch.finfo(torch.float32).max
    x[0, 1] = 8388608.0  # 2^23, the first argument reduced exactly
    got, want = _run(device, fn, x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_clamp_with_tensor_bounds(device):
    """x.clamp(min=tensor, max=tensor), bounds broadcasting, a NaN in x or in a bound kept."""
    x = _special((5, 7))
    lo = _random(1, 7, seed=1, low=-2.0, high=0.0)
    lo[0, 3] = NAN
    hi = _random(5, 1, seed=2, low=0.0, high=3.0)
    for fn in (lambda a, b, c: a.clamp(min=b, max=c), lambda a, b, c: torch.clamp(a, min=b),
               lambda a, b, c: torch.clamp(a, max=c)):
        _same_bits(*_run(device, fn, x, lo, hi))


def test_indexing_with_one_index_tensor_runs_on_the_device(device):
    """x[idx], x[:, idx], x[..., idx2d] and index_select, the index a user's int64 tensor (held
    narrowed), negative entries counting from the end as in torch; NaN and Inf moved bit for bit."""
    x = _special((5, 7)).reshape(5, 7, 1).expand(5, 7, 3).contiguous()
    i, j = torch.tensor([4, -1, 0, 2, 2]), torch.tensor([[6, -7], [0, 3]])

    def fn(a, b, c):
        return a[b], a[:, c], a[..., b[2:4]], torch.index_select(a, 1, c.reshape(-1).flip(0)[:2])

    got, want = _run(device, fn, x, i, j)
    for g, w in zip(got, want, strict=True):
        _same_bits(g, w)


def test_indexing_with_several_index_tensors_runs_on_the_device(device):
    """x[rows, cols] (CLIP's pooling `x[torch.arange(B), ids.argmax(-1)]`), separated index
    tensors (their dims lead), broadcasting and negative entries: one gather of a linear index
    computed in int32 on the device, the int64 inputs and argmax held narrowed; NaN and Inf moved
    bit for bit."""
    x = _special((5, 7)).reshape(5, 7, 1).expand(5, 7, 3).contiguous()
    ids = torch.tensor([[3, 9, 1, 0, 2, 7, 9], [5, 5, 2, 8, 0, 1, 4], [0, 0, 0, 0, 0, 0, 6],
                        [1, 2, 3, 4, 5, 6, 7], [9, 1, 1, 1, 1, 1, 1]])
    rows, cols = torch.tensor([[4], [-1], [0]]), torch.tensor([6, -7, 2, 2])  # broadcast to [3, 4]

    def fn(a, t, r, c):
        pooled = a[torch.arange(a.shape[0]), t.argmax(dim=-1)]
        return (pooled, a[r, c], a[r, :, torch.tensor([0, 2, -1, 1])], a[:, c, torch.tensor([[2], [-1]])],
                a[:, t.argmax(-1), torch.tensor([0, 1, 2, 0, -1])])

    got, want = _run(device, fn, x, ids, rows, cols)
    for g, w in zip(got, want, strict=True):
        _same_bits(g, w)


def test_gather_and_take_along_dim_run_on_the_device(device):
    """torch.gather (an index smaller than self on the other dims), take_along_dim broadcasting
    and counting negative entries from the end, and a top-1 pick `x.gather(-1, x.argmax(-1,
    keepdim=True))`: one gather of a linear index on the device; NaN and Inf moved bit for bit."""
    x = _special((5, 7)).reshape(5, 7, 1).expand(5, 7, 3).contiguous()
    g = torch.Generator().manual_seed(4)
    idx = torch.randint(0, 7, (4, 6, 2), generator=g)
    along = torch.tensor([[[-1], [3], [0], [-7]]])  # [1, 4, 1]: broadcast over dims 0 and 2

    def fn(a, i, j):
        top = a.abs().nan_to_num().gather(1, a.abs().nan_to_num().argmax(1, keepdim=True))
        fixed = torch.tensor([[[2], [0]]]).expand(5, 2, 1)
        return torch.gather(a, 1, i), torch.take_along_dim(a, j, dim=1), top, torch.gather(a, -1, fixed)

    got, want = _run(device, fn, x, idx, along)
    for gv, wv in zip(got, want, strict=True):
        _same_bits(gv, wv)


def test_windows_and_wrapped_pads_run_on_the_device(device):
    """Tensor.unfold, F.unfold (im2col: an index by two index tensors), circular F.pad, bicubic
    upsampling (torch's decomposition indexes by several tensors) and a whole tensor's max() and
    min(): no fallback, torch's result (NaN and Inf moved bit for bit where the op only moves)."""
    x = _special((5, 7)).reshape(1, 5, 7, 1).expand(1, 5, 7, 3).permute(0, 3, 1, 2).contiguous()  # [1, 3, 5, 7]

    def moves(a):
        return (a.unfold(3, 3, 2), F.unfold(a, (2, 3), stride=(1, 2)), F.pad(a, (2, 1, 0, 3), mode="circular"),
                a.max(), a.min())

    got, want = _run(device, moves, x)
    for g, w in zip(got[:3], want[:3], strict=True):
        _same_bits(g, w)
    for g, w in zip(got[3:], want[3:], strict=True):  # NaN, whose sign bit a reduction does not define
        torch.testing.assert_close(g, w, equal_nan=True, rtol=0, atol=0)
    smooth = _random(1, 3, 5, 7, seed=6)
    got, want = _run(device, lambda a: (F.interpolate(a, scale_factor=2, mode="bicubic", align_corners=False),
                                        a.max(), a.min()), smooth)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])


def test_topk_runs_on_the_device(device):
    """A mixture-of-experts router (top-2 of the logits, softmax over them, the experts' ids),
    the smallest k, NaN and Inf among the values: values as torch's, ids torch's where no values
    tie; float32 lines of up to 256 sort in one sort_lines dispatch and keep k, longer ones past
    the decomposition's rounds sort by a bitonic network, and int32 values past the rounds run on
    the CPU with its reason."""
    logits = _random(6, 8, seed=7)
    special = _special((5, 7))

    def route(a, b):
        top, ids = a.topk(2, dim=-1)
        low, low_ids = torch.topk(b, 3, dim=0, largest=False)
        return torch.softmax(top, -1), ids, low, b.topk(4, dim=1)[0], b.gather(0, low_ids)

    got, want = _run(device, route, logits, special)
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=1e-7)
    assert got[1].dtype == torch.int64 and torch.equal(got[1], want[1])
    for g, w in zip(got[2:], want[2:], strict=True):
        torch.testing.assert_close(g, w, equal_nan=True, rtol=0, atol=0)
    x = _random(2, 20)
    with texelflow.compile(Call(lambda a: a.topk(17, dim=-1)[0] * 2), (x,), device=device) as prog:
        assert prog.plan.fallbacks == [] and prog.plan.dispatches["sort_lines"] == 1  # float32: sorted
        torch.testing.assert_close(prog(x), x.topk(17, dim=-1)[0] * 2, rtol=0, atol=0)
    long = _random(2, 300)
    with texelflow.compile(Call(lambda a: a.topk(17, dim=-1)[0] * 2), (long,), device=device) as prog:
        assert prog.plan.fallbacks == [] and prog.plan.dispatches["bitonic_step"] > 0
        torch.testing.assert_close(prog(long), long.topk(17, dim=-1)[0] * 2, rtol=0, atol=0)
    ints = lambda a: a.to(torch.int32).topk(17, dim=-1)[0] * 2  # noqa: E731  (no bitonic sort of int32)
    with texelflow.compile(Call(ints), (x,), device=device) as prog:
        (name, why), = prog.plan.fallbacks
        assert name == "topk" and "\n" not in why and "k = 17, above 16" in why, why


def test_binary_ops_of_two_dtypes_promote_on_the_device(device):
    """float x bool (a gate times a routing mask), float + int32, a float compared with an int32
    and the max of the two: each tensor cast to torch's promoted dtype, then the op; NaN, Inf and
    signed zeros as torch's (a bool is exactly 0 or 1, an int32 this small exactly a float)."""
    x = _special((5, 7))
    m = _random(5, 7, seed=8) > 0
    i = torch.arange(-17, 18, dtype=torch.int32).reshape(5, 7)

    def fn(a, b, c):
        return a * b, b * a, a + c, c - a, a > c, torch.maximum(a, c), a / c

    got, want = _run(device, fn, x, m, i)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype
        if w.dtype == torch.bool:
            assert torch.equal(g, w)
        else:  # a NaN's sign bit is not defined
            torch.testing.assert_close(g, w, equal_nan=True, rtol=0, atol=0)
            assert torch.equal(torch.signbit(g)[~w.isnan()], torch.signbit(w)[~w.isnan()])


def test_norms_over_several_dims_one_hot_and_rrelu_run_on_the_device(device):
    """nn.LayerNorm([C, H, W]) (affine) and F.layer_norm over two dims, std_mean, F.one_hot of
    int64 ids (torch's decomposition compares them with an arange) and RReLU in inference."""
    norm = nn.LayerNorm([6, 5, 7])
    with torch.no_grad():
        norm.weight.copy_(_random(6, 5, 7, seed=9))
        norm.bias.copy_(_random(6, 5, 7, seed=10))
    x = _random(2, 6, 5, 7, seed=11)
    ids = torch.tensor([[0, 5, 2, 2], [4, 1, 3, 0]])
    rrelu = nn.RReLU(0.1, 0.3).eval()

    def fn(a, i):
        std, mean = torch.std_mean(a, dim=(2, 3))
        return norm(a), F.layer_norm(a, (5, 7)), std, mean, F.one_hot(i, num_classes=6).float() * 2, rrelu(a)

    got, want = _run(device, fn, x, ids)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=2e-6)


def test_assignments_into_copies_run_on_the_device(device):
    """Writes into a clone, functionalized by torch.export: `y[:, 1:3] = src` (slice_scatter),
    `y[y > 0] = v` (index_put of a mask and one value), `y[:, idx] = src` and `y.index_add_(0, idx,
    src)` (index_put of one index tensor, negative entries from the end), a whole-tensor
    `copy_` (transformers' causal-mask update); NaN and Inf moved bit for bit."""
    x = _special((5, 7))
    src = _random(5, 2, seed=12)
    idx = torch.tensor([3, -1])
    rows = _random(2, 7, seed=13)

    def fn(a, b, i, r, j):
        y = a.clone()
        y[:, 1:3] = b
        z = a.clone()
        z[z > 0] = 0.5
        w = a.clone()
        w[:, i] = b
        v = a.clone()
        v.copy_(r[:1].expand(5, 7))
        return y, z, w, torch.zeros(6, 7).index_add(0, j, r), v

    got, want = _run(device, fn, x, src, idx, rows, torch.tensor([4, 0]))
    for g, w in zip(got, want, strict=True):
        _same_bits(g, w)


def test_scatters_run_on_the_device(device):
    """A graph network's message sum (`zeros(N, F).scatter_add(0, dst.expand(-1, F), messages)`,
    more entries than nodes), scatter of sources and of a number; Inf and NaN among the sources."""
    messages = _special((5, 7))
    dst = torch.tensor([[2], [0], [2], [3], [0]])
    where = torch.tensor([[4, 0, 2], [1, 3, 6]])

    def fn(m, t, w):
        summed = torch.zeros(4, 7).scatter_add(0, t.expand(-1, 7), m)
        return summed, torch.zeros(2, 7).scatter(1, w, m[:2, :3]), m[:2].scatter(1, w, 9.0)

    got, want = _run(device, fn, messages, dst, where)
    torch.testing.assert_close(got[0], want[0], equal_nan=True, rtol=1e-6, atol=1e-6)
    _same_bits(got[1], want[1])
    _same_bits(got[2], want[2])


def test_last_token_of_each_sequence_runs_on_the_device(device):
    """transformers' sequence-classification head: the last token before the first padding id,
    `(ids.eq(pad).int().argmax(-1) - 1) % T`, Python's remainder of int32 on the device (a row
    without padding wraps -1 to T - 1), then a two-tensor index."""
    h = _random(3, 6, 4, seed=14)
    ids = torch.tensor([[5, 3, 2, 0, 0, 0], [1, 2, 3, 4, 5, 6], [7, 0, 0, 0, 0, 0]])

    def fn(a, t):
        last = (torch.eq(t, 0).int().argmax(-1) - 1) % t.shape[-1]
        return a[torch.arange(a.shape[0]), last], last

    got, want = _run(device, fn, h, ids)
    _same_bits(got[0], want[0])
    assert got[1].dtype == torch.int64 and torch.equal(got[1], want[1])


@pytest.mark.parametrize("mode, padding, align", [("bilinear", "zeros", False), ("bilinear", "border", True),
                                                   ("nearest", "zeros", True), ("nearest", "border", False)])
def test_grid_sample_runs_on_the_device(mode, padding, align, device):
    """F.grid_sample (a spatial transformer's warp), points inside and outside the input; NaN and
    Inf in the input spread to the taps that read them, as in torch. Bicubic and reflection run
    on the CPU with their reason."""
    x = _special((5, 7)).reshape(1, 1, 5, 7).expand(2, 3, 5, 7).contiguous()
    x[1] = _random(3, 5, 7, seed=15)
    grid = _random(2, 4, 6, 2, seed=16, low=-1.3, high=1.3)

    got, want = _run(device, lambda a, g: F.grid_sample(a, g, mode=mode, padding_mode=padding,
                                                       align_corners=align), x, grid)
    torch.testing.assert_close(got, want, equal_nan=True, rtol=1e-5, atol=1e-5)
    with texelflow.compile(Call(lambda a, g: F.grid_sample(a, g, padding_mode="reflection", align_corners=False)),
                           (x, grid), device=device) as prog:
        (name, why), = prog.plan.fallbacks
        assert "padding_mode" in why and "\n" not in why, why


def test_sort_and_argsort_run_on_the_device(device):
    """torch.sort and argsort of short lines (token pruning's argsort of scores): values with NaN
    and Inf in torch's places, indices as torch's stable sort; a line too long for the pairwise
    ranks runs as a bitonic network (tests/reliability/test_long_sorts.py), or for int32 values on
    the CPU with its reason."""
    x = _special((5, 7))

    def fn(a):
        v, i = torch.sort(a, dim=-1, stable=True)
        return v, i, torch.argsort(a, dim=0, descending=True, stable=True), a.sort(0, descending=True)[0]

    got, want = _run(device, fn, x)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, equal_nan=True, rtol=0, atol=0)
    ints = lambda a: a.to(torch.int32).sort(-1)[0] * 2  # noqa: E731  (long lines of int32: no bitonic sort)
    with texelflow.compile(Call(ints), (_random(8, 2048),), device=device) as prog:
        (name, why), = prog.plan.fallbacks
        assert name == "sort" and "bitonic sort of torch.int32" in why and "\n" not in why, why


def test_position_ids_from_arange_compare_on_the_device(device):
    """A length mask `arange(T) < lengths[:, None]`: the folded arange is an int64 constant whose
    values fit int32, held narrowed like the int64 input it meets, so the compare runs on the
    device; a returned arange comes back as torch's int64."""

    def fn(x, lengths):
        pos = torch.arange(x.shape[1])
        keep = pos[None, :] < lengths[:, None]
        return x.masked_fill(~keep[:, :, None], 0.0).sum(1), pos.unsqueeze(0).expand(x.shape[0], -1)

    x, lengths = _random(3, 6, 4, seed=3), torch.tensor([6, 0, 4])
    got, want = _run(device, fn, x, lengths)
    _same_bits(got[0][1], want[0][1])  # the masked row: zeros of torch's sign
    # the sums are compensated (within a rounding of float64's), torch's run in order
    torch.testing.assert_close(got[0], fn(x.double(), lengths)[0].float(), rtol=2.0 ** -23, atol=0)
    assert got[1].dtype == torch.int64 and torch.equal(got[1], want[1])


def test_integer_magnitudes_clamps_and_divisions_run_on_the_device(device):
    """int32 abs / neg / clamp, and integer division by a number rounded down (`//`) and toward
    zero, on negative values, int32's extremes and int64 ids held narrowed (their intervals
    bounded: `ids % 7 - 3`); a float trunc division and float to int32 casts (NaN, Inf and values past
    int32 give int32's least, as torch on x86); torch's int64 results come back."""
    g = torch.Generator().manual_seed(5)
    ints = torch.randint(-2**31, 2**31 - 1, (5, 7), generator=g, dtype=torch.int32)
    ints[0, :4] = torch.tensor([-2**31, 2**31 - 1, -7, 0], dtype=torch.int32)
    ids = torch.randint(0, 50000, (3, 9), generator=g)

    def fn(i, ids, x):
        small = ids % 7 - 3
        return (i.abs(), -i, i.clamp(-5, 1000), i.clamp(max=-3), i // 3, torch.div(i, -4, rounding_mode="trunc"),
                i // -1, small.abs().clamp(1, 2) * -small, small // 2, torch.div(small, 2, rounding_mode="trunc"),
                torch.div(x, 0.3, rounding_mode="trunc"), (x * 10).int(), x.half().int())

    got, want = _run(device, fn, ints, ids, _special((5, 7)))
    for gt, w in zip(got, want, strict=True):
        assert gt.dtype == w.dtype, (gt.dtype, w.dtype)
        torch.testing.assert_close(gt, w, equal_nan=True, rtol=0, atol=0)


def test_divisions_the_device_cannot_round_as_torch_stay_on_the_cpu():
    """A float floor division (torch floors an fmod-exact quotient) and an integer division by a
    tensor run on the CPU, each with its reason."""
    x, i = _random(3, 5), torch.arange(15).reshape(3, 5)
    plan = texelflow.plan(Call(lambda a: torch.div(a, 0.3, rounding_mode="floor")), (x,))
    assert any("float floor division" in why for _, why in plan.fallbacks), plan.fallbacks
    plan = texelflow.plan(Call(lambda a: a.int() // (a.int() + 1)), (i,))
    assert any("divides integers elementwise by a tensor" in why for _, why in plan.fallbacks), plan.fallbacks


def test_bool_comparisons_and_half_casts_run_on_the_device(device):
    """A bool compared with a number (`mask.tril() == 0` made into -inf, count_nonzero of a mask),
    and float32 <-> float16 casts as a half model's norm does them (rounded to nearest even, past
    65504 to inf)."""

    def fn(x):
        mask = torch.ones(5, 5, dtype=torch.bool, device=x.device).tril()
        scores = x.masked_fill(mask == 0, float("-inf")).softmax(-1)
        return scores, torch.count_nonzero(x > 0, -1), x.half(), (x * 3e4).half(), (x * 3e4).half().float() + 1

    x = _random(2, 5, 5, seed=6)
    x[0, 0, :3] = torch.tensor([NAN, INF, 1.0 + 2**-11])  # a tie: 1 + 2^-11 rounds to 1.0 in float16
    got, want = _run(device, fn, x)
    torch.testing.assert_close(got[0], want[0], equal_nan=True, rtol=1e-6, atol=1e-7)  # softmax's exp
    for gt, w in zip(got[1:], want[1:], strict=True):
        assert gt.dtype == w.dtype
        torch.testing.assert_close(gt, w, equal_nan=True, rtol=0, atol=0)

    def half_norm(h):  # a float16 model's RMSNorm: upcast, normalise, downcast
        f = h.to(torch.float32)
        return (f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.float16) * h

    h = _random(3, 8, seed=7).half()
    got, want = _run(device, half_norm, h)
    assert got.dtype == torch.float16
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)


def test_median_and_kthvalue_run_on_the_device(device):
    """torch.median (the lower median; a line with NaN gives NaN at its first NaN) along a dim and
    of a whole tensor, and kthvalue (NaN counts as the largest), by the stable sort's ranks. torch
    leaves the index among equal values unspecified: there the index must point at the value."""
    x = _special((5, 7))
    x[4] = torch.tensor([2.0, 2.0, 1.0, 2.0, 3.0, 2.0, 0.0])  # ties

    def fn(a):
        return (a.median(-1), a.median(0, keepdim=True), a.kthvalue(3, -1), a.kthvalue(5, 0, keepdim=True),
                a[1:].median(), a.median(), (a[4] * 2).int().median())

    got, want = _run(device, fn, x)
    for g, w, name in zip(got[:4], want[:4], ("median", "median0", "kth", "kth0"), strict=True):
        torch.testing.assert_close(g.values, w.values, equal_nan=True, rtol=0, atol=0, msg=name)
        assert g.indices.dtype == torch.int64, name
        dim = -1 if name in ("median", "kth") else 0  # the keepdim ones reduce dim 0
        idx = g.indices if dim == 0 else g.indices.unsqueeze(-1)
        torch.testing.assert_close(x.gather(dim, idx), g.values.reshape(idx.shape), equal_nan=True, rtol=0, atol=0,
                                   msg=name)
    for g, w in zip(got[4:], want[4:], strict=True):
        torch.testing.assert_close(g, w, equal_nan=True, rtol=0, atol=0)


@pytest.mark.parametrize("fn", [
    lambda x: F.max_pool3d(x, 3, 2, 1),
    lambda x: F.max_pool3d(x, (2, 3, 3), (2, 2, 2), (0, 1, 1), ceil_mode=True),
    lambda x: F.max_pool3d(x[0], (1, 3, 3), 1, (0, 1, 1), dilation=(1, 2, 2)),
    lambda x: F.avg_pool3d(x, 3, 2, 1),
    lambda x: F.avg_pool3d(x, 3, 2, 1, count_include_pad=False),
    lambda x: F.avg_pool3d(x, (1, 3, 3), 1, (0, 1, 1), divisor_override=5),
    lambda x: F.adaptive_avg_pool3d(x[:, :, :4, :6], (2, 3, 3)),
], ids=["max", "max-ceil", "max-dilated-unbatched", "avg", "avg-valid-count", "avg-divisor", "adaptive"])
def test_3d_pools_run_on_the_device(fn, device):
    """3-D pools as windows along T, H and W in turn (separable): padding, ceil_mode, dilation, an
    unbatched input, count_include_pad=False, divisor_override; NaN and Inf spread as in torch."""
    x = _random(2, 3, 5, 7, 6, seed=8)
    x[0, 0, 1, 2, 3], x[1, 2, 0, 0, 0], x[1, 1, 4, 6, 5] = NAN, INF, -INF
    got, want = _run(device, fn, x)
    torch.testing.assert_close(got, want, equal_nan=True, rtol=1e-6, atol=1e-6)


def test_3d_convolutions_run_on_the_device(device):
    """conv3d as per-frame conv2d's summed over the kernel's frames: stride, padding and dilation in
    time, groups, padding="same"; NaN spreads."""
    g = torch.Generator().manual_seed(9)
    x = _random(2, 3, 5, 7, 6, seed=9)
    x[1, 0, 2, 3, 3] = NAN
    w1, w2, b2 = torch.randn(6, 1, 3, 3, 3, generator=g), torch.randn(4, 3, 3, 1, 3, generator=g), torch.randn(4)

    def fn(a):
        return (F.conv3d(a, w1, None, (2, 1, 1), (1, 1, 1), 1, 3),
                F.conv3d(a, w2, b2, padding="same", dilation=(2, 1, 1)),
                F.conv3d(a, w2, b2, stride=(1, 2, 2)))

    got, want = _run(device, fn, x)
    for g_, w in zip(got, want, strict=True):
        torch.testing.assert_close(g_, w, equal_nan=True, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("options", [{"mode": "sum"}, {"mode": "mean"}, {"mode": "max"},
                                     {"mode": "sum", "padding_idx": 4}, {"mode": "sum", "include_last_offset": True}],
                         ids=["sum", "mean", "max", "padding-idx", "last-offset"])
def test_embedding_bag_runs_on_the_device(options, device):
    """nn.EmbeddingBag with 1-D indices and offsets passed in: bags of other sizes (one empty) on a
    second call of the same program, per_sample_weights for sum."""
    torch.manual_seed(10)
    bag = torch.nn.EmbeddingBag(10, 5, **options).eval()
    last = options.get("include_last_offset", False)
    idx = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9])
    calls = [(idx, torch.tensor([0, 3, 3, 5] + ([8] if last else []))),
             (idx.flip(0), torch.tensor([0, 0, 6, 7] + ([8] if last else [])))]
    if options == {"mode": "sum"}:
        calls = [c + (torch.rand(8),) for c in calls]
    with texelflow.compile(bag, calls[0], device=device) as prog:
        assert prog.plan.fallbacks == [], prog.plan.fallbacks
        for args in calls:
            torch.testing.assert_close(prog(*args), bag(*args), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("reduce", ["sum", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_runs_on_the_device(reduce, include_self, device):
    """Tensor.scatter_reduce of floats, NaN and -inf among the sources, repeated and missing
    positions; a graph network's mean aggregation of node features along dim 0."""
    g = torch.Generator().manual_seed(11)
    src = torch.randn(3, 6, generator=g)
    src[0, 1], src[1, 2] = NAN, -INF
    idx, base = torch.randint(0, 5, (3, 6), generator=g), torch.randn(3, 5, generator=g)
    got, want = _run(device, lambda b, s, i: b.scatter_reduce(1, i, s, reduce, include_self=include_self),
                     base, src, idx)
    torch.testing.assert_close(got, want, equal_nan=True, rtol=1e-6, atol=1e-6)
    x, edges = torch.randn(7, 4, generator=g), torch.randint(0, 5, (7,), generator=g)
    got, want = _run(device, lambda x, e: torch.zeros(5, 4).scatter_reduce(
        0, e[:, None].expand(-1, 4), x, reduce, include_self=include_self), x, edges)
    torch.testing.assert_close(got, want, equal_nan=True, rtol=1e-6, atol=1e-6)


def test_diagonals_distances_buckets_and_folds_run_on_the_device(device):
    """torch.diagonal at offsets above and below, of any two dims, and trace; cdist for p = 2, 1,
    inf and 3; bucketize and searchsorted (left, right, out_int32, a NaN value past every boundary,
    boundaries passed in, per-row sequences); F.fold with stride, padding and dilation, and
    fold(unfold(x)) (each pixel times the windows that hold it)."""
    g = torch.Generator().manual_seed(12)
    x, a, b = torch.randn(2, 4, 5, generator=g), torch.randn(2, 6, 3, generator=g), torch.randn(2, 4, 3, generator=g)
    x[0, 1, 1] = NAN
    got, want = _run(device, lambda t: (torch.diagonal(t, 0, -2, -1), torch.diagonal(t, 2, 1, 2),
                                        torch.diagonal(t, -1, 2, 1), torch.diagonal(t, 0, 0, 2), torch.trace(t[1])), x)
    for gt, w in zip(got, want, strict=True):
        torch.testing.assert_close(gt, w, equal_nan=True, rtol=1e-6, atol=1e-6)
    got, want = _run(device, lambda u, v: tuple(torch.cdist(u, v, p=p) for p in (2.0, 1.0, float("inf"), 3.0)), a, b)
    for gt, w in zip(got, want, strict=True):
        torch.testing.assert_close(gt, w, rtol=1e-5, atol=1e-5)
    bounds = torch.tensor([-1.0, 0.0, 1.0, INF])
    v = torch.tensor([[NAN, INF, -INF, 0.0, -1.0, 5.0, 0.5]])
    seq, vals = torch.sort(torch.randn(2, 5, generator=g))[0], torch.randn(2, 3, generator=g)

    def buckets(t, bb, s, q):
        return (torch.bucketize(t, bounds), torch.bucketize(t, bb, right=True, out_int32=True),
                torch.searchsorted(bounds, t, side="right"), torch.searchsorted(s, q))

    got, want = _run(device, buckets, v, bounds, seq, vals)
    for gt, w in zip(got, want, strict=True):
        assert gt.dtype == w.dtype and torch.equal(gt, w), (gt, w)
    cols = torch.randn(2, 12, 30, generator=g)
    img = torch.randn(1, 3, 5, 6, generator=g)
    got, want = _run(device, lambda c, i: (F.fold(c[:, :, :20], (5, 6), 2), F.fold(c[:, :, :12], (6, 8), 2, stride=2),
                                           F.fold(c[:, :, :24], (5, 6), 2, padding=(1, 0), dilation=(1, 2)),
                                           F.fold(F.unfold(i, 3, padding=1), (5, 6), 3, padding=1)), cols, img)
    for gt, w in zip(got, want, strict=True):
        torch.testing.assert_close(gt, w, rtol=1e-6, atol=1e-6)


def test_atan2_follows_c_at_zeros_and_infinities(device):
    """torch.atan2 on every pair of signed zeros, infinities, NaN and ordinary values: C's angles
    (atan2(+-0, -0) = +-pi, atan2(+-inf, -inf) = +-3 pi / 4, ...) within one float32 step."""
    vals = [0.0, -0.0, 1.0, -1.0, INF, -INF, NAN, 1e-30, -3.5, 1e30]
    y = torch.tensor([a for a in vals for _ in vals])
    x = torch.tensor([b for _ in vals for b in vals])
    got, want = _run(device, torch.atan2, y, x)
    torch.testing.assert_close(got, want, equal_nan=True, rtol=3e-7, atol=0)
    finite = ~torch.isnan(want)
    assert torch.equal(torch.signbit(got[finite]), torch.signbit(want[finite]))


def test_bitwise_ops_and_shifts_run_on_the_device(device):
    """int32 and / or / xor with numbers, shifts by numbers and tensors (past 31 bits: 0, or the
    sign for a right shift, as torch), on int32's extremes; int64 ids hashed by shifts and masks
    run narrowed (their intervals fit int32) and come back int64."""
    i32 = torch.tensor([5, -5, 7, 2**31 - 1, -2**31, 0, 123456], dtype=torch.int32)
    ids = torch.tensor([[5, 300, 7, 70000, 1, 0, 9]])

    def fn(i, t):
        return (((i & 3) | (i >> 1)) ^ 6, i << 2, i >> 40, i << 33, torch.bitwise_right_shift(i, i.abs() % 3),
                ((t >> 4) & 0xF) + (t & 15) * 3, (t % 256) ^ 0x55)

    got, want = _run(device, fn, i32, ids)
    for gt, w in zip(got, want, strict=True):
        assert gt.dtype == w.dtype and torch.equal(gt, w), (gt, w)
    with texelflow.compile(Call(lambda t: ((t > 6) & 3, (t > 6) | True)), (ids,), device=device) as prog:
        got, want = prog(ids), ((ids > 6) & 3, (ids > 6) | True)  # bool & 3 is int64 in torch
        for gt, w in zip(got, want, strict=True):
            assert gt.dtype == w.dtype and torch.equal(gt, w), (gt, w)


def test_products_run_on_the_device(device):
    """prod along a dim and of everything, cumprod along each dim; zeros, NaN and Inf spread as in
    torch."""
    x = _random(4, 5, 6, seed=13, low=0.5, high=1.5)
    x[0, 0, 0], x[1, 1, 1], x[2, 2, 2] = NAN, 0.0, INF
    got, want = _run(device, lambda t: (t.prod(-1), t.prod(0, keepdim=True), t[:2, :3].prod(), torch.cumprod(t, 0),
                                        torch.cumprod(t, -1), torch.cumprod(t, 1)), x)
    for gt, w in zip(got, want, strict=True):
        torch.testing.assert_close(gt, w, equal_nan=True, rtol=1e-5, atol=1e-6)
