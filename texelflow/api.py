"""The public API: plan a model (no device needed) or compile it for a Vulkan device."""

from __future__ import annotations

from typing import Sequence

from texelflow.runtime.graph.optimal import SOLVER_TIME_LIMIT_S  # light: scipy loads when planning


def _texture_limits(texture_limits, device):
    from texelflow.generated.layouts import TEXTURE_LIMITS

    if texture_limits is not None:
        return tuple(texture_limits)
    if device is not None:
        ext = device.limits.max_image_extent_3d
        return (min(ext[0], TEXTURE_LIMITS[0]), min(ext[1], TEXTURE_LIMITS[1]), min(ext[2], TEXTURE_LIMITS[2]))
    return TEXTURE_LIMITS


def _plan(model, example_inputs, planner, limits, time_limit):
    from texelflow.runtime.graph.fusion import fuse_patterns
    from texelflow.runtime.graph.importer import export_program
    from texelflow.runtime.graph.lowering import lower
    from texelflow.runtime.graph.plan import plan_graph

    ep = export_program(model, example_inputs)
    result = plan_graph(fuse_patterns(lower(ep, limits)), planner, limits, time_limit)
    result.exported = ep
    return result


def plan(model, example_inputs: Sequence = (), planner: str = "optimal", texture_limits=None,
         time_limit: float = SOLVER_TIME_LIMIT_S):
    """Export `model` (an nn.Module with `example_inputs`, or an ExportedProgram), partition it and
    plan a representation for every tensor. Returns a Plan; no Vulkan device is needed."""
    return _plan(model, example_inputs, planner, _texture_limits(texture_limits, None), time_limit)


def compile(model, example_inputs: Sequence = (), planner: str = "optimal", device=None, texture_limits=None,
            time_limit: float = SOLVER_TIME_LIMIT_S):
    """Plan `model` for `device` and build a callable program.

    With `device=None` every program shares one process-wide default device (the best one found,
    created on first use and closed at interpreter exit: `runtime.vulkan.device.default_device`).
    The program is freed by close(), by `with texelflow.compile(...) as prog:`, or by a finalizer
    when it is garbage collected; it never closes a device it was given or the default one."""
    from texelflow.runtime.program import CompiledProgram
    from texelflow.runtime.vulkan.device import default_device

    device = default_device() if device is None else device
    device.check_open("compiling a program")
    result = _plan(model, example_inputs, planner, _texture_limits(texture_limits, device), time_limit)
    return CompiledProgram(result, result.exported, device)
