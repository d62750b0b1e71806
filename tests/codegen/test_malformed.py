"""Malformed YAML: one `file:line: message` line per problem, non-zero exit, no traceback,
generated/ untouched."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.codegen.test_generate import gen_cli, tree_digest

ADD_ENTRY = "  add:\n    class: binary\n    targets: [aten.add.Tensor]\n"


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
    ("unknown-op-key", "ops.yaml", (ADD_ENTRY, "  add:\n    class: binary\n    target: [aten.add.Tensor]\n"),
     "unknown key 'target' in op 'add' (did you mean 'targets'?)", "    target: [aten.add.Tensor]"),
    ("unknown-class", "ops.yaml", ("    class: unary\n    targets: [aten.relu.default]", "    class: unry\n    targets: [aten.relu.default]"),
     "op 'relu': unknown class 'unry' (did you mean 'unary'?)", "class: unry"),
    ("unknown-repset", "ops.yaml", ("    outputs: {out: CONTIGUOUS_ANY}\n    sync: [[self, mat2, out]]",
                                    "    outputs: {out: CONTIGUOUS_AN}\n    sync: [[self, mat2, out]]"),
     "unknown repset 'CONTIGUOUS_AN' (did you mean 'CONTIGUOUS_ANY'?)", "{out: CONTIGUOUS_AN}"),
    ("sync-missing-arg", "ops.yaml", ("sync: [[self, mat2, out]]", "sync: [[self, mat3, out]]"),
     "sync group member 'mat3' names no argument or output (did you mean 'mat2'?)", "[[self, mat3, out]]"),
    ("sync-scalar", "ops.yaml", (ADD_ENTRY, ADD_ENTRY + "    sync: [[self, alpha, out]]\n"),
     "sync group member 'alpha' is not a tensor", "[[self, alpha, out]]"),
    ("duplicate-target", "ops.yaml", ("targets: [aten.sub.Tensor]", "targets: [aten.add.Tensor]"),
     "target 'aten.add.Tensor' is already implemented by op 'add'", "  sub:"),
    ("duplicate-op", "ops.yaml", ("  sub:\n", "  add:\n"), "duplicate key 'add'", ("targets: [aten.sub.Tensor]", -2)),
    ("bad-indentation", "ops.yaml", ("    targets: [aten.mul.Tensor]\n", "    targets: [aten.mul.Tensor]\n   dtypes: FP\n"),
     "YAML syntax error", ("   dtypes: FP\n", 0)),
    ("wrong-type", "ops.yaml", ("    flags: [identity, supports_highdim]\n", "    flags: identity\n"),
     "op 'alias_copy' flags must be a list, found string 'identity'", "    flags: identity"),
    ("unknown-flag", "ops.yaml", ("flags: [identity, supports_highdim]", "flags: [identty]"),
     "unknown flag 'identty' (did you mean 'identity'?)", "flags: [identty]"),
    ("unknown-template", "ops.yaml", ("shader: {template: binary}", "shader: {template: binry}"),
     "unknown shader template 'binry' (did you mean 'binary'?)", "template: binry"),
    ("undeclared-param", "ops.yaml", ('params: {OP: "X * Y"}', 'params: {OP: "X * Y", TILE: "4"}'),
     "template 'binary' has no parameter 'TILE'", '"X * Y", TILE'),
    ("missing-param", "ops.yaml", ('params: {OP: "X * Y"}', "params: {}"),
     "template 'binary' needs parameter 'OP'", "params: {}"),
    ("unknown-dtype-set", "ops.yaml", ("    dtypes: FP_H_INT\n    shader: {template: binary}", "    dtypes: FP_H_INTS\n    shader: {template: binary}"),
     "unknown dtype set 'FP_H_INTS' (did you mean 'FP_H_INT'?)", "dtypes: FP_H_INTS"),
    ("unknown-axis", "ops.yaml", ("shader: {axes: [dtype, storage]}", "shader: {axes: [dtype, storag]}"),
     "unknown variant axis 'storag' (did you mean 'storage'?)", "axes: [dtype, storag]"),
    ("bad-target", "ops.yaml", ("targets: [aten.relu.default]", "targets: [relu]"),
     "target 'relu' must look like namespace.op.overload", "targets: [relu]"),
    ("empty-ops", "ops.yaml", None, "file is empty", None),
    # ---- the template's contract ----
    ("missing-sync", "ops.yaml", ("    targets: [aten.relu.default]\n", "    targets: [aten.relu.default]\n    sync: []\n"),
     "template 'unary' assumes self, out share packed-dim info (shaders/unary.glsl.j2:2), but no sync group", "    sync: []"),
    ("wrong-sync", "ops.yaml", ("    sync: [[input, out]]\n    dtypes: FP_H\n    weights: [weight, bias]\n    samples:\n      - {input: [1, 3, 7, 5]",
                                "    sync: [[input, weight]]\n    dtypes: FP_H\n    weights: [weight, bias]\n    samples:\n      - {input: [1, 3, 7, 5]"),
     "template 'conv2d' assumes input, out share packed-dim info", "    sync: [[input, weight]]"),
    ("contract-storage", "ops.yaml", ("tensors: {input: CONTIGUOUS_ANY, weight: CONTIGUOUS_BUFFER,", "tensors: {input: CONTIGUOUS_ANY, weight: CONTIGUOUS_ANY,"),
     "template 'linear' binds 'weight' as a buffer (shaders/linear.glsl.j2:3), but its repset CONTIGUOUS_ANY allows TEXTURE_3D",
     "tensors: {input: CONTIGUOUS_ANY, weight: CONTIGUOUS_ANY,"),
    ("contract-weights", "ops.yaml", ("    sync: [[input, out]]\n    weights: [weight, bias]\n    samples:\n      - {input: [2, 3, 7], weight: [5, 7]",
                                      "    sync: [[input, out]]\n    weights: [weight]\n    samples:\n      - {input: [2, 3, 7], weight: [5, 7]"),
     "template 'linear' reads 'bias' as a prepacked constant (shaders/linear.glsl.j2:4); list it in `weights`", "    weights: [weight]"),
    ("contract-cooperative-grid", "shaders/q8ta_linear_gemv.glsl.j2",
     ("grid: {cooperative: out, invocations: 4}", "grid: {cooperative: out, invocations: 3}"),
     "contract grid must be per_output_unit", "grid: {cooperative: out, invocations: 3}"),
    ("contract-tile-invocations", "shaders/linear_wg.glsl.j2",
     ("grid: {per_tile: out, width: 64, height: 64, invocations: 256}",
      "grid: {per_tile: out, width: 64, height: 64, invocations: 512}"),
     "{per_tile: TENSOR, width: W, height: H[, planes: P][, invocations: N]}", "invocations: 512}"),
    ("contract-element-units", "shaders/cat.glsl.j2",
     ("grid: {per_list_element: tensors, element_units: whole}", "grid: {per_list_element: tensors, element_units: wholes}"),
     "contract grid: element_units 'wholes' is not a spec constant of the template", "element_units: wholes"),
    # ---- torch's schema ----
    ("unknown-target", "ops.yaml", ("targets: [aten.relu.default]", "targets: [aten.relu.Tensor]"),
     "target 'aten.relu.Tensor': torch 2.13.0", "targets: [aten.relu.Tensor]"),
    ("unknown-torch-op", "ops.yaml", ("targets: [aten.relu.default]", "targets: [aten.reluu.default]"),
     "has no op 'aten.reluu'", "targets: [aten.reluu.default]"),
    ("arg-name-vs-schema", "ops.yaml", ("tensors: {input: CHANNELS_PACKED_TEXTURE,", "tensors: {inp: CHANNELS_PACKED_TEXTURE,"),
     "'inp' is no tensor argument of aten.conv2d.default (its tensors: input, weight, bias) (did you mean 'input'?)",
     "tensors: {inp: CHANNELS_PACKED_TEXTURE,"),
    ("arg-default-vs-schema", "ops.yaml", ("args: {approximate: {values: [none, tanh]}}",
                                           "args: {approximate: {values: [none, tanh], default: tanh}}"),
     "arg 'approximate': default 'tanh' disagrees with torch's schema of aten.gelu.default", "default: tanh"),
    ("scalar-kind-retyped", "ops.yaml", ("args: {dim: {kind: any}}", "args: {dim: {kind: int}}"),
     "kind comes from torch's schema", "args: {dim: {kind: int}}"),
    ("returns-vs-outputs", "ops.yaml", ("outputs: {out: ANY_STORAGE, mean: ANY_STORAGE, rstd: ANY_STORAGE}\n    sync: [[input, out, mean, rstd]]",
                                        "outputs: {out: ANY_STORAGE, mean: ANY_STORAGE}\n    sync: [[input, out, mean]]"),
     "aten.native_layer_norm.default returns 3 tensor(s), but the op declares 2 output(s)", "targets: [aten.native_layer_norm.default]"),
    # ---- push constants and hooks ----
    ("push-without-derivation", "ops.yaml", ("    push:\n      pool_pad_dilation: {ivec4: [{pair: padding}, {pair: dilation}]}\n", ""),
     "push constant 'pool_pad_dilation' (ivec4) of template contract shaders/pool2d.glsl.j2:", "  max_pool2d:"),
    ("push-unknown-rule", "ops.yaml", ("push: {alpha: arg}", "push: {alpha: {argument: alpha}}"),
     "a derivation names exactly one of", "push: {alpha: {argument: alpha}}"),
    ("push-optional-without-none", "ops.yaml", ("{arg: min, none: -inf}", "{arg: min}"),
     "argument 'min' may be None; say what the shader gets then with `none:`", "{arg: min}, max"),
    ("hook-missing", "ops.yaml", ("    shader:\n      template: permute\n",
                                  "    push: {permute_dims: {hook: whcn_perm}}\n    shader:\n      template: permute\n"),
     "hook 'whcn_perm' does not exist in shaders/hooks.py (did you mean 'whcn_permutation'?)", "{hook: whcn_perm}"),
    ("check-unknown-list-ref", "ops.yaml", ("{broadcast_foldable: [in0, in1], of: out}", "{broadcast_foldable: [in0, in2], of: out}"),
     "check 'broadcast_foldable' names 'in2', which the op does not have", "{broadcast_foldable: [in0, in2], of: out}"),
    ("check-unknown-arg", "ops.yaml", ("    shader: {template: matmul}\n", "    checks: [{rank: {mat3: [2]}}]\n    shader: {template: matmul}\n"),
     "check 'rank' names 'mat3', which the op does not have", "checks: [{rank: {mat3: [2]}}]"),
    ("check-unknown-choice", "shaders/scan.glsl.j2", ("kind: scan, of: out}", "kind: scann, of: out}"),
     "check 'loop_trips' takes kind one of reduce, softmax, scan, layer_norm, group_norm, pool, adaptive_pool, "
     "matmul, conv, conv_transpose, conv_transpose_tiles, sort, not 'scann' (did you mean 'scan'?)", "kind: scann"),
    ("sample-missing-tensor", "ops.yaml", ("      - {self: [3, 7], mat2: [7, 5]}", "      - {self: [3, 7]}"),
     "sample lacks tensor 'mat2'", "      - {self: [3, 7]}"),
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
    ("storage-bad-kind", "layouts.yaml", ("    kind: image\n", "    kind: imag\n"),
     "unknown storage kind 'imag' (did you mean 'image'?)", ("  TEXTURE_3D:", 3)),
    ("storage-descriptor-mismatch", "layouts.yaml", ("    descriptor: STORAGE_IMAGE\n", "    descriptor: STORAGE_BUFFER\n"),
     "storage 'TEXTURE_3D': kind 'image' is bound as STORAGE_IMAGE, not STORAGE_BUFFER", ("  TEXTURE_3D:", 5)),
    ("storage-image-without-dims", "layouts.yaml", ("    image_dims: 3\n", ""),
     "storage 'TEXTURE_3D' is an image and needs 'image_dims'", "  TEXTURE_3D:\n"),
    ("storage-duplicate-axis", "layouts.yaml", ("    axis: texture3d\n", "    axis: buffer\n"),
     "storage 'TEXTURE_3D' reuses axis name 'buffer' of 'BUFFER'", ("  TEXTURE_3D:", 2)),
    ("dtype-unknown-feature", "layouts.yaml", ("features: [shaderFloat16, storageBuffer16BitAccess]",
                                               "features: [shaderFlaot16, storageBuffer16BitAccess]"),
     "unknown device feature 'shaderFlaot16' (did you mean 'shaderFloat16'?)", "shaderFlaot16"),
    ("dtype-unknown-family", "layouts.yaml", ("    family: int8x4\n    bytes: 1\n", "    family: int8x8\n    bytes: 1\n"),
     "unknown family 'int8x8' (did you mean 'int8x4'?)", "family: int8x8"),
    ("dtype-missing-key", "layouts.yaml", ("    lane_bytes: 2\n", ""),
     "dtype 'float16' is missing required key 'lane_bytes'", "  float16:\n"),
    ("dtype-half-image-format", "layouts.yaml", ("    image_format: null\n", "    image_format: rgba8i\n"),
     "dtype 'int8': image, image_format and vk_format are all given or all null", "    image: null"),
    ("dtype-bad-bytes", "layouts.yaml", ("    bytes: 2\n", "    bytes: 3\n"),
     "dtype 'float16' bytes must be 1, 2, 4 or 8, found 3", "    bytes: 3"),
]


def test_hook_without_declaration(scratch_repo: Path):
    hooks = scratch_repo / "shaders" / "hooks.py"
    hooks.write_text(hooks.read_text() + '\n\n@hook("int")\ndef spare(node):\n    return 0\n')
    before = tree_digest(scratch_repo)
    run = gen_cli(scratch_repo, "--no-compile")
    assert run.returncode != 0 and "Traceback" not in run.stderr
    expected = line_of(hooks, "def spare(node):")
    assert f"shaders/hooks.py:{expected}: hook 'spare' is declared by no op" in run.stderr, run.stderr
    assert tree_digest(scratch_repo) == before


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
        assert re.match(r"^((ops|layouts)\.yaml|shaders/[\w.]+):\d+: \S", line), line
    matching = [l for l in problems if message in l]
    assert matching, run.stderr
    expected_line = 1 if marker is None else line_of(path, marker)
    assert matching[0].startswith(f"{fname}:{expected_line}: "), (matching[0], expected_line)
    assert tree_digest(scratch_repo) == before


def test_every_problem_is_reported_not_just_the_first(scratch_repo: Path):
    ops_yaml = scratch_repo / "ops.yaml"
    edit(ops_yaml, "template: binary", "template: binry")
    edit(ops_yaml, "    dtypes: FP_H_INT\n    shader: {template: binry}", "    dtypes: FP_H_INTS\n    shader: {template: binry}")
    edit(scratch_repo / "layouts.yaml", "    short: HP\n", "")
    run = gen_cli(scratch_repo, "--no-compile")
    assert run.returncode == 1
    assert "layouts.yaml:" in run.stderr and "ops.yaml:" not in run.stderr.split("layouts.yaml")[0]
    assert "3 problem(s)" in run.stderr or "problem(s)" in run.stderr
