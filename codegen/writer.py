"""Write the generated tree: only changed files, atomically, and stale files removed."""

from __future__ import annotations

import difflib
import os
import tempfile
from pathlib import Path

KEEP = ("__pycache__",)


def existing_files(out_dir: Path) -> dict[str, str]:
    files = {}
    if not out_dir.exists():
        return files
    for path in sorted(out_dir.rglob("*")):
        rel = path.relative_to(out_dir).as_posix()
        if path.is_file() and not any(part in KEEP for part in path.relative_to(out_dir).parts):
            files[rel] = path.read_text(encoding="utf-8", errors="replace")
    return files


def drift(out_dir: Path, wanted: dict[str, str]) -> list[str]:
    """Human-readable differences between generated/ on disk and what the YAML produces."""
    have = existing_files(out_dir)
    problems = []
    for rel in sorted(set(have) | set(wanted)):
        if rel not in have:
            problems.append(f"generated/{rel}: missing")
        elif rel not in wanted:
            problems.append(f"generated/{rel}: not produced by the YAML (stale or hand-added)")
        elif have[rel] != wanted[rel]:
            diff = difflib.unified_diff(
                have[rel].splitlines(), wanted[rel].splitlines(), f"generated/{rel} (on disk)", "(from YAML)", lineterm="", n=1
            )
            problems.append(f"generated/{rel}: differs\n" + "\n".join(list(diff)[:20]))
    return problems


def write_tree(out_dir: Path, wanted: dict[str, str]) -> list[str]:
    """Write changed files atomically, delete stale ones; returns the paths touched."""
    have = existing_files(out_dir)
    touched = []
    for rel, text in sorted(wanted.items()):
        if have.get(rel) == text:
            continue
        path = out_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        os.replace(tmp, path)
        touched.append(rel)
    for rel in sorted(set(have) - set(wanted)):
        (out_dir / rel).unlink()
        touched.append(rel)
    return touched
