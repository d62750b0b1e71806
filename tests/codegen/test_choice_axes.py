"""Choice axes of ops.yaml (`variant_axes: {int_dot: {dot4x8: [shaderIntegerDotProduct], plain: []}}`):
one template compiled per code path, each value with the device features it requires, preferred
first. Checked on the generated registry and, for bad declarations, through `texelflow gen`'s
`file:line: message` diagnostics."""

from __future__ import annotations

from pathlib import Path

import pytest

from texelflow.generated.ops import OPS
from texelflow.generated.variants import CHOICES, VARIANT_FEATURES, VARIANTS
from tests.codegen.test_generate import gen_cli, tree_digest
from tests.codegen.test_malformed import edit, line_of

AXIS = "  int_dot: {dot4x8: [shaderIntegerDotProduct], plain: []}\n"


def test_each_value_is_a_variant_requiring_its_features():
    assert CHOICES["int_dot"] == {"dot4x8": ("shaderIntegerDotProduct",), "plain": ()}
    assert "shaderIntegerDotProduct" in VARIANT_FEATURES
    for op in ("q8ta_linear", "q8ta_linear_gemv", "q8ta_conv2d_im2col"):
        by_value = {dict(VARIANTS[n].axes)["int_dot"]: VARIANTS[n] for n in OPS[op].variants}
        assert set(by_value) == {"dot4x8", "plain"}, op
        assert by_value["dot4x8"].features == ("shaderIntegerDotProduct",)
        assert by_value["plain"].features == ()
        assert by_value["dot4x8"].preference < by_value["plain"].preference
        # the same bindings and push constants: the runtime may swap one for the other
        assert by_value["dot4x8"].bindings == by_value["plain"].bindings
        assert by_value["dot4x8"].push_constants == by_value["plain"].push_constants


@pytest.mark.parametrize("new,message,marker", [
    ("  int_dot: {dot4x8: [shaderIntegerDotProduct]}\n",
     "variant axis 'int_dot': its last value 'dot4x8' must require no device feature", "  int_dot:"),
    ("  int_dot: {dot4x8: [shaderIntegerDotProdct], plain: []}\n",
     "unknown device feature 'shaderIntegerDotProdct' (did you mean 'shaderIntegerDotProduct'?)", "  int_dot:"),
    ("  int_dot: {Dot4x8: [shaderIntegerDotProduct], plain: []}\n",
     "variant axis 'int_dot' value 'Dot4x8' must be lower_snake_case", "  int_dot:"),
])
def test_bad_choice_axis_is_reported_with_its_line(scratch_repo: Path, new, message, marker):
    ops_yaml = scratch_repo / "ops.yaml"
    edit(ops_yaml, AXIS, new)
    before = tree_digest(scratch_repo)
    run = gen_cli(scratch_repo, "--no-compile")
    assert run.returncode != 0 and "Traceback" not in run.stderr, run.stderr
    matching = [l for l in run.stderr.splitlines() if message in l]
    assert matching, run.stderr
    assert matching[0].startswith(f"ops.yaml:{line_of(ops_yaml, marker)}: "), matching[0]
    assert tree_digest(scratch_repo) == before


def test_a_choice_axis_is_no_storage(scratch_repo: Path):
    """storage_of must name a storage axis; a choice axis is refused."""
    ops_yaml = scratch_repo / "ops.yaml"
    edit(ops_yaml, "    shader: {template: q8ta_linear, axes: [dtype, storage, int_dot]}\n",
         "    shader: {template: q8ta_linear, axes: [dtype, storage, int_dot], storage_of: {out: int_dot}}\n")
    run = gen_cli(scratch_repo, "--no-compile")
    assert run.returncode != 0 and "Traceback" not in run.stderr, run.stderr
    assert "storage_of 'int_dot' is neither a storage" in run.stderr, run.stderr
