"""Issue 9, items 4, 5, 7 and 11: what a compiled program accepts and returns.

11: bad call arguments (numpy arrays, None, Python scalars, meta tensors, the wrong number of
    inputs, wrong shapes, a closed program) gave tracebacks from deep inside; now each raises one
    texelflow error naming the argument position.
5:  inputs of another dtype were silently cast (float64/float16/int64/bool into a float32 program;
    floats into an int32 program truncated, NaN became 1); now InputValueError names the input,
    the expected and the given dtype.
7:  a program running entirely on the CPU did not check input shapes.
4:  0-d outputs came back with shape (1,); outputs now have torch's shape and dtype, contiguous.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import texelflow
from texelflow import InputTypeError, InputValueError, ProgramClosedError


class _Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


@pytest.fixture(scope="module")
def linear_prog(device):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2).eval()
    prog = texelflow.compile(model, (torch.randn(2, 3),), device=device)
    yield prog, model
    prog.close()


EXPECTED = "input 0 (input): expected a torch.Tensor of shape (2, 3) float32"


@pytest.mark.parametrize("arg,got", [
    (np.zeros((2, 3), np.float32), "a numpy.ndarray"),
    (None, "None"),
    (1.5, "a float"),
    (3, "an int"),
    ([[0.0] * 3] * 2, "a list"),
])
def test_non_tensor_argument_is_a_type_error(linear_prog, arg, got):
    prog, _ = linear_prog
    with pytest.raises(InputTypeError) as info:
        prog(arg)
    assert str(info.value) == f"{EXPECTED}, got {got}"
    assert isinstance(info.value, TypeError)


def test_meta_tensor_is_a_type_error(linear_prog):
    prog, _ = linear_prog
    with pytest.raises(InputTypeError) as info:
        prog(torch.empty(2, 3, device="meta"))
    assert str(info.value) == f"{EXPECTED}, got a tensor on the meta device (it has no data)"


def test_wrong_number_of_inputs(linear_prog):
    prog, _ = linear_prog
    x = torch.randn(2, 3)
    for args in ((), (x, x)):
        with pytest.raises(InputTypeError) as info:
            prog(*args)
        assert str(info.value) == (f"the program takes 1 input, got {len(args)}; it expects "
                                   f"input 0 (input): a torch.Tensor of shape (2, 3) float32")


def test_wrong_shape_is_a_value_error(linear_prog):
    prog, _ = linear_prog
    with pytest.raises(InputValueError) as info:
        prog(torch.randn(3, 3))
    assert str(info.value) == ("input 0 (input): expected shape (2, 3), got (3, 3) "
                               "(the program was compiled for fixed shapes)")
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.int64, torch.bool])
def test_other_dtype_into_a_float32_program_is_refused(linear_prog, dtype):
    prog, model = linear_prog
    with pytest.raises(InputValueError) as info:
        prog(torch.ones(2, 3, dtype=dtype))
    name = str(dtype).replace("torch.", "")
    assert str(info.value) == (f"input 0 (input): expected dtype float32, got {name} (the program was "
                               f"compiled for float32; convert it with .to(torch.float32))")
    x = torch.randn(2, 3)  # the program still works afterwards
    torch.testing.assert_close(prog(x), model(x).detach(), rtol=1e-5, atol=1e-5)


def test_floats_into_an_int32_program_are_refused_not_truncated(device):
    x = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    with texelflow.compile(_Fn(lambda t: t + 1), (x,), device=device) as prog:
        assert prog.num_submits_per_call == 1 and not prog.plan.fallbacks
        torch.testing.assert_close(prog(x), x + 1)
        with pytest.raises(InputValueError) as info:
            prog(torch.full((3, 4), float("nan")))
        assert str(info.value) == ("input 0 (x): expected dtype int32, got float32 (the program was "
                                   "compiled for int32; convert it with .to(torch.int32))")


def test_program_entirely_on_the_cpu_checks_shapes(device):
    x = torch.randn(3, 4)
    with texelflow.compile(_Fn(torch.special.erfcx), (x,), device=device) as prog:
        assert prog.num_submits_per_call == 0  # every node falls back to torch
        torch.testing.assert_close(prog(x), torch.special.erfcx(x))
        with pytest.raises(InputValueError) as info:
            prog(torch.randn(5, 4))
        assert str(info.value) == ("input 0 (x): expected shape (3, 4), got (5, 4) "
                                   "(the program was compiled for fixed shapes)")
        with pytest.raises(InputValueError):
            prog(torch.randn(3, 4, dtype=torch.float64))


def test_calling_a_closed_program(device):
    x = torch.randn(2, 3)
    prog = texelflow.compile(torch.nn.Linear(3, 2), (x,), device=device)
    prog.close()
    with pytest.raises(ProgramClosedError) as info:
        prog(x)
    assert str(info.value) == "this compiled program was closed; compile it again to run it"


def test_non_contiguous_and_grad_inputs_are_accepted(linear_prog):
    prog, model = linear_prog
    x = torch.randn(3, 2).t()  # (2, 3), not contiguous
    assert not x.is_contiguous()
    torch.testing.assert_close(prog(x), model(x).detach(), rtol=1e-5, atol=1e-5)
    xg = torch.randn(2, 3, requires_grad=True)
    torch.testing.assert_close(prog(xg), model(xg).detach(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fn", [
    lambda t: t.sum() * 2,  # the report's case: a device op after a CPU reduction
    lambda t: (t * 3).sum(),  # a device op before it
    lambda t: t.amax(),  # CPU only
    lambda t: (t.sum() * 2, t + 1),  # a 0-d and a 2-d output
], ids=["sum_times_2", "mul_then_sum", "amax", "tuple"])
def test_outputs_have_torch_shape_and_dtype(device, fn):
    x = torch.randn(3, 4)
    want = fn(x)
    with texelflow.compile(_Fn(fn), (x,), device=device) as prog:
        got = prog(x)
    wants = want if isinstance(want, tuple) else (want,)
    gots = got if isinstance(got, tuple) else (got,)
    assert len(gots) == len(wants)
    for g, w in zip(gots, wants):
        assert g.shape == w.shape and g.dtype == w.dtype and g.is_contiguous()
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


class _ZeroDim(torch.nn.Module):
    """0-d int32 values cross between the device (the adds) and torch (int32 abs falls back)."""

    def forward(self, x, y):
        c = torch.abs(torch.abs(x) + 2)
        return x + c, c + y


def test_0d_values_between_device_and_cpu(device):
    x, y = torch.tensor(-3, dtype=torch.int32), torch.tensor(1.5)
    want = _ZeroDim()(x, y)
    with texelflow.compile(_ZeroDim(), (x, y), device=device) as prog:
        assert prog.num_submits_per_call >= 1
        got = prog(x, y)
    for g, w in zip(got, want):
        assert g.shape == w.shape == () and g.dtype == w.dtype
        torch.testing.assert_close(g, w)


class _Masked(torch.nn.Module):
    def forward(self, x, mask):
        return x * mask + 1.0


def test_inputs_may_be_passed_by_name(device):
    """prog(x, mask=m) and prog(mask=m, x=x) as the model's forward takes them; a wrong name, a
    name given twice or a missing input is one InputTypeError naming the inputs."""
    x, m = torch.randn(2, 3), torch.rand(2, 3)
    want = _Masked()(x, m)
    with texelflow.compile(_Masked(), (x, m), device=device) as prog:
        assert torch.equal(prog(x, mask=m), want)
        assert torch.equal(prog(mask=m, x=x), want)
        cases = [((x,), {"y": m}, "no input named 'y'; the program's inputs are x, mask"),
                 ((x,), {"x": x}, "input 'x' given by position and by name; the program's inputs are x, mask"),
                 ((), {"mask": m}, "input 0 (x) is missing: the program takes 2 inputs")]
        for args, kwargs, message in cases:
            with pytest.raises(InputTypeError) as info:
                prog(*args, **kwargs)
            assert str(info.value) == message
