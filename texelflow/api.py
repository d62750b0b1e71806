"""The public API: plan a model (no device needed) or compile it for a Vulkan device."""

from __future__ import annotations

import time
from typing import Sequence

from texelflow.runtime.graph.optimal import SOLVER_TIME_LIMIT_S  # light: scipy loads when planning
from texelflow.runtime.graph.prepack_matmul import SDPA_TARGET, attention_form, subgroup_facts


def _texture_limits(texture_limits, device):
    from texelflow.generated.layouts import TEXTURE_LIMITS

    if texture_limits is not None:
        return tuple(texture_limits)
    if device is not None:  # the device's texture extents, and its largest storage buffer in bytes
        ext = device.limits.max_image_extent_3d
        return (min(ext[0], TEXTURE_LIMITS[0]), min(ext[1], TEXTURE_LIMITS[1]), min(ext[2], TEXTURE_LIMITS[2]),
                int(device.limits.max_storage_buffer_range))
    return TEXTURE_LIMITS


PERMUTES = "global"  # the default permute optimisation (runtime/graph/permutes): "global", "local", "none"


def _cost_model(costs, device):
    """The cost model of a `costs=` option (runtime/graph/costs.resolve), keyed by `device`."""
    from texelflow.runtime.graph.costs import resolve

    key = None
    if device is not None and costs in (None, "table"):
        from texelflow.runtime.tune import device_key

        key = device_key(device)
    return resolve(costs, key)


def _check_precision(precision) -> None:
    """A bad `precision=` fails at once, in one line, before the model is exported."""
    from texelflow.runtime.graph.precision import PRECISIONS

    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r}: expected one of {', '.join(repr(p) for p in PRECISIONS)}")


def _plan(model, example_inputs, planner, limits, time_limit, permutes=None, conv_dim_order="nchw", costs=None,
          precision="fp32", features=None, subgroup=None):
    from texelflow.runtime.graph.bfloat16 import fold_roundings, held_as_float32
    from texelflow.runtime.graph.fusion import choose_conv_kernels, fuse_patterns
    from texelflow.runtime.graph.importer import export_program
    from texelflow.runtime.graph.lowering import lower
    from texelflow.runtime.graph.own_decompositions import DECOMPOSE_FIRST
    from texelflow.runtime.graph.permutes import optimize_permutes
    from texelflow.runtime.graph.permutes.dim_order import apply_dim_orders
    from texelflow.runtime.graph.plan import plan_graph
    from texelflow.runtime.graph.precision import apply_precision
    from texelflow.runtime.graph.prepack_matmul import split_k
    from texelflow.runtime.graph.quantized import fold_round_trips

    timings: dict[str, float] = {}
    ep = export_program(model, example_inputs, timings)
    start = time.perf_counter()
    original = ep
    ep, bfloat16 = held_as_float32(ep)  # bfloat16 tensors held as float32, rounded as torch rounds
    timings["decomposition"] = timings.get("decomposition", 0.0) + time.perf_counter() - start
    form, why = attention_form(subgroup)
    decompose_first = dict(DECOMPOSE_FIRST)
    if form == "gemm":
        decompose_first[SDPA_TARGET] = f"attention as bmm + softmax + bmm: {why}"
    try:
        graph = lower(ep, limits, timings, decompose_first)
    except Exception:
        if bfloat16 is None:
            raise
        # never worse than before the rewrite: the original's bfloat16 nodes run on the CPU
        ep, bfloat16 = original, None
        graph = lower(ep, limits, timings, decompose_first)
    graph.bfloat16 = bfloat16
    start = time.perf_counter()
    graph = fuse_patterns(graph, limits, choose_kernels=False, subgroup=subgroup, costs=costs)
    timings["fusion"] = time.perf_counter() - start
    start = time.perf_counter()
    graph = apply_dim_orders(graph, conv_dim_order, limits)  # explicit permutes, before they are optimised
    choose_conv_kernels(graph, limits, subgroup, costs=costs)  # after dim orders: a conv taken to conv2d_nhwc keeps that kernel
    split_k(graph, limits)  # after the conv kernels: an im2col conv's GEMM may be split too
    fold_round_trips(graph, limits)  # after the conv kernels: a quantize_dequantize joins its conv's store
    graph = optimize_permutes(graph, PERMUTES if permutes is None else permutes, limits)
    timings["permutes"] = time.perf_counter() - start
    if bfloat16 is not None:
        fold_roundings(graph)  # last: the producers are the nodes that dispatch
    result = plan_graph(graph, planner, limits, time_limit, costs)
    start = time.perf_counter()
    apply_precision(result, precision, features)  # float16 storage, after planning: result.precision
    result.seconds += time.perf_counter() - start
    timings["planning"] = result.seconds
    result.timings = timings
    result.exported = ep
    return result


