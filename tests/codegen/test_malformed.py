"""Malformed YAML: one `file:line: message` line per problem, non-zero exit, no traceback,
generated/ untouched."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.codegen.test_generate import gen_cli, tree_digest

ADD_ENTRY = "  add:\n    targets: [aten.add.Tensor]\n"


def edit(path: Path, old: str, new: str, count: int = 1) -> None:
    text = path.read_text()
    assert old in text, f"fixture text not found: {old!r}"
    path.write_text(text.replace(old, new, count))


def line_of(path: Path, marker) -> int:
    """1-based line of the first line containing `marker`; for (text, offset), of the first line
    that is exactly `text` (or, with a non-zero offset, contains it), plus the offset."""
    if isinstance(marker, str):
        needle, offset, exact = marker, 0, False
    else:
        needle, offset = marker
        exact = offset == 0
    for i, line in enumerate(path.read_text().splitlines(keepends=True), 1):
        if (line == needle) if exact else (needle.strip() in line):
            return i + offset
    raise AssertionError(needle)


# (id, file, edit (old, new), expected message fragment, line marker found after the edit)
CASES = [
    ("unknown-op-key", "ops.yaml", (ADD_ENTRY, "  add:\n    target: [aten.add.Tensor]\n"),
     "unknown key 'target' in op 'add' (did you mean 'targets'?)", "    target: [aten.add.Tensor]"),
    ("unknown-repset", "ops.yaml", ("      alpha: {kind: float, default: 1.0}\n    outputs: {out: ANY_STORAGE}",
                                    "      alpha: {kind: float, default: 1.0}\n    outputs: {out: ANY_STORAG}"),
     "unknown repset 'ANY_STORAG' (did you mean 'ANY_STORAGE'?)", "{out: ANY_STORAG}"),
    ("sync-missing-arg", "ops.yaml", ("sync: [[self, other, out]]", "sync: [[self, othr, out]]"),
     "sync group member 'othr' names no argument or output (did you mean 'other'?)", "[[self, othr, out]]"),
    ("sync-scalar", "ops.yaml", ("sync: [[self, other, out]]", "sync: [[self, alpha, out]]"),
     "sync group member 'alpha' is not a tensor", "[[self, alpha, out]]"),
    ("duplicate-target", "ops.yaml", ("targets: [aten.sub.Tensor]", "targets: [aten.add.Tensor]"),
     "target 'aten.add.Tensor' is already implemented by op 'add'", "  sub:"),
    ("duplicate-op", "ops.yaml", ("  sub:\n", "  add:\n"), "duplicate key 'add'", ("targets: [aten.sub.Tensor]", -1)),
    ("bad-indentation", "ops.yaml", ("    targets: [aten.mul.Tensor]\n", "    targets: [aten.mul.Tensor]\n   dtypes: FP\n"),
     "YAML syntax error", ("   dtypes: FP\n", 0)),
    ("wrong-type", "ops.yaml", ("    flags: [identity, supports_highdim, supports_resize]\n    shader:\n      template: copy\n      axes: [dtype, storage]\n      params: {}\n  clone:",
                                "    flags: identity\n    shader:\n      template: copy\n      axes: [dtype, storage]\n      params: {}\n  clone:"),
     "op 'alias_copy' flags must be a list, found string 'identity'", "    flags: identity"),
    ("unknown-flag", "ops.yaml", ("flags: [identity, supports_highdim, supports_resize]", "flags: [identty]"),
     "unknown flag 'identty' (did you mean 'identity'?)", "flags: [identty]"),
    ("unknown-template", "ops.yaml", ("template: binary", "template: binry"),
     "unknown shader template 'binry' (did you mean 'binary'?)", "template: binry"),
    ("undeclared-param", "ops.yaml", ('params: {OP: "X * Y"}', 'params: {OP: "X * Y", TILE: "4"}'),
     "template 'binary' has no parameter 'TILE'", '"X * Y", TILE'),
    ("missing-param", "ops.yaml", ('params: {OP: "X * Y"}', "params: {}"),
     "template 'binary' needs parameter 'OP'", "params: {}"),
    ("unknown-dtype-set", "ops.yaml", ("dtypes: FP_INT", "dtypes: FP_INTS"),
     "unknown dtype set 'FP_INTS' (did you mean 'FP_INT'?)", "dtypes: FP_INTS"),
    ("unknown-axis", "ops.yaml", ("axes: [dtype, storage]", "axes: [dtype, storag]"),
     "unknown variant axis 'storag' (did you mean 'storage'?)", "axes: [dtype, storag]"),
    ("bad-target", "ops.yaml", ("targets: [aten.relu.default]", "targets: [relu]"),
     "target 'relu' must look like namespace.op.overload", "targets: [relu]"),
    ("empty-ops", "ops.yaml", None, "file is empty", None),
    ("layout-unknown-in-repset", "layouts.yaml", ("BUFFER: [WIDTH_PACKED]\n  WIDTH_PACKED_TEXTURE", "BUFFER: [WIDTH_PACKD]\n  WIDTH_PACKED_TEXTURE"),
     "unknown layout 'WIDTH_PACKD' (did you mean 'WIDTH_PACKED'?)", "[WIDTH_PACKD]"),
    ("repset-cycle", "layouts.yaml", ("union: [ANY_BUFFER, ANY_TEXTURE]", "union: [ANY_BUFFER, ANY_STORAGE]"),
     "repset 'ANY_STORAGE' is defined in terms of itself", "  ANY_STORAGE:"),
    ("int8-on-texture", "layouts.yaml", ("  CHANNELS_PACKED_TEXTURE:\n    TEXTURE_3D: [CHANNELS_PACKED]",
                                         "  CHANNELS_PACKED_TEXTURE:\n    TEXTURE_3D: [PACKED_INT8_4W4C]"),
     "layout 'PACKED_INT8_4W4C' is not allowed in storage 'TEXTURE_3D'", "TEXTURE_3D: [PACKED_INT8_4W4C]"),
    ("layout-bad-dim", "layouts.yaml", ("    packed_dim: 0\n", "    packed_dim: 7\n"),
     "layout 'WIDTH_PACKED' packed_dim must be a WHCN dim 0..3, found 7", "packed_dim: 7"),
    ("layout-missing-key", "layouts.yaml", ("    short: HP\n", ""),
     "layout 'HEIGHT_PACKED' is missing required key 'short'", "  HEIGHT_PACKED:"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_malformed_input_is_reported_with_its_line(scratch_repo: Path, case):
    _, fname, change, message, marker = case
    path = scratch_repo / fname
    if change is None:
        path.write_text("")
    else:
        edit(path, *change)
    before = tree_digest(scratch_repo)
    run = gen_cli(scratch_repo, "--no-compile")
    assert run.returncode != 0
    assert "Traceback" not in run.stderr
    problems = [l for l in run.stderr.splitlines() if not l.startswith("texelflow gen:")]
    assert problems, run.stderr
    for line in problems:
        assert re.match(r"^(ops|layouts)\.yaml:\d+: \S", line), line
    matching = [l for l in problems if message in l]
    assert matching, run.stderr
    expected_line = 1 if marker is None else line_of(path, marker)
    assert matching[0].startswith(f"{fname}:{expected_line}: "), (matching[0], expected_line)
    assert tree_digest(scratch_repo) == before


def test_every_problem_is_reported_not_just_the_first(scratch_repo: Path):
    ops_yaml = scratch_repo / "ops.yaml"
    edit(ops_yaml, "template: binary", "template: binry")
    edit(ops_yaml, "dtypes: FP_INT", "dtypes: FP_INTS")
    edit(scratch_repo / "layouts.yaml", "    short: HP\n", "")
    run = gen_cli(scratch_repo, "--no-compile")
    assert run.returncode == 1
    assert "layouts.yaml:" in run.stderr and "ops.yaml:" not in run.stderr.split("layouts.yaml")[0]
    assert "3 problem(s)" in run.stderr or "problem(s)" in run.stderr
