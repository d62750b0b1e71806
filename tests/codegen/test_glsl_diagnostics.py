"""GLSL errors at the template line: `#line` markers in the rendered GLSL, and `texelflow gen`
naming `shaders/NAME.glsl.j2:LINE` (and the generated file and line) for every broken variant."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from texelflow.codegen import glsl_lines, spirv
from texelflow.codegen.generate import build_models, generate, render_all
from texelflow.codegen.spirv import ShaderCompileError
from tests.codegen.test_generate import gen_cli, tree_digest
from tests.conftest import ROOT

JINJA = ("{{", "{%", "{#", "#}")


@pytest.fixture(scope="module")
def rendered() -> dict[str, str]:
    layouts, ops = build_models(ROOT)
    return {k: v for k, v in render_all(ROOT, layouts, ops).items() if k.endswith(".comp")}


def line_of(path: Path, needle: str) -> int:
    hits = [i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line]
    assert len(hits) == 1, f"{needle!r} is on lines {hits} of {path}"
    return hits[0]


def test_markers_are_the_only_change(rendered, monkeypatch):
    """Without the markers (and the extension line enabling them) the GLSL is exactly what the
    templates render with plain jinja2."""
    monkeypatch.setattr(glsl_lines, "install", lambda env, prefix="": env)
    layouts, ops = build_models(ROOT)
    plain = render_all(ROOT, layouts, ops)
    for rel, text in rendered.items():
        kept = [line for line in text.split("\n")
                if not line.startswith("#line ") and line != glsl_lines.EXTENSION_LINE]
        assert "\n".join(kept) == plain[rel], rel


def test_every_line_maps_to_the_template_line_that_wrote_it(rendered):
    templates: dict[str, list[str]] = {}
    for rel, text in rendered.items():
        smap = glsl_lines.SourceMap.of(text)
        lines = text.split("\n")
        assert lines[1] == glsl_lines.EXTENSION_LINE, rel
        markers = 0
        for n, line in enumerate(lines, 1):
            if line.startswith("#line "):
                markers += 1
                continue
            origin = smap.origin(n)
            code = line.strip() and not line.strip().startswith("//")
            if n > 2 and code:
                assert origin is not None, f"{rel}:{n} has no template line"
            if origin is None:
                continue
            path, tline = origin
            assert path.startswith("shaders/") and path.endswith(".glsl.j2"), origin
            src = templates.setdefault(path, (ROOT / path).read_text().split("\n"))
            if code and not any(j in src[tline - 1] for j in JINJA):
                assert src[tline - 1] == line, f"{rel}:{n} maps to {path}:{tline}"
        assert markers < len(lines) / 2, f"{rel}: {markers} markers in {len(lines)} lines"


def test_source_map_reads_markers():
    text = '#version 450\n#line 7 "a.j2"\nx\ny\n#line 3\nz\n#line 1 "b.j2"\nw'
    smap = glsl_lines.SourceMap.of(text)
    assert [smap.origin(n) for n in range(1, 9)] == [
        None, None, ("a.j2", 7), ("a.j2", 8), None, ("a.j2", 3), None, ("b.j2", 1)]
    assert glsl_lines.remove_markers(text).split("\n")[1] == '//#line 7 "a.j2"'


def test_template_glsl_error_names_the_template_line(scratch_repo: Path):
    # (expand: a template of few variants, so that the test compiles few; its buffer branch breaks)
    template = scratch_repo / "shaders" / "expand.glsl.j2"
    needle = "t_out[w] = {{ out.to_word }}(read_self(runs_word(w)));"
    line = line_of(template, needle)
    template.write_text(template.read_text().replace(needle, "not_declared_anywhere; " + needle))  # no type clash, whatever out is
    before = tree_digest(scratch_repo)

    with pytest.raises(ShaderCompileError) as err:
        generate(scratch_repo)
    problems = err.value.problems
    assert problems and {p.where for p in problems} == {f"shaders/expand.glsl.j2:{line}"}
    assert all(name.endswith("_buffer") for name in err.value.failures)  # the texture branch is intact
    layouts, ops = build_models(scratch_repo)
    files = render_all(scratch_repo, layouts, ops)
    for p in problems:  # the generated line named is the one holding the broken text
        path, gline = p.also.rsplit(":", 1)
        assert "not_declared_anywhere" in files[path.removeprefix("generated/")].split("\n")[int(gline) - 1]

    run = gen_cli(scratch_repo)
    assert run.returncode == 1 and "Traceback" not in run.stderr
    errors = [x for x in run.stderr.splitlines() if ": error: " in x]
    assert len(errors) == 1, run.stderr  # one problem, however many variants it breaks
    assert re.fullmatch(rf"shaders/expand\.glsl\.j2:{line}: error: 'not_declared_anywhere' : undeclared identifier "
                        r"\(generated/glsl/\w+_buffer\.comp:\d+(, and \d+ more variants)?\)", errors[0]), errors[0]
    assert f"{len(err.value.failures)} shader variant(s) failed to compile" in run.stderr
    assert tree_digest(scratch_repo) == before


def test_errors_in_two_templates_are_all_reported(scratch_repo: Path):
    shaders = scratch_repo / "shaders"  # (templates of few variants, so that the test compiles few)
    roll, expand = shaders / "roll.glsl.j2", shaders / "expand.glsl.j2"
    include = '{% include "_prologue.glsl.j2" %}\n'
    roll.write_text(roll.read_text().replace(include, include + "void broken() { undefined_in_roll(); }\n", 1))
    expand.write_text(expand.read_text().replace(include, include + "void broken() { undefined_in_expand(); }\n", 1))
    before = tree_digest(scratch_repo)

    run = gen_cli(scratch_repo)
    assert run.returncode == 1 and "Traceback" not in run.stderr
    errors = [x for x in run.stderr.splitlines() if ": error: " in x]
    assert len(errors) == 2, run.stderr
    assert errors[0].startswith(f"shaders/expand.glsl.j2:{line_of(expand, 'undefined_in_expand')}: error: ")
    assert errors[1].startswith(f"shaders/roll.glsl.j2:{line_of(roll, 'undefined_in_roll')}: error: ")
    assert tree_digest(scratch_repo) == before


def test_error_in_an_include_names_the_include(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("TEXELFLOW_CACHE_DIR", str(tmp_path / "cache"))
    inc = tmp_path / "include"
    inc.mkdir()
    (inc / "helpers.glslh").write_text("float twice(float x) {\n  return x * two_undefined;\n}\n")
    source = ('#version 450\n' + glsl_lines.EXTENSION_LINE + '\n#extension GL_GOOGLE_include_directive : require\n'
              '#line 4 "shaders/demo.glsl.j2"\nlayout(local_size_x = 1) in;\n'
              'layout(set = 0, binding = 0, std430) buffer B { float v[]; };\n#include "helpers.glslh"\n'
              'void main() { v[0] = twice(1.0) + after_include; }\n')
    jobs = [spirv.CompileJob(name, source) for name in ("demo_a", "demo_b")]
    with pytest.raises(ShaderCompileError) as err:
        spirv.compile_many(jobs, [inc], progress=False, include_names={inc: "shaders/include"})
    assert err.value.lines() == [
        "shaders/demo.glsl.j2:7: error: 'after_include' : undeclared identifier "
        "(generated/glsl/demo_a.comp:8, and 1 more variant)",
        "shaders/include/helpers.glslh:2: error: 'two_undefined' : undeclared identifier "
        "(included by generated/glsl/demo_a.comp, and 1 more variant)",
    ]
