"""Issue 9, item 13: `texelflow plan MODULE:ATTR --svg F` says in one line what failed.

Before: a missing folder raised subprocess.CalledProcessError (a traceback) after planning. Now
every failure to write F (missing folder, a file in the folder's place, F a folder, no Graphviz
`dot`, `dot` failing) is one line `texelflow plan: cannot write F: ...` and a non-zero exit; the
folder and `dot` are checked before planning.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from texelflow.cli import main

TARGET = "texelflow.models:tiny_mixer"


def plan(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["plan", TARGET, *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_missing_folder_is_one_line_end_to_end(tmp_path):
    """The reported case, as a user runs it (a CalledProcessError traceback before)."""
    svg = tmp_path / "no-such-folder" / "plan.svg"
    out = subprocess.run([sys.executable, "-m", "texelflow.cli", "plan", TARGET, "--svg", str(svg)],
                         capture_output=True, text=True)
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
    assert out.stderr.strip() == f"texelflow plan: cannot write {svg}: folder {svg.parent} does not exist"
    assert out.stdout == ""  # refused before planning


@pytest.mark.parametrize("name", ["plan.svg", "plan.dot"])
def test_missing_folder(capsys, tmp_path, name):
    f = tmp_path / "a" / "b" / name
    rc, out, err = plan(capsys, "--svg", str(f))
    assert rc == 1 and out == ""
    assert err == f"texelflow plan: cannot write {f}: folder {f.parent} does not exist\n"
    assert not (tmp_path / "a").exists()  # nothing created


def test_a_file_where_the_folder_should_be(capsys, tmp_path):
    (tmp_path / "x").write_text("")
    f = tmp_path / "x" / "plan.svg"
    rc, _, err = plan(capsys, "--svg", str(f))
    assert rc == 1 and err == f"texelflow plan: cannot write {f}: {tmp_path / 'x'} is not a folder\n"


def test_the_file_is_a_folder(capsys, tmp_path):
    rc, _, err = plan(capsys, "--svg", str(tmp_path))
    assert rc == 1 and err == f"texelflow plan: cannot write {tmp_path}: it is a folder\n"


def test_graphviz_missing(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    f = tmp_path / "plan.svg"
    rc, out, err = plan(capsys, "--svg", str(f))
    assert rc == 1 and out == "" and not f.exists()
    assert err.startswith(f"texelflow plan: cannot write {f}: drawing an SVG needs Graphviz's `dot`")
    assert err.count("\n") == 1


def test_graphviz_missing_is_fine_for_a_dot_file(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    f = tmp_path / "plan.dot"
    rc, out, err = plan(capsys, "--svg", str(f))
    assert rc == 0, err
    assert f.read_text().startswith("digraph plan {") and f"wrote {f}" in out


def test_graphviz_failing(capsys, tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "dot"
    fake.write_text("#!/bin/sh\necho 'Error: something broke' >&2\necho 'more detail' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    f = tmp_path / "plan.svg"
    rc, _, err = plan(capsys, "--svg", str(f))
    assert rc == 1 and not f.exists()
    assert err == f"texelflow plan: cannot write {f}: Graphviz's `dot` failed: Error: something broke\n"


def test_svg_still_drawn(capsys, tmp_path):
    f = tmp_path / "plan.svg"
    rc, out, err = plan(capsys, "--svg", str(f))
    assert rc == 0, err
    assert f.read_text().lstrip().startswith(("<?xml", "<svg")) and f"wrote {f}" in out
