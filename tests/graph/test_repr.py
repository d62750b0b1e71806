"""The representation model: repset algebra, packed-dim predicates, limits, per-op sync groups."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from texelflow.generated.layouts import LAYOUT_INFO, REPSETS, Layout, Storage
from texelflow.generated.ops import OPS
from texelflow.runtime.graph.op_repsets import OpRepSets
from texelflow.runtime.graph.repr import TensorRepr, TensorRepSet
from texelflow.shaders.geometry import texture_extents, whcn_sizes

L, S = Layout, Storage
BUF, TEX = S.BUFFER, S.TEXTURE_3D
ALL_REPRS = [TensorRepr(s, l) for l, info in LAYOUT_INFO.items() for s in info.storages]


def rs(*pairs) -> TensorRepSet:
    return TensorRepSet.of(*(TensorRepr(s, l) for s, l in pairs))


repsets = st.sets(st.sampled_from(ALL_REPRS)).map(lambda xs: TensorRepSet.of(*xs))


def test_named_repsets_follow_layouts_yaml():
    any_storage = TensorRepSet.named("ANY_STORAGE")
    assert len(any_storage) == 6
    incl = TensorRepSet.named("ANY_STORAGE_INCL_PACKED_INT8")
    assert incl.side(TEX) == any_storage.side(TEX)  # the texture side stays float-only
    assert incl.side(BUF) == any_storage.side(BUF) | TensorRepSet.named("PACKED_INT8_BUFFER").side(BUF)
    assert TensorRepSet.named("NO_STORAGE").is_empty()
    with pytest.raises(KeyError, match="unknown repset 'ANY_STORAG'"):
        TensorRepSet.named("ANY_STORAG")


def test_preference_pick_texture_first_then_wp_hp_cp():
    assert TensorRepSet.named("ANY_STORAGE").pick() == TensorRepr(TEX, L.WIDTH_PACKED)
    assert TensorRepSet.named("ANY_BUFFER").pick() == TensorRepr(BUF, L.WIDTH_PACKED)
    assert rs((TEX, L.CHANNELS_PACKED), (TEX, L.HEIGHT_PACKED)).pick() == TensorRepr(TEX, L.HEIGHT_PACKED)
    assert TensorRepSet.named("PACKED_INT8_CHANNELS_PACKED_BUFFER").pick() == TensorRepr(BUF, L.PACKED_INT8_4W4C)
    with pytest.raises(ValueError):
        TensorRepSet.empty().pick()


def test_invalid_layout_for_storage_is_refused():
    with pytest.raises(ValueError, match="cannot live in storage TEXTURE_3D"):
        TensorRepSet({TEX: {L.PACKED_INT8_4W4C}})


@given(repsets, repsets)
def test_intersection_and_union_are_set_algebra(a, b):
    assert set(a & b) == set(a) & set(b)
    assert set(a | b) == set(a) | set(b)
    assert (a & b) == (b & a) and hash(a & b) == hash(b & a)
    assert (a & b).is_empty() == (len(set(a) & set(b)) == 0)


@given(repsets, repsets)
def test_compatible_filter_leaves_a_compatible_set(a, b):
    filtered = a.filter_for_compatible_packed_dim_infos(b)
    assert set(filtered) <= set(a)
    if not b.is_empty():
        theirs = b.possible_pdis()
        for r in filtered:
            assert r.pdi in theirs[r.storage]


def test_float_pdi_means_same_storage_and_layout():
    wp_tex, wp_buf = rs((TEX, L.WIDTH_PACKED)), rs((BUF, L.WIDTH_PACKED))
    assert not wp_tex.has_compatible_packed_dim_info_set(wp_buf)
    assert wp_tex.filter_for_compatible_packed_dim_infos(wp_buf).is_empty()
    any_storage = TensorRepSet.named("ANY_STORAGE")
    assert any_storage.filter_for_compatible_packed_dim_infos(wp_tex) == wp_tex
    assert any_storage.has_compatible_packed_dim_info_set(wp_buf)
    assert not wp_buf.has_compatible_packed_dim_info_set(any_storage)


def test_int8_families_mix_4w4c_with_4c1w_and_reject_4h4w():
    w4c4 = rs((BUF, L.PACKED_INT8_4W4C))
    c4w1 = rs((BUF, L.PACKED_INT8_4C1W))
    h4w4 = rs((BUF, L.PACKED_INT8_4H4W))
    w4 = rs((BUF, L.PACKED_INT8_4W))
    assert w4c4.has_same_packed_dim_info_set(c4w1)
    assert w4c4.has_compatible_packed_dim_info_set(c4w1)
    assert h4w4.has_same_packed_dim_info_set(w4)
    assert not w4c4.has_compatible_packed_dim_info_set(h4w4)
    assert not w4c4.has_same_packed_dim_info_set(h4w4)
    int8 = TensorRepSet.named("PACKED_INT8_BUFFER")
    assert int8.filter_for_compatible_packed_dim_infos(w4c4) == rs((BUF, L.PACKED_INT8_4W4C), (BUF, L.PACKED_INT8_4C1W))
    assert int8.filter_for_compatible_packed_dim_infos(h4w4) == rs((BUF, L.PACKED_INT8_4H4W), (BUF, L.PACKED_INT8_4W))
    assert TensorRepSet.empty().has_same_packed_dim_info_set(w4c4)
    assert w4c4.filter_for_compatible_packed_dim_infos(TensorRepSet.empty()) == w4c4


def test_whcn_sizes_and_texture_extents():
    assert whcn_sizes([2, 3, 5, 7]) == (7, 5, 3, 2)
    assert whcn_sizes([5]) == (5, 1, 1, 1)
    assert whcn_sizes([2, 3, 4, 5, 6]) == (6, 5, 4, 6)
    assert texture_extents([2, 3, 5, 7], L.WIDTH_PACKED) == (2, 5, 6)
    assert texture_extents([2, 3, 5, 7], L.HEIGHT_PACKED) == (7, 2, 6)
    assert texture_extents([2, 5, 5, 7], L.CHANNELS_PACKED) == (7, 5, 4)


def test_texture_limit_filter_e3_and_rank5_e4():
    """Acceptance E3: WP and CP exceed the 16384 y-extent of [1,1,20000,8]; only TEX HP fits."""
    any_storage = TensorRepSet.named("ANY_STORAGE")
    e3 = any_storage.filter_invalid_reprs([1, 1, 20000, 8])
    assert e3.side(TEX) == frozenset({L.HEIGHT_PACKED})
    assert e3.side(BUF) == any_storage.side(BUF)
    assert e3.pick() == TensorRepr(TEX, L.HEIGHT_PACKED)
    e4 = any_storage.filter_invalid_reprs([2, 3, 4, 5, 6])
    assert e4.side(TEX) == frozenset() and e4.pick() == TensorRepr(BUF, L.WIDTH_PACKED)
    small = any_storage.filter_invalid_reprs([1, 4, 16, 16], texture_limits=(2, 2, 2))
    assert small.side(TEX) == frozenset()


def test_op_repsets_keep_one_set_per_tensor_and_sync_by_pdi():
    clone = OPS["clone"]
    sets = OpRepSets.build(clone, {"self": [1, 8, 16, 16], "out": [1, 8, 16, 16]})
    assert set(sets.sets) == {"self", "out"}
    assert sets.constrain("self", rs((BUF, L.PACKED_INT8_4W4C)))
    assert sets.sets["self"] == rs((BUF, L.PACKED_INT8_4W4C))
    # The output may take any layout of the same int8 family, not only the input's.
    assert sets.sets["out"] == rs((BUF, L.PACKED_INT8_4W4C), (BUF, L.PACKED_INT8_4C1W))
    assert not sets.constrain("out", rs((BUF, L.PACKED_INT8_4H4W)))
    assert sets.is_sync_compatible({"self": TensorRepr(BUF, L.PACKED_INT8_4W4C), "out": TensorRepr(BUF, L.PACKED_INT8_4C1W)})
    assert not sets.is_sync_compatible({"self": TensorRepr(BUF, L.PACKED_INT8_4W4C), "out": TensorRepr(BUF, L.PACKED_INT8_4H4W)})


def test_op_repsets_filter_each_tensor_by_its_own_shape():
    add = OPS["add"]
    big, small = [1, 1, 20000, 8], [1, 1, 1, 8]
    sets = OpRepSets.build(add, {"self": big, "other": small, "out": big})
    # The broadcast operand could be WP on its own; the sync group narrows it to what `self` can be.
    assert sets.sets["other"].side(TEX) == frozenset({L.HEIGHT_PACKED})
    assert sets.sets["out"] == sets.sets["self"]
    rank5 = [2, 3, 4, 5, 6]
    assert OpRepSets.build(add, {"self": rank5, "other": rank5, "out": rank5}).sets["out"].side(TEX) == frozenset()


def test_texture_only_op_with_oversized_tensor_has_an_empty_repset():
    """The partitioner rejects a node when any of its repsets comes out empty."""
    relu = OPS["relu"]
    fake = dataclasses.replace(
        relu,
        args=(dataclasses.replace(relu.args[0], repset="CHANNELS_PACKED_TEXTURE"),),
        outputs=(dataclasses.replace(relu.outputs[0], repset="CHANNELS_PACKED_TEXTURE"),),
    )
    sets = OpRepSets.build(fake, {"self": [2, 3, 4, 5, 6], "out": [2, 3, 4, 5, 6]})
    assert sets.any_empty() and set(sets.empty_tensors()) == {"self", "out"}


def test_every_named_repset_round_trips():
    for name, sides in REPSETS.items():
        r = TensorRepSet.named(name)
        assert {s: r.side(s) for s in Storage} == {s: sides.get(s, frozenset()) for s in Storage}
