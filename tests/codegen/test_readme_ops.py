"""README "Adding an op" replayed: its snippets rebuild the checked-in registry exactly.

A scratch copy of the repository loses the ops the README walks through (their ops.yaml entries
and the templates the README creates); the snippets marked `<!-- replay: FILE -->` in README.md are
then applied one walk-through at a time, as a contributor would: an ops.yaml snippet is appended
to `ops:`, any other file is written whole. After the last one, generated/ must equal the
repository's byte for byte, and only ops.yaml and the README's template may have changed.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from texelflow.codegen.generate import generate
from tests.conftest import ROOT, copy_sources

SECTION = "## Adding an op"
REPLAY_RE = re.compile(r"<!-- replay: (?P<file>[\w./-]+) -->\n```[\w-]*\n(?P<body>.*?)^```", re.S | re.M)
ENTRY_RE = re.compile(r"^  ([a-z_][a-z0-9_]*):\s*$", re.M)


def walkthroughs() -> list[tuple[str, list[tuple[str, str]]]]:
    """(sub-heading, [(file, snippet)]) for each sub-section of "Adding an op" with snippets."""
    text = (ROOT / "README.md").read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    section = text[start:] if end < 0 else text[start:end]
    result = []
    for part in section.split("\n### ")[1:]:
        snippets = [(m["file"], m["body"]) for m in REPLAY_RE.finditer(part)]
        if snippets:
            result.append((part.splitlines()[0], snippets))
    return result


def ops_of(walks) -> list[str]:
    return [name for _, snippets in walks for file, body in snippets if file == "ops.yaml"
            for name in ENTRY_RE.findall(body)]


def remove_entry(ops_yaml: str, name: str) -> str:
    """ops.yaml without the entry `name` under `ops:` (its key line and every deeper line)."""
    lines = ops_yaml.splitlines(keepends=True)
    start = lines.index(f"  {name}:\n", lines.index("ops:\n"))
    end = start + 1
    while end < len(lines) and (lines[end].startswith("    ") or not lines[end].strip()):
        end += 1
    return "".join(lines[:start] + lines[end:])


def append_to_ops(ops_yaml: str, snippet: str) -> str:
    """The snippet added at the end of the `ops:` mapping (the last top-level key of ops.yaml)."""
    tail = ops_yaml[ops_yaml.index("\nops:\n"):]
    assert not re.search(r"^[^\s#]", tail[len("\nops:\n"):], re.M), "`ops:` is not the last key of ops.yaml"
    return ops_yaml.rstrip("\n") + "\n" + snippet


def digest(root: Path, generated: bool) -> dict[str, str]:
    """Path -> sha256 of the files of generated/ (generated=True) or of the sources around it."""
    files = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if p.is_file() and "__pycache__" not in rel.parts and (rel.parts[0] == "generated") == generated:
            files[rel.as_posix()] = hashlib.sha256(p.read_bytes()).hexdigest()
    return files


def changed(before: dict, after: dict) -> list[str]:
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))


def test_readme_walkthroughs_rebuild_the_registry(tmp_path: Path):
    walks = walkthroughs()
    assert len(walks) == 3, [title for title, _ in walks]
    names = ops_of(walks)
    assert names == ["erf", "leaky_relu", "flip"]
    new_files = [f for _, snippets in walks for f, _ in snippets if f != "ops.yaml"]
    assert new_files == ["shaders/flip.glsl.j2"]

    root = copy_sources(tmp_path)
    ops_yaml = root / "ops.yaml"
    text = ops_yaml.read_text()
    for name in names:
        text = remove_entry(text, name)
    ops_yaml.write_text(text)
    for f in new_files:
        (root / f).unlink()

    # Without the README's ops, generated/ is the repository's minus theirs.
    generate(root, compile=False)
    repo = digest(ROOT, generated=True)
    stripped = digest(root, generated=True)
    theirs = {k for k in repo if any(Path(k).name.startswith(f"{n}_") for n in names)}
    assert theirs and set(stripped) == set(repo) - theirs
    shared = ("generated/ops.py", "generated/variants.py", "generated/samples.py")
    assert changed(repo, stripped) == sorted(theirs | set(shared))
    for f in shared:
        body = (root / f).read_text()
        assert not [n for n in names if f"'{n}'" in body or f"'{n}_" in body], f

    # Each walk-through touches ops.yaml (and flip one template), and adds exactly its op.
    sources_before = digest(root, generated=False)
    for (title, snippets), name in zip(walks, names):
        gen_before = digest(root, generated=True)
        src_before = digest(root, generated=False)
        for file, body in snippets:
            if file == "ops.yaml":
                ops_yaml.write_text(append_to_ops(ops_yaml.read_text(), body))
            else:
                (root / file).write_text(body)
        assert changed(src_before, digest(root, generated=False)) == sorted({f for f, _ in snippets}), title
        generate(root, compile=False)
        mine = sorted(k for k in theirs if Path(k).name.startswith(f"{name}_"))
        assert changed(gen_before, digest(root, generated=True)) == sorted(mine + list(shared)), title

    # (a) generated/ is the checked-in tree byte for byte; (b) only these sources were touched.
    after = digest(root, generated=True)
    assert changed(repo, after) == [], "the README snippets no longer rebuild the checked-in generated/"
    assert changed(sources_before, digest(root, generated=False)) == ["ops.yaml", "shaders/flip.glsl.j2"]
    assert (root / "shaders" / "flip.glsl.j2").read_bytes() == (ROOT / "shaders" / "flip.glsl.j2").read_bytes()
