"""`texelflow tune` on the real device: it measures a cost table fast, stores it keyed by the device,
and compile then plans by predicted time, with predicted and measured time side by side."""

from __future__ import annotations

import json
import time

import pytest
import torch

import texelflow
from texelflow.cli import main as cli_main
from texelflow.runtime import tune
from texelflow.runtime.graph.costs import CostModel, table_path


@pytest.fixture(scope="module")
def tuned(device, tmp_path_factory):
    """`texelflow tune --quick` run once, through the CLI, into a scratch table folder."""
    folder = tmp_path_factory.mktemp("costs")
    mp = pytest.MonkeyPatch()
    mp.setenv("TEXELFLOW_COSTS_DIR", str(folder))
    start = time.perf_counter()
    rc = cli_main(["tune", "--quick"])
    seconds = time.perf_counter() - start
    yield rc, seconds, table_path(tune.device_key(device))
    mp.undo()


def test_quick_tune_is_fast_and_writes_a_table_keyed_by_the_device(device, tuned):
    rc, seconds, path = tuned
    assert rc == 0 and path.is_file()
    assert seconds < 60, f"tune --quick took {seconds:.0f} s"
    doc = json.loads(path.read_text())
    info = doc["device_info"]
    assert info["name"] == device.limits.name and doc["device"] == device.limits.name
    assert {"vendor_id", "device_id", "driver_version"} <= set(info)
    assert f"{info['vendor_id']:04x}" in path.name and doc["quick"] is True
    model = CostModel.from_json(path.read_text(), str(path))
    classes = {c for c, _ in model.entries}
    assert {"relu", "unary", "add", "binary", "to_layout", "*"} <= classes
    # convolutions and linear layers, under whichever kernels fusion picks for them today
    assert any(c.startswith("conv2d") for c in classes) and any("linear" in c for c in classes), classes
    assert "*compute" in classes and any(k.per_flop > 0 for k in model.entries.values())
    for (c, r), k in model.entries.items():  # physical: nothing negative, every dispatch costs something
        assert k.fixed >= 0 and k.per_byte >= 0 and k.per_flop >= 0 and k.seconds(1 << 20, 1 << 20) > 0, (c, r)


def test_the_fit_predicts_the_measured_kernels(device):
    samples = tune.measure(device, quick=True, reps=3)
    model = tune.fit_table(samples, device.limits.name)
    assert len(samples) > 100
    assert tune.fit_error(model, samples) < 0.25  # median |predicted / measured - 1|
    # one time per uniform representation the node accepts: relu runs in all six float ones
    relu = {str(s.repr) for s in samples if s.classes[0] == "relu"}
    assert len(relu) == 6


def test_compile_plans_by_the_table_and_profiles_predicted_beside_measured(device, tuned, monkeypatch):
    _, _, path = tuned
    monkeypatch.setenv("TEXELFLOW_COSTS_DIR", str(path.parent))

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.fc = torch.nn.LayerNorm(32), torch.nn.Linear(32, 48)

        def forward(self, x):
            return torch.nn.functional.gelu(self.fc(self.norm(x))).softmax(-1) + 1

    model, x = Block().eval(), torch.randn(1, 7, 32)
    with torch.no_grad():
        want = model(x)
    with texelflow.compile(model, (x,), device=device) as prog:  # default: the device's table
        plan = prog.plan
        assert plan.costs is not None and plan.costs.source == "table" and plan.optimal
        assert "predicted us" in plan.summary()
        torch.testing.assert_close(prog(x), want, rtol=1e-4, atol=1e-5)
        rows = prog.profile()
        assert rows and all(label == r.label and us == r.measured_us for r, (label, us) in zip(rows, rows))
        named = [r for r in rows if r.predicted_us is not None]
        ops = {r.op for r in named}
        assert "layer_norm" in ops and any("linear" in op for op in ops), ops
        assert all(r.predicted_us > 0 and r.measured_us > 0 for r in named)
        assert "total" in prog.profile_summary()
    with texelflow.compile(model, (x,), device=device, costs="none") as prog:
        assert prog.plan.costs is None
        torch.testing.assert_close(prog(x), want, rtol=1e-4, atol=1e-5)
        rows = prog.profile()  # predicted by the device's table even when not planned by it
        assert any(r.predicted_us for r in rows)
