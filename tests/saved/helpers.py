"""Helpers of the saved-program tests: small models, and a child process in which torch, jinja2
and YAML cannot be imported, that loads a file, runs it and writes its outputs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

ROOT = Path(__file__).resolve().parents[2]

# The child: a meta-path finder refuses torch/jinja2/yaml before anything is imported.
CHILD = r"""
import sys
BLOCKED = ("torch", "torchao", "jinja2", "yaml", "safetensors.torch")
class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name in BLOCKED or name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is blocked in this process")
sys.meta_path.insert(0, Blocker())
import numpy as np
import texelflow
path, ins, outs = sys.argv[1:4]
arrays = np.load(ins)
with texelflow.load(path) as prog:
    result = prog(*[arrays[f"a{i}"] for i in range(len(arrays.files))])
result = [result] if isinstance(result, np.ndarray) else list(result)
np.savez(outs, **{f"o{i}": r for i, r in enumerate(result)})
leaked = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "jinja2", "yaml", "texelflow.codegen"))
assert not leaked, leaked
print("child ok", type(prog).__name__)
"""


def run_without_torch(path: Path, inputs: list[np.ndarray], tmp: Path) -> list[np.ndarray]:
    """Outputs of the file at `path` loaded and run in a fresh process where `import torch` fails."""
    ins, outs = tmp / "inputs.npz", tmp / "outputs.npz"
    np.savez(ins, **{f"a{i}": a for i, a in enumerate(inputs)})
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    done = subprocess.run([sys.executable, "-c", CHILD, str(path), str(ins), str(outs)], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "child ok LoadedProgram" in done.stdout
    got = np.load(outs)
    return [got[f"o{i}"] for i in range(len(got.files))]


def as_list(result) -> list[np.ndarray]:
    """A program's result (one tensor/array, or a tuple or list of them) as numpy arrays."""
    items = list(result) if isinstance(result, (tuple, list)) else [result]
    return [x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x) for x in items]


def assert_same(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    """Bit-for-bit equal: same shapes, dtypes and bytes (NaN payloads included)."""
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        assert g.tobytes() == w.tobytes()


class Awkward(nn.Module):
    """Sizes 1, 3, 5, 7, channels 3 and 5 (not multiples of 4), three outputs: a permuted device
    result, a reshaped one (a folded view read back on the host) and an input returned as is."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 5, 3, padding=1)
        self.lin = nn.Linear(7, 3)

    def forward(self, x, z):
        y = torch.relu(self.conv(x))
        return y.permute(0, 2, 3, 1), self.lin(z).reshape(-1), x


class Embed(nn.Module):
    """An int64 input the device holds narrowed to int32, and a list output."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(7, 5)

    def forward(self, idx):
        return [self.emb(idx) * 2.0]


def awkward_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 3, 5, 7, generator=g)
    x[0, 0, 0, 0], x[0, 1, 2, 3], x[0, 2, 4, 6] = float("nan"), float("inf"), -float("inf")
    z = torch.randn(1, 7, generator=g)
    z[0, 3] = float("nan")
    return x, z
