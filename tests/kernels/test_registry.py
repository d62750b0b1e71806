"""The shape of the generated registry: properties every entry must have, and the representation
constraints ../shared/acceptance/layout_cases.md asks of each kind of op. No device needed.

Nothing here lists ops: kinds of ops are found through the registry (their shader template, their
flags), so an op added to ops.yaml is checked without touching this file.
"""
from __future__ import annotations

import pytest

from texelflow.generated.layouts import LAYOUT_INFO, Layout, Storage
from texelflow.generated.ops import OPS, TARGETS
from texelflow.generated.variants import VARIANTS
from texelflow.runtime.graph.repr import TensorRepSet

from .nodecheck import declared_repsets, ops_with_variants, template_of

ALL = sorted(OPS)
WITH_VARIANTS = ops_with_variants()


def _activations(op) -> dict[str, str]:
    """Tensor slots that are not prepacked weights -> repset."""
    return {n: r for n, r in declared_repsets(op).items() if n not in op.weights}


def test_targets_map_back_to_their_op():
    assert TARGETS == {t: name for name, op in OPS.items() for t in op.targets}


@pytest.mark.parametrize("name", ALL)
def test_entry_is_consistent(name):
    op = OPS[name]
    slots = declared_repsets(op)
    for slot, repset in slots.items():
        assert not TensorRepSet.named(repset).is_empty(), f"{name}.{slot}: repset {repset} is empty"
    for group in op.sync:
        assert len(group) >= 2 and set(group) <= set(slots), f"{name}: sync group {group}"
    synced = {m for g in op.sync for m in g}
    args = {a.name: a for a in op.args}
    for w in op.weights:
        assert w in args and args[w].repset is not None, f"{name}: weight '{w}' is no tensor argument"
        assert w not in synced, f"{name}: weight '{w}' is prepacked, so it cannot be in a sync group"
        # one representation, or one layout whose storage the planner picks by the texture limits
        # where the op has a variant per weight storage (linear_packed's `weight_storage` axis)
        reprs = TensorRepSet.named(args[w].repset)
        assert len(reprs) == 1 or ("weight_storage" in op.shader_axes and len({r.layout for r in reprs}) == 1), \
            f"{name}: weight '{w}' is prepacked into one representation"
    lists = [a.name for a in op.args if a.kind == "tensor_list"]
    if lists:
        assert op.grid[:2] == ("per_list_element", lists[0]), f"{name}: a tensor list needs one dispatch per element"
    else:
        assert op.grid[0] in ("per_output_unit", "per_row", "cooperative", "per_tile")


@pytest.mark.parametrize("name", WITH_VARIANTS)
def test_variants_belong_to_their_op(name):
    op = OPS[name]
    assert op.variants == tuple(sorted(v.name for v in VARIANTS.values() if v.op == name))
    assert {VARIANTS[v].dtype for v in op.variants} == set(op.dtypes), f"{name}: a dtype without a variant"
    for v in op.variants:
        bound = {b.tensor for b in VARIANTS[v].bindings}
        assert set(declared_repsets(op)) <= bound, f"{v} does not bind every tensor of {name}"


@pytest.mark.parametrize("name", WITH_VARIANTS)
def test_optional_tensors_have_a_presence_flag(name):
    """A shader cannot tell a dummy buffer from a real tensor: a `present` push constant must."""
    op = OPS[name]
    flagged = {dict(p.params)["present"] for p in op.push if p.rule == "present"}
    optional = {a.name for a in op.args if a.repset is not None and a.optional}
    assert optional == flagged, f"{name}: optional tensors {sorted(optional)}, presence flags {sorted(flagged)}"


@pytest.mark.parametrize("name", [n for n in ALL if OPS[n].is_identity])
def test_identity_ops(name):
    """One tensor in, one out, synced, in ANY_STORAGE_INCL_PACKED_INT8 (layout_cases.md)."""
    op = OPS[name]
    assert [a.name for a in op.args if a.repset] == ["self"] and [o.name for o in op.outputs] == ["out"]
    assert op.sync == (("self", "out"),)
    assert set(declared_repsets(op).values()) == {"ANY_STORAGE_INCL_PACKED_INT8"}


@pytest.mark.parametrize("name", [n for n in ALL if "supports_highdim" in OPS[n].flags])
def test_highdim_ops_admit_buffers(name):
    """A rank > 4 tensor has no texture representation, so every activation must allow a buffer."""
    for slot, repset in _activations(OPS[name]).items():
        assert TensorRepSet.named(repset).side(Storage.BUFFER), f"{name}.{slot}: {repset} has no buffer"


# What layout_cases.md asks of each kind of op, by shader template: the repset of every tensor
# that is not a prepacked weight, and whether they all share one sync group.
def _width_packed(repset):
    return {r.layout for r in TensorRepSet.named(repset)} == {Layout.WIDTH_PACKED}


def _channels_packed_texture(repset):
    return {(r.storage, r.layout) for r in TensorRepSet.named(repset)} == {(Storage.TEXTURE_3D, Layout.CHANNELS_PACKED)}


def _channels_packed(repset):
    return {r.layout for r in TensorRepSet.named(repset)} == {Layout.CHANNELS_PACKED}


def _any_float(repset):
    float_layouts = {lay for lay, info in LAYOUT_INFO.items() if info.family == "float"}
    reprs = {(r.storage, r.layout) for r in TensorRepSet.named(repset) if r.layout in float_layouts}
    return reprs == {(s, lay) for s in Storage for lay in float_layouts}


ACCEPTANCE = {  # template -> (activation repset predicate, all activations synced)
    "matmul": (_width_packed, False),  # linear / addmm / mm: width-packed, weights prepacked
    "linear": (_width_packed, False),
    "linear_packed": (_width_packed, False),  # the tiled family (issue 13): weights prepacked
    "linear_packed_gemv": (_width_packed, False),
    "linear_wg": (_width_packed, False),
    "mm_tiled": (_width_packed, False),
    "mm_wg": (_width_packed, False),
    "conv2d": (_channels_packed_texture, False),  # conv2d, pools: channels-packed texture
    # Ours also takes a channels-packed buffer (NHWC memory): beside conv2d_nhwc the permutes
    # around a pool are then free views (ResNet-18's max pool; the reference: texture only).
    "pool2d": (_channels_packed, True),
    "unary": (_any_float, True),  # elementwise, unary, layer_norm, cat, permute: any float, synced
    "binary": (_any_float, True),
    "layer_norm": (_any_float, True),
    "cat": (_any_float, True),
    # Ours differs from the reference (synced) on purpose: the permute kernel reads any layout and
    # writes any, so a permute is a free layout change (NCHW channels-packed in, NHWC width-packed
    # out), which takes ConvNeXt from 24 transitions to 1.
    "permute": (_any_float, False),
}


@pytest.mark.parametrize("name", [n for n in WITH_VARIANTS if template_of(n) in ACCEPTANCE])
def test_acceptance_constraints(name):
    op = OPS[name]
    allowed, synced = ACCEPTANCE[template_of(name)]
    acts = _activations(op)
    for slot, repset in acts.items():
        assert allowed(repset), f"{name}.{slot}: {repset} is not what layout_cases.md asks for a {template_of(name)} op"
    if synced:
        assert any(set(acts) <= set(g) for g in op.sync), f"{name}: {sorted(acts)} must share one sync group"
