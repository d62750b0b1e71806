"""The SPIR-V cache shared by the code generator and the runtime (no import of either).

An entry is keyed by the hash of the GLSL source, every include file (name and content), the
compiler version and the flags, so it can never be stale, and it is shared by every checkout on
the machine: `TEXELFLOW_CACHE_DIR`, default ~/.cache/texelflow/spirv. Entries are written
atomically (a temporary file in the entry's own folder, then a rename, so the cache may live on any
filesystem), so concurrent writers and readers never see half a file.

Each entry `KEY.spv` has a sidecar `KEY.sha256` (the hex SHA-256 of the entry, written first). An
entry is used only when it is a whole number of 32-bit words, starts with the SPIR-V magic and
matches its hash; a bad one (truncated, overwritten, edited) is recompiled and rewritten with a
SpirvCacheWarning, never handed to the driver. When the folder cannot be created or written,
entries are kept in memory for the life of the process instead, with one SpirvCacheWarning.

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
import threading
import warnings
from pathlib import Path
from typing import Iterable

BASE_FLAGS = ("-fshader-stage=compute", "-O", "-Werror")
SPIRV_MAGIC = b"\x03\x02\x23\x07"  # little endian


class CacheWarning(UserWarning):
    """An on-disk cache of texelflow could not be used as it is (an unusable folder, a bad entry);
    work goes on without it."""


class SpirvCacheWarning(CacheWarning):
    """The SPIR-V cache could not be used as it is (an unusable folder, a bad entry); work goes on."""


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
    """The cache folder (`TEXELFLOW_CACHE_DIR`, default ~/.cache/texelflow/spirv); created on the
    first write, not here, so that naming an unusable folder is not yet an error."""
    root = os.environ.get("TEXELFLOW_CACHE_DIR")
    return Path(root) if root else Path.home() / ".cache" / "texelflow" / "spirv"


# Entries of cache folders that cannot be written, by full path, for the life of the process.
_memory: dict[str, bytes] = {}
_unusable: set[str] = set()  # cache folders found unusable (each warned about once)
_lock = threading.Lock()


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
    return cache_dir() / "by-source" / f"{key}.spv"


def hash_path(entry: Path) -> Path:
    """The sidecar holding the hex SHA-256 of `entry`."""
    return entry.with_suffix(".sha256")


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file in the same folder (never across filesystems)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
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


def spirv_problem(data: bytes) -> str | None:
    """Why `data` is not a SPIR-V module (too short, not whole words, no magic), or None."""
    if len(data) < 20:
        return f"{len(data)} bytes, shorter than a SPIR-V header"
    if len(data) % 4:
        return f"{len(data)} bytes, not a whole number of 32-bit words"
    if data[:4] != SPIRV_MAGIC:
        return f"no SPIR-V magic number (starts with {data[:4].hex()})"
    return None


def _warn_unusable(root: Path, exc: OSError) -> None:
    with _lock:
        if str(root) in _unusable:
            return
        _unusable.add(str(root))
    why = exc.strerror or str(exc)
    warnings.warn(f"texelflow: the SPIR-V cache folder {root} cannot be used ({why}: "
                  f"{getattr(exc, 'filename', None) or root}); keeping compiled shaders in memory for this "
                  "process only. Set TEXELFLOW_CACHE_DIR to a writable folder to keep them.",
                  SpirvCacheWarning, stacklevel=3)


def write_entry(path: Path, data: bytes) -> None:
    """File one entry and its hash sidecar (hash first, so a reader that sees the entry sees its
    hash); in memory when the cache folder cannot be created or written."""
    root = cache_dir()
    if str(root) not in _unusable:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(hash_path(path), hashlib.sha256(data).hexdigest().encode() + b"\n")
            write_atomic(path, data)
            with _lock:
                _memory.pop(str(path), None)
            return
        except OSError as exc:
            _warn_unusable(root, exc)
    with _lock:
        _memory[str(path)] = data


def read_entry(path: Path, *, unverified_ok: bool = False) -> bytes | None:
    """The SPIR-V of an entry, or None when it is absent, unreadable or bad (a bad one is reported
    with a SpirvCacheWarning and must be recompiled). An entry without its hash sidecar (written by
    an older texelflow) counts as absent unless `unverified_ok` (no compiler to rebuild it)."""
    with _lock:
        data = _memory.get(str(path))
    if data is not None:
        return data
    try:
        data = path.read_bytes()
    except OSError:  # absent, or a folder we cannot read: a miss
        return None
    problem = spirv_problem(data)
    if problem is None:
        try:
            want = hash_path(path).read_text(encoding="ascii").strip()
        except (OSError, ValueError):
            return data if unverified_ok else None
        if hashlib.sha256(data).hexdigest() != want:
            problem = f"{len(data)} bytes that do not match their recorded SHA-256"
    if problem is not None:
        warnings.warn(f"texelflow: bad SPIR-V cache entry {path} ({problem}); "
                      f"{'ignoring it' if unverified_ok else 'recompiling it'}", SpirvCacheWarning, stacklevel=3)
        return None
    return data


def store(key: str, portable: str, data: bytes) -> Path:
    """File SPIR-V under its key (and its portable key); returns the entry's path."""
    problem = spirv_problem(data)
    if problem is not None:
        raise SpirvCompileError(f"glslc wrote something that is not SPIR-V ({problem})")
    path = entry_path(key)
    write_entry(path, data)
    write_entry(portable_path(portable), data)
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
        data = read_entry(portable_path(portable), unverified_ok=True)
        if data is None:
            raise GlslcMissingError(f"shader {name} is not in the SPIR-V cache ({cache_dir()}) and glslc is not "
                                    "installed: install it (`apt-get install glslc`) or run `texelflow gen` "
                                    "where it is")
        return data
    key = cache_key(source, includes, target_env)
    data = read_entry(entry_path(key))
    if data is not None:
        return data
    data = compile_source(source, include_dirs, target_env, name)
    store(key, portable, data)
    return data
