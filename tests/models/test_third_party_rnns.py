"""Recurrent models written the way speech, text and time-series code writes them (nn.LSTM,
nn.GRU, nn.RNN, stacked, bidirectional, with projections and given initial states): each must
plan with no CPU fallback and match eager PyTorch within 1e-4 of the output's largest value.

No Vulkan op implements `aten.lstm.input` or `aten.gru.input`. Lowering decomposes them with torch's
own decompositions, which unroll the time loop into linear ops (decompose.py: the composite GRU
kernel cannot be traced over fake tensors, and the LSTM one picks oneDNN's fused layer unless
oneDNN is off while tracing). The weights the unrolled steps transpose stay constants
(lowering folds pieces computed from constants alone), so no step transposes a weight.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import texelflow
from texelflow.demo import compare

TOLERANCE = 1e-4  # max |texelflow - eager| <= TOLERANCE * max |eager|


class Recurrent(nn.Module):
    """An nn.LSTM / GRU / RNN returning its output sequence and final state(s), optionally fed
    an initial state, then a linear head on the last step (a classifier's usual shape)."""

    def __init__(self, kind: str, head: int = 0, **kwargs):
        super().__init__()
        self.rnn = getattr(nn, kind)(**kwargs)
        out = kwargs.get("proj_size") or kwargs["hidden_size"]
        self.head = nn.Linear(out * (2 if kwargs.get("bidirectional") else 1), head) if head else None

    def forward(self, x, *state):
        y, final = self.rnn(x, *state) if state else self.rnn(x)
        finals = final if isinstance(final, tuple) else (final,)
        if self.head is None:
            return (y, *finals)
        last = y[:, -1] if self.rnn.batch_first else y[-1]
        return (self.head(last), *finals)


def _initial_state(kind, kwargs, batch):
    layers = kwargs.get("num_layers", 1) * (2 if kwargs.get("bidirectional") else 1)
    h = torch.randn(layers, batch, kwargs.get("proj_size") or kwargs["hidden_size"])
    if kind == "LSTM":
        return ((h, torch.randn(layers, batch, kwargs["hidden_size"])),)
    return (h,)


CASES = {
    # name: (kind, kwargs, input shape, initial state given, head width)
    "lstm_batch_first_classifier": ("LSTM", dict(input_size=13, hidden_size=21, batch_first=True), (2, 7, 13), False, 5),
    "lstm_stacked_bidirectional": ("LSTM", dict(input_size=6, hidden_size=9, num_layers=2, bidirectional=True),
                                   (5, 3, 6), False, 0),
    "lstm_projection_with_state": ("LSTM", dict(input_size=7, hidden_size=11, proj_size=5, batch_first=True),
                                   (3, 4, 7), True, 0),
    "gru_bidirectional_with_state": ("GRU", dict(input_size=5, hidden_size=7, num_layers=2, bidirectional=True,
                                                 batch_first=True), (1, 5, 5), True, 0),
    "gru_no_bias": ("GRU", dict(input_size=4, hidden_size=3, bias=False), (6, 1, 4), False, 3),
    "rnn_relu": ("RNN", dict(input_size=6, hidden_size=3, nonlinearity="relu"), (4, 1, 6), False, 0),
    "rnn_tanh_stacked": ("RNN", dict(input_size=3, hidden_size=5, num_layers=3, batch_first=True),
                         (2, 3, 3), True, 0),
}


def build(name):
    kind, kwargs, shape, with_state, head = CASES[name]
    torch.manual_seed(0)
    model = Recurrent(kind, head, **kwargs).eval()
    x = torch.randn(*shape)
    batch = shape[0] if kwargs.get("batch_first") else shape[1]
    return model, (x, *_initial_state(kind, kwargs, batch)) if with_state else (x,)


def _call(model, inputs):
    x, *state = inputs
    return model(x, *state)


class WithState(nn.Module):
    """The LSTM's (h0, c0) pair passed as two tensors, since an exported input is a tensor."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x, h0, c0):
        return self.model(x, (h0, c0))


def _exportable(model, inputs):
    if len(inputs) == 2 and isinstance(inputs[1], tuple):
        return WithState(model).eval(), (inputs[0], *inputs[1])
    return model, inputs


@pytest.mark.parametrize("name", sorted(CASES))
def test_recurrent_model_runs_whole_on_the_device_and_matches_eager(name, device):
    model, inputs = _exportable(*build(name))
    with texelflow.compile(model, inputs, device=device) as prog:
        assert prog.plan.fallbacks == [], f"{name} runs on the CPU: {prog.plan.fallbacks}"
        ops = {n.op.name for n in prog.plan.graph.nodes if n.op is not None}
        got = prog(*inputs)
    assert not {"lstm", "gru", "rnn_tanh", "rnn_relu"} & ops, ops
    with torch.no_grad():
        want = model(*inputs)
    check = compare(got, want)
    assert check.max_abs <= TOLERANCE * check.max_ref, (
        f"{name}: max |texelflow - eager| = {check.max_abs:.3g} > {TOLERANCE} x {check.max_ref:.3g}")


def test_unrolled_steps_take_the_weights_as_constants():
    """Each step's hidden-state product multiplies by a constant of the plan (folded at lowering
    from the decomposition's weight.t()), not a transpose computed on every call: a packed linear
    (prepack_matmul._weight_as_linear) reading a prepacked constant (the head: nn.Linear's)."""
    from texelflow.runtime.graph.prepack_matmul import PACKED_OPS

    model, inputs = build("gru_no_bias")
    plan = texelflow.plan(model, inputs)
    assert plan.fallbacks == []
    names = [n.op.name for n in plan.graph.nodes if n.op is not None]
    assert not any(name.startswith(("permute", "transpose")) for name in names), names
    steps = inputs[0].shape[0]
    products = [n for n in plan.graph.nodes if n.op is not None and n.op.name in PACKED_OPS]
    assert len(products) == steps + 1, names  # the input projection, the steps after the first, the head
    for node in products:
        weight = node.arg("weight")
        assert weight.role.name == "CONST" and weight.derive.recipe in ("matmul_weight_kn", "linear_weight_kn"), node.name
        assert weight.derive.sources[0].role.name == "CONST", node.name


def test_a_long_sequence_plans_in_seconds():
    """The unrolled loop grows with the sequence: 100 steps of a GRU give some 1,800 nodes, and
    the plan (lowering, fusion, the certified layout plan) still takes seconds, not minutes."""
    torch.manual_seed(0)
    model = Recurrent("GRU", 0, input_size=8, hidden_size=16, batch_first=True).eval()
    plan = texelflow.plan(model, (torch.randn(1, 100, 8),))
    assert plan.fallbacks == []
    assert plan.optimal
    assert sum(plan.timings.values()) < 60, plan.timings
