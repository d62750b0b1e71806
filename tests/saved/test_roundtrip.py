"""Saved programs run bit for bit like the program that was saved: in this process, and in a
fresh one where torch cannot be imported (issue 14)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import texelflow
from texelflow.models import tiny_mixer, tiny_resnet
from texelflow.runtime.saved import LoadedProgram

from .helpers import Awkward, Embed, as_list, assert_same, awkward_inputs, run_without_torch


def _saved(device, model, inputs, path):
    prog = texelflow.compile(model.eval(), inputs, device=device)
    want = as_list(prog(*inputs))
    prog.save(path)
    return prog, want


@pytest.mark.parametrize("factory", [tiny_resnet, tiny_mixer], ids=["tiny_resnet", "tiny_mixer"])
def test_tiny_models_round_trip_in_process(factory, device, tmp_path):
    model, inputs = factory()
    prog, want = _saved(device, model, inputs, tmp_path / "m.tflow")
    with texelflow.load(tmp_path / "m.tflow", device=device) as loaded:
        assert isinstance(loaded, LoadedProgram)
        assert loaded.dispatch_variants == prog.dispatch_variants
        got = loaded(*[x.numpy() for x in inputs])
        assert isinstance(got, np.ndarray)
        assert_same([got], want)
        back = loaded(*inputs)  # torch in, torch out
        assert isinstance(back, torch.Tensor)
        assert_same(as_list(back), want)
    prog.close()


def test_awkward_shapes_nan_inf_and_three_outputs(device, tmp_path):
    x, z = awkward_inputs()
    prog, want = _saved(device, Awkward(), (x, z), tmp_path / "a.tflow")
    assert np.isnan(want[0]).any() and np.isinf(want[2]).any()
    with texelflow.load(tmp_path / "a.tflow", device=device) as loaded:
        got = loaded(x.numpy(), z.numpy())
        assert isinstance(got, tuple) and len(got) == 3
        assert_same(list(got), want)
        assert [s["shape"] for s in loaded.output_specs] == [[1, 5, 7, 5], [3], [1, 3, 5, 7]]
    prog.close()


def test_narrowed_int64_input_and_list_output(device, tmp_path):
    idx = torch.tensor([[0, 3, 6]])
    prog, want = _saved(device, Embed(), (idx,), tmp_path / "e.tflow")
    with texelflow.load(tmp_path / "e.tflow", device=device) as loaded:
        assert loaded.input_specs == [{"name": "idx", "shape": [1, 3], "dtype": "int64"}]
        got = loaded(idx.numpy())
        assert isinstance(got, list)
        assert_same(got, want)
        with pytest.raises(texelflow.InputValueError, match="outside the int32 range"):
            loaded(np.array([[0, 2**40, 1]], np.int64))
    prog.close()


class Classify(torch.nn.Module):
    """A classifier head with its argmax: int64 indices from the device (int32, held narrowed), a
    folded constant (the positions), a bool any."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 5)

    def forward(self, x):
        y = self.fc(x)
        return y.argmax(-1), y.max(-1).values, (y > 0).any(-1)


def test_argmax_indices_round_trip_as_int64_without_torch(device, tmp_path):
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    prog, want = _saved(device, Classify(), (x,), tmp_path / "c.tflow")
    assert prog.plan.fallbacks == [] and want[0].dtype == np.int64
    prog.close()
    assert_same(run_without_torch(tmp_path / "c.tflow", [x.numpy()], tmp_path), want)


def test_two_saves_are_byte_identical(device, tmp_path):
    model, inputs = tiny_resnet()
    prog = texelflow.compile(model, inputs, device=device)
    prog.save(tmp_path / "a.tflow")
    prog.save(tmp_path / "b.tflow")
    assert (tmp_path / "a.tflow").read_bytes() == (tmp_path / "b.tflow").read_bytes()
    prog.close()


def test_loads_and_runs_where_torch_cannot_be_imported(device, tmp_path):
    x, z = awkward_inputs()
    prog, want = _saved(device, Awkward(), (x, z), tmp_path / "a.tflow")
    prog.close()
    assert_same(run_without_torch(tmp_path / "a.tflow", [x.numpy(), z.numpy()], tmp_path), want)


def test_bad_calls_and_closed_program_say_so(device, tmp_path):
    model, inputs = tiny_resnet()
    _saved(device, model, inputs, tmp_path / "m.tflow")[0].close()
    loaded = texelflow.load(tmp_path / "m.tflow", device=device)
    x = inputs[0].numpy()
    with pytest.raises(texelflow.InputTypeError, match="takes 1 inputs"):
        loaded(x, x)
    with pytest.raises(texelflow.InputValueError, match="input 'x': expected shape"):
        loaded(x[:, :2])
    with pytest.raises(texelflow.InputValueError, match="expected dtype float32, got float64"):
        loaded(x.astype(np.float64))
    assert "dispatches" in loaded.summary() and "planner=" in loaded.summary()
    loaded.close()
    loaded.close()  # idempotent
    with pytest.raises(texelflow.ProgramClosedError):
        loaded(x)


class ReturnsBuffer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.tensor([[1.0, float("nan"), -float("inf")], [0.0, -0.0, 3.5]]))

    def forward(self, x):
        return x * 2.0, self.table


def test_a_returned_constant_comes_from_the_file_as_a_fresh_array(device, tmp_path):
    x = torch.tensor([[1.0, float("nan"), 3.0], [float("inf"), -1.0, 0.5]])
    prog, want = _saved(device, ReturnsBuffer(), (x,), tmp_path / "c.tflow")
    prog.close()
    with texelflow.load(tmp_path / "c.tflow", device=device) as loaded:
        got = loaded(x.numpy())
        assert_same(list(got), want)
        got[1][...] = 7.0  # the caller's copy: the next call still returns the saved table
        assert_same(list(loaded(x.numpy())), want)
