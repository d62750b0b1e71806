"""SPIR-V compilation through the content-hash cache, with real glslc."""

from __future__ import annotations

from pathlib import Path

import pytest

from texelflow.codegen import spirv
from texelflow.generated.variants import VARIANTS

SOURCE = """#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 0, std430) buffer B { float v[]; };
void main() { v[0] = %s; }
"""


@pytest.fixture
def private_cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("TEXELFLOW_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_cache_hit_reuses_the_file(private_cache: Path, tmp_path: Path):
    inc = tmp_path / "inc"
    inc.mkdir()
    job = spirv.CompileJob("one", SOURCE % "1.0")
    first = spirv.compile_many([job], [inc], progress=False)["one"]
    assert first.read_bytes()[:4] == b"\x03\x02\x23\x07"  # SPIR-V magic, little endian
    stamp = first.stat().st_mtime_ns
    again = spirv.compile_many([job], [inc], progress=False)["one"]
    assert again == first and again.stat().st_mtime_ns == stamp
    # Any include change is a new key, even one the source does not include.
    (inc / "extra.glslh").write_text("// changed\n")
    changed = spirv.compile_many([job], [inc], progress=False)["one"]
    assert changed != first and changed.exists()


def test_key_covers_source_target_env_and_compiler():
    a = spirv.cache_key("x", "inc", "vulkan1.1")
    assert a != spirv.cache_key("y", "inc", "vulkan1.1")
    assert a != spirv.cache_key("x", "inc", "vulkan1.2")
    assert a != spirv.cache_key("x", "inc2", "vulkan1.1")
    assert spirv.glslc_version() in spirv.glslc_version()  # queried once, stable


def test_all_failures_are_reported_together(private_cache: Path, tmp_path: Path):
    jobs = [
        spirv.CompileJob("good", SOURCE % "2.0"),
        spirv.CompileJob("bad_a", SOURCE % "undefined_a"),
        spirv.CompileJob("bad_b", SOURCE % "1.0 +"),
    ]
    with pytest.raises(spirv.ShaderCompileError) as err:
        spirv.compile_many(jobs, [tmp_path], progress=False)
    assert set(err.value.failures) == {"bad_a", "bad_b"}
    assert "undefined_a" in str(err.value)
    assert "generated/glsl/bad_a.comp" in err.value.failures["bad_a"]


def test_warnings_are_errors(private_cache: Path, tmp_path: Path):
    src = "#version 450\n#extension GL_NOT_A_REAL_EXTENSION : enable\nlayout(local_size_x = 1) in;\nvoid main() {}\n"
    with pytest.raises(spirv.ShaderCompileError):
        spirv.compile_many([spirv.CompileJob("warn", src)], [tmp_path], progress=False)


def test_spirv_for_a_generated_variant():
    code = spirv.spirv_for(VARIANTS["relu_float32_texture3d"])
    assert code[:4] == b"\x03\x02\x23\x07" and len(code) % 4 == 0
