"""The `texelflow` console script: variants listing and gen --check on this repository."""

from __future__ import annotations

import subprocess

from tests.conftest import ROOT


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["texelflow", *args], capture_output=True, text=True, cwd=ROOT)


def test_variants_lists_axes():
    out = run("variants", "--op", "to_layout")
    assert out.returncode == 0, out.stderr
    assert "to_layout_float32_buffer_texture3d" in out.stdout
    assert "dtype=float32  in_storage=buffer  out_storage=texture3d" in out.stdout
    assert "to_layout_int8_texture3d" not in out.stdout


def test_variants_unknown_op_suggests():
    out = run("variants", "--op", "reluu")
    assert out.returncode == 1
    assert out.stderr.strip() == "texelflow variants: unknown op 'reluu' (did you mean 'relu'?)"


def test_gen_check_from_a_subfolder():
    out = subprocess.run(["texelflow", "gen", "--check"], capture_output=True, text=True, cwd=ROOT / "shaders")
    assert out.returncode == 0, out.stderr
    assert "generated/ is up to date" in out.stdout
