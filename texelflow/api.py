"""The public API: plan a model (no device needed) or compile it for a Vulkan device."""

from __future__ import annotations

import time
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


PERMUTES = "global"  # the default permute optimisation (runtime/graph/permutes): "global", "local", "none"


def _plan(model, example_inputs, planner, limits, time_limit, permutes=None, conv_dim_order="nchw"):
    from texelflow.runtime.graph.fusion import fuse_patterns
    from texelflow.runtime.graph.importer import export_program
    from texelflow.runtime.graph.lowering import lower
    from texelflow.runtime.graph.permutes import optimize_permutes
    from texelflow.runtime.graph.permutes.dim_order import apply_dim_orders
    from texelflow.runtime.graph.plan import plan_graph

    timings: dict[str, float] = {}
    ep = export_program(model, example_inputs, timings)
    graph = lower(ep, limits, timings)
    start = time.perf_counter()
    graph = fuse_patterns(graph, limits)
    timings["fusion"] = time.perf_counter() - start
    start = time.perf_counter()
    graph = apply_dim_orders(graph, conv_dim_order, limits)  # explicit permutes, before they are optimised
    graph = optimize_permutes(graph, PERMUTES if permutes is None else permutes, limits)
    timings["permutes"] = time.perf_counter() - start
    result = plan_graph(graph, planner, limits, time_limit)
    timings["planning"] = result.seconds
    result.timings = timings
    result.exported = ep
    return result


def plan(model, example_inputs: Sequence = (), planner: str = "optimal", texture_limits=None,
         time_limit: float = SOLVER_TIME_LIMIT_S, permutes: str | None = None, conv_dim_order: str = "nchw"):
    """Export `model`, partition it and plan a representation for every tensor. Returns a Plan
    (`plan.fallbacks`: every node that runs on the CPU and why; `plan.timings`: seconds per
    stage); no Vulkan device is needed.

    `model` is an nn.Module with `example_inputs` (a GraphModule from `torch.export(...).module()`
    or torchao's `convert_pt2e` included), never changed, not even its training flags: it is
    exported in inference mode through a shallow copy; or an ExportedProgram, used as it is.

    `permutes` chooses the permute optimisation (runtime/graph/permutes): "global", "local" or
    "none"; None takes the default. `conv_dim_order` chooses the dense convolution kernel: "nchw"
    (conv2d on channels-packed textures) or "nhwc" (conv2d_nhwc on buffers, between explicit
    permutes: runtime/graph/permutes/dim_order.py)."""
    return _plan(model, example_inputs, planner, _texture_limits(texture_limits, None), time_limit, permutes,
                 conv_dim_order)


def compile(model, example_inputs: Sequence = (), planner: str = "optimal", device=None, texture_limits=None,
            time_limit: float = SOLVER_TIME_LIMIT_S, progress=None, permutes: str | None = None,
            conv_dim_order: str = "nchw"):
    """Plan `model` for `device` and build a callable program.

    `progress`, when given, is called as `progress(stage, done, total)` while the program is
    built: stage "prepacking" (constants uploaded into their representations) and then
    "pipelines" (compute pipelines created), `done` counting up from 0 to `total`, enough to
    draw a progress bar. Seconds per stage are in `prog.timings` (also `prog.plan.timings`).

    With `device=None` every program shares one process-wide default device (the best one found,
    created on first use and closed at interpreter exit: `runtime.vulkan.device.default_device`).
    The program is freed by close(), by `with texelflow.compile(...) as prog:`, or by a finalizer
    when it is garbage collected; it never closes a device it was given or the default one."""
    from texelflow.runtime.program import CompiledProgram
    from texelflow.runtime.vulkan.device import default_device

    device = default_device() if device is None else device
    device.check_open("compiling a program")
    result = _plan(model, example_inputs, planner, _texture_limits(texture_limits, device), time_limit, permutes,
                   conv_dim_order)
    return CompiledProgram(result, result.exported, device, progress=progress)
