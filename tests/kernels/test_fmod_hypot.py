"""Float fmod and remainder (tf_fmod / tf_remainder in shaders/include/math.glslh) against torch, bit
for bit: torch's fmod is exact (C's), so the kernel must be too, for quotients up to float32's whole
range (long divisions of up to 277 steps), subnormal divisors, both signs, zeros, NaN and
infinities; remainder follows torch's own rule (an fmod moved by the divisor where signs differ).
One difference, on purpose: torch's vectorised fmod (Sleef's, for its full SIMD chunks) gives NaN
where the quotient |x / y| overflows float32, while its scalar loop (a tensor's tail) and C give the
exact value; the kernel gives the exact value everywhere, checked there against numpy's fmod. Also
hypot (no overflow, no underflow), signbit and copysign (by bits)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import texelflow
from tests.reliability.models import Call


def _wide(n: int, seed: int) -> torch.Tensor:
    """Magnitudes spread over float32's exponents (subnormals included), random signs, and the
    specials spread among them."""
    rng = np.random.default_rng(seed)
    mags = 10.0 ** rng.uniform(-44, 38, n)
    x = (np.where(rng.random(n) < 0.5, -1, 1) * mags).astype(np.float32)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 3.0, 1e-45, -3.4e38], np.float32)
    x[rng.permutation(n)[:specials.size]] = specials
    return torch.from_numpy(x)


def _run(device, fn, *inputs):
    with torch.no_grad():
        prog = texelflow.compile(Call(fn), inputs, device=device)
    try:
        assert prog.plan.fallbacks == [], prog.plan.fallbacks
        return prog(*inputs), fn(*inputs)
    finally:
        prog.close()


def _exact(name: str, x, y) -> torch.Tensor:
    """C's fmod (numpy's), and torch's remainder rule on it, in float32."""
    x, y = torch.broadcast_tensors(x, torch.as_tensor(y, dtype=torch.float32))
    with np.errstate(invalid="ignore"):
        r = torch.from_numpy(np.fmod(x.numpy(), y.numpy()))
    if name == "remainder":
        r = torch.where((r != 0) & ((y < 0) != (r < 0)), r + y, r)
    return r


def _check(name: str, got: torch.Tensor, want: torch.Tensor, x, y) -> None:
    """torch's result, except where its vectorised fmod gave NaN for an overflowing quotient: the
    exact one there (module docstring)."""
    exact = _exact(name, x, y)
    overflow = want.isnan() & ~exact.isnan()
    assert not overflow.any() or ((x.abs() / torch.as_tensor(y).abs())[overflow] > 3.4e38).all()
    _same_bits(got, torch.where(overflow, exact, want))


def _same_bits(got: torch.Tensor, want: torch.Tensor) -> None:
    normal = ~((want != 0) & (want.abs() < torch.finfo(torch.float32).tiny))  # a subnormal result may flush to 0
    g, w = got[normal], want[normal]
    same = (g.view(torch.int32) == w.view(torch.int32)) | (g.isnan() & w.isnan())
    bad = (~same).nonzero().flatten()
    assert bad.numel() == 0, f"{bad.numel()} differ, first: got {g[bad[:3]].tolist()}, torch {w[bad[:3]].tolist()}"
    assert (got[~normal].abs() <= want[~normal].abs()).all()


@pytest.mark.parametrize("name", ["fmod", "remainder"])
def test_tensor_forms_are_exact_over_float32s_range(device, name):
    fn = getattr(torch, name)
    x, y = _wide(4097, 1).reshape(17, 241), _wide(4097, 2).reshape(17, 241)
    _check(name, *_run(device, fn, x, y), x, y)
    y = torch.rand(17, 241) * 8 - 4  # ordinary divisors: quotients of every size
    _check(name, *_run(device, fn, x, y), x, y)


@pytest.mark.parametrize("other", [0.7, -2.5, 6.283185307179586, 1e-30, 3e38, 7.0])
@pytest.mark.parametrize("name", ["fmod", "remainder"])
def test_scalar_forms_are_exact(device, name, other):
    fn = getattr(torch, name)
    x = _wide(1001, 3).reshape(7, 11, 13)
    got, want = _run(device, lambda t: fn(t, other), x)
    _check(name, got, want, x, other)


def test_a_phase_wrapped_to_two_pi_in_a_model(device):
    """A common use: angles wrapped into [0, 2 pi) with `%`."""
    x = torch.linspace(-40, 40, 333).reshape(9, 37)
    got, want = _run(device, lambda t: torch.sin(t % (2 * np.pi)) + t % 1.0, x)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_hypot_neither_overflows_nor_underflows(device):
    """C's hypot: no square overflows (1e30, 1e30) or underflows (1e-30, 1e-30); inf beside NaN
    is inf. Within 2 float32 ulps of torch's (its result is correctly rounded or nearly)."""
    x, y = _wide(4097, 4).reshape(17, 241), _wide(4097, 5).reshape(17, 241)
    got, want = _run(device, torch.hypot, x, y)
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf())
    finite = want.isfinite() & (want >= torch.finfo(torch.float32).tiny)
    torch.testing.assert_close(got[finite], want[finite], rtol=2.4e-7, atol=0)


def test_signbit_and_copysign_read_the_sign_bit(device):
    x = torch.tensor([[0.0, -0.0, 1.5, -1.5, float("inf"), -float("inf"), float("nan"), -float("nan")]])
    y = torch.tensor([[-0.0, 0.0, -2.0, 3.0, -1.0, 1.0, -0.0, 1.0]])
    got, want = _run(device, lambda a, b: torch.cat([torch.copysign(a, b), torch.copysign(a, -0.0),
                                                     torch.signbit(a).float(), torch.signbit(b).float()]), x, y)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (got, want)
