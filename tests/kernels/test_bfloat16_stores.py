"""Every shader variant that can round its output to bfloat16 at the store, with that path taken.

A bfloat16 program (runtime/graph/bfloat16.py) moves a round_bfloat16 node into its producer's
store where the producer's template declares the `round_bfloat16` shape class: the store then
applies tf_round_bfloat16 (shaders/_prologue.glsl.j2). For each template that declares it, per
storage of its output, one float32 variant runs every ops.yaml sample (with NaN and Inf injected
where the registry test injects them) with the node marked. Every value of the output must be one bfloat16 holds,
and match torch's answer rounded to bfloat16 within the template's tolerance or one bfloat16
step; padding must stay zero. (That the store's rounding is torch's bit for bit is
tests/reliability/test_bfloat16.py's: the rounding kernel on ties, NaN and Inf, and whole programs
with the roundings in the stores against the same programs with round_bfloat16 nodes. Only the
marked pipeline is built here: the registry test builds the unmarked one.)
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from texelflow.generated.ops import OPS
from texelflow.generated.samples import SAMPLES
from texelflow.generated.variants import VARIANTS

from .nodecheck import (assert_matches, assert_padding_zero, build_node, combo_id, fits, injected_specials, run_nodes,
                        sample_case, tolerance, variant_cases)


def _rounding_cases() -> list[tuple[str, dict]]:
    """Per template that rounds a float32 `out` at the store, one float32 variant and
    representation case per storage of `out`: the store is the template's code (the op's own
    expression, OP, is what the registry test checks), and it differs by out's storage only."""
    seen, cases = set(), []
    for vname, combo in variant_cases():
        v = VARIANTS[vname]
        key = (OPS[v.op].template, combo["out"].storage if "out" in combo else None)
        if (v.dtype == "float32" and OPS[v.op].tensor_dtype("out", "float32") == "float32" and key not in seen
                and any(s.rule == "round_bfloat16" for s in v.spec_constants)):
            seen.add(key)
            cases.append((vname, combo))
    return cases


CASES = _rounding_cases()


def _rounded(x: np.ndarray) -> np.ndarray:
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(torch.bfloat16).float().numpy()


def _same(got: np.ndarray, want: np.ndarray) -> bool:
    nan = np.isnan(got) & np.isnan(want)
    return bool(((got.view(np.uint32) == want.view(np.uint32)) | nan).all())


def test_rounding_variants_exist():
    """The templates of the ops a bfloat16 model computes with declare the shape class, and every
    template that declares it has a case here."""
    from texelflow.runtime.graph.bfloat16 import rounds_at_store

    for name in ("add", "mul", "gelu", "exp", "layer_norm", "softmax", "sum", "linear_packed", "mm", "bmm",
                 "conv2d", "conv2d_pw", "conv2d_dw", "scaled_dot_product_attention", "avg_pool2d", "addmm"):
        assert rounds_at_store(name), f"{name} cannot round at its store"
    declared = {OPS[v.op].template for v in VARIANTS.values() if any(s.rule == "round_bfloat16" for s in v.spec_constants)}
    assert declared == {OPS[VARIANTS[v].op].template for v, _ in CASES}


@pytest.mark.parametrize("vname,combo", CASES, ids=[f"{v}-{combo_id(OPS[VARIANTS[v].op], c)}" for v, c in CASES])
def test_store_rounds_to_bfloat16(device, vname, combo):
    op = OPS[VARIANTS[vname].op]
    lacking = set(VARIANTS[vname].features) - set(device.enabled_features)
    if lacking:
        pytest.skip(f"{vname} needs device features {sorted(lacking)}, which this device lacks")
    specials = injected_specials(op.name, "float32")
    cases = [sample_case(op.name, "float32", index, values) for index in range(len(SAMPLES[op.name]))
             for values in (((), specials) if specials else ((),))]
    cases = [c for c in cases if fits(op, "float32", c, combo)]
    assert cases, f"{vname}: no sample fits {combo_id(op, combo)}"
    nodes = []
    for case in cases:
        node, arrays = build_node(op, "float32", case)
        node.round_bfloat16 = True
        nodes.append((node, arrays))
    results = run_nodes(device, nodes, combo, "float32", expect_variant=vname)
    for case, outs in zip(cases, results):
        what = f"{vname} {combo_id(op, combo)} {case.label}"
        got, want = outs[0].got, np.asarray(case.want[0], np.float32)
        stored = got.view(np.uint32)
        assert not (stored & 0xFFFF)[~np.isnan(got)].any(), f"{what}: 'out' holds values bfloat16 cannot"
        assert_matches_bfloat16(got, want, op.name, what)
        assert_padding_zero(outs[0], what)
        for out, w in zip(outs[1:], case.want[1:]):  # other outputs are never rounded
            assert_matches(out.got, w, op.name, what)


def assert_matches_bfloat16(got: np.ndarray, want: np.ndarray, op_name: str, what: str) -> None:
    """`got` against torch's float32 answer rounded to bfloat16: bit for bit for a bit-exact
    template, else within the template's tolerance or one bfloat16 step (2**-7 relative: two
    roundings of nearly equal values differ by one step), whichever is wider."""
    want = _rounded(want)
    tol = tolerance(op_name)
    if tol is None:
        assert _same(got, want), f"{what}: differs from torch's answer rounded to bfloat16"
        return
    np.testing.assert_allclose(got, want, rtol=max(tol[0], 2.0 ** -7), atol=tol[1], equal_nan=True, err_msg=what)
