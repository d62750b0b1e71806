"""Issue 9, item 3: NaN and +-Inf flow through compiled programs as they do through torch.

The minimal reproducers of the report (relu(NaN) gave 0, clamp(NaN, -1, 1) gave -1), then every
unary and binary op of the registry, compiled whole through the public API: each input mixes NaN,
+Inf, -Inf, signed zeros and ordinary values, and the output must equal torch's, NaN where torch
has NaN. (tests/kernels/test_registry_ops.py does the same per shader variant and representation.)
"""
from __future__ import annotations

import pytest
import torch

import texelflow
from texelflow.generated.ops import OPS

from .models import Call

SPECIAL = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1.5, -2.25, 0.5, -0.75, 3.0, 7.0, -1.0])
# torch's own exact gelu is inconsistent at +Inf (NaN from its vectorised kernel, +Inf from its
# scalar path, depending on the tensor's size), so +Inf is left out of its input.
NO_POS_INF = {"gelu"}
# Scalar arguments torch requires a value for.
SCALARS = {"clamp": (-1.0, 1.0)}
# The scalar forms (aten.<op>.Scalar, pow.Tensor_Scalar): their Scalar operand.
SCALARS.update({"add_scalar": (2.0,), "sub_scalar": (2.0,), "mul_scalar": (-3.0,), "div_scalar": (0.5,),
                "rsub_scalar": (1.0,), "pow_tensor_scalar": (0.5,)})
SCALARS.update({f"{cmp}_scalar": (0.0,) for cmp in ("eq", "ne", "lt", "le", "gt", "ge")})
SCALARS.update({"fmod_scalar": (0.7,), "remainder_scalar": (-2.5,), "copysign_scalar": (-1.0,)})


def _target(op):
    ns, name, overload = op.targets[0].split(".")
    return getattr(getattr(getattr(torch.ops, ns), name), overload)



def _compare(device, fn, *inputs):
    want = fn(*inputs)
    with torch.no_grad():
        prog = texelflow.compile(Call(fn), inputs, device=device)
    try:
        assert not prog.plan.fallbacks, prog.plan.fallbacks
        got = prog(*inputs)
    finally:
        prog.close()
    torch.testing.assert_close(got, want, equal_nan=True, rtol=1e-5, atol=1e-6)


def test_relu_keeps_nan(device):
    _compare(device, torch.relu, torch.tensor([float("nan"), -1.0, 2.0]))


def test_clamp_keeps_nan(device):
    _compare(device, lambda x: torch.clamp(x, -1, 1), torch.tensor([float("nan"), -3.0, 0.5, 3.0]))


def _ops(template):
    """Ops of `template` a model can call (texelflow.* ops, such as precision's casts, are made by passes)."""
    return sorted(name for name, op in OPS.items() if op.template == template and "float32" in op.dtypes
                  and not op.targets[0].startswith("texelflow."))


@pytest.mark.parametrize("name", _ops("unary"))
def test_unary_op_on_nan_and_inf(device, name):
    x = SPECIAL.reshape(3, 4).clone()
    if name in NO_POS_INF:
        x[x == float("inf")] = 4.0
    fn = _target(OPS[name])
    scalars = SCALARS.get(name, ())
    _compare(device, lambda t: fn(t, *scalars), x)


@pytest.mark.parametrize("name", _ops("binary"))
def test_binary_op_on_nan_and_inf(device, name):
    x = SPECIAL.reshape(3, 4).clone()
    y = SPECIAL.roll(5).reshape(3, 4).clone()
    _compare(device, _target(OPS[name]), x, y)
    _compare(device, _target(OPS[name]), x, y[:1])  # broadcasting
