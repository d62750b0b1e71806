"""The public API and command line as a user meets them."""

from __future__ import annotations

import subprocess
from collections import Counter

import pytest

import torch

import texelflow
from texelflow.models import tiny_mixer, tiny_resnet
from texelflow.runtime.graph.fusion import fusion_op_name

# the expected plans (op counts, transitions) assume the CPU forms: keep them on a GPU too
pytestmark = pytest.mark.usefixtures("register_tiles")


def run(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(["texelflow", *args], capture_output=True, text=True, cwd=cwd)


def test_plan_accepts_an_exported_program():
    model, inputs = tiny_resnet()
    ep = torch.export.export(model, inputs)
    plan = texelflow.plan(ep)
    assert plan.num_transitions == 1 and plan.optimal
    # five convs: the three followed only by a relu run fused with it (conv2d_act)
    ops = Counter(fusion_op_name(n) for n in plan.graph.device_nodes())  # whichever conv kernel runs
    assert ops["conv2d"] == 2 and ops["conv2d_act"] == 3
    assert plan.dispatches["to_layout"] == 1
    assert plan.num_permutes == 0


class CpuOpModel(torch.nn.Module):
    """special.erfcx has no Vulkan kernel: the one node that runs on the CPU, between two device ops."""

    def forward(self, x):
        return torch.special.erfcx(x.relu()) * 2


def test_plan_reports_fallbacks_and_permutes():
    plan = texelflow.plan(*tiny_mixer())
    assert plan.fallbacks == [] and plan.num_permutes == 1
    plan = texelflow.plan(CpuOpModel(), (torch.randn(3, 5),))
    assert plan.fallbacks == [("special_erfcx", "no Vulkan op implements aten.special_erfcx.default")]
    dot = plan.to_dot()
    assert dot.startswith("digraph plan {") and "CPU: aten.special_erfcx.default" in dot
    # Transitions are drawn as diamonds. tiny_mixer has none since permute_copy re-lays out for
    # free (its conv's CP output leaves the permute WP for the layer norm); tiny_resnet keeps one.
    assert "shape=diamond" in texelflow.plan(*tiny_resnet()).to_dot()
    assert "shape=diamond" not in texelflow.plan(*tiny_mixer()).to_dot()


def test_unknown_planner_is_a_clear_error():
    try:
        texelflow.plan(*tiny_resnet(), planner="fastest")
    except ValueError as exc:
        assert "unknown planner 'fastest'" in str(exc)
    else:
        raise AssertionError("expected a ValueError")


def test_cli_plan_draws_an_svg(tmp_path):
    svg = tmp_path / "plan.svg"
    out = run("plan", "texelflow.models:tiny_mixer", "--svg", str(svg))
    assert out.returncode == 0, out.stderr
    # 0: the permute after the conv turns CP into WP itself (it used to need one to_layout)
    assert "planner=optimal  transitions=0" in out.stdout
    assert "fallbacks=0" in out.stdout
    assert svg.read_text().lstrip().startswith(("<?xml", "<svg"))


def test_cli_plan_bad_target_is_one_line():
    out = run("plan", "no_such_module:thing")
    assert out.returncode != 0
    assert "Traceback" not in out.stderr
    assert out.stderr.strip().startswith("texelflow: cannot load no_such_module:thing")


@pytest.mark.slow
def test_cli_demo_runs_on_the_device():
    out = run("demo")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "demo: OK" in out.stdout and "1 queue submit(s) per call" in out.stdout


@pytest.mark.parametrize("factory", [tiny_resnet, tiny_mixer])
def test_built_in_models_match_eager(factory, device):
    model, inputs = factory()
    prog = texelflow.compile(model, inputs, device=device)
    try:
        torch.testing.assert_close(prog(*inputs), model(*inputs), rtol=1e-4, atol=1e-5)
        assert prog.num_submits_per_call == 1 + len(prog.plan.fallbacks)
    finally:
        prog.close()
