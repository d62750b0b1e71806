"""The SPIR-V cache shared by the code generator and the runtime (no import of either).

An entry is keyed by the hash of the GLSL source, every include file (name and content), the
compiler version and the flags, so it can never be stale, and it is shared by every checkout on
the machine: `TEXELFLOW_CACHE_DIR`, default ~/.cache/texelflow/spirv. Entries are written
atomically (a temporary file in the cache folder, then a rename), so concurrent writers and readers
never see half a file.

`texelflow gen` fills the cache in batches (texelflow.codegen.spirv); the runtime asks `spirv()`
for one variant and compiles it with glslc only on a miss. So that a machine without glslc can run
what was compiled on it, each entry is also filed under a key without the compiler version
(`by-source/`): when glslc is absent, the runtime takes the SPIR-V that the last compiler built from
the same source, includes and flags.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterable

BASE_FLAGS = ("-fshader-stage=compute", "-O", "-Werror")
SPIRV_MAGIC = b"\x03\x02\x23\x07"  # little endian


class GlslcMissingError(Exception):
    """glslc is needed (a variant is not cached) but not installed."""


class SpirvCompileError(Exception):
    """glslc rejected a shader; the message is glslc's."""


def glslc_path() -> str:
    path = shutil.which(os.environ.get("TEXELFLOW_GLSLC", "glslc"))
    if path is None:
        raise GlslcMissingError("glslc not found: install it with `apt-get install glslc` (or run `make test`)")
    return path


@functools.lru_cache(maxsize=None)
def _version_of(path: str) -> str:
    out = subprocess.run([path, "--version"], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def glslc_version() -> str:
    """`glslc --version` of the compiler in use (asked once per process and binary)."""
    return _version_of(glslc_path())


def glslc_available() -> bool:
    try:
        glslc_path()
    except GlslcMissingError:
        return False
    return True


def cache_dir() -> Path:
    root = os.environ.get("TEXELFLOW_CACHE_DIR")
    path = Path(root) if root else Path.home() / ".cache" / "texelflow" / "spirv"
    path.mkdir(parents=True, exist_ok=True)
    return path


def flags_for(target_env: str) -> tuple[str, ...]:
    return BASE_FLAGS + (f"--target-env={target_env}",)


def include_fingerprint(include_dirs: Iterable[Path]) -> str:
    """Hash of every include file by name and content, in a fixed order."""
    h = hashlib.sha256()
    for d in include_dirs:
        for f in sorted(Path(d).glob("*.glslh")):
            h.update(f.name.encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def _hash(parts: Iterable[str]) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def cache_key(source: str, includes: str, target_env: str) -> str:
    """Key of the SPIR-V of `source` (`includes` = include_fingerprint); runs glslc once for its version."""
    return _hash((source, includes, glslc_version(), " ".join(flags_for(target_env))))


def portable_key(source: str, includes: str, target_env: str) -> str:
    """The same key without the compiler version: the glslc-less fallback of the runtime."""
    return _hash((source, includes, " ".join(flags_for(target_env))))


def entry_path(key: str) -> Path:
    return cache_dir() / f"{key}.spv"


def portable_path(key: str) -> Path:
    path = cache_dir() / "by-source"
    path.mkdir(exist_ok=True)
    return path / f"{key}.spv"


def write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".spv")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def store(key: str, portable: str, data: bytes) -> Path:
    """File SPIR-V under its key (and its portable key); returns the entry's path."""
    if data[:4] != SPIRV_MAGIC or len(data) % 4:
        raise SpirvCompileError(f"glslc wrote something that is not SPIR-V ({len(data)} bytes)")
    path = entry_path(key)
    write_atomic(path, data)
    write_atomic(portable_path(portable), data)
    return path


def glslc_command(target_env: str, include_dirs: Iterable[Path]) -> list[str]:
    return [glslc_path(), *flags_for(target_env), *(f"-I{Path(d).resolve()}" for d in include_dirs)]


def compile_source(source: str, include_dirs: list[Path], target_env: str = "vulkan1.1", name: str = "shader") -> bytes:
    """SPIR-V of one shader, straight from glslc (no cache); SpirvCompileError with glslc's messages."""
    cmd = glslc_command(target_env, include_dirs)
    with tempfile.TemporaryDirectory(prefix="texelflow-glsl-") as tmp:
        src, out = Path(tmp) / f"{name}.comp", Path(tmp) / f"{name}.spv"
        src.write_text(source, encoding="utf-8")
        proc = subprocess.run([*cmd, str(src), "-o", str(out)], capture_output=True, text=True)
        if proc.returncode != 0 or not out.exists():
            raise SpirvCompileError((proc.stderr or proc.stdout).replace(str(src), f"{name}.comp").strip())
        return out.read_bytes()


def spirv(source: str, include_dirs: list[Path], target_env: str = "vulkan1.1", name: str = "shader") -> bytes:
    """SPIR-V of `source`: from the cache, else compiled with glslc (GlslcMissingError without it)."""
    includes = include_fingerprint(include_dirs)
    portable = portable_key(source, includes, target_env)
    if not glslc_available():
        try:
            return portable_path(portable).read_bytes()
        except FileNotFoundError:
            raise GlslcMissingError(f"shader {name} is not in the SPIR-V cache ({cache_dir()}) and glslc is not "
                                    "installed: install it (`apt-get install glslc`) or run `texelflow gen` "
                                    "where it is") from None
    key = cache_key(source, includes, target_env)
    try:
        return entry_path(key).read_bytes()
    except FileNotFoundError:
        pass
    data = compile_source(source, include_dirs, target_env, name)
    store(key, portable, data)
    return data
