"""Random models of the ops the registry implements, with CPU fallbacks in between, compiled and
run on the Vulkan device: outputs must equal eager PyTorch, whatever the planner chose."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import texelflow

# (name, function of one tensor) — every one keeps the shape [1, 4, 8, 8].
UNARY = {
    "relu": torch.relu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "neg": torch.neg,
    "abs": torch.abs,
    "exp_small": lambda x: torch.exp(x * 0.1),
    "gelu": F.gelu,
    "hardswish": F.hardswish,
    "clamp": lambda x: torch.clamp(x, -0.5, 0.5),
    "clone": lambda x: x.clone(),
    "view_roundtrip": lambda x: x.view(4, 64).view(1, 4, 8, 8),
    "max_pool": lambda x: F.max_pool2d(x, 3, stride=1, padding=1),
    "avg_pool": lambda x: F.avg_pool2d(x, 1),
    "permute_back": lambda x: x.permute(0, 2, 3, 1).permute(0, 3, 1, 2),
    "layer_norm": lambda x: F.layer_norm(x, (8,)),
    "cumsum": lambda x: torch.cumsum(x, dim=3),
    # Not implemented on Vulkan: these fall back to PyTorch on the CPU.
    "erfcx_cpu": torch.special.erfcx,
    "i1e_cpu": torch.special.i1e,
}
BINARY = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "maximum": torch.maximum,
    "minimum": torch.minimum,
}


class Random(torch.nn.Module):
    def __init__(self, steps):
        super().__init__()
        self.steps = steps

    def forward(self, x, y):
        values = [x, y]
        for kind, name, i, j in self.steps:
            a = values[i % len(values)]
            if kind == "u":
                values.append(UNARY[name](a))
            else:
                values.append(BINARY[name](a, values[j % len(values)]))
        return values[-1], values[-2]


steps = st.lists(
    st.one_of(
        st.tuples(st.just("u"), st.sampled_from(sorted(UNARY)), st.integers(0, 9), st.just(0)),
        st.tuples(st.just("b"), st.sampled_from(sorted(BINARY)), st.integers(0, 9), st.integers(0, 9)),
    ),
    min_size=2,
    max_size=7,
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(steps=steps, planner=st.sampled_from(["optimal", "greedy"]))
def test_random_models_match_eager(steps, planner, device):
    model = Random(steps)
    inputs = (torch.randn(1, 4, 8, 8), torch.randn(1, 4, 8, 8))
    prog = texelflow.compile(model, inputs, planner=planner, device=device)
    try:
        got, want = prog(*inputs), model(*inputs)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
        cpu = {name for name, _ in prog.plan.fallbacks}
        assert all("erfcx" in n or "i1e" in n for n in cpu), prog.plan.fallbacks
    finally:
        prog.close()


def test_model_with_no_supported_op_runs_on_cpu(device):
    class AllCpu(torch.nn.Module):
        def forward(self, x):
            return torch.special.erfcx(torch.special.i1e(x))

    x = torch.randn(5, 3)
    prog = texelflow.compile(AllCpu(), (x,), device=device)
    try:
        torch.testing.assert_close(prog(x), AllCpu()(x))
        assert [n for n, _ in prog.plan.fallbacks] == ["special_i1e", "special_erfcx"]
        assert all("no Vulkan op implements" in why for _, why in prog.plan.fallbacks)
        assert prog.plan.dispatches == {}
    finally:
        prog.close()


def test_fallback_between_device_segments_says_why(device):
    class Mixed(torch.nn.Module):
        def forward(self, x):
            return torch.sigmoid(torch.special.erfcx(torch.relu(x))) + 1.0

    x = torch.randn(2, 7, 3)
    prog = texelflow.compile(Mixed(), (x,), device=device)
    try:
        torch.testing.assert_close(prog(x), Mixed()(x))
        assert prog.plan.fallbacks == [("special_erfcx", "no Vulkan op implements aten.special_erfcx.default")]
        assert prog.num_submits_per_call == 2
        assert "fallback: no Vulkan op implements aten.special_erfcx.default" in prog.plan.summary()
    finally:
        prog.close()
