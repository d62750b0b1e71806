"""softmax and log_softmax on inputs uniform random samples never produce.

test_registry_ops injects one NaN, +inf and -inf per tensor. Here, on the ops' own samples, in
every variant and representation: logits around +-1000 (exp overflows unless the row maximum is
subtracted first), a whole line along the softmax dim of -inf (torch: NaN), and a line that is
half -inf (those elements 0, the rest a softmax of their own).
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest

from texelflow.generated.ops import OPS
from texelflow.generated.samples import SAMPLES
from texelflow.generated.variants import VARIANTS

from .nodecheck import check_variant, combo_id, explicit_case, variant_cases

SOFTMAX_OPS = ("softmax", "_softmax", "log_softmax", "_log_softmax")


def _logits(rng, shape, dim: int) -> np.ndarray:
    """Large logits with one all -inf line and one half -inf line along torch dim `dim`."""
    x = (rng.uniform(-3.0, 3.0, size=shape) + rng.choice([-1000.0, 1000.0])).astype(np.float32)
    if not shape:
        return np.full(shape, -np.inf, np.float32)
    dim %= len(shape)
    first = tuple(slice(None) if d == dim else 0 for d in range(len(shape)))
    last = tuple(slice(None) if d == dim else n - 1 for d, n in enumerate(shape))
    x[last][::2] = -np.inf
    x[first] = -np.inf  # when first and last are the same line, it is all -inf
    return x


def _cases(op_name):
    op = OPS[op_name]
    cases = []
    for i, sample in enumerate(SAMPLES[op_name]):
        rng = np.random.default_rng(zlib.crc32(f"{op_name}/{i}".encode()))
        inputs = {"self": _logits(rng, tuple(sample["self"]), sample["dim"])}
        cases.append(explicit_case(op, sample, inputs, f"large/-inf logits sample {i} {dict(sample)}"))
    return cases


# float32 variants: logits around +-1000 keep no fraction in float16 (spacing 0.5), and these
# references come from the float32 inputs; float16 is checked in test_registry_ops / test_fp16_precision.
PARAMS = [(v, c) for v, c in variant_cases() if VARIANTS[v].op in SOFTMAX_OPS and VARIANTS[v].dtype == "float32"]


@pytest.mark.parametrize("vname,combo", PARAMS, ids=[f"{v}-{combo_id(OPS[VARIANTS[v].op], c)}" for v, c in PARAMS])
def test_softmax_of_large_and_infinite_logits(device, vname, combo):
    cases = _cases(VARIANTS[vname].op)
    assert any(np.isnan(c.want[0]).any() for c in cases), "no case has an all -inf line"
    failures = check_variant(device, vname, combo, cases)
    assert not failures, "\n\n".join(msg for _, msg in failures)
