"""Compile GLSL to SPIR-V with shaderc's glslc, through a content-hash cache.

The cache key is the hash of the rendered source, every include file, the compiler version and the
flags, so a cache entry can never be stale and is shared by every checkout on the machine
(`TEXELFLOW_CACHE_DIR`, default ~/.cache/texelflow/spirv).
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

BASE_FLAGS = ("-fshader-stage=compute", "-O", "-Werror")


class ShaderCompileError(Exception):
    """Every failed variant, with glslc's messages."""

    def __init__(self, failures: dict[str, str]):
        self.failures = failures
        lines = [f"{len(failures)} shader variant(s) failed to compile:"]
        for name, msg in sorted(failures.items()):
            lines.append(f"--- {name}")
            lines.append(msg.strip())
        super().__init__("\n".join(lines))


class GlslcMissingError(Exception):
    pass


@dataclass(frozen=True)
class CompileJob:
    name: str
    source: str
    target_env: str = "vulkan1.1"


def glslc_path() -> str:
    path = shutil.which(os.environ.get("TEXELFLOW_GLSLC", "glslc"))
    if path is None:
        raise GlslcMissingError("glslc not found: install it with `apt-get install glslc` (or run `make test`)")
    return path


@functools.lru_cache(maxsize=None)
def glslc_version() -> str:
    out = subprocess.run([glslc_path(), "--version"], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def cache_dir() -> Path:
    root = os.environ.get("TEXELFLOW_CACHE_DIR")
    path = Path(root) if root else Path.home() / ".cache" / "texelflow" / "spirv"
    path.mkdir(parents=True, exist_ok=True)
    return path


def flags_for(target_env: str) -> tuple[str, ...]:
    return BASE_FLAGS + (f"--target-env={target_env}",)


def include_fingerprint(include_dirs: list[Path]) -> str:
    """Hash of every include file by name and content, in a fixed order."""
    h = hashlib.sha256()
    for d in include_dirs:
        for f in sorted(d.glob("*.glslh")):
            h.update(f.name.encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def cache_key(source: str, includes: str, target_env: str) -> str:
    h = hashlib.sha256()
    for part in (source, includes, glslc_version(), " ".join(flags_for(target_env))):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def compile_many(jobs: list[CompileJob], include_dirs: list[Path], progress: bool | None = None) -> dict[str, Path]:
    """Compile every job (cached ones are free) in parallel; raise with all failures at once."""
    includes = include_fingerprint(include_dirs)
    cdir = cache_dir()
    results: dict[str, Path] = {}
    todo = []
    for job in jobs:
        path = cdir / f"{cache_key(job.source, includes, job.target_env)}.spv"
        results[job.name] = path
        if not path.exists():
            todo.append((job, path))
    if not todo:
        return results
    glslc = glslc_path()
    failures: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="texelflow-glsl-") as tmp:
        def run(item):
            job, path = item
            src = Path(tmp) / f"{job.name}.comp"
            src.write_text(job.source, encoding="utf-8")
            out = Path(tmp) / f"{job.name}.spv"
            cmd = [glslc, *flags_for(job.target_env), *(f"-I{d}" for d in include_dirs), str(src), "-o", str(out)]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                return job.name, (proc.stderr or proc.stdout).replace(str(src), f"generated/glsl/{job.name}.comp")
            os.replace(out, path)  # atomic: a reader never sees half a file
            return job.name, None

        show = sys.stderr.isatty() if progress is None else progress
        with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
            if show:
                from rich.progress import Progress

                with Progress(transient=True) as bar:
                    task = bar.add_task("compiling shaders", total=len(todo))
                    for name, err in pool.map(run, todo):
                        bar.advance(task)
                        if err:
                            failures[name] = err
            else:
                for name, err in pool.map(run, todo):
                    if err:
                        failures[name] = err
    if failures:
        raise ShaderCompileError(failures)
    return results


def installed_include_dirs() -> list[Path]:
    """Include dirs of the installed package: the generated layouts header and shaders/include."""
    import texelflow.generated as generated
    import texelflow.shaders as shaders

    return [Path(generated.__file__).parent / "glsl" / "include", Path(shaders.__file__).parent / "include"]


def spirv_for(variant) -> bytes:
    """SPIR-V of a generated variant (a texelflow.generated.variants.ShaderVariant), compiled on demand."""
    import texelflow.generated as generated

    source = (Path(generated.__file__).parent / "glsl" / variant.source).read_text(encoding="utf-8")
    job = CompileJob(variant.name, source, variant.target_env)
    path = compile_many([job], installed_include_dirs(), progress=False)[variant.name]
    return path.read_bytes()
