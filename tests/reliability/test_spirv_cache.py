"""Issue 9, item 12: faults of the SPIR-V cache (and of the torch schema cache beside it).

(a) a cache folder on another filesystem than TMPDIR: entries are written through a temporary file
in their own folder, never renamed across folders; (b) a truncated, overwritten or edited entry is
detected (size, SPIR-V magic, recorded SHA-256) and recompiled with a warning, on the runtime path
and in gen, instead of reaching the driver (which answered VkErrorUnknown on every run); (c) a cache
folder that cannot be created or written gives one warning and an in-memory cache, never a raw
FileNotFoundError / OSError.
"""
from __future__ import annotations

import errno
import hashlib
import os
import tempfile
import uuid
import warnings
from pathlib import Path

import pytest

from texelflow.codegen import spirv, torch_schema
from texelflow.generated.variants import VARIANTS
from texelflow.shaders import spirv_cache
from texelflow.shaders.spirv_cache import CacheWarning, SpirvCacheWarning
from tests.codegen.test_spirv import run_runtime

SOURCE = """#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 0, std430) buffer B { float v[]; };
void main() { v[0] = %s; }
"""
VARIANT = "relu_float32_texture3d"


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("TEXELFLOW_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def inc(tmp_path) -> Path:
    d = tmp_path / "inc"
    d.mkdir()
    return d


def compile_one(inc: Path, value: str = "1.0") -> bytes:
    return spirv_cache.spirv(SOURCE % value, [inc], "vulkan1.1", "one")


def entries(cache: Path) -> list[Path]:
    return sorted(cache.glob("*.spv")) + sorted((cache / "by-source").glob("*.spv"))


def no_glslc(monkeypatch, tmp_path):
    monkeypatch.setenv("TEXELFLOW_GLSLC", str(tmp_path / "no-glslc"))
    assert not spirv_cache.glslc_available()


def same_folder_replace_only(monkeypatch) -> list[tuple[str, str]]:
    """os.replace as across two filesystems: a rename between folders fails with EXDEV."""
    calls: list[tuple[str, str]] = []
    real = os.replace

    def replace(src, dst, *args, **kwargs):
        calls.append((str(src), str(dst)))
        if Path(src).resolve().parent != Path(dst).resolve().parent:
            raise OSError(errno.EXDEV, "Invalid cross-device link", str(src))
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    return calls


# (a) another filesystem --------------------------------------------------------------------------


def test_cache_on_another_filesystem_than_tmpdir(monkeypatch, inc):
    """The real case when the machine has one (/dev/shm is a tmpfs where /tmp is on disk)."""
    shm = Path("/dev/shm")
    tmp = Path(tempfile.gettempdir())
    if not shm.is_dir() or shm.stat().st_dev == tmp.stat().st_dev:
        pytest.skip("no folder on another filesystem than TMPDIR here; the simulated test below covers it")
    root = shm / f"texelflow-test-{uuid.uuid4().hex}"
    monkeypatch.setenv("TEXELFLOW_CACHE_DIR", str(root))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no fallback to memory: the folder works
            code = compile_one(inc)
            assert code[:4] == spirv_cache.SPIRV_MAGIC
            got = spirv.compile_many([spirv.CompileJob("two", SOURCE % "2.0")], [inc], progress=False)
        assert got["two"].parent == root and spirv_cache.read_entry(got["two"]) is not None
        assert len(entries(root)) == 4
        assert not [p for p in root.rglob(".tmp-*")]
    finally:
        import shutil

        shutil.rmtree(root, ignore_errors=True)


def test_writes_never_rename_across_folders(cache, inc, monkeypatch):
    """Simulated: any rename between two folders fails as across filesystems; every write of the
    runtime path, of gen and of the torch schema cache still works and never tries one."""
    calls = same_folder_replace_only(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert compile_one(inc)[:4] == spirv_cache.SPIRV_MAGIC
        spirv.compile_many([spirv.CompileJob("two", SOURCE % "2.0")], [inc], progress=False)
        torch_schema.lookup({"aten.relu.default": None})
    assert calls and all(Path(s).parent == Path(d).parent for s, d in calls)
    assert len(entries(cache)) == 4 and (cache / "torch-schemas.json").is_file()


# (b) bad entries ---------------------------------------------------------------------------------

SPOILERS = {
    "truncated to whole words": lambda data: data[: len(data) // 2 // 4 * 4],
    "truncated mid-word": lambda data: data[:-3],
    "empty": lambda data: b"",
    "overwritten": lambda data: b"\0" * len(data),
    "one word changed": lambda data: data[:40] + b"\xff\xff\xff\xff" + data[44:],
}


@pytest.mark.parametrize("spoil", SPOILERS, ids=list(SPOILERS))
def test_a_bad_entry_is_recompiled_on_the_runtime_path(cache, inc, spoil):
    good = compile_one(inc)
    for entry in entries(cache):
        entry.write_bytes(SPOILERS[spoil](good))
    with pytest.warns(SpirvCacheWarning, match="bad SPIR-V cache entry .*recompiling it"):
        again = compile_one(inc)
    assert again == good
    assert all(e.read_bytes() == good for e in entries(cache))  # rewritten
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert compile_one(inc) == good  # and good from now on


@pytest.mark.parametrize("spoil", SPOILERS, ids=list(SPOILERS))
def test_a_bad_entry_is_recompiled_by_gen(cache, inc, spoil):
    jobs = [spirv.CompileJob("one", SOURCE % "1.0"), spirv.CompileJob("twin", SOURCE % "1.0")]
    path = spirv.compile_many(jobs, [inc], progress=False)["one"]
    good = path.read_bytes()
    for entry in entries(cache):
        entry.write_bytes(SPOILERS[spoil](good))
    with pytest.warns(SpirvCacheWarning, match="bad SPIR-V cache entry"):
        again = spirv.compile_many(jobs, [inc], progress=False)
    assert again["one"] == again["twin"] == path and path.read_bytes() == good
    assert all(e.read_bytes() == good for e in entries(cache))


def test_an_entry_without_its_hash_is_rebuilt_quietly(cache, inc):
    """Entries of an older texelflow have no hash sidecar: rebuilt (no warning) and then trusted."""
    good = compile_one(inc)
    for entry in entries(cache):
        spirv_cache.hash_path(entry).unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert compile_one(inc) == good
    for entry in entries(cache):
        assert spirv_cache.hash_path(entry).read_text().strip() == hashlib.sha256(good).hexdigest()


def test_a_bad_entry_without_glslc_is_a_clear_error(cache, inc, monkeypatch, tmp_path):
    good = compile_one(inc)
    for entry in entries(cache):
        entry.write_bytes(good[:64])
    no_glslc(monkeypatch, tmp_path)
    with pytest.warns(SpirvCacheWarning, match="bad SPIR-V cache entry"), \
            pytest.raises(spirv_cache.GlslcMissingError, match="not in the SPIR-V cache"):
        compile_one(inc)


def test_pipeline_creation_recompiles_a_bad_entry(cache, device):
    """The reported case: a truncated entry of a generated variant made every later run fail with
    VkErrorUnknown until it was deleted."""
    from texelflow.runtime.vulkan.pipeline import PipelineCache, find_variant, generated_spirv

    variant = VARIANTS[VARIANT]
    good = generated_spirv(variant)
    for entry in entries(cache):
        entry.write_bytes(good[: len(good) // 2 // 4 * 4])
    pipes = PipelineCache(device)
    try:
        with pytest.warns(SpirvCacheWarning, match="recompiling"):
            pipe = pipes.get(find_variant("relu", dtype="float32", storage="texture3d"))
        assert pipe.handle is not None
    finally:
        pipes.close()
    assert all(e.read_bytes() == good for e in entries(cache))


def test_bad_spirv_never_reaches_the_driver(device):
    """Whatever hands PipelineCache bad SPIR-V gets a clear VulkanError, not VkErrorUnknown."""
    from texelflow.runtime.vulkan.errors import VulkanError
    from texelflow.runtime.vulkan.pipeline import PipelineCache

    variant = VARIANTS[VARIANT]
    pipes = PipelineCache(device, spirv_for=lambda v: b"\x03\x02\x23\x07" + b"\0" * 17)
    try:
        with pytest.raises(VulkanError, match=f"shader module of {VARIANT}: its SPIR-V is not valid"):
            pipes.get(variant)
    finally:
        pipes.close()


# (c) unusable folders ----------------------------------------------------------------------------


def test_an_uncreatable_cache_folder_falls_back_to_memory(tmp_path, monkeypatch, inc):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("TEXELFLOW_CACHE_DIR", str(blocker / "cache"))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        first = compile_one(inc)
        second = compile_one(inc)  # from memory
        assert spirv.compile_many([spirv.CompileJob("one", SOURCE % "1.0")], [inc], progress=False)
    assert first == second and first[:4] == spirv_cache.SPIRV_MAGIC
    cache_warnings = [w for w in seen if issubclass(w.category, SpirvCacheWarning)]
    assert len(cache_warnings) == 1, [str(w.message) for w in seen]
    assert "cannot be used" in str(cache_warnings[0].message) and "in memory" in str(cache_warnings[0].message)
    no_glslc(monkeypatch, tmp_path)
    assert compile_one(inc) == first  # the in-memory cache serves a run without glslc too


def test_an_unwritable_cache_folder_falls_back_to_memory(cache, monkeypatch, inc):
    """A folder that exists but refuses writes (read-only; simulated, as root may write anywhere)."""
    cache.mkdir()

    def refuse(path, data):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(spirv_cache, "write_atomic", refuse)
    with pytest.warns(SpirvCacheWarning, match="Permission denied"):
        code = compile_one(inc, "5.0")
    assert code[:4] == spirv_cache.SPIRV_MAGIC and not entries(cache)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one warning per folder, not one per entry
        assert compile_one(inc, "6.0")[:4] == spirv_cache.SPIRV_MAGIC


def test_gen_spirv_for_works_without_a_usable_folder(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("TEXELFLOW_CACHE_DIR", str(blocker))
    with pytest.warns(SpirvCacheWarning):
        code = spirv.spirv_for(VARIANTS["relu_float32_buffer"])
    assert code[:4] == spirv_cache.SPIRV_MAGIC and len(code) % 4 == 0


def test_runtime_with_an_unusable_cache_folder_runs_with_one_warning(tmp_path):
    """The reported case, end to end: a raw FileNotFoundError before."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = dict(os.environ, TEXELFLOW_CACHE_DIR=str(blocker / "spirv"))
    out = run_runtime(env)  # builds a pipeline in a fresh process; prints the codegen modules it imported
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]" and "Traceback" not in out.stderr
    assert out.stderr.count("SpirvCacheWarning") == 1


# The torch schema cache of gen (torch-schemas.json in the same folder) -----------------------


def test_schema_cache_in_an_unusable_folder(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("TEXELFLOW_CACHE_DIR", str(blocker / "cache"))
    with pytest.warns(CacheWarning, match="cannot write the torch schema cache"):
        got = torch_schema.lookup({"aten.relu.default": None})
    assert [a.name for a in got["aten.relu.default"].args] == ["self"]


@pytest.mark.parametrize("text", ['{"torch": "2', "\0\0\0", "[]", '{"torch": null}', "not json",
                                  '{"torch": "VERSION", "targets": []}',
                                  '{"torch": "VERSION", "targets": {"aten.relu.default": {"args": 3}}}',
                                  '{"torch": "VERSION", "targets": {"aten.relu.default": "x"}}'])
def test_a_corrupted_schema_cache_is_rebuilt(cache, text):
    cache.mkdir()
    path = cache / "torch-schemas.json"
    path.write_text(text.replace("VERSION", torch_schema.torch_version()))
    got = torch_schema.lookup({"aten.relu.default": None})
    assert [a.name for a in got["aten.relu.default"].args] == ["self"]
    assert torch_schema.lookup({"aten.relu.default": None}) == got  # the rewritten file reads back
    assert not list(cache.glob(".tmp-*"))
