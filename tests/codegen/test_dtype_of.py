"""Per-tensor dtypes (`dtype_of`): tensors of a fixed dtype beside the variant's, such as a
comparison's bool `out` or where's bool `condition`. Gen must bind each tensor with its own GLSL
types and refuse malformed declarations with their line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from texelflow.generated.ops import OPS
from texelflow.generated.variants import VARIANTS
from tests.codegen.test_generate import ROOT, gen_cli, tree_digest
from tests.codegen.test_malformed import edit, line_of

LOGICAL_NOT = "    dtype_of: {out: bool}\n    shader: {params: {OP: \"tf_logical_not(X)\"}}"
WHERE = "    dtype_of: {condition: bool}\n"


def test_registry_lists_fixed_dtypes():
    assert OPS["eq"].dtype_of == (("out", "bool"),)
    assert OPS["where"].dtype_of == (("condition", "bool"),)
    assert OPS["add"].dtype_of == ()
    assert OPS["eq"].tensor_dtype("out", "int32") == "bool"
    assert OPS["eq"].tensor_dtype("self", "int32") == "int32"
    assert OPS["eq"].variant_dtype({"out": "bool", "self": "float32", "other": "float32"}) == "float32"
    assert OPS["where"].variant_dtype({"out": "int32", "condition": "bool"}) == "int32"


def _bindings(glsl: str) -> dict[str, str]:
    """tensor -> its declaration line in the generated GLSL."""
    return {m.group(2): m.group(0) for m in re.finditer(r"layout\(set = 0, binding = (\d+).* t_(\w+)(\[\])?;", glsl)}


@pytest.mark.parametrize("variant,want", [
    ("eq_float32_texture3d", {"out": "rgba32i) uniform writeonly iimage3D", "self": "rgba32f) uniform readonly image3D"}),
    ("eq_int32_buffer", {"out": "int t_out[]", "self": "int t_self[]"}),
    ("lt_scalar_float32_buffer", {"out": "int t_out[]", "self": "float t_self[]"}),
    ("where_float32_texture3d", {"condition": "iimage3D", "self": "image3D", "out": "image3D"}),
    ("logical_not_bool_buffer", {"out": "int t_out[]", "self": "int t_self[]"}),
])
def test_each_tensor_is_bound_with_its_own_dtype(variant, want):
    glsl = (ROOT / "generated" / "glsl" / VARIANTS[variant].source).read_text()
    decls = _bindings(glsl)
    for tensor, fragment in want.items():
        assert fragment in decls[tensor], (tensor, decls[tensor])
    if "where" in variant:  # the bool condition loads as int, the values as the variant's T
        assert "int load_condition(ivec4 idx)" in glsl and "T load_self(ivec4 idx)" in glsl


# (id, (old, new) in ops.yaml, message fragment, line marker after the edit)
CASES = [
    ("unknown-tensor", (LOGICAL_NOT, LOGICAL_NOT.replace("{out: bool}", "{outt: bool}")),
     "op 'logical_not': dtype_of names 'outt', which is no tensor of the op (did you mean 'out'?)", "{outt: bool}"),
    ("unknown-dtype", (LOGICAL_NOT, LOGICAL_NOT.replace("{out: bool}", "{out: boool}")),
     "unknown dtype 'boool' (did you mean 'bool'?)", "{out: boool}"),
    ("every-tensor-fixed", (LOGICAL_NOT, LOGICAL_NOT.replace("{out: bool}", "{out: bool, self: bool}")),
     "op 'logical_not': dtype_of fixes every tensor", "{out: bool, self: bool}"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_malformed_dtype_of_is_reported_with_its_line(scratch_repo: Path, case):
    _, change, message, marker = case
    path = scratch_repo / "ops.yaml"
    edit(path, *change)
    before = tree_digest(scratch_repo)
    run = gen_cli(scratch_repo, "--no-compile")
    assert run.returncode != 0 and "Traceback" not in run.stderr
    matching = [l for l in run.stderr.splitlines() if message in l]
    assert matching, run.stderr
    assert matching[0].startswith(f"ops.yaml:{line_of(path, marker)}: "), matching[0]
    assert tree_digest(scratch_repo) == before
