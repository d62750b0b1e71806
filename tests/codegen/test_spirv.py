"""SPIR-V compilation through the content-hash cache, with real glslc."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from texelflow.codegen import spirv
from texelflow.generated.variants import VARIANTS
from texelflow.shaders import spirv_cache

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
    assert "generated/glsl/bad_a.comp:4: error:" in err.value.failures["bad_a"]
    assert "good" not in err.value.failures


def test_a_failing_batch_keeps_its_good_variants(private_cache: Path, tmp_path: Path):
    """Enough jobs for several batches per core; the failures are found and named, and every good
    variant of every batch (the failing ones included) is cached."""
    good = [spirv.CompileJob(f"good_{i}", SOURCE % f"{i}.0") for i in range(4 * (os.cpu_count() or 1) + 3)]
    bad = [spirv.CompileJob("bad_first", SOURCE % "nope_1"), spirv.CompileJob("bad_last", SOURCE % "nope_2")]
    with pytest.raises(spirv.ShaderCompileError) as err:
        spirv.compile_many([bad[0], *good, bad[1]], [tmp_path], progress=False)
    assert set(err.value.failures) == {"bad_first", "bad_last"}
    assert [line.split(": error:")[0] for line in err.value.lines()] == [
        "generated/glsl/bad_first.comp:4", "generated/glsl/bad_last.comp:4"]
    entries = spirv.compile_many(good, [tmp_path], progress=False)  # all cached: no glslc run needed
    assert all(p.read_bytes()[:4] == spirv_cache.SPIRV_MAGIC for p in entries.values())


def test_cache_entries_are_written_atomically(private_cache: Path, tmp_path: Path):
    spirv.compile_many([spirv.CompileJob("one", SOURCE % "3.0")], [tmp_path], progress=False)
    leftovers = [p for p in private_cache.rglob("*") if p.name.startswith(".tmp-")]
    assert leftovers == []
    assert len(list(private_cache.glob("*.spv"))) == 1 and len(list((private_cache / "by-source").glob("*.spv"))) == 1


def test_warnings_are_errors(private_cache: Path, tmp_path: Path):
    src = "#version 450\n#extension GL_NOT_A_REAL_EXTENSION : enable\nlayout(local_size_x = 1) in;\nvoid main() {}\n"
    with pytest.raises(spirv.ShaderCompileError):
        spirv.compile_many([spirv.CompileJob("warn", src)], [tmp_path], progress=False)


def test_spirv_for_a_generated_variant():
    code = spirv.spirv_for(VARIANTS["relu_float32_texture3d"])
    assert code[:4] == b"\x03\x02\x23\x07" and len(code) % 4 == 0


RUNTIME_SCRIPT = textwrap.dedent("""
    import sys
    from texelflow.runtime.vulkan.device import Device
    from texelflow.runtime.vulkan.pipeline import PipelineCache, find_variant

    device = Device()
    cache = PipelineCache(device)
    try:
        cache.get(find_variant("relu", dtype="float32", storage="texture3d"))
    finally:
        cache.close()
        device.close()
    print(sorted(m for m in sys.modules if m.startswith("texelflow.codegen")))
""")


def run_runtime(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", RUNTIME_SCRIPT], env=env, capture_output=True, text=True)


def test_runtime_needs_neither_codegen_nor_glslc_for_a_cached_variant(private_cache: Path, tmp_path: Path):
    env = dict(os.environ, TEXELFLOW_CACHE_DIR=str(private_cache), TEXELFLOW_GLSLC=str(tmp_path / "no-glslc"))
    cold = run_runtime(env)  # nothing cached and no compiler: a clear error
    assert cold.returncode != 0 and "GlslcMissingError" in cold.stderr and "not in the SPIR-V cache" in cold.stderr
    # Warm the cache the way the runtime does, with glslc, then run again without it.
    from texelflow.runtime.vulkan.pipeline import generated_spirv

    assert generated_spirv(VARIANTS["relu_float32_texture3d"])[:4] == spirv_cache.SPIRV_MAGIC
    warm = run_runtime(env)
    assert warm.returncode == 0, warm.stderr
    assert warm.stdout.strip() == "[]"  # texelflow.codegen never imported


def test_runtime_and_gen_share_cache_entries(private_cache: Path):
    """`texelflow gen` (compile_many) and the runtime (spirv_cache.spirv) file a variant under one key."""
    from texelflow.runtime.vulkan.pipeline import generated_spirv

    code = generated_spirv(VARIANTS["relu_float32_buffer"])
    assert len(list(private_cache.glob("*.spv"))) == 1
    assert spirv.spirv_for(VARIANTS["relu_float32_buffer"]) == code
    assert len(list(private_cache.glob("*.spv"))) == 1
