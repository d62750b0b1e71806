"""Shape classes (a template contract's `spec` and `span`): gen checks them and writes them into
the reflection; a bad declaration is one `file:line: message` line, no traceback, generated/
untouched."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.codegen.test_generate import gen_cli, tree_digest
from tests.codegen.test_malformed import edit, line_of
from texelflow.generated.ops import OPS
from texelflow.generated.variants import VARIANTS
from texelflow.shaders.node_rules import SPEC_RULES

# (id, template, edit (old, new), expected message fragment, the line it names after the edit)
BAD = [
    ("unknown-rule", "binary", ("a_class: {read_class: in0, of: out}", "a_class: {read_clas: in0, of: out}"),
     "spec constant 'a_class' names no spec rule 'read_clas' (did you mean 'read_class'?)", "a_class: {read_clas"),
    ("rule-params", "binary", ("a_class: {read_class: in0, of: out}", "a_class: {read_class: in0}"),
     "spec constant 'a_class': rule 'read_class' takes exactly read_class, of", "a_class: {read_class: in0}"),
    ("not-a-name", "unary", ("  ragged: {ragged: out}", "  Ragged: {ragged: out}"),
     "spec constant 'Ragged' must be a lower_snake_case name", "Ragged: {ragged: out}"),
    ("bad-span", "unary", ("span: {buffer: 16, texture3d: 4}", "span: {buffer: 0, texture3d: 4}"),
     "contract span of 'buffer' must be an int from 1 to 64, got 0", "span: {buffer: 0"),
    ("tensor-the-op-lacks", "binary", ("b_class: {read_class: in1, of: out}", "b_class: {read_class: in2, of: out}"),
     "op 'add': spec constant 'b_class' names tensor 'in2', which the op does not have", "b_class: {read_class: in2"),
    ("texel-reads-tensor-the-op-lacks", "binary", ("texel_reads: [in0, in1]", "texel_reads: [in0, in2]"),
     "op 'add': texel_reads names tensor 'in2', which the op does not have as an input", "texel_reads: [in0, in2]"),
    ("texel-reads-an-output", "unary", ("texel_reads: [in0]", "texel_reads: [out]"),
     "texel_reads names tensor 'out', which the op does not have as an input", "texel_reads: [out]"),
    ("texel-reads-not-a-list", "unary", ("texel_reads: [in0]", "texel_reads: in0"),
     "contract texel_reads must be a list of distinct tensor names, got 'in0'", "texel_reads: in0"),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_spec_declaration_is_one_line_naming_the_template(scratch_repo: Path, case):
    _, template, change, message, marker = case
    path = scratch_repo / "shaders" / f"{template}.glsl.j2"
    edit(path, *change)
    before = tree_digest(scratch_repo)
    run = gen_cli(scratch_repo, "--no-compile")
    assert run.returncode != 0
    assert "Traceback" not in run.stderr
    matching = [l for l in run.stderr.splitlines() if message in l]
    assert matching, run.stderr
    assert matching[0].startswith(f"shaders/{template}.glsl.j2:{line_of(path, marker)}: "), matching[0]
    assert tree_digest(scratch_repo) == before


def test_spec_name_clashing_with_a_push_constant_is_refused(scratch_repo: Path):
    path = scratch_repo / "shaders" / "binary.glsl.j2"
    edit(path, "  tail: {units_tail: out}", "  alpha: {units_tail: out}")
    run = gen_cli(scratch_repo, "--no-compile")
    assert run.returncode != 0 and "Traceback" not in run.stderr
    assert "op 'add': spec constant 'alpha' of template 'binary' has the name of a tensor, push or layout constant" \
        in run.stderr, run.stderr


def test_reflection_lists_each_shape_class_with_its_rule_and_general_default():
    add = VARIANTS["add_float32_buffer"]
    classes = {s.name: s for s in add.spec_constants if s.rule}
    assert set(classes) == {"bf16_out", "a_class", "b_class", "tail", "ragged", "rows4", "findex"}
    assert classes["bf16_out"].rule == "round_bfloat16"  # a bfloat16 program's mark (runtime/graph/bfloat16.py)
    assert classes["a_class"].rule == "read_class" and dict(classes["a_class"].params) == {"read_class": "self", "of": "out"}
    for s in classes.values():  # the default is the general path, right for any node
        assert s.default == SPEC_RULES[s.rule].general
    ids = [s.id for s in add.spec_constants]
    assert ids == list(range(len(ids)))  # layouts first (3, 4, 5), then the classes
    assert add.span == 16 and VARIANTS["add_float32_texture3d"].span == 4
    assert VARIANTS["clone_float32_buffer"].span == 16
    # templates without a contract `spec` keep one unit per invocation and no classes (conv2d's
    # contract declares only the bfloat16 store)
    conv = next(v for v in VARIANTS.values() if v.op == "conv2d")
    assert conv.span == 1 and [s.rule for s in conv.spec_constants if s.rule] == ["round_bfloat16"]
    gather = next(v for v in VARIANTS.values() if v.op == "index_select")
    assert gather.span == 1 and not [s for s in gather.spec_constants if s.rule]
    assert OPS["add"].template == "binary"


def test_every_spec_rule_documents_itself_and_has_a_general_value():
    for rule in SPEC_RULES.values():
        assert rule.doc and rule.general in (0, 1), rule.name
        assert rule.name in rule.tensor_params
