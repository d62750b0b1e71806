"""Permute optimisation on the planning IR (DESIGN §8), between fusion and layout planning.

Models bring permutes (ConvNeXt's channels-last blocks, attention heads) and dim-order contracts
add explicit ones around kernels that compute in another dim order (`dim_order.py`). Two ways to
remove what can be removed:
- `local.py`: six small local passes (the reference backend's approach), each a rewrite that keeps
  numerics: permutes around elementwise regions, a permute with inverse permutes in all its
  consumers, a permute of size-1 dims as a view, permutes sunk below squeeze / unsqueeze views,
  cascaded permutes fused, cascaded views fused. They decide locally and give up at forks.
- `placement.py`: the global placement: every tensor labelled with its dim order, one permute per
  (tensor, target order) shared by its consumers, at minimum total cost (count, then bytes),
  exact as a min-cut where two orders compete.

`optimize_permutes(graph, mode)` runs "global" (the default: the local simplifications, then the
global placement), "local" (the local passes only: the baseline the benchmarks compare with) or
"none"; after either of the first two, `unit_dims.py` takes size-1 dims out of a buffer permute's
way (views around it) where they hide that its innermost dim maps through, and `kernel_orders.py`
gives a depthwise conv between a permute to NCHW and one back its [N, H, W, C] form, which takes
both permutes in (ConvNeXt's blocks).
"""

from __future__ import annotations

MODES = ("global", "local", "none")


def optimize_permutes(graph, mode: str = "global", texture_limits=None):
    """Rewrite `graph` in place so that it keeps as few permutes as `mode` finds; returns it.
    `texture_limits`: the device's (None: the registry's defaults), for what may run on Vulkan."""
    if mode not in MODES:
        raise ValueError(f"permutes={mode!r}: expected one of {', '.join(MODES)}")
    if mode == "none":
        return graph
    from .local import optimize_local

    graph = optimize_local(graph)
    if mode == "global":
        from .placement import place_permutes

        graph = place_permutes(graph) if texture_limits is None else place_permutes(graph, texture_limits)
    from .kernel_orders import absorb_permutes
    from .unit_dims import squeeze_unit_dims

    squeeze_unit_dims(graph)
    absorb_permutes(graph) if texture_limits is None else absorb_permutes(graph, texture_limits)
    return graph
