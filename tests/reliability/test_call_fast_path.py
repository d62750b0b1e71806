"""Issue 13, item 6: the fast call of a compiled program (runtime/call_fast.py) against the general one.

A program of one device segment with plain tensor inputs and outputs is called through a path planned
at build; every other call goes the general way. Each test runs the same program both ways
(`prog.fast_path = False` forces the general path) on awkward shapes (sizes 1, 3, 5, 7, channels not
a multiple of 4) with NaN and Inf in the data, and checks: the same results as eager torch, the
same errors for wrong arguments, no output sharing memory with a later call's, calls from several
threads, and that programs the fast path does not cover still take the general one.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

import texelflow
from texelflow import InputTypeError, InputValueError, ProgramClosedError

SHAPE = (1, 3, 5, 7)


class TwoInTwoOut(torch.nn.Module):
    """Two inputs (one broadcast), a tuple of a float and a bool output."""

    def forward(self, x, y):
        return torch.tanh(x + y) * 2.0, x > y


class Single(torch.nn.Module):
    def forward(self, x):
        return torch.relu(torch.neg(x))


class AsList(torch.nn.Module):
    def forward(self, x):
        return [torch.sigmoid(x), x * 3.0]


class Positive(torch.nn.Module):
    def forward(self, x):
        return x > 0


def _awkward(gen, shape):
    x = torch.randn(*shape, generator=gen)
    flat = x.view(-1)
    flat[:3] = torch.tensor([float("nan"), float("inf"), float("-inf")])
    return x


@pytest.fixture(scope="module")
def two(device):
    gen = torch.Generator().manual_seed(0)
    args = (_awkward(gen, SHAPE), _awkward(gen, SHAPE[1:]))
    prog = texelflow.compile(TwoInTwoOut(), args, device=device)
    yield prog
    prog.close()


def _both(prog, *args):
    """(fast result, general result) of one call each; plain tensors (not a subclass, no grad) go
    the fast way, the others the general way either way."""
    plain = all(type(a) is torch.Tensor and not a.requires_grad for a in args)
    assert prog._fast is not None and prog._fast.accepts(args) == plain
    fast = prog(*args)
    prog.fast_path = False
    try:
        general = prog(*args)
    finally:
        prog.fast_path = True
    return fast, general


def _same(a, b):
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and a.is_contiguous()
        assert torch.equal(a.isnan(), b.isnan()) and torch.equal(torch.nan_to_num(a), torch.nan_to_num(b))
    else:
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)


def _close_to_torch(got, want):
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        if g.dtype == torch.bool:
            assert torch.equal(g, w)
        else:
            assert torch.allclose(g, w, rtol=1e-4, atol=1e-4, equal_nan=True)


def test_fast_and_general_paths_agree_with_torch(two):
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        x, y = _awkward(gen, SHAPE), _awkward(gen, SHAPE[1:])
        fast, general = _both(two, x, y)
        _same(fast, general)
        _close_to_torch(fast, TwoInTwoOut()(x, y))


# (the outputs of width 5 and 7 textures are gathered past padding; the others are read with
# one copy: both kinds of transfer, for writes and reads, and a 5-d buffer)
@pytest.mark.parametrize("model,shape", [(Single(), (3,)), (Single(), (1, 5, 7)), (Single(), (2, 1, 3, 5, 7)),
                                         (AsList(), (7, 5)), (AsList(), (3, 8)), (Positive(), (1, 7)),
                                         (Positive(), (5,))])
def test_single_and_list_results_keep_their_structure(device, model, shape):
    gen = torch.Generator().manual_seed(2)
    x = _awkward(gen, shape)
    with texelflow.compile(model, (x,), device=device) as prog:
        fast, general = _both(prog, x)
        _same(fast, general)
        want = model(x)
        _close_to_torch([fast] if isinstance(want, torch.Tensor) else fast,
                        [want] if isinstance(want, torch.Tensor) else want)


def _error(prog, *args):
    try:
        prog(*args)
    except Exception as exc:  # noqa: BLE001 - compared below
        return type(exc), str(exc)
    raise AssertionError("the call was accepted")


@pytest.mark.parametrize("make_args", [
    lambda x, y: (x.reshape(3, 1, 5, 7), y),  # wrong shape
    lambda x, y: (x.double(), y),  # wrong dtype
    lambda x, y: (x, y.to(torch.int32)),
    lambda x, y: (x.numpy(), y),  # not a tensor
    lambda x, y: (x, None),
    lambda x, y: (x, 1.5),
    lambda x, y: (x,),  # wrong count
    lambda x, y: (x, y, y),
    lambda x, y: (),
    lambda x, y: (torch.empty(SHAPE, device="meta"), y),
    lambda x, y: (x.to_sparse(), y),
], ids=["shape", "dtype", "int32", "numpy", "none", "float", "one", "three", "zero", "meta", "sparse"])
def test_wrong_arguments_raise_the_same_error_both_ways(two, make_args):
    gen = torch.Generator().manual_seed(3)
    args = make_args(_awkward(gen, SHAPE), _awkward(gen, SHAPE[1:]))
    fast = _error(two, *args)
    two.fast_path = False
    try:
        general = _error(two, *args)
    finally:
        two.fast_path = True
    assert fast == general
    assert fast[0] in (InputTypeError, InputValueError) and "\n" not in fast[1]


def test_strided_grad_and_subclass_inputs_are_accepted_both_ways(two):
    gen = torch.Generator().manual_seed(4)
    x = _awkward(gen, (1, 3, 7, 5)).transpose(2, 3)  # non-contiguous, the compiled shape
    y = _awkward(gen, SHAPE[1:]).requires_grad_()
    p = torch.nn.Parameter(_awkward(gen, SHAPE), requires_grad=False)
    for args in ((x, y.detach()), (x.contiguous(), y), (p, y.detach())):
        fast, general = _both(two, *args)
        _same(fast, general)
        with torch.no_grad():
            _close_to_torch(fast, TwoInTwoOut()(*args))


def test_inference_mode_and_no_grad_calls(two):
    gen = torch.Generator().manual_seed(6)
    with torch.inference_mode():
        x, y = _awkward(gen, SHAPE), _awkward(gen, SHAPE[1:])  # inference tensors
        fast, general = _both(two, x, y)
        _same(fast, general)
        assert all(t.is_inference() for t in fast)
    _same(two(x, y), fast)  # inference tensors passed outside inference mode
    with torch.no_grad():
        _close_to_torch(two(x, y), TwoInTwoOut()(x, y))


def test_outputs_never_share_memory_with_a_later_call(two):
    gen = torch.Generator().manual_seed(5)
    first_args = (_awkward(gen, SHAPE), _awkward(gen, SHAPE[1:]))
    first = two(*first_args)
    kept = [t.clone() for t in first]
    second = two(_awkward(gen, SHAPE), _awkward(gen, SHAPE[1:]))
    _same(list(first), kept)  # the second call changed nothing of the first's results
    for a, b in zip(first, second):
        assert a.data_ptr() != b.data_ptr()
    second[0].fill_(7.0)
    _same(two(*first_args)[0], kept[0])  # writing into a result touches nothing of the program


def test_threads_calling_one_program(two):
    wrong, errors = [], []
    start = threading.Barrier(4)

    def work(k):
        try:
            gen = torch.Generator().manual_seed(10 + k)
            start.wait()
            for i in range(15):
                x, y = _awkward(gen, SHAPE), _awkward(gen, SHAPE[1:])
                got = two(x, y)
                want = TwoInTwoOut()(x, y)
                if not (torch.allclose(got[0], want[0], rtol=1e-4, atol=1e-4, equal_nan=True)
                        and torch.equal(got[1], want[1])):
                    wrong.append((k, i))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert not wrong, wrong


def test_a_closed_program_raises_on_the_fast_path(device):
    x = torch.randn(5)
    prog = texelflow.compile(Single(), (x,), device=device)
    assert prog._fast is not None
    prog.close()
    assert prog._fast.accepts((x,))
    with pytest.raises(ProgramClosedError, match="this compiled program was closed"):
        prog(x)


class Narrowed(torch.nn.Module):
    def forward(self, ids):
        return ids + 1


class Mutates(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(3))

    def forward(self, x):
        self.count.add_(x)
        return x * 2.0


@pytest.mark.parametrize("model,arg", [
    (Narrowed(), torch.tensor([1, 5, 7], dtype=torch.int64)),  # int64 narrowed to int32 on the device
    (Mutates(), torch.tensor([1.0, float("nan"), float("inf")])),  # a buffer written back
], ids=["int64", "mutation"])
def test_programs_outside_the_fast_path_take_the_general_one(device, model, arg):
    want_model = type(model)()
    with texelflow.compile(model, (arg,), device=device) as prog:
        assert prog._fast is None
        got = prog(arg)
        want = want_model(arg)
        assert got.dtype == want.dtype
        assert torch.allclose(got, want, equal_nan=True)
        if isinstance(model, Mutates):
            assert torch.equal(model.count.nan_to_num(), want_model.count.nan_to_num())


def test_bench_overhead_layers_use_the_fast_path(device):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from overhead import unary_chain_model

    model, inputs = unary_chain_model(shape=(1, 3, 5, 7))
    with texelflow.compile(model, inputs, device=device) as prog:
        assert prog._fast is not None and prog.num_submits_per_call == 1
        x = inputs[0].clone()
        x.view(-1)[:2] = torch.tensor([float("nan"), float("inf")])
        fast, general = _both(prog, x)
        _same(fast, general)
        assert torch.allclose(fast, model(x), atol=1e-5, equal_nan=True)
        assert isinstance(np.asarray(fast), np.ndarray)
