"""`texelflow tune` on the real device: it measures a cost table fast, stores it keyed by the device,
and compile then plans by predicted time, with predicted and measured time side by side."""

from __future__ import annotations

import json

import pytest
import torch

import texelflow
from texelflow.cli import main as cli_main
from texelflow.runtime import tune
from texelflow.runtime.graph.costs import CostModel, node_signature, table_path


@pytest.fixture(scope="module")
def tuned(device, tmp_path_factory):
    """`texelflow tune --quick` run once, through the CLI, into a scratch table folder."""
    folder = tmp_path_factory.mktemp("costs")
    mp = pytest.MonkeyPatch()
    mp.setenv("TEXELFLOW_COSTS_DIR", str(folder))
    rc = cli_main(["tune", "--quick"])
    yield rc, table_path(tune.device_key(device))
    mp.undo()


def test_quick_tune_finishes_and_writes_a_table_keyed_by_the_device(device, tuned):
    rc, path = tuned
    assert rc == 0 and path.is_file()
    doc = json.loads(path.read_text())
    assert doc["samples"] > 100 and doc["seconds"] > 0  # the run finished: every job timed, the file written
    info = doc["device_info"]
    assert info["name"] == device.limits.name and doc["device"] == device.limits.name
    assert {"vendor_id", "device_id", "driver_version"} <= set(info)
    assert f"{info['vendor_id']:04x}" in path.name and doc["quick"] is True
    if device.limits.device_type == "cpu":  # lavapipe: the processor is part of the device
        assert info["host_cpu"] == tune.host_cpu() and tune.device_key(device).endswith(info["host_cpu"])
    model = CostModel.from_json(path.read_text(), str(path))
    classes = {c for c, _ in model.entries}
    assert {"relu", "unary", "add", "binary", "to_layout", "*"} <= classes
    # convolutions and linear layers, under whichever kernels fusion picks for them today
    assert any(c.startswith("conv2d") for c in classes) and any("linear" in c for c in classes), classes
    assert "*compute" in classes and any(k.per_flop > 0 for k in model.entries.values())
    for (c, r), k in model.entries.items():  # physical: nothing negative, every dispatch costs something
        assert k.fixed >= 0 and k.per_byte >= 0 and k.per_flop >= 0 and k.seconds(1 << 20, 1 << 20) > 0, (c, r)


@pytest.mark.parametrize("quick", [True, False])
def test_the_tuning_set_times_convolutions_at_a_real_network_width(quick):
    """Fitted on 32-channel convolutions alone, per-FLOP cost overstated ResNet's about 3x."""
    widths = set()
    for name, factory in tune._models(quick):
        module, inputs = factory()
        widths |= {m.in_channels for m in module.modules() if isinstance(m, torch.nn.Conv2d) and m.groups == 1}
    assert max(widths) >= 128 and min(widths) <= 32, widths


def test_the_full_tuning_set_times_the_zoo_at_its_real_size():
    """Fitted on small models alone, predictions at 224 px missed single nodes 3-10x."""
    names = [name for name, _ in tune._models(False)]
    assert all(f"{zoo} {tune.ZOO_SIZE}" in names for zoo in tune.ZOO_TUNED) and tune.ZOO_SIZE == 224
    assert not any(zoo in name for name, _ in tune._models(True) for zoo in tune.ZOO_TUNED)  # --quick stays small


def test_the_table_keeps_each_nodes_measured_time_and_predicts_it(device, tuned):
    """A node the tuner timed is predicted as it measured it, not by the fit; one it never saw by the fit."""
    _, path = tuned
    model = CostModel.from_json(path.read_text(), str(path))
    assert len(model.measured) > 100 and all(t > 0 for t in model.measured.values())
    limits = tune._limits(device)
    graph = tune._lowered(*tune._models(True)[0][1](), "register")  # the first tuning model: its nodes were timed
    checked = differs = 0
    for node in graph.device_nodes():
        for r in tune.REPRS:
            slots = tune.uniform_slots(node, r, limits)
            known = model.measured.get((node_signature(node), str(r)))
            if slots is None or known is None:
                continue
            fitted = CostModel("table", model.device, model.entries)  # the same coefficients, no times
            assert model.node_seconds(node, slots) == pytest.approx(known, rel=1e-9) or \
                model.node_seconds(node, slots) > known  # only when the other slots' fitted shares exceed it
            differs += fitted.node_seconds(node, slots) != pytest.approx(known, rel=1e-6)
            checked += 1
    assert checked >= 6 and differs > 0, (checked, differs)  # the fit alone would have predicted otherwise


