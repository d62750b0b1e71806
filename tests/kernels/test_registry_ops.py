"""Every shader variant of every registry op against torch, from the samples ops.yaml declares.

For each op with variants, each variant, and the assignments of representations its repsets and
sync groups allow for that variant's storages (nodecheck.repr_combos: every pair for to_layout,
which has no sync group; nodecheck.variant_cases: every one for float32 variants, and every one
for some dtype of each family of variants differing only in dtype; TEXELFLOW_TEST_EVERY_COMBO=1
runs each variant in each), every sample of generated/samples.py whose shapes fit those
representations becomes a one-node PlanGraph. The runtime's own node_dispatches lowers it (push
constants come from the registry's derivations, never from this file) and all samples of one
(variant, representations) run in one Program, one submit. Every output must match torch (the
first target that takes the sample's arguments), within the tolerance of its template
(nodecheck.TOLERANCES), and padding lanes and words must stay zero. Ops whose template is in nodecheck.INJECT_TEMPLATES run
every sample a second time with NaN, +Inf and -Inf injected into their float inputs.
"""
from __future__ import annotations

import os

import pytest

from texelflow.generated.ops import OPS
from texelflow.generated.samples import SAMPLES
from texelflow.generated.variants import VARIANTS

from .nodecheck import (
    DISPATCHED,
    EVERY_COMBO_ENV,
    check_variant,
    combo_id,
    injected_specials,
    ops_with_variants,
    repr_combos,
    sample_case,
    template_of,
    variant_cases,
    variant_family,
)

CASES = variant_cases()

# Real disagreements with torch on special values, reported and not yet fixed in the shaders.
# The variant's test xfails (with the number of failing NaN/Inf cases) when everything else of it
# passes; it fails on any other mismatch, and once these cases pass (then delete the entry).
KNOWN_DEVIATIONS: dict[str, str] = {}  # op -> why it may differ from torch on NaN/Inf samples


@pytest.mark.parametrize("vname,combo", CASES, ids=[f"{v}-{combo_id(OPS[VARIANTS[v].op], c)}" for v, c in CASES])
def test_variant_matches_torch(device, vname, combo):
    op, dtype = OPS[VARIANTS[vname].op], VARIANTS[vname].dtype
    assert SAMPLES.get(op.name), f"op '{op.name}' declares no samples in ops.yaml"
    lacking = set(VARIANTS[vname].features) - set(device.enabled_features)
    if lacking:
        pytest.skip(f"{vname} needs device features {sorted(lacking)}, which this device lacks")
    specials = injected_specials(op.name, dtype)
    cases = [sample_case(op.name, dtype, index, values) for index in range(len(SAMPLES[op.name]))
             for values in (((), specials) if specials else ((),))]
    failures = check_variant(device, vname, combo, cases)
    known = KNOWN_DEVIATIONS.get(op.name)
    unexpected = [msg for case, msg in failures if known is None or not case.specials]
    assert not unexpected, f"{len(unexpected)} failures:\n\n" + "\n\n".join(unexpected)
    if known is not None and specials:
        assert failures, f"{op.name} now matches torch on NaN/Inf: delete its KNOWN_DEVIATIONS entry"
        pytest.xfail(f"known deviation of {op.name} on {len(failures)} NaN/Inf samples: {known}")


def test_every_op_with_variants_has_samples():
    missing = [name for name in ops_with_variants() if not SAMPLES.get(name)]
    assert not missing, f"ops with shader variants but no `samples:` in ops.yaml: {', '.join(missing)}"


def test_every_variant_has_a_representation_case():
    """repr_combos finds at least one assignment for every variant (checked without a device)."""
    empty = [v for name in ops_with_variants() for v in OPS[name].variants if not repr_combos(OPS[name], VARIANTS[v])]
    assert not empty, f"variants no representation assignment can reach: {empty}"
    assert {v for v, _ in CASES} == {v for name in ops_with_variants() for v in OPS[name].variants}


