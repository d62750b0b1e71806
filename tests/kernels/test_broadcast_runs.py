"""Broadcast runs (shaders/node_rules.py broadcast_runs, contiguous_runs and the read classes
4-9): the input word the formula (w / i1) % p1 + ((w / i2) % p2) p1 gives for every word w of
the output, against the word an explicit index mapping gives, for every float buffer layout's
dim order and any broadcast; and where the rule must fall back to the general path. The
kernels themselves run in tests/kernels/test_shape_classes.py (binary and expand, each class)."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from texelflow.generated.layouts import LAYOUT_INFO, Layout, Storage
from texelflow.runtime.graph.repr import TensorRepr
from texelflow.shaders.node_rules import (
    READ_GENERAL,
    READ_RUNS,
    SPEC_RULES,
    broadcast_runs,
    buffer_dim_order,
    contiguous_runs,
)

FLOAT_LAYOUTS = [Layout.WIDTH_PACKED, Layout.HEIGHT_PACKED, Layout.CHANNELS_PACKED]


def _words(sizes, order) -> np.ndarray:
    """word[idx] of a buffer of WHCN `sizes` held in dim order `order` (fastest first)."""
    words = np.zeros(tuple(reversed(sizes)), dtype=np.int64)  # indexed [n, c, h, w]
    stride = 1
    for d in order:
        shape = [1, 1, 1, 1]
        shape[3 - d] = sizes[d]
        words = words + (np.arange(sizes[d]) * stride).reshape(shape)
        stride *= sizes[d]
    return words


def _formula(w, runs):
    i1, p1, i2, p2 = runs
    return (w // i1) % p1 + ((w // i2) % p2) * p1


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.integers(1, 5), min_size=4, max_size=4),
       kept=st.lists(st.booleans(), min_size=4, max_size=4),
       layout=st.sampled_from(FLOAT_LAYOUTS))
def test_runs_give_the_input_word_of_every_output_word(sizes, kept, layout):
    order = buffer_dim_order(layout)
    in_sizes = [n if k else 1 for n, k in zip(sizes, kept)]
    runs = broadcast_runs(tuple(sizes), tuple(in_sizes), order)
    assert runs is not None  # four dims never make more than two kept runs
    out_words = _words(sizes, order)
    in_words = np.broadcast_to(_words(in_sizes, order), out_words.shape)
    got = _formula(out_words.ravel(), runs)
    assert np.array_equal(got, in_words.ravel()), (sizes, in_sizes, layout, runs)


@settings(max_examples=200, deadline=None)
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=6), data=st.data())
def test_contiguous_runs_at_any_rank(shape, data):
    """A width-packed buffer holds a tensor of any rank in torch's contiguous order: expand's
    runs come from torch shapes, self's leading dims absent or 1."""
    kept = data.draw(st.lists(st.booleans(), min_size=len(shape), max_size=len(shape)))
    lead = data.draw(st.integers(0, len(shape)))
    in_shape = [n if k else 1 for n, k in zip(shape, kept)][lead:]
    runs = contiguous_runs(in_shape, shape)
    padded = [1] * lead + in_shape
    flags = [a > 1 for a, n in zip(padded, shape) if n > 1]
    kept_runs = sum(1 for j, f in enumerate(flags) if f and (j == 0 or not flags[j - 1]))
    if kept_runs > 2:
        assert runs is None
        return
    want = np.broadcast_to(np.arange(int(np.prod(in_shape))).reshape(in_shape), shape).ravel()
    assert np.array_equal(_formula(np.arange(want.size), runs), want), (in_shape, shape, runs)


def test_blocked_and_int8_layouts_have_no_dim_order():
    for layout, info in LAYOUT_INFO.items():
        if info.family != "float":
            assert buffer_dim_order(layout) is None


def _facts(shapes: dict, reprs: dict):
    return SimpleNamespace(shape=lambda n: tuple(shapes[n]), repr=lambda n: reprs[n], present=lambda n: n in shapes,
                           value=lambda n: None, span=16, element=None)


def test_read_class_runs_only_where_both_buffers_order_the_kept_dims_alike():
    rule = SPEC_RULES["read_class"].fn
    buf = {layout: TensorRepr(Storage.BUFFER, layout) for layout in FLOAT_LAYOUTS}
    shapes = {"x": (2, 6, 3, 5), "s": (2, 6, 1, 1), "out": (2, 6, 3, 5)}
    same = _facts(shapes, {"x": buf[Layout.WIDTH_PACKED], "s": buf[Layout.WIDTH_PACKED], "out": buf[Layout.WIDTH_PACKED]})
    assert rule(same, {"read_class": "s", "of": "out"}) >= READ_RUNS
    # [2, 6, 1, 1]: N and C kept; channels-packed words hold C then N as width-packed ones do
    mixed = _facts(shapes, {"s": buf[Layout.CHANNELS_PACKED], "out": buf[Layout.WIDTH_PACKED]})
    assert rule(mixed, {"read_class": "s", "of": "out"}) >= READ_RUNS
    # [1, 6, 1, 5]: C and W kept, in opposite orders in the two layouts
    shapes["s"] = (1, 6, 1, 5)
    crossed = _facts(shapes, {"s": buf[Layout.CHANNELS_PACKED], "out": buf[Layout.WIDTH_PACKED]})
    assert rule(crossed, {"read_class": "s", "of": "out"}) == READ_GENERAL
    texture = _facts(shapes, {"s": TensorRepr(Storage.TEXTURE_3D, Layout.WIDTH_PACKED),
                              "out": TensorRepr(Storage.TEXTURE_3D, Layout.WIDTH_PACKED)})
    assert rule(texture, {"read_class": "s", "of": "out"}) == READ_GENERAL


def test_expand_runs_need_width_packed_buffers_on_both_sides():
    rule = SPEC_RULES["contiguous_runs"].fn
    shapes = {"self": (1, 4, 1, 6, 8), "out": (1, 4, 2, 6, 8)}
    wp = TensorRepr(Storage.BUFFER, Layout.WIDTH_PACKED)
    assert rule(_facts(shapes, {"self": wp, "out": wp}), {"contiguous_runs": "self", "of": "out"}) == 5  # vec4s, two runs
    cp = TensorRepr(Storage.BUFFER, Layout.CHANNELS_PACKED)
    assert rule(_facts(shapes, {"self": cp, "out": wp}), {"contiguous_runs": "self", "of": "out"}) == 0
