"""Tensors past the device's largest storage buffer (maxStorageBufferRange: 128 MiB on lavapipe,
the least Vulkan allows): the planner knows the limit when it compiles for a device
(api._texture_limits adds it to the texture extents), so such a tensor is held in a texture where
one fits, and its nodes run on the CPU, with the reason, where none does. Before, compiling
stopped with BufferTooLargeError when the buffer was allocated."""
from __future__ import annotations

import torch

import texelflow

from .models import Call


def _fn(x):
    return x.relu() * 2


def test_a_vector_past_the_buffer_limit_runs_on_the_cpu_with_its_reason(device):
    limit = device.limits.max_storage_buffer_range
    x = torch.randn(limit // 4 + 1024)  # one float32 buffer of it would be over the limit
    with texelflow.compile(Call(_fn), (x,), device=device) as prog:
        reasons = [why for _, why in prog.plan.fallbacks]
        got = prog(x)
    assert reasons and all(f"buffers up to {limit} bytes" in why for why in reasons), reasons
    assert torch.equal(got, _fn(x))


def test_a_map_past_the_buffer_limit_is_held_in_a_texture(device):
    limit = device.limits.max_storage_buffer_range
    channels = limit // (4 * 1024 * 1024) + 4  # [1, C, 1024, 1024] float32 over the limit
    x = torch.randn(1, channels, 1024, 1024)
    with texelflow.compile(Call(_fn), (x,), device=device) as prog:
        assert prog.plan.fallbacks == []
        got = prog(x)
    assert torch.equal(got, _fn(x))


def test_planning_without_a_device_knows_no_buffer_limit():
    """texelflow.plan (no device) plans with the texture limits alone: the same vector is planned
    on the device, in buffers; a device that cannot hold it says so when it compiles."""
    plan = texelflow.plan(Call(_fn), (torch.empty(40_000_000),))
    assert plan.fallbacks == []
