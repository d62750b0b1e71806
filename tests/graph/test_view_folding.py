"""Which reshapes keep every element in place (redundant.same_placement), and that planning folds
exactly those: a view of a contiguous buffer is free, a view that moves words or texels is not."""

from __future__ import annotations

import pytest

from texelflow.generated.layouts import Layout, Storage
from texelflow.runtime.graph.plan import plan_graph
from texelflow.runtime.graph.redundant import same_placement
from texelflow.runtime.graph.repr import TensorRepr
from tests.graph.synthetic import GraphBuilder


def _r(storage: str, layout: str) -> TensorRepr:
    return TensorRepr(Storage[storage], Layout[layout])


@pytest.mark.parametrize("shape, new_shape, repr_, same", [
    # contiguous buffers keep any reshape
    ((2, 3, 5, 7), (6, 35), ("BUFFER", "WIDTH_PACKED"), True),
    ((2, 7, 3, 2, 5), (14, 30), ("BUFFER", "WIDTH_PACKED"), True),
    ((105,), (3, 5, 7), ("BUFFER", "WIDTH_PACKED"), True),
    # height-packed buffers (N, C, W, H order) keep W and H
    ((2, 3, 5, 7), (6, 5, 7), ("BUFFER", "HEIGHT_PACKED"), True),
    ((2, 3, 5, 7), (2, 15, 7), ("BUFFER", "HEIGHT_PACKED"), False),
    # channels-packed buffers (NHWC) need W, H and C
    ((2, 3, 5, 7), (1, 2, 3, 5, 7), ("BUFFER", "CHANNELS_PACKED"), True),
    ((2, 3, 5, 7), (6, 5, 7), ("BUFFER", "CHANNELS_PACKED"), False),
    ((2, 4, 5, 7), (1, 8, 5, 7), ("BUFFER", "CHANNELS_PACKED"), False),
    # textures: (x, y) = (W, H), C and N stacked on z; C / 4 when C is packed
    ((2, 3, 5, 7), (6, 5, 7), ("TEXTURE_3D", "WIDTH_PACKED"), True),
    ((2, 3, 5, 7), (6, 5, 7), ("TEXTURE_3D", "HEIGHT_PACKED"), True),
    ((2, 3, 5, 7), (6, 5, 7), ("TEXTURE_3D", "CHANNELS_PACKED"), False),
    ((2, 3, 5, 7), (2, 3, 35), ("TEXTURE_3D", "WIDTH_PACKED"), False),
    ((1, 3, 5, 7), (3, 5, 7), ("TEXTURE_3D", "CHANNELS_PACKED"), True),
    # int8 blocks: 4W4C needs W, H and C; 4W needs only W
    ((2, 4, 5, 8), (8, 5, 8), ("BUFFER", "PACKED_INT8_4W4C"), False),
    ((2, 4, 5, 8), (8, 5, 8), ("BUFFER", "PACKED_INT8_4W"), True),
])
def test_same_placement(shape, new_shape, repr_, same):
    assert same_placement(shape, new_shape, _r(*repr_)) is same


def test_reshape_chain_in_a_contiguous_buffer_folds_to_nothing():
    b = GraphBuilder()
    x = b.input((2, 3, 5, 7))
    v = b.view(b.unary("relu", x), (6, 35))
    v = b.view(v, (2, 3, 35))
    v = b.view(v, (2, 7, 3, 5))
    plan = plan_graph(b.output(b.unary("relu", v)), "optimal", texture_limits=(1, 1, 1))
    assert {str(r) for r in plan.assignment.values.values()} == {"BUFFER/WIDTH_PACKED"}
    assert len(plan.folded) == 3
    assert plan.dispatches == {"relu": 2}
