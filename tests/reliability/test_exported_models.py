"""Issue 9, item 10: models that export fine work, or are refused with one clear error.

Casts (torch.export adds `_assert_tensor_metadata` nodes with no outputs), returned parameters and
buffers, in-place ops on an input or on a buffer (written back after the call, as torch does),
0-size tensors and Python float inputs (specialised by torch.export) work; dynamic shapes raise
UnsupportedModelError naming the input and the reason.
"""
from __future__ import annotations

import pytest
import torch

import texelflow
from texelflow.runtime.errors import UnsupportedModelError

from .models import Call



def _compile(device, model, inputs):
    return texelflow.compile(model, inputs, device=device)


@pytest.mark.parametrize("name, fn, x", [
    ("float", lambda x: x.float() + 1, torch.arange(6, dtype=torch.int32).reshape(2, 3)),
    ("int", lambda x: (x * 3).int(), torch.linspace(-2, 2, 6).reshape(2, 3)),
    ("to", lambda x: x.to(torch.int32) + x.to(torch.float32).to(torch.int32), torch.linspace(-2, 2, 6)),
])
def test_dtype_casts(device, name, fn, x):
    prog = _compile(device, Call(fn), (x,))
    try:
        got, want = prog(x), fn(x)
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want)
    finally:
        prog.close()


class _ReturnsState(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("b", torch.arange(3.0))
        self.p = torch.nn.Parameter(torch.ones(3))

    def forward(self, x):
        return x + self.p, self.b, self.p


def test_returned_buffer_and_parameter(device):
    model, x = _ReturnsState(), torch.randn(3)
    prog = _compile(device, model, (x,))
    try:
        for _ in range(2):
            got = prog(x)
            with torch.no_grad():
                want = model(x)
            assert len(got) == 3
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w)
    finally:
        prog.close()


class _InPlaceInput(torch.nn.Module):
    def forward(self, x, y):
        y.mul_(2)
        return x + y


def test_in_place_on_input_is_written_back(device):
    x = torch.randn(4)
    prog = _compile(device, _InPlaceInput(), (x, torch.ones(4)))
    try:
        y_tf, y_torch = torch.arange(4.0), torch.arange(4.0)
        got = prog(x, y_tf)
        want = _InPlaceInput()(x, y_torch)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(y_tf, y_torch)  # the caller's tensor changed, as in torch
    finally:
        prog.close()


class _Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("total", torch.zeros(3))

    def forward(self, x):
        self.total.add_(x)
        return self.total * 2


def test_mutated_buffer_is_written_back(device):
    model, eager = _Counter(), _Counter()
    prog = _compile(device, model, (torch.zeros(3),))
    try:
        for i in range(3):
            x = torch.full((3,), float(i + 1))
            torch.testing.assert_close(prog(x), eager(x))
            torch.testing.assert_close(model.total, eager.total)  # the module's buffer is updated
        assert any("mutates" in reason for _, reason in prog.plan.fallbacks)
    finally:
        prog.close()


@pytest.mark.parametrize("shape", [(0,), (0, 3), (2, 0, 3), (1, 2, 0, 4, 5)])
def test_zero_size_inputs(device, shape):
    def fn(x, y):
        return torch.relu(x + y) * 2, x.sum(-1)

    x, y = torch.randn(shape), torch.randn(shape[-1:])
    prog = _compile(device, Call(fn), (x, y))
    try:
        for g, w in zip(prog(x, y), fn(x, y)):
            assert g.shape == w.shape
            torch.testing.assert_close(g, w)
    finally:
        prog.close()


def test_python_float_input(device):
    # torch.export specialises a Python number into the graph; the call must pass the same value
    model, x = Call(lambda x, a: x * a), torch.randn(3)
    prog = _compile(device, model, (x, 2.0))
    try:
        torch.testing.assert_close(prog(x, 2.0), x * 2.0)
    finally:
        prog.close()


class _AddOne(torch.nn.Module):
    def forward(self, x):
        return x + 1


def test_dynamic_shapes_are_refused():
    x = torch.randn(4, 3)
    ep = torch.export.export(_AddOne(), (x,), dynamic_shapes=({0: torch.export.Dim("batch")},))
    with pytest.raises(UnsupportedModelError) as err:
        texelflow.plan(ep, (x,))
    msg = str(err.value)
    assert msg.startswith("node 'x' has the dynamic shape [")
    assert msg.endswith(", 3]: texelflow compiles static shapes only; export without dynamic_shapes (torch.export.Dim)")


class _Item(torch.nn.Module):
    def forward(self, x):
        return x.max().item()


def test_data_dependent_scalar_is_refused():
    with pytest.raises(UnsupportedModelError) as err:
        texelflow.plan(_Item(), (torch.randn(3),))
    assert str(err.value) == (
        "node 'item' (aten.item.default) computes a SymFloat, not a tensor "
        "(a Python number read from tensor data, e.g. .item() or .tolist()): texelflow compiles graphs of "
        "tensors only")


class _SliceInPlace(torch.nn.Module):
    def forward(self, x):
        x[1:].add_(1)
        return x * 2


def test_in_place_on_a_view_of_an_input(device):
    prog = _compile(device, _SliceInPlace(), (torch.zeros(3),))
    try:
        x_tf, x_torch = torch.arange(3.0), torch.arange(3.0)
        torch.testing.assert_close(prog(x_tf), _SliceInPlace()(x_torch))
        torch.testing.assert_close(x_tf, x_torch)
    finally:
        prog.close()


class _ScaleInPlace(torch.nn.Module):
    def forward(self, a, x):
        x.mul_(a)
        return x + 1


def test_in_place_on_an_input_after_a_python_number(device):
    prog = _compile(device, _ScaleInPlace(), (3.0, torch.zeros(3)))
    try:
        x_tf, x_torch = torch.arange(3.0), torch.arange(3.0)
        torch.testing.assert_close(prog(3.0, x_tf), _ScaleInPlace()(3.0, x_torch))
        torch.testing.assert_close(x_tf, x_torch)
    finally:
        prog.close()


class _Branchy(torch.nn.Module):
    def forward(self, x):
        return x * 2 if x.sum() > 0 else x  # data-dependent control flow: torch.export refuses


def test_a_model_torch_export_refuses():
    with pytest.raises(UnsupportedModelError) as err:
        texelflow.plan(_Branchy(), (torch.ones(3),))
    assert str(err.value).startswith("torch.export could not export the model: ")
    assert err.value.__cause__ is not None  # torch's own error, with its explanation


class _SharedConstant(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("c", torch.tensor(0.75))

    def forward(self, x, y):
        return x + self.c, y + self.c


@pytest.mark.parametrize("planner", ["optimal", "greedy"])
def test_constant_read_in_two_representations(device, planner):
    # found by test_fuzz: the planner put x's add in a buffer and y's in a texture; the constant was
    # prepacked only for its first reader and the second dispatch got the wrong storage (ValueError)
    x, y = torch.randn(1, 1, 1, 1, 1), torch.randn(())
    prog = texelflow.compile(_SharedConstant(), (x, y), planner=planner, device=device)
    try:
        for g, w in zip(prog(x, y), _SharedConstant()(x, y)):
            torch.testing.assert_close(g, w)
    finally:
        prog.close()
