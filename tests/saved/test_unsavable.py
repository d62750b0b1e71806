"""Programs format version 1 cannot hold are refused at save, clearly, and write no file (CPU
fallbacks and write-backs are saved: test_fallbacks.py, test_writes.py)."""

from __future__ import annotations

import pytest
import torch

import texelflow
from texelflow.runtime.saved import UnsavableProgramError


class Scale(torch.nn.Module):
    def forward(self, a, k: int):  # torch.export specialises the int: the file could not take it
        return a * k


class Double(torch.nn.Module):
    def forward(self, a):
        return a * 2.0


def test_a_program_with_a_non_tensor_input_is_refused_at_save(device, tmp_path):
    with texelflow.compile(Scale(), (torch.randn(3), 3), device=device) as prog:
        with pytest.raises(UnsavableProgramError) as info:
            prog.save(tmp_path / "s.tflow")
    msg = str(info.value)
    assert "\n" not in msg and "non-tensor inputs" in msg, msg
    assert not (tmp_path / "s.tflow").exists()


def test_a_closed_program_is_refused_at_save(device, tmp_path):
    prog = texelflow.compile(Double(), (torch.randn(3),), device=device)
    prog.close()
    with pytest.raises(UnsavableProgramError, match="it was closed"):
        prog.save(tmp_path / "c.tflow")
