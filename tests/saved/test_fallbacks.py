"""Saved programs with CPU-fallback nodes (issue 14): the node is stored as data (its op's
qualified name, an argument tree, where its inputs come from) and run through `torch.ops` at load,
bit for bit like the compiled program; without torch the load itself says which nodes need it;
a tampered target never resolves to anything but a `torch.ops` overload."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import texelflow
from texelflow.runtime.saved import SchemaError

from .helpers import ROOT, as_list, assert_same, run_without_torch
from .test_malformed import _refused, _rewrite


class Mixed(torch.nn.Module):
    """Fallbacks of every kind of input: a folded permute feeding a two-output op (frexp), a
    keyword dtype (cumsum to float64), a constant buffer (nextafter), and a fallback output read
    by a later device segment (isclose's bools feeding where)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("sign", torch.tensor([[1.0, -0.0, float("nan"), -2.0, float("-inf")]]))

    def forward(self, a, b):
        m, e = torch.frexp(a.permute(1, 0))
        c = torch.cumsum(a, dim=1, dtype=torch.float64)
        picked = torch.where(torch.isclose(a, a.abs()) | (b > 0), a, b) * 3.0
        return m * 2.0, e, c, torch.nextafter(a, self.sign), picked


def _inputs(rows: int):
    g = torch.Generator().manual_seed(rows)
    a, b = torch.randn(rows, 5, generator=g), torch.randn(rows, 5, generator=g)
    a[0, 0], a[-1, 4], b[0, 1] = float("nan"), float("inf"), -float("inf")
    a[-1, 1] = -0.0
    return a, b


@pytest.fixture(scope="module")
def saved(tmp_path_factory, device):
    """A saved Mixed program (3 rows), its inputs and the compiled program's outputs."""
    path = tmp_path_factory.mktemp("fallbacks") / "mixed.tflow"
    a, b = _inputs(3)
    with texelflow.compile(Mixed(), (a, b), device=device) as prog:
        assert {name for name, _ in prog.plan.fallbacks} >= {"frexp", "cumsum", "nextafter", "isclose"}
        want = as_list(prog(a, b))
        prog.save(path)
    return path, (a, b), want


@pytest.mark.parametrize("rows", [1, 3, 7])
def test_fallbacks_round_trip_bit_for_bit(rows, device, tmp_path):
    a, b = _inputs(rows)
    with texelflow.compile(Mixed(), (a, b), device=device) as prog:
        want = as_list(prog(a, b))
        prog.save(tmp_path / "m.tflow")
    assert np.isnan(want[0]).any() and np.isnan(want[3]).any() and np.isnan(want[2]).any()
    with texelflow.load(tmp_path / "m.tflow", device=device) as loaded:
        assert_same(list(loaded(a.numpy(), b.numpy())), want)
        assert_same(as_list(loaded(a, b)), want)  # torch in, torch out
    assert {str(w.dtype) for w in want} == {"float32", "int32", "float64"}


def test_the_file_names_the_ops_and_the_torch_that_runs_them(saved):
    from texelflow.runtime.saved.reader import read

    doc = read(saved[0])[0]
    targets = [s["fallback"]["target"] for s in doc["segments"] if "fallback" in s]
    assert sorted(targets) == ["aten.cumsum.default", "aten.frexp.Tensor", "aten.isclose.default",
                               "aten.nextafter.default"]
    assert doc["torch_version"] == torch.__version__.split("+")[0]
    text = texelflow.runtime.saved.inspect(saved[0])
    assert "CPU fallbacks (need torch 2.13.0): " in text and "isclose (aten.isclose.default)" in text


_CHILD = r"""
import sys
class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "torchao"):
            raise ImportError(f"{name} is blocked in this process")
sys.meta_path.insert(0, Blocker())
import texelflow
try:
    texelflow.load(sys.argv[1])
except texelflow.runtime.saved.MissingDependencyError as exc:
    print("refused:", exc)
"""


def test_without_torch_the_load_says_which_nodes_need_it(saved):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    done = subprocess.run([sys.executable, "-c", _CHILD, str(saved[0])], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"refused: {saved[0]}: nodes "), done.stdout
    for word in ("frexp (aten.frexp.Tensor)", "isclose (aten.isclose.default)", "cumsum", "nextafter",
                 "pip install torch==2.13.0"):
        assert word in lines[0], lines[0]


def test_a_device_only_program_still_loads_without_torch(device, tmp_path):
    class Plain(torch.nn.Module):
        def forward(self, a):
            return torch.relu(a) * 2.0

    a = torch.tensor([[1.0, float("nan"), -float("inf")], [0.5, -0.0, 7.0]])
    with texelflow.compile(Plain(), (a,), device=device) as prog:
        want = as_list(prog(a))
        prog.save(tmp_path / "p.tflow")
    assert_same(run_without_torch(tmp_path / "p.tflow", [a.numpy()], tmp_path), want)


def _retarget(target, args=None):
    def edit(e):
        node = next(s["fallback"] for s in e["program"]["segments"] if "fallback" in s)
        node["target"] = target
        if args is not None:
            node["args"] = args
    return edit


@pytest.mark.parametrize("target, words", [
    ("builtins.eval", "is not <namespace>.<op>.<overload>"),
    ("os.system.default", "outside the op namespaces"),
    ("aten.signbit.default.__class__", "is not <namespace>.<op>.<overload>"),
    ("aten.__init__.default", "is not <namespace>.<op>.<overload>"),
    ("aten.signbit.__call__", "is not <namespace>.<op>.<overload>"),
    ("aten.signbit.out_of_range", "is not an op of this torch"),
    ("aten.no_such_op.default", "is not an op of this torch"),
])
def test_a_tampered_target_is_refused_and_nothing_runs(saved, device, tmp_path, target, words):
    marker = tmp_path / "pwned"
    command = {"list": [{"str": f"touch {marker}"}]}
    bad = _rewrite(saved[0], tmp_path / "t.tflow", _retarget(target, command))
    error = SchemaError
    _refused(bad, device, error, "fallback", words)
    assert not marker.exists()


@pytest.mark.parametrize("edit, words", [
    (lambda n: n["args"].update({"list": [{"input": 7}]}), "input index outside"),
    (lambda n: n["args"].update({"list": [{"code": "print(1)"}]}), "unknown argument kind 'code'"),
    (lambda n: n["inputs"][0].update(source="fallback", index=99), "fallback 99 is not available"),
    (lambda n: n["inputs"][0].update(source="device", index=10**6), "is not available"),
])
def test_a_fallback_outside_the_schema(saved, device, tmp_path, edit, words):
    def apply(e):
        edit(next(s["fallback"] for s in e["program"]["segments"] if "fallback" in s))

    _refused(_rewrite(saved[0], tmp_path / "s.tflow", apply), device, SchemaError, words)


def test_a_named_argument_that_is_not_a_dtype_is_refused_at_load(saved, device, tmp_path):
    def edit(e):
        node = next(s["fallback"] for s in e["program"]["segments"]
                    if "fallback" in s and s["fallback"]["kwargs"])
        node["kwargs"]["dtype"] = {"dtype": "Tensor"}

    _refused(_rewrite(saved[0], tmp_path / "d.tflow", edit), device, SchemaError, "'Tensor' is not a torch dtype")
