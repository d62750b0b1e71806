"""The int8 cases Q1, Q3 and Q4 of ../shared/acceptance/layout_cases.md: PT2E-shaped graphs
(explicit quantize / dequantize calls) fused into q8ta ops, planned by both planners with zero
transitions; and the packed-dim family rule that lets q8ta_add mix 4W4C and 4C1W."""

from __future__ import annotations

import pytest

import texelflow
from texelflow.generated.ops import OPS
from texelflow.runtime.graph.op_repsets import OpRepSets
from texelflow.runtime.graph.repr import TensorRepr
from tests.graph.test_q8ta_fusion import AddRelu, ConvBlock, ShuffleAdd, r

# id: (model, inputs, dispatches by op)
CASES = {
    "Q1": (AddRelu(), (r(1, 8, 16, 16, seed=1), r(1, 8, 16, 16, seed=2)),
           {"quantize_per_tensor": 2, "q8ta_add": 1, "q8ta_relu": 1, "dequantize_per_tensor": 1}),
    "Q3": (ShuffleAdd(), (r(1, 8, 8, 8, seed=3), r(1, 2, 16, 16, seed=4)),
           {"quantize_per_tensor": 2, "q8ta_pixel_shuffle": 1, "q8ta_add": 1, "dequantize_per_tensor": 1}),
    "Q4": (ConvBlock(), (r(1, 8, 16, 16, seed=5),),
           {"quantize_per_tensor": 1, "q8ta_conv2d_im2col": 2, "q8ta_relu": 1, "q8ta_add": 1,
            "dequantize_per_tensor": 1}),
}


@pytest.mark.parametrize("planner", ["greedy", "optimal"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_int8_cases_plan_without_transitions(case, planner):
    model, inputs, dispatches = CASES[case]
    plan = texelflow.plan(model, inputs, planner=planner)
    assert plan.fallbacks == []
    assert plan.dispatches == dispatches, plan.summary()
    assert plan.num_transitions == 0, plan.summary()
    if planner == "optimal":
        assert plan.optimal and plan.lower_bound == 0
    int8 = {v.name: plan.reprs[v.name] for n in plan.graph.device_nodes() for _, v in n.outputs
            if v.dtype == "int8"}
    assert int8 and all("PACKED_INT8" in rep for rep in int8.values()), int8


def test_q8ta_add_may_mix_4w4c_and_4c1w():
    """Q1's note: the add's inputs and output share a packed-dim family, not one layout."""
    shape = (1, 8, 16, 16)
    sets = OpRepSets.build(OPS["q8ta_add"], {"self": shape, "other": shape, "out": shape}, dtype="int8")
    w4c, c1w = (TensorRepr.parse(f"BUFFER/PACKED_INT8_{layout}") for layout in ("4W4C", "4C1W"))
    assert sets.is_sync_compatible({"self": w4c, "other": c1w, "out": w4c})
    assert sets.is_sync_compatible({"self": c1w, "other": w4c, "out": c1w})
    h4w = TensorRepr.parse("BUFFER/PACKED_INT8_4H4W")
    assert not sets.is_sync_compatible({"self": w4c, "other": h4w, "out": w4c})  # another family