def plan(model, example_inputs: Sequence = (), planner: str = "optimal", texture_limits=None,
         time_limit: float = SOLVER_TIME_LIMIT_S, permutes: str | None = None, conv_dim_order: str = "nchw",
         costs=None, device=None, precision: str = "fp32"):
    """Export `model`, partition it and plan a representation for every tensor. Returns a Plan
    (`plan.fallbacks`: every node that runs on the CPU and why; `plan.timings`: seconds per
    stage); no Vulkan device is needed.

    `model` is an nn.Module with `example_inputs` (a GraphModule from `torch.export(...).module()`
    or torchao's `convert_pt2e` included), never changed, not even its training flags: it is
    exported in inference mode through a shallow copy; or an ExportedProgram, used as it is.

    `permutes` chooses the permute optimisation (runtime/graph/permutes): "global", "local" or
    "none"; None takes the default. `conv_dim_order` chooses the dense convolution kernel: "nchw"
    (conv2d on channels-packed textures) or "nhwc" (conv2d_nhwc on buffers, between explicit
    permutes: runtime/graph/permutes/dim_order.py).

    `costs` chooses what the optimal planner minimises (docs/planner.md, "Predicted time"):
    "table" (the predicted time from `device`'s cost table, measured by `texelflow tune`; the
    built-in estimate when it has none), "estimate" (the built-in estimate), "none" (transitions
    alone: count, then bytes), or a runtime.graph.costs.CostModel. None (the default): the
    device's table when one exists, else transitions alone. Without `device` no table is read
    (plan needs no device).

    `precision`: "fp32" (the default) or "fp16": tensors between ops with float16 variants are
    stored as float16, weights included, with cast nodes where float16 meets float32; kernels
    still compute in float32, and inputs and outputs stay float32 for the caller
    (docs/precision.md). `plan.precision` says what it did: float16 nodes, casts, and why float32
    variants are used where `device` lacks the float16 features (without `device`, float16
    support is assumed)."""
    _check_precision(precision)
    return _plan(model, example_inputs, planner, _texture_limits(texture_limits, device), time_limit, permutes,
                 conv_dim_order, _cost_model(costs, device), precision,
                 device.enabled_features if device is not None else None,
                 subgroup_facts(device.limits) if device is not None else None)


def compile(model, example_inputs: Sequence = (), planner: str = "optimal", device=None, texture_limits=None,
            time_limit: float = SOLVER_TIME_LIMIT_S, progress=None, permutes: str | None = None,
            conv_dim_order: str = "nchw", costs=None, precision: str = "fp32", profile: bool = False):
    """Plan `model` for `device` and build a callable program.

    `progress`, when given, is called as `progress(stage, done, total)` while the program is
    built: stage "prepacking" (constants uploaded into their representations) and then
    "pipelines" (compute pipelines created), `done` counting up from 0 to `total`, enough to
    draw a progress bar. Seconds per stage are in `prog.timings` (also `prog.plan.timings`).

    With `device=None` every program shares one process-wide default device (the best one found,
    created on first use and closed at interpreter exit: `runtime.vulkan.device.default_device`).
    The program is freed by close(), by `with texelflow.compile(...) as prog:`, or by a finalizer
    when it is garbage collected; it never closes a device it was given or the default one.

    `costs` as for plan(), keyed by this device: by default its cost table when `texelflow tune`
    measured one, else transitions alone. `precision` as for plan(): "fp16" stores activations and
    weights as float16 where this device has the float16 features, else runs the float32
    variants and says so in `prog.plan.precision`.

    `profile=True` records GPU timestamps around every dispatch of each call, which
    `prog.profile()` reads (also switchable later: `prog.profiling = True`). Off by default: a
    timestamp pair costs device time (on lavapipe about as much as a small kernel)."""
    _check_precision(precision)
    from texelflow.runtime.program import CompiledProgram
    from texelflow.runtime.vulkan.device import default_device

    device = default_device() if device is None else device
    device.check_open("compiling a program")
    result = _plan(model, example_inputs, planner, _texture_limits(texture_limits, device), time_limit, permutes,
                   conv_dim_order, _cost_model(costs, device), precision, device.enabled_features,
                   subgroup_facts(device.limits))
    return CompiledProgram(result, result.exported, device, progress=progress, profile=profile)
