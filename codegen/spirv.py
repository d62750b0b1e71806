"""Compile every variant to SPIR-V with shaderc's glslc, in batches, through the shared cache.

The cache itself (key, folder, atomic writes, compile-on-miss for the runtime) lives in
`texelflow.shaders.spirv_cache`, which the runtime imports without the code generator. This module
adds what `texelflow gen` needs: many variants per glslc process (glslc's start-up, not its work,
dominated one process per variant), spread over every core, and errors reported at the template
line that produced the bad GLSL (`shaders/NAME.glsl.j2:LINE: error: ...`), with the generated file
and line, every failure of a run at once.

When a batch fails, glslc has still written the SPIR-V of each of its variants that compiled (it
writes a file's output only when that file compiled): those are cached, and each missing one is
compiled alone, with its `#line` markers turned into comments so that glslc names lines of the
generated file (messages about an include file name no variant, so a batch's messages cannot be
shared out); the markers then map each line back to the template (codegen.glsl_lines.SourceMap).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from texelflow.shaders.spirv_cache import (  # noqa: F401  (re-exported: the generator's names)
    BASE_FLAGS,
    GlslcMissingError,
    cache_dir,
    cache_key,
    entry_path,
    flags_for,
    glslc_command,
    glslc_path,
    glslc_version,
    include_fingerprint,
    portable_key,
    portable_path,
    read_entry,
    store,
    write_atomic,
    write_entry,
)

from .glsl_lines import SourceMap, remove_markers

_MESSAGE_RE = re.compile(r"^(?P<file>.*?):(?P<line>[0-9]+): (?P<text>(?:error|warning): .*)$")
_FILE_MESSAGE_RE = re.compile(r"^(?P<file>[^:]*): (?P<text>(?:error|warning): .*)$")
_SUMMARY_RE = re.compile(r"^[0-9]+ (?:errors?|warnings?)(?: and [0-9]+ (?:errors?|warnings?))? generated\.$")


@dataclass(frozen=True)
class CompileJob:
    name: str
    source: str
    target_env: str = "vulkan1.1"
    path: str | None = None  # how messages name the file; default generated/glsl/NAME.comp

    @property
    def display(self) -> str:
        return self.path or f"generated/glsl/{self.name}.comp"


@dataclass(frozen=True)
class Problem:
    """One glslc message about one variant: `where: text (also)`."""

    variant: str
    where: str  # shaders/unary.glsl.j2:17, shaders/include/indexing.glslh:4, generated/glsl/X.comp:40
    text: str  # "error: 'foo' : undeclared identifier"
    also: str = ""  # generated/glsl/X.comp:40 when `where` is a template line

    def __str__(self) -> str:
        return f"{self.where}: {self.text}" + (f" ({self.also})" if self.also else "")


class ShaderCompileError(Exception):
    """Every failed variant, its messages mapped to template lines: one line per problem."""

    def __init__(self, problems: list[Problem]):
        self.problems = sorted(problems, key=lambda p: p.variant)  # stable: glslc's order per variant
        self.failures: dict[str, str] = {}
        for p in self.problems:
            self.failures[p.variant] = (self.failures.get(p.variant, "") + "\n" + str(p)).lstrip("\n")
        super().__init__("\n".join(self.lines()))

    def lines(self) -> list[str]:
        """One line per distinct problem; a template line that breaks many variants is named once,
        with the first variant's generated line and how many more variants it breaks."""
        groups: dict[tuple[str, str], list[Problem]] = {}
        for p in self.problems:
            groups.setdefault((p.where, p.text), []).append(p)
        out = []
        for (where, text), ps in sorted(groups.items(), key=lambda kv: _location_order(kv[0][0])):
            first = ps[0]
            also = first.also or (f"generated/glsl/{first.variant}.comp" if where.startswith("shaders/") else "")
            more = len({p.variant for p in ps}) - 1
            if more:
                also = f"{also}, and {more} more variant{'s' if more > 1 else ''}" if also else f"{more + 1} variants"
            out.append(f"{where}: {text}" + (f" ({also})" if also else ""))
        return out


def _location_order(where: str):
    path, _, line = where.rpartition(":")
    return (path, int(line)) if line.isdigit() else (where, 0)


