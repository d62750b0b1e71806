"""Input values a per-op `sample_values` range cannot describe, on the registry's samples.

test_registry_ops draws every input uniformly from one range per tensor. The cases here need
values of another kind: a negative base with integral exponents (pow), denominators of either
sign but away from zero (div), a NaN in addmm's `self` where beta = 0 (torch then ignores self).
They run the op's own samples, in every variant and representation, through the same lowering.
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest

from texelflow.generated.ops import OPS
from texelflow.generated.samples import SAMPLES
from texelflow.generated.variants import VARIANTS

from .nodecheck import check_variant, combo_id, explicit_case, random_array, tensor_args, variant_cases


def _signed(rng, shape, low, high):
    return (rng.choice([-1.0, 1.0], size=shape) * rng.uniform(low, high, size=shape)).astype(np.float32)


def _pow_negative_base(rng, name, shape):
    if name == "self":
        return _signed(rng, shape, 0.25, 3.0)
    return rng.integers(-3, 4, size=shape).astype(np.float32)  # integral exponents


def _div_signed(rng, name, shape):
    return _signed(rng, shape, 0.25, 4.0) if name == "other" else random_array(rng, shape, "float32")


def _addmm_nan_self(rng, name, shape):
    x = random_array(rng, shape, "float32")
    if name == "self":
        x[..., 0] = np.nan  # beta = 0: torch ignores self, NaN included
    return x


# name -> (op, which samples, input maker)
DOMAINS = {
    "pow-negative-base": ("pow", lambda s: True, _pow_negative_base),
    "div-signed-denominator": ("div", lambda s: True, _div_signed),
    "addmm-beta0-nan-self": ("addmm", lambda s: s.get("beta", 1.0) == 0.0, _addmm_nan_self),
}


def _cases(name):
    op_name, pick, make = DOMAINS[name]
    op = OPS[op_name]
    cases = []
    for i, sample in enumerate(SAMPLES[op_name]):
        if not pick(sample):
            continue
        rng = np.random.default_rng(zlib.crc32(f"{name}/{i}".encode()))
        inputs = {n: np.asarray(make(rng, n, shape), np.float32) for n, shape in tensor_args(op, sample)}
        cases.append(explicit_case(op, sample, inputs, f"{name} sample {i} {dict(sample)}"))
    assert cases, f"{name}: no sample of {op_name} qualifies"
    return cases


PARAMS = [(name, v, c) for name, (op, _, _) in DOMAINS.items() for v, c in variant_cases()
          if VARIANTS[v].op == op and VARIANTS[v].dtype == "float32"]


@pytest.mark.parametrize("name,vname,combo", PARAMS,
                         ids=[f"{n}-{v}-{combo_id(OPS[VARIANTS[v].op], c)}" for n, v, c in PARAMS])
def test_value_domain(device, name, vname, combo):
    failures = check_variant(device, vname, combo, _cases(name))
    assert not failures, "\n\n".join(msg for _, msg in failures)
