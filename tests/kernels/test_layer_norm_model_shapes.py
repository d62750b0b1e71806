"""layer_norm and native_layer_norm at the shapes of the models that made them slow (issue 10).

The registry samples keep rows short; ViT-S/16 normalizes rows of 384 ([1, 197, 384]) and ConvNeXt
rows of 40 over a channels-last [1, 56, 56, 40], which take the row kernel's loops through many
whole texels (and, in textures packed along H or C, many texel rows). Every variant in every
representation its repsets allow must match torch there, with inputs whose mean is far from 0.
"""
from __future__ import annotations

import numpy as np
import pytest

from texelflow.generated.ops import OPS
from texelflow.generated.variants import VARIANTS

from .nodecheck import check_variant, combo_id, explicit_case, repr_combos

SHAPES = [[1, 197, 384], [1, 56, 56, 40], [2, 3, 5, 37]]
OP_NAMES = ("layer_norm", "native_layer_norm")
# float32 variants: these references are computed from the float32 inputs; the float16 variants
# are checked against references from their rounded inputs (test_registry_ops, test_fp16_precision).
CASES = [(vname, combo) for name in OP_NAMES for vname in OPS[name].variants if VARIANTS[vname].dtype == "float32"
         for combo in repr_combos(OPS[name], VARIANTS[vname])]


def model_case(op_name: str, shape: list[int], offset: float, seed: int):
    """A case of `shape` with inputs in [offset - 3, offset + 3], weight and bias in [-2, 2]."""
    rng = np.random.default_rng(seed)
    w = shape[-1]
    inputs = {"input": rng.uniform(offset - 3.0, offset + 3.0, shape).astype(np.float32),
              "weight": rng.uniform(-2.0, 2.0, w).astype(np.float32),
              "bias": rng.uniform(-2.0, 2.0, w).astype(np.float32)}
    sample = {"input": shape, "normalized_shape": [w], "weight": [w], "bias": [w], "eps": 1.0e-6}
    return explicit_case(OPS[op_name], sample, inputs, f"{shape} around {offset}")


@pytest.mark.parametrize("vname,combo", CASES, ids=[f"{v}-{combo_id(OPS[VARIANTS[v].op], c)}" for v, c in CASES])
def test_model_shapes_match_torch(device, vname, combo):
    op_name = VARIANTS[vname].op
    cases = [model_case(op_name, shape, offset, k) for k, shape in enumerate(SHAPES) for offset in (1.0, 12.0)]
    failures = check_variant(device, vname, combo, cases)
    assert not failures, f"{len(failures)} failures:\n\n" + "\n\n".join(msg for _, msg in failures)
