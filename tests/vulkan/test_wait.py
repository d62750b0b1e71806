"""How long a submit waits for its work: as long as it runs, unless TEXELFLOW_WAIT_TIMEOUT_S caps it.

A fixed 60 s cap used to turn a long but healthy call (a big model on lavapipe, or any call on a
loaded machine) into a DeviceLostError; a hung GPU is reported by its driver as device lost."""
from __future__ import annotations

import pytest
import torch

import texelflow
from texelflow.runtime.vulkan.device import WAIT_TIMEOUT_ENV, Device, wait_limit_s
from texelflow.runtime.vulkan.errors import DeviceLostError


class Chain(torch.nn.Module):
    """Products enough to keep lavapipe busy for far longer than a millisecond."""

    def forward(self, a, b):
        for _ in range(6):
            a = torch.mm(a, b)
        return a


def test_the_limit_is_read_from_the_environment(monkeypatch):
    monkeypatch.delenv(WAIT_TIMEOUT_ENV, raising=False)
    assert wait_limit_s() is None
    monkeypatch.setenv(WAIT_TIMEOUT_ENV, " 2.5 ")
    assert wait_limit_s() == 2.5
    for bad in ("0", "-1", "soon", "nan"):
        monkeypatch.setenv(WAIT_TIMEOUT_ENV, bad)
        with pytest.raises(ValueError, match=rf"{WAIT_TIMEOUT_ENV}='{bad}': give a number of seconds above 0"):
            wait_limit_s()


def test_work_past_the_limit_raises_a_clear_error_and_the_device_still_closes(monkeypatch):
    monkeypatch.delenv(WAIT_TIMEOUT_ENV, raising=False)
    torch.manual_seed(0)
    a, b = torch.randn(256, 256), torch.randn(256, 256) / 16
    device = Device()
    try:
        prog = texelflow.compile(Chain(), (a, b), device=device)
        torch.testing.assert_close(prog(a, b), Chain()(a, b), rtol=1e-4, atol=1e-4)  # no limit: it runs
        monkeypatch.setenv(WAIT_TIMEOUT_ENV, "0.0001")
        with pytest.raises(DeviceLostError, match=rf"did not finish within 0.0001 s \({WAIT_TIMEOUT_ENV}\)"):
            prog(a, b)
        device.wait_idle()
    finally:
        device.close()  # waits for whatever is still running, then frees everything


def test_a_bad_limit_is_refused_before_anything_is_submitted(monkeypatch, device):
    monkeypatch.setenv(WAIT_TIMEOUT_ENV, "soon")
    before = device.submit_count
    with pytest.raises(ValueError, match=WAIT_TIMEOUT_ENV):
        device.run_once(lambda cmd: None, "nothing")
    assert device.submit_count == before
