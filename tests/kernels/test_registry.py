"""The registry entries of the kernels tested here, as docs/acceptance layout_cases.md needs them."""
from __future__ import annotations

import pytest

from texelflow.generated.ops import OPS, TARGETS

# op -> (targets, {tensor: repset}, sync groups, weights, variants)
EXPECTED = {
    "linear": ({"aten.linear.default"},
               {"input": "CONTIGUOUS_ANY", "weight": "CONTIGUOUS_BUFFER", "bias": "CONTIGUOUS_BUFFER",
                "out": "CONTIGUOUS_ANY"},
               (("input", "out"),), ("weight", "bias"), ("linear_float32_buffer", "linear_float32_texture3d")),
    "mm": ({"aten.mm.default"}, {"self": "CONTIGUOUS_ANY", "mat2": "CONTIGUOUS_ANY", "out": "CONTIGUOUS_ANY"},
           (("self", "mat2", "out"),), (), ("mm_float32_buffer", "mm_float32_texture3d")),
    "addmm": ({"aten.addmm.default"},
              {"self": "CONTIGUOUS_BUFFER", "mat1": "CONTIGUOUS_ANY", "mat2": "CONTIGUOUS_BUFFER",
               "out": "CONTIGUOUS_ANY"},
              (("mat1", "out"),), ("self", "mat2"), ("addmm_float32_buffer", "addmm_float32_texture3d")),
    "conv2d": ({"aten.conv2d.default"},
               {"input": "CHANNELS_PACKED_TEXTURE", "weight": "CONTIGUOUS_BUFFER", "bias": "CONTIGUOUS_BUFFER",
                "out": "CHANNELS_PACKED_TEXTURE"},
               (("input", "out"),), ("weight", "bias"), ("conv2d_float32_texture3d",)),
    "max_pool2d": ({"aten.max_pool2d.default"}, {"self": "CHANNELS_PACKED_TEXTURE", "out": "CHANNELS_PACKED_TEXTURE"},
                   (("self", "out"),), (), ("max_pool2d_float32_texture3d",)),
    "avg_pool2d": ({"aten.avg_pool2d.default"}, {"self": "CHANNELS_PACKED_TEXTURE", "out": "CHANNELS_PACKED_TEXTURE"},
                   (("self", "out"),), (), ("avg_pool2d_float32_texture3d",)),
    "layer_norm": ({"aten.layer_norm.default"},
                   {"input": "ANY_STORAGE", "weight": "CONTIGUOUS_BUFFER", "bias": "CONTIGUOUS_BUFFER",
                    "out": "ANY_STORAGE"},
                   (("input", "out"),), ("weight", "bias"), ("layer_norm_float32_buffer", "layer_norm_float32_texture3d")),
    "native_layer_norm": (
        {"aten.native_layer_norm.default"},
        {"input": "ANY_STORAGE", "weight": "CONTIGUOUS_BUFFER", "bias": "CONTIGUOUS_BUFFER", "out": "ANY_STORAGE",
         "mean": "ANY_STORAGE", "rstd": "ANY_STORAGE"},
        (("input", "out", "mean", "rstd"),), ("weight", "bias"),
        ("native_layer_norm_float32_buffer", "native_layer_norm_float32_texture3d")),
    "cat": ({"aten.cat.default"}, {"tensors": "ANY_STORAGE", "out": "ANY_STORAGE"}, (("tensors", "out"),), (),
            ("cat_float32_buffer", "cat_float32_texture3d", "cat_int32_buffer", "cat_int32_texture3d")),
    "permute_copy": ({"aten.permute.default", "aten.permute_copy.default"}, {"self": "ANY_STORAGE", "out": "ANY_STORAGE"},
                     (("self", "out"),), (), ("permute_copy_float32_buffer", "permute_copy_float32_texture3d",
                                              "permute_copy_int32_buffer", "permute_copy_int32_texture3d")),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_entry(name):
    targets, repsets, sync, weights, variants = EXPECTED[name]
    op = OPS[name]
    assert set(op.targets) == targets and all(TARGETS[t] == name for t in targets)
    got = {a.name: a.repset for a in op.args if a.repset} | {o.name: o.repset for o in op.outputs}
    assert got == repsets
    assert op.sync == sync and op.weights == weights and op.variants == variants


def test_optional_tensors():
    optional = {(n, a.name) for n in EXPECTED for a in OPS[n].args if a.repset and a.optional}
    assert optional == {("linear", "bias"), ("conv2d", "bias"), ("layer_norm", "weight"), ("layer_norm", "bias"),
                        ("native_layer_norm", "weight"), ("native_layer_norm", "bias")}
    assert [a.kind for a in OPS["cat"].args] == ["tensor_list", "int"]


def test_squeeze_unsqueeze_targets():
    assert {t for t, op in TARGETS.items() if op == "squeeze_copy"} >= {
        "aten.squeeze.dims", "aten.squeeze_copy.dims", "aten.squeeze.dim"}
    assert {t for t, op in TARGETS.items() if op == "unsqueeze_copy"} == {
        "aten.unsqueeze.default", "aten.unsqueeze_copy.default"}