def test_the_table_prices_a_permute_by_its_pair_of_representations(device, tuned):
    """NCHW -> NHWC (the conv block's permute): timed on its fast path, channels-packed in and
    width-packed out, and on its general path in each uniform representation, which costs more."""
    from texelflow.runtime.graph.costs import GENERAL, fast_pair
    from texelflow.runtime.graph.repr import TensorRepr

    _, path = tuned
    model = CostModel.from_json(path.read_text(), str(path))
    assert any(c == "permute_copy" + GENERAL for c, _ in model.entries)
    name, factory = next((n, f) for n, f in tune._models(True) if n.startswith("conv block"))
    node = next(n for n in tune._lowered(*factory(), "register").device_nodes() if n.op.name == "permute_copy")
    cp, wp = TensorRepr.parse("TEXTURE_3D/CHANNELS_PACKED"), TensorRepr.parse("TEXTURE_3D/WIDTH_PACKED")
    assert fast_pair(node, cp, wp) and not fast_pair(node, wp, wp)
    assert (node_signature(node), str(wp)) in model.measured  # the fast pair, timed
    assert (node_signature(node) + GENERAL, str(wp)) in model.measured  # the general path, timed
    fast = model.node_seconds(node, {"self": cp, "out": wp})
    general = model.node_seconds(node, {"self": wp, "out": wp})
    if device.limits.device_type == "cpu":
        assert general > 1.5 * fast, (name, general, fast)  # 5-10x on lavapipe
    else:  # a GPU runs this small block near its launch cost either way (1.14x on an H200)
        assert general != fast, (name, general, fast)  # each path has its own measured time


def test_the_fit_predicts_the_measured_kernels(device):
    samples = tune.measure(device, quick=True, reps=3)
    model = tune.fit_table(samples, device.limits.name)
    assert len(samples) > 100
    assert tune.fit_error(model, samples) < 0.25  # median |predicted / measured - 1|
    # one time per uniform representation the node accepts: relu runs in all six float ones
    relu = {str(s.repr) for s in samples if s.classes[0] == "relu"}
    assert len(relu) == 6


def test_compile_plans_by_the_table_and_profiles_predicted_beside_measured(device, tuned, monkeypatch):
    _, path = tuned
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
    with texelflow.compile(model, (x,), device=device, profile=True) as prog:  # default: the device's table
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
    with texelflow.compile(model, (x,), device=device, costs="none", profile=True) as prog:
        assert prog.plan.costs is None
        torch.testing.assert_close(prog(x), want, rtol=1e-4, atol=1e-5)
        rows = prog.profile()  # predicted by the device's table even when not planned by it
        assert any(r.predicted_us for r in rows)


def test_the_table_times_both_gemm_tilings_and_plans_by_them(device, tuned, monkeypatch):
    """The tuner times every GEMM in register and in workgroup tiles; with the table, each linear
    takes the tiling predicted faster for its shapes, and its note says so (on lavapipe, where a
    workgroup barrier is costly, the register tiles)."""
    from texelflow.runtime.graph.fusion import fuse_patterns
    from texelflow.runtime.graph.importer import export_program
    from texelflow.runtime.graph.lowering import lower
    from texelflow.runtime.graph.prepack_matmul import GEMM_ENV, subgroup_facts

    _, path = tuned
    model = CostModel.from_json(path.read_text(), str(path))
    classes = {c for c, _ in model.entries}
    assert {"linear_packed", "linear_wg", "mm_wg"} <= classes, classes
    monkeypatch.delenv(GEMM_ENV, raising=False)
    # a ViT-S/16 linear: big enough that the tilings' work, not the fixed cost of a dispatch (about
    # 0.1 ms for either), decides the prediction; at 20 x 32 -> 48 a loaded host flipped it (104
    # against 107 us predicted)
    graph = fuse_patterns(lower(export_program(torch.nn.Linear(384, 1152), (torch.randn(197, 384),))),
                          subgroup=subgroup_facts(device.limits), costs=model)
    node = graph.device_nodes()[0]  # where workgroup tiles win, split K may add linear_splitk_sum after it
    assert any("cost table" in note for note in node.fused), node.fused
    if device.limits.device_type == "cpu":
        assert [n.op.name for n in graph.device_nodes()] == ["linear_packed"], node.fused
    else:
        assert node.op.name in ("linear_packed", "linear_wg", "linear_wg_splitk"), node.fused
