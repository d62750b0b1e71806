"""Running ops along a dim through torch.export: logcumsumexp (the scan kernel, MODE logaddexp),
cummax and cummin (own_decompositions: a running max by doubling and the positions that set it),
lgamma and digamma in a model, each on the device with no CPU node and torch's answer.

Awkward lines: lengths 1, 3, 5, 7 and 1000, every dim, ties (torch's cummax takes the later
index), NaN (it sticks, with its index, until the next NaN), -inf and +inf, -0.0, int64 inputs.
"""
from __future__ import annotations

import pytest
import torch

import texelflow

from .models import Call


def _awkward(shape, seed: int, ties: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * 5
    if ties:
        x = x.round()  # many equal values along each line
    flat = x.view(-1)
    k = flat.numel()
    specials = torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0, 0.0, 1e30, -1e30])
    pick = torch.randperm(k, generator=g)[: min(k // 4, specials.numel())]
    flat[pick] = specials[: pick.numel()]
    return x


SHAPES = [((7,), 0), ((3, 5), 1), ((3, 5), 0), ((2, 3, 5, 7), 3), ((2, 3, 5, 7), 1), ((2, 1000), 1), ((1,), 0),
          ((5, 1), 1)]


def _run(fn, x):
    model = Call(fn)
    with texelflow.compile(model, (x,)) as prog:
        assert prog.plan.fallbacks == [], prog.plan.fallbacks
        return prog(x), model(x)


@pytest.mark.parametrize("shape,dim", SHAPES, ids=[f"{s}-{d}" for s, d in SHAPES])
@pytest.mark.parametrize("largest", [True, False], ids=["cummax", "cummin"])
def test_cummax_cummin_as_torch(shape, dim, largest):
    op = torch.cummax if largest else torch.cummin
    for seed, ties in ((0, False), (1, True)):
        x = _awkward(shape, seed, ties)
        (got_v, got_i), (want_v, want_i) = _run(lambda t: tuple(op(t, dim)), x)
        assert got_i.dtype == torch.int64 and torch.equal(got_i, want_i), (x, got_i, want_i)
        assert torch.equal(got_v.isnan(), want_v.isnan())
        assert torch.equal(torch.nan_to_num(got_v), torch.nan_to_num(want_v))


def test_cummax_of_int64_ids():
    ids = torch.randint(-50, 50, (3, 9), generator=torch.Generator().manual_seed(3))
    (got_v, got_i), (want_v, want_i) = _run(lambda t: tuple(torch.cummax(t, -1)), ids)
    assert got_v.dtype == torch.int64 and torch.equal(got_v, want_v) and torch.equal(got_i, want_i)


@pytest.mark.parametrize("shape,dim", SHAPES, ids=[f"{s}-{d}" for s, d in SHAPES])
def test_logcumsumexp_as_torch(shape, dim):
    x = _awkward(shape, 2) * 10  # a wide range: exp of it overflows float32 both ways
    got, want = _run(lambda t: torch.logcumsumexp(t, dim), x)
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf())
    finite = torch.isfinite(want)
    torch.testing.assert_close(got[finite], want[finite], rtol=2e-6, atol=1e-5)


def test_lgamma_digamma_in_a_model():
    """A negative binomial log-likelihood (forecasting heads), lgamma and digamma of computed values."""

    def nb_loglik(x):
        mu, alpha = x.exp(), torch.sigmoid(x) + 0.1
        y = (x * 3).abs().round()
        r = 1.0 / alpha
        ll = (torch.lgamma(y + r) - torch.lgamma(y + 1) - torch.lgamma(r) + r * torch.log(r / (r + mu))
              + y * torch.log(mu / (r + mu)))
        return ll, torch.digamma(y + r) - torch.digamma(r)

    x = torch.randn(4, 9, generator=torch.Generator().manual_seed(4))
    (got_ll, got_d), (want_ll, want_d) = _run(nb_loglik, x)
    torch.testing.assert_close(got_ll, want_ll, rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(got_d, want_d, rtol=1e-5, atol=2e-5)
