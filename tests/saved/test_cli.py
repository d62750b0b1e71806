"""`texelflow compile / run / inspect`: a model compiled and saved from the command line, inspected
without a device, and run in a process where torch cannot be imported."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from tests.saved.helpers import ROOT
from texelflow.cli import main

BLOCKED_RUN = r"""
import sys
class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "torchao", "jinja2", "yaml"):
            raise ImportError(f"{name} is blocked in this process")
sys.meta_path.insert(0, Blocker())
from texelflow.cli import main
sys.exit(main(sys.argv[1:]))
"""


class SmallNet(torch.nn.Module):
    """Conv, activation, pooling and a linear: channels 3 -> 5, spatial 7 x 5, two outputs."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 5, 3, padding=1)
        self.fc = torch.nn.Linear(5, 3)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        return self.fc(y.mean(dim=(2, 3))), y

    @staticmethod
    def example_inputs():
        return (torch.randn(1, 3, 7, 5),)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "small.tflow"
    assert main(["compile", "tests.saved.test_cli:SmallNet", "-o", str(path)]) == 0
    return path


def _blocked(*args) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", BLOCKED_RUN, *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)


def test_compile_writes_a_file_that_inspect_describes(saved, capsys):
    assert saved.stat().st_size > 0
    assert main(["inspect", str(saved)]) == 0
    out = capsys.readouterr().out
    assert "inputs:  x float32[1, 3, 7, 5]" in out
    assert "outputs:" in out and "float32[1, 3]" in out and "float32[1, 5, 7, 5]" in out
    assert "dispatches" in out and "planner=" in out and "sizes: file" in out


def test_run_without_torch_matches_the_compiled_program(saved, tmp_path):
    """The file run by `texelflow run` in a torch-free process gives the in-process compiled
    program's outputs bit for bit (same kernels, NaN and Inf inputs included), and torch's to
    float32 tolerance where torch's answer is defined the same way (NaN propagation only: a
    Winograd tile spreads an Inf input, see tests/kernels/test_conv_kernels.py)."""
    import texelflow

    model = SmallNet()
    x = np.random.default_rng(3).standard_normal((1, 3, 7, 5)).astype(np.float32)
    x[0, 1, 2, 3] = np.nan
    x_inf = x.copy()
    x_inf[0, 2, 6, 4] = np.inf
    for i, arr in enumerate((x, x_inf)):
        np.save(tmp_path / f"x{i}.npy", arr)
        done = _blocked("run", saved, "--input", tmp_path / f"x{i}.npy", "--output", tmp_path / f"out{i}.npz",
                        "--bench", "3")
        assert done.returncode == 0, done.stderr[-2000:]
        assert "3 calls: median" in done.stdout
    with texelflow.compile(model, SmallNet.example_inputs()) as prog:
        for i, arr in enumerate((x, x_inf)):
            got = np.load(tmp_path / f"out{i}.npz")
            want = [w.numpy() for w in prog(torch.from_numpy(arr))]
            assert len(got.files) == len(want)
            for name, w in zip(got.files, want):
                assert got[name].dtype == w.dtype and got[name].tobytes() == w.tobytes(), name
    got = np.load(tmp_path / "out0.npz")
    with torch.no_grad():
        want = [w.numpy() for w in model(torch.from_numpy(x))]
    for name, w in zip(got.files, want):
        np.testing.assert_allclose(got[name], w, rtol=1e-4, atol=1e-4, equal_nan=True)


def test_run_with_random_inputs_and_inspect_need_no_torch(saved):
    done = _blocked("run", saved)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "float32 [1, 3]" in done.stdout
    done = _blocked("inspect", saved)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "variants:" in done.stdout


@pytest.mark.parametrize("args, message", [
    (["run", "{missing}"], "cannot read it"),
    (["inspect", "{missing}"], "cannot read it"),
    (["run", "{garbage}"], "texelflow run: "),
    (["inspect", "{garbage}"], "texelflow inspect: "),
])
def test_bad_files_are_one_line_errors(tmp_path, capsys, args, message):
    garbage = tmp_path / "garbage.tflow"
    garbage.write_bytes(b"\x80\x04not a texelflow file" * 8)
    args = [a.format(missing=tmp_path / "nope.tflow", garbage=garbage) for a in args]
    assert main(args) == 1
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_run_with_the_wrong_number_of_inputs_says_so(saved, tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((1, 3, 7, 5), np.float32))
    with pytest.raises(SystemExit, match="takes 1 input"):
        main(["run", str(saved), "--input", str(tmp_path / "a.npy"), "--input", str(tmp_path / "a.npy")])


def test_run_with_a_pickled_npy_is_refused(saved, tmp_path):
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(SystemExit, match="cannot read"):
        main(["run", str(saved), "--input", str(tmp_path / "obj.npy")])