def test_cases_cover_every_combination_of_every_family():
    """The cases run (variant_cases) against every combination (every=True): each variant runs,
    each float32 variant in all its combinations, and each combination of a family (the variants
    differing only in dtype) with at least one of its dtypes."""
    def keys(cases, by=lambda v: v):  # (variant, or its family; combination id) of each case
        return {(by(v), combo_id(OPS[VARIANTS[v].op], c)) for v, c in cases}

    every = variant_cases(every=True)
    assert len(CASES) < len(every) or os.environ.get(EVERY_COMBO_ENV)
    missed = keys(every, variant_family) - keys(CASES, variant_family)
    assert not missed, f"combinations no dtype runs: {sorted(missed)[:5]}"
    assert keys(CASES) <= keys(every)
    assert {k for k in keys(every) if VARIANTS[k[0]].dtype == "float32"} <= keys(CASES)


def test_every_variant_was_dispatched(request, device):
    """Every generated variant the device can run goes through test_variant_matches_torch: it has a
    case there, and each case asserts that it lowered to and dispatched its variant (check_variant's
    expect_variant). Run in one process (this module, whole), the variants dispatched are checked
    too; under pytest-xdist a worker runs only part of the cases, so only the first half holds."""
    runnable = {n for n, v in VARIANTS.items() if set(v.features) <= set(device.enabled_features)}
    no_case = sorted(runnable - {v for v, _ in CASES})
    assert not no_case, f"generated variants with no case here: {no_case}"
    if hasattr(request.config, "workerinput"):
        return  # a pytest-xdist worker: DISPATCHED holds this worker's share only
    mine = [i for i in request.session.items if i.module is request.module and i.originalname == "test_variant_matches_torch"]
    if len(mine) != len(CASES):
        pytest.skip("only part of this module was selected")
    missing = sorted(runnable - DISPATCHED)
    assert not missing, f"generated variants no test dispatched: {missing}"


# Ops whose kernels compile a push constant's work in or out by a shape class (the int8 word and
# block paths: int8_words, padded_words, quant_words; a fused activation: activation_code). The test
# above runs their samples with the classes lowering gives; this one runs them as bare dispatches,
# each spec constant at its general default (the activation read from the push constant).
# (The conv templates' general path is _conv_activation.glsl.j2's one: a few of them stand for all;
# the Winograd kernels, 13 s a case to compile here, are left to the test above.)
GENERAL_OPS = ("quantize_per_tensor", "dequantize_per_tensor", "q8ta_add", "q8ta_relu", "q8ta_max_pool2d", "q8ta_conv2d",
               "q8ta_conv2d_im2col", "q8ta_linear", "q8ta_linear_gemv", "conv2d_dw_act", "conv2d_dw3_s1",
               "conv2d_dw5_s2", "conv2d_pw_act", "conv2d_gemm", "conv2d_wino4_output")
# one representation case per variant: the general path does not depend on the classes' inputs
GENERAL_CASES = list({v: (v, c) for v, c in reversed(CASES)
                      if VARIANTS[v].op in GENERAL_OPS and VARIANTS[v].dtype != "float16"}.values())


@pytest.mark.parametrize("vname,combo", GENERAL_CASES,
                         ids=[f"{v}-{combo_id(OPS[VARIANTS[v].op], c)}" for v, c in GENERAL_CASES])
def test_variant_without_shape_classes(device, vname, combo):
    op, dtype = OPS[VARIANTS[vname].op], VARIANTS[vname].dtype
    lacking = set(VARIANTS[vname].features) - set(device.enabled_features)
    if lacking:
        pytest.skip(f"{vname} needs device features {sorted(lacking)}, which this device lacks")
    cases = [sample_case(op.name, dtype, index) for index in range(len(SAMPLES[op.name]))]
    failures = check_variant(device, vname, combo, cases, general=True)
    assert not failures, f"{len(failures)} failures:\n\n" + "\n\n".join(msg for _, msg in failures)