def compile_many(jobs: list[CompileJob], include_dirs: list[Path], progress: bool | None = None,
                 include_names: dict[Path, str] | None = None) -> dict[str, Path]:
    """Compile every job not yet cached, many per glslc process over every core; return the cache
    entry of each job. Raises ShaderCompileError listing every failure of every job.

    `include_names` maps an include folder to the path messages should name it by."""
    includes = include_fingerprint(include_dirs)
    results: dict[str, Path] = {}
    todo: dict[str, tuple[CompileJob, str]] = {}  # key -> (first job with that source, portable key)
    twins: dict[str, list[CompileJob]] = {}  # first job's name -> later jobs with the same source
    checked: set[str] = set()
    for job in jobs:
        key = cache_key(job.source, includes, job.target_env)
        results[job.name] = entry_path(key)
        if key in todo:
            twins.setdefault(todo[key][0].name, []).append(job)
            continue
        if key in checked:  # a twin of a cached job
            continue
        checked.add(key)
        code = read_entry(results[job.name])  # None when absent or bad (then recompiled, with a warning)
        if code is None:
            todo[key] = (job, portable_key(job.source, includes, job.target_env))
        else:  # cached; make sure a glslc-less runtime finds it too (entries from older versions)
            portable = portable_path(portable_key(job.source, includes, job.target_env))
            if read_entry(portable) is None:
                write_entry(portable, code)
    if not todo:
        return results
    batches = _batches(list(todo.items()), os.cpu_count() or 1)
    names = _include_names(include_dirs, include_names)
    problems: list[Problem] = []
    with tempfile.TemporaryDirectory(prefix="texelflow-glsl-") as tmp:
        def run(numbered):
            n, batch = numbered
            return len(batch), _compile_batch(batch, include_dirs, names, Path(tmp) / f"b{n}")

        show = sys.stderr.isatty() if progress is None else progress
        workers = min(len(batches), os.cpu_count() or 1)
        with ThreadPoolExecutor(max_workers=workers) as pool:
            done = pool.map(run, enumerate(batches))
            if show:
                from rich.progress import Progress

                with Progress(transient=True) as bar:
                    task = bar.add_task(f"compiling {len(todo)} shaders", total=len(todo))
                    for size, found in done:
                        bar.advance(task, size)
                        problems.extend(found)
            else:
                for _, found in done:
                    problems.extend(found)
    for p in list(problems):
        for twin in twins.get(p.variant, ()):
            first = next(j for j, _ in todo.values() if j.name == p.variant)
            problems.append(Problem(twin.name, p.where.replace(first.display, twin.display), p.text,
                                    p.also.replace(first.display, twin.display)))
    if problems:
        raise ShaderCompileError(problems)
    return results


def _batches(items: list, workers: int) -> list[list]:
    """Split the work into about two batches per core, balanced by source size (largest first onto
    the lightest batch), one target environment per batch."""
    by_env: dict[str, list] = {}
    for item in items:
        by_env.setdefault(item[1][0].target_env, []).append(item)
    out = []
    for group in by_env.values():
        count = max(1, min(len(group), 2 * workers if len(group) > 4 * workers else workers))
        bins: list[list] = [[] for _ in range(count)]
        loads = [0] * count
        for item in sorted(group, key=lambda it: -len(it[1][0].source)):
            i = loads.index(min(loads))
            bins[i].append(item)
            loads[i] += len(item[1][0].source)
        out.extend(b for b in bins if b)
    return out


def _include_names(include_dirs: list[Path], names: dict[Path, str] | None) -> dict[str, str]:
    """Absolute include folder -> the prefix messages use for files in it."""
    out = {}
    given = {Path(k).resolve(): v for k, v in (names or {}).items()}
    for d in include_dirs:
        d = Path(d).resolve()
        if d in given:
            out[str(d)] = given[d]
        else:
            try:
                out[str(d)] = str(d.relative_to(Path.cwd()))
            except ValueError:
                out[str(d)] = str(d)
    return out


def _compile_batch(batch, include_dirs, names: dict[str, str], work: Path) -> list[Problem]:
    """One glslc process for the whole batch; on failure, find and explain each failing variant."""
    src_dir, out_dir = work / "src", work / "out"
    src_dir.mkdir(parents=True)
    out_dir.mkdir()
    files = []
    for key, (job, portable) in batch:
        src = src_dir / f"{job.name}.comp"
        src.write_text(job.source, encoding="utf-8")
        files.append((key, job, portable, src, out_dir / f"{job.name}.comp.spv"))
    cmd = glslc_command(batch[0][1][0].target_env, include_dirs)
    proc = subprocess.run([*cmd, "-c", *(str(f[3]) for f in files)], cwd=out_dir, capture_output=True, text=True)
    problems: list[Problem] = []
    for key, job, portable, src, out in files:
        if proc.returncode == 0 or out.exists():
            # glslc writes a file's SPIR-V only when that file compiled.
            store(key, portable, out.read_bytes())
            continue
        problems.extend(_compile_alone(key, job, portable, cmd, names, work))
    return problems


