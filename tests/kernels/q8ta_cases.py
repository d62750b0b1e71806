"""What the q8ta kernel tests at model sizes share (test_q8ta_linear.py, test_q8ta_conv2d.py):
running one explicit case on the device and comparing it with PyTorch's reference."""
from __future__ import annotations

import numpy as np

from texelflow.generated.layouts import Layout, Storage
from texelflow.generated.ops import OPS
from texelflow.runtime.graph.repr import TensorRepr

from .nodecheck import assert_padding_zero, build_node, run_nodes, sample_problem, variant_at

CONTIGUOUS = TensorRepr(Storage.BUFFER, Layout.WIDTH_PACKED)  # scales, zero points and bias


def run_q8ta_case(device, op_name: str, case, reprs: dict, int_dot: str = "plain"):
    """The kernel's Output for the case, its tensors in representations `reprs`, on its int_dot
    variant `int_dot` where the op has that axis."""
    node, arrays = build_node(OPS[op_name], "int8", case)
    assert sample_problem(OPS[op_name], node) is None
    [[out]] = run_nodes(device, [(node, arrays)], reprs, "int8",
                        expect_variant=variant_at(op_name, dtype="int8", int_dot=int_dot))
    return out


def assert_close_to_reference(case, out, what: str) -> None:
    """>= 99% of the outputs equal PyTorch's, none more than one step away, padding zero, and
    under 5% of the reference saturated (else the case would test too little)."""
    want = case.want[0].astype(np.int64)
    got = out.got.astype(np.int64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    diff = np.abs(got - want)
    exact = float(np.mean(diff == 0))
    lo, hi = case.sample["quant_min"], case.sample["quant_max"]
    relu = case.sample["activation"] == "relu"  # the zero point then holds every negative result
    saturated = float(np.mean((want == hi) | ((want == lo) & (not relu or lo != case.sample["out_zero_point"]))))
    print(f"{what}: {exact:.2%} exact, max |diff| {diff.max()}, {saturated:.2%} saturated")
    assert diff.max() <= 1, f"{what}: {int(np.sum(diff > 1))} outputs more than one step from the reference"
    assert exact >= 0.99, f"{what}: only {exact:.2%} of the outputs equal the reference"
    assert saturated < 0.05, f"{what}: {saturated:.2%} of the reference saturates; the case tests too little"
    assert_padding_zero(out, what)
