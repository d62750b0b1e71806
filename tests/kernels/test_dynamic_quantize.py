"""dynamic_quantize_dequantize: dynamic quantization's choose_qparams -> quantize -> dequantize in
one float pass, against torch's own three ops, bit for bit.

The registry test (test_registry_ops.py) runs the ops.yaml samples with observed ranges that hold
0 or lie above it; these add the ranges amin / amax give in practice but the samples cannot
(all below 0, a constant tensor, a range of one sign), exact rounding ties, and +-Inf and NaN in
the tensor quantized (not in the observed range, which would make torch's scale infinite).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from texelflow.generated.layouts import Layout, Storage
from texelflow.runtime.graph.repr import TensorRepr

from .nodecheck import build_node, explicit_case, run_nodes

REPRS = [TensorRepr(Storage.BUFFER, Layout.WIDTH_PACKED), TensorRepr(Storage.TEXTURE_3D, Layout.CHANNELS_PACKED),
         TensorRepr(Storage.BUFFER, Layout.CHANNELS_PACKED)]
EPS = 2.0**-12  # XNNPACKQuantizer's dynamic eps


def _name(r: TensorRepr) -> str:
    return f"{r.storage.name}-{r.layout.name}"


def _torch_round_trip(x: np.ndarray, quant_min: int, quant_max: int, eps: float) -> np.ndarray:
    """What a dynamically quantized PT2E graph computes: parameters from x itself."""
    ops = torch.ops.quantized_decomposed
    dtype = torch.uint8 if quant_max > 127 else torch.int8
    t = torch.from_numpy(x)
    scale, zero_point = ops.choose_qparams.tensor(t[torch.isfinite(t)], quant_min, quant_max, eps, dtype)
    q = ops.quantize_per_tensor.tensor(t, scale, zero_point, quant_min, quant_max, dtype)
    return ops.dequantize_per_tensor.tensor(q, scale, zero_point, quant_min, quant_max, dtype).numpy()


def _run(device, x: np.ndarray, repr_: TensorRepr, quant_min: int, quant_max: int, eps: float = EPS):
    from texelflow.generated.ops import OPS

    finite = x[np.isfinite(x)]
    lo, hi = np.array(finite.min(), np.float32), np.array(finite.max(), np.float32)
    sample = {"self": x.shape, "observed_min": (), "observed_max": (), "quant_min": quant_min,
              "quant_max": quant_max, "eps": eps}
    op = OPS["dynamic_quantize_dequantize"]
    case = explicit_case(op, sample, {"self": x, "observed_min": lo, "observed_max": hi}, "dynamic")
    node, arrays = build_node(op, "float32", case)
    scalar = TensorRepr(repr_.storage, Layout.WIDTH_PACKED)  # (a variant's tensors share its storage)
    [[out]] = run_nodes(device, [(node, arrays)], {"self": repr_, "out": repr_, "observed_min": scalar,
                                                    "observed_max": scalar}, "float32")
    return out.got


RANGES = {
    "straddles 0": lambda rng: rng.uniform(-3.0, 5.0, (2, 5, 3, 7)),
    "all below 0": lambda rng: rng.uniform(-9.0, -2.0, (1, 3, 5, 6)),
    "all above 0": lambda rng: rng.uniform(0.5, 4.0, (3, 7)),
    "constant": lambda rng: np.full((1, 6, 1, 5), 1.25),
    "zeros": lambda rng: np.zeros((5,)),
    "tiny": lambda rng: rng.uniform(-1e-6, 1e-6, (2, 9)),  # the scale is eps
}


@pytest.mark.parametrize("quant_range", [(-128, 127), (0, 255), (-127, 127)], ids=str)
@pytest.mark.parametrize("kind", sorted(RANGES))
@pytest.mark.parametrize("repr_", REPRS, ids=_name)
def test_matches_torchs_dynamic_round_trip_bit_for_bit(device, repr_, kind, quant_range):
    x = RANGES[kind](np.random.default_rng(5)).astype(np.float32)
    got = _run(device, x, repr_, *quant_range)
    want = _torch_round_trip(x, *quant_range, EPS)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), err_msg=f"{kind} {_name(repr_)}")


@pytest.mark.parametrize("repr_", REPRS, ids=_name)
def test_ties_infinities_and_nan(device, repr_):
    """Values on rounding ties of the scale the range gives, +-Inf (the range's ends) and NaN
    (whose int8 value torch leaves undefined: 0 here, the zero point)."""
    scale_range = np.float32(255 * 0.25)  # from -25.5 to 38.25: scale 0.25, zero point -26
    x = np.concatenate([np.arange(-102, 153, dtype=np.float32) * 0.125 * 2 - 25.5 + 0.125,
                        [np.float32(-25.5), np.float32(-25.5) + scale_range]]).astype(np.float32)
    got = _run(device, x.reshape(1, 1, 1, -1), repr_, -128, 127)
    want = _torch_round_trip(x.reshape(1, 1, 1, -1), -128, 127, EPS)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    special = np.array([[np.inf, -np.inf, 1.0, np.nan, -2.0]], dtype=np.float32)
    got = _run(device, special, repr_, -128, 127)
    finite = _torch_round_trip(np.array([[1.0, -2.0]], np.float32), -128, 127, EPS)
    step = (np.float32(1.0) - np.float32(-2.0)) / np.float32(255)
    assert got[0, 2] == finite[0, 0] and got[0, 4] == finite[0, 1]
    assert got[0, 3] == 0.0  # NaN: the zero point
    assert np.isclose(got[0, 0], 1.0, atol=step) and np.isclose(got[0, 1], -2.0, atol=step)  # +-Inf clamp to the ends
