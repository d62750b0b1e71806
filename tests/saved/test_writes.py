"""Saved programs that write back (issue 14): a buffer the model mutates lives on in the loaded
program (read by its CPU-fallback readers and outputs, written after each call), and a mutated
input is written into the caller's array or tensor, as CompiledProgram's finish_call does."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import texelflow
from texelflow.runtime.saved import SchemaError

from .helpers import as_list, assert_same
from .test_malformed import _refused, _rewrite


class Accumulate(torch.nn.Module):
    """A running sum in a buffer (channels 3, not a multiple of 4), and a scaled input in place."""

    def __init__(self, width: int):
        super().__init__()
        self.register_buffer("total", torch.linspace(-1.0, 1.0, 3 * width).reshape(3, width))
        self.total[0, 0] = float("nan")

    def forward(self, a, b):
        self.total.add_(a)
        b.mul_(2.0)
        return a * 2.0 + self.total, self.total


def _inputs(width: int):
    a = torch.linspace(-3.0, 2.5, 3 * width).reshape(3, width)
    a[-1, -1] = float("inf")
    b = torch.arange(width, dtype=torch.float32).reshape(1, width) - 1.5
    b[0, 0] = -float("inf")
    return a, b


@pytest.mark.parametrize("width", [1, 5, 7])
def test_state_and_mutated_inputs_match_the_compiled_program_call_after_call(width, device, tmp_path):
    a, b = _inputs(width)
    with texelflow.compile(Accumulate(width), (a, b.clone()), device=device) as prog:
        prog.save(tmp_path / "w.tflow")
        mine = b.clone()
        want = [as_list(prog(a, mine)) for _ in range(3)]
    with texelflow.load(tmp_path / "w.tflow", device=device) as loaded:
        theirs = b.numpy().copy()
        got = [[x.copy() for x in loaded(a.numpy(), theirs)] for _ in range(3)]
        theirs_t = b.clone()
        loaded(a, theirs_t)  # torch in: the caller's tensor is written too
    for g, w in zip(got, want):
        assert_same(g, w)
    assert not np.array_equal(want[0][1], want[2][1], equal_nan=True)  # the state did move
    assert_same([theirs], [mine.numpy()])
    assert_same([theirs_t.numpy()], [b.numpy() * 2.0])


def test_a_write_to_a_missing_buffer_is_refused(device, tmp_path):
    a, b = _inputs(3)
    with texelflow.compile(Accumulate(3), (a, b.clone()), device=device) as prog:
        prog.save(tmp_path / "w.tflow")

    def edit(e):
        next(w for w in e["program"]["writes"] if w["kind"] == "buffer")["target"] = 999

    _refused(_rewrite(tmp_path / "w.tflow", tmp_path / "bad.tflow", edit), device, SchemaError,
             "writes[", "no constant const/999")
