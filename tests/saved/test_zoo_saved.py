"""Every zoo model saved, loaded in a fresh process where torch cannot be imported, and run: the
outputs match the saved program's bit for bit, and the file is within 5% of the prepacked
constants plus the SPIR-V it holds (issue 14's acceptance). One child process per model."""

from __future__ import annotations

import pytest
import safetensors.numpy

import texelflow
from texelflow.models import ZOO

from .helpers import as_list, assert_same, run_without_torch


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_model_round_trips_without_torch(name, device, tmp_path):
    model, inputs = ZOO[name]()
    path = tmp_path / f"{name}.tflow"
    with texelflow.compile(model, inputs, device=device) as prog:
        want = as_list(prog(*inputs))
        prog.save(path)
        consts = sum(t.nbytes for t in prog._consts.values())
    got = run_without_torch(path, [x.numpy() for x in inputs], tmp_path)
    assert_same(got, want)
    spirv = sum(a.nbytes for k, a in safetensors.numpy.load_file(path).items() if k.startswith("spirv/"))
    assert path.stat().st_size <= 1.05 * (consts + spirv), (path.stat().st_size, consts, spirv)