def _compile_alone(key: str, job: CompileJob, portable: str, cmd: list[str], names: dict[str, str],
                   work: Path) -> list[Problem]:
    """Explain a variant that its batch did not compile: compile it alone with its `#line` markers
    turned into comments, so glslc names lines of the generated file, and map those to the template.
    (Should it compile after all, as after a crashed batch, it is compiled as is and cached.)"""
    alone = work / "alone"
    alone.mkdir(exist_ok=True)
    plain = alone / f"{job.name}.comp"
    plain.write_text(remove_markers(job.source), encoding="utf-8")
    proc = subprocess.run([*cmd, str(plain), "-o", str(alone / f"{job.name}.unmarked.spv")],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return _explain(proc, job, plain, names)
    src, out = alone / f"{job.name}.marked.comp", alone / f"{job.name}.spv"
    src.write_text(job.source, encoding="utf-8")
    again = subprocess.run([*cmd, str(src), "-o", str(out)], capture_output=True, text=True)
    if again.returncode == 0 and out.exists():
        store(key, portable, out.read_bytes())
        return []
    return _explain(again, job, src, names)


def _explain(proc: subprocess.CompletedProcess, job: CompileJob, src: Path, names: dict[str, str]) -> list[Problem]:
    text = (proc.stderr or proc.stdout or "").strip()
    return parse_messages(text, job, str(src), names) or [
        Problem(job.name, job.display, f"error: glslc failed: {text or 'no message'}")]


def parse_messages(text: str, job: CompileJob, source_path: str, names: dict[str, str]) -> list[Problem]:
    """glslc's `file:line: error: ...` lines about `job` (compiled from `source_path`) -> Problems."""
    smap = SourceMap.of(job.source)
    problems = []
    for raw in text.splitlines():
        raw = raw.rstrip()
        if not raw or _SUMMARY_RE.match(raw):
            continue
        m = _MESSAGE_RE.match(raw)
        if m is None:  # `file: error: ...` or glslc's own `glslc: error: ...`
            f = _FILE_MESSAGE_RE.match(raw)
            problems.append(Problem(job.name, job.display, f.group("text") if f else raw))
            continue
        file, line, msg = m.group("file"), int(m.group("line")), m.group("text")
        if _same_file(file, source_path):
            generated = f"{job.display}:{line}"
            origin = smap.origin(line)
            if origin is not None:
                problems.append(Problem(job.name, f"{origin[0]}:{origin[1]}", msg, generated))
            else:
                problems.append(Problem(job.name, generated, msg))
        else:
            where = f"{_include_display(file, names)}:{line}"
            problems.append(Problem(job.name, where, msg, f"included by {job.display}"))
    return problems


def _same_file(a: str, b: str) -> bool:
    return os.path.normpath(os.path.abspath(a)) == os.path.normpath(os.path.abspath(b))


def _include_display(file: str, names: dict[str, str]) -> str:
    """A file glslc names (an include, or a `#line` file name) as the repository names it."""
    full = os.path.normpath(os.path.abspath(file))
    for d, prefix in names.items():
        if full.startswith(d.rstrip(os.sep) + os.sep):
            return f"{prefix}/{os.path.relpath(full, d)}"
    return file


def installed_include_dirs() -> list[Path]:
    """Include dirs of the installed package: the generated layouts header and shaders/include."""
    import texelflow.generated as generated
    import texelflow.shaders as shaders

    return [Path(generated.__file__).parent / "glsl" / "include", Path(shaders.__file__).parent / "include"]


def spirv_for(variant) -> bytes:
    """SPIR-V of a generated variant (a texelflow.generated.variants.ShaderVariant), compiled on demand
    (the runtime's own path is texelflow.shaders.spirv_cache; this one raises ShaderCompileError)."""
    import texelflow.generated as generated

    source = (Path(generated.__file__).parent / "glsl" / variant.source).read_text(encoding="utf-8")
    job = CompileJob(variant.name, source, variant.target_env, f"generated/glsl/{variant.source}")
    for _ in range(2):  # a second time only if the entry was removed or spoilt since it was written
        code = read_entry(compile_many([job], installed_include_dirs(), progress=False)[variant.name])
        if code is not None:  # (from memory when the cache folder cannot be written)
            return code
    raise ShaderCompileError([Problem(variant.name, job.display, "error: its SPIR-V cache entry keeps going bad")])
