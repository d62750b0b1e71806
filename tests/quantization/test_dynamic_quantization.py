"""Dynamically quantized PT2E graphs (XNNPACKQuantizer's and X86InductorQuantizer's dynamic configs):
each linear's input is quantized with parameters computed at run time,

    choose_qparams.tensor(x) -> (scale, zero_point)
    x -> quantize_per_tensor.tensor(scale, zero_point) -> dequantize_per_tensor.tensor -> linear

The q8ta fusion makes each such pair one float pass on the device, dynamic_quantize_dequantize
(x, amin(x), amax(x)), so the program runs whole on Vulkan; before, the three nodes ran on the CPU
with a host round trip per linear. The program must give the quantized graph's answer.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn

import texelflow
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

qd = torch.ops.quantized_decomposed
# Of the output's largest value. The linears sum in another order than torch's, and a sum that lands
# across a rounding boundary of the next dynamic quantization moves by one step (1/255 of that
# tensor's range). On lavapipe these models land on torch's steps (1e-7); the exact round trip
# itself is checked bit for bit below and in tests/kernels/test_dynamic_quantize.py.
TOLERANCE = 1e-2


def _xnnpack(per_channel: bool):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "XNNPACKQuantizer is deprecated"
        from torchao.testing.pt2e._xnnpack_quantizer import XNNPACKQuantizer, get_symmetric_quantization_config

        return XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=per_channel,
                                                                                is_dynamic=True))


def _x86():
    import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as x86

    return x86.X86InductorQuantizer().set_global(x86.get_default_x86_inductor_quantization_config(is_dynamic=True))


QUANTIZERS = {"xnnpack_per_channel": lambda: _xnnpack(True), "xnnpack_per_tensor": lambda: _xnnpack(False),
              "x86_uint8": _x86}


def _quantized(model, inputs, quantizer):
    prepared = prepare_pt2e(torch.export.export(model.eval(), inputs).module(), quantizer)
    prepared(*inputs)
    return convert_pt2e(prepared)


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.head = nn.Linear(13, 24), nn.Linear(24, 7), nn.Linear(7, 3)

    def forward(self, x):
        return self.head(torch.relu(self.fc2(torch.nn.functional.gelu(self.fc1(x)))))


class Encoder(nn.Module):
    """A transformer encoder layer (attention's in-projection and out-projection, the MLP) and a
    head: XNNPACK's dynamic config quantizes each linear's input on its own."""

    def __init__(self):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(16, 2, 40, dropout=0.0, batch_first=True)
        self.head = nn.Linear(16, 5)

    def forward(self, x):
        return self.head(self.layer(x)).mean(1)


def _check(model, inputs, quantizer, device):
    torch.manual_seed(0)
    quantized = _quantized(model, inputs, quantizer)
    chooses = [n for n in torch.export.export(quantized, inputs).graph.nodes if n.target == qd.choose_qparams.tensor]
    assert chooses, "the quantizer made no dynamic quantization"
    with texelflow.compile(quantized, inputs, device=device) as prog:
        assert prog.plan.fallbacks == [], prog.plan.fallbacks
        assert prog.plan.dispatches["dynamic_quantize_dequantize"] == len(chooses)
        got = prog(*inputs)
    with torch.no_grad():
        want = quantized(*inputs)
    assert (got - want).abs().max() <= TOLERANCE * want.abs().max()
    return prog


@pytest.mark.parametrize("quantizer", sorted(QUANTIZERS))
def test_a_dynamically_quantized_mlp_runs_whole_on_the_device(quantizer, device):
    torch.manual_seed(0)
    _check(Mlp(), (torch.randn(5, 13),), QUANTIZERS[quantizer](), device)


def test_a_dynamically_quantized_encoder_layer_runs_whole_on_the_device(device):
    torch.manual_seed(0)
    prog = _check(Encoder(), (torch.randn(2, 7, 16),), _xnnpack(True), device)
    note = next(n for n in prog.plan.graph.nodes if n.op is not None and n.op.name == "dynamic_quantize_dequantize")
    assert note.fused[0].startswith("choose_qparams") and "amin" in note.fused[0]


class Manual(nn.Module):
    """The three ops written out, their parameters also returned when `leak`."""

    def __init__(self, leak: bool = False, quant_range=(-128, 127)):
        super().__init__()
        self.leak, (self.lo, self.hi) = leak, quant_range

    def forward(self, x):
        dtype = torch.uint8 if self.hi > 127 else torch.int8
        scale, zero_point = qd.choose_qparams.tensor(x, self.lo, self.hi, 2.0**-12, dtype)
        q = qd.quantize_per_tensor.tensor(x * 3.0, scale, zero_point, self.lo, self.hi, dtype)
        y = qd.dequantize_per_tensor.tensor(q, scale, zero_point, self.lo, self.hi, dtype) + 1.0
        return (y, scale) if self.leak else y


@pytest.mark.parametrize("quant_range", [(-128, 127), (0, 255)], ids=str)
@pytest.mark.parametrize("x", [torch.randn(3, 5, 7), -torch.rand(6, 4) - 1.0, torch.full((2, 3), 0.75)],
                         ids=["randn", "all-negative", "constant"])
def test_the_round_trip_is_torchs_bit_for_bit(x, quant_range, device):
    """The quantized tensor need not be the one observed (here 3 x): its values clamp to the range."""
    model = Manual(quant_range=quant_range)
    with texelflow.compile(model, (x,), device=device) as prog:
        assert prog.plan.fallbacks == []
        assert torch.equal(prog(x), model(x))


def test_parameters_read_elsewhere_keep_the_nodes_on_the_cpu_with_their_reason(device):
    x = torch.randn(4, 6)
    with texelflow.compile(Manual(leak=True), (x,), device=device) as prog:
        reasons = dict(prog.plan.fallbacks)
        got = prog(x)
    assert "dynamic_quantize_dequantize" not in prog.plan.dispatches
    assert "computed at run time" in reasons["quantize_per_tensor"]
    want = Manual(leak=True)(x)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
