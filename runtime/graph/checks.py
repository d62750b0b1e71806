"""Per-op argument checks the YAML cannot say: a node failing one runs on the CPU, with the reason.

Each check takes the node's resolved arguments (registry names -> Value or python value) and
returns None when the Vulkan kernel can run it, else a short reason for the plan's fallback list.
"""

from __future__ import annotations

from typing import Callable

from .ir import Node, Value

Check = Callable[[Node], "str | None"]
CHECKS: dict[str, Check] = {}


def check(*ops: str):
    def register(fn: Check) -> Check:
        for op in ops:
            CHECKS[op] = fn
        return fn

    return register


def _shape(v) -> tuple[int, ...]:
    return v.shape if isinstance(v, Value) else ()


@check("layer_norm", "native_layer_norm")
def _layer_norm(node: Node) -> str | None:
    normalized = node.arg("normalized_shape")
    x = node.arg("input")
    if normalized is None or len(normalized) != 1 or not isinstance(x, Value) or x.shape[-1:] != tuple(normalized):
        return f"layer norm over {list(normalized or [])} (only the last dim is implemented)"
    return None


@check("conv2d")
def _conv2d(node: Node) -> str | None:
    x = node.arg("input")
    if not isinstance(x, Value) or len(x.shape) != 4:
        return f"conv2d on a {len(_shape(x))}-D input (4-D NCHW only)"
    return None


@check("max_pool2d", "avg_pool2d")
def _pool(node: Node) -> str | None:
    x = node.arg("self")
    if not isinstance(x, Value) or len(x.shape) not in (3, 4):
        return f"pooling on a {len(_shape(x))}-D input"
    return None


@check("linear", "mm", "addmm")
def _matmul(node: Node) -> str | None:
    for name in ("weight", "mat2"):
        w = node.arg(name)
        if isinstance(w, Value) and len(w.shape) != 2:
            return f"{name} of rank {len(w.shape)} (2-D only)"
    return None


@check("permute_copy")
def _permute(node: Node) -> str | None:
    x = node.arg("self")
    if isinstance(x, Value) and len(x.shape) > 4:
        return "permute of a tensor with more than 4 dims"
    return None


def run_check(node: Node) -> str | None:
    fn = CHECKS.get(node.op.name) if node.op else None
    return fn(node) if fn else None
