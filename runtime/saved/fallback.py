"""CPU-fallback nodes of a saved program: stored as data, run through `torch.ops` only.

A node texelflow cannot run on the device runs in PyTorch between two device segments. The file
holds it as its op overload's qualified name (`aten.signbit.default`), its arguments as a JSON
tree, where its tensor inputs come from (`Ref`: an input, a read-back device tensor, an earlier
fallback's output, a constant, a literal; with the folded views and cast CompiledProgram applies)
and which device tensors its outputs are uploaded to. At load the name is resolved only as
`torch.ops.<ns>.<op>.<overload>`, each part an identifier not starting with `__` (no dunder
attribute is ever looked up) and the namespace one of `NAMESPACES`:
no eval, no import, no attribute path from the file beyond those three names.
"""

from __future__ import annotations

import re

import numpy as np

from texelflow.runtime.saved.errors import SchemaError, UnsavableProgramError

NAMESPACES = ("aten", "prims", "quantized_decomposed", "texelflow")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# tagged leaves of an argument tree (every other dict is malformed); the value of each is a name
NAMED = ("dtype", "layout", "memory_format", "device")


def check_target(target: str) -> str | None:
    """Why `target` is not an allowed op name (None when it is): `<ns>.<op>.<overload>`."""
    parts = target.split(".")
    if len(parts) != 3 or not all(_IDENT.match(p) and not p.startswith("__") for p in parts):
        return f"{target[:60]!r} is not <namespace>.<op>.<overload>"
    if parts[0] not in NAMESPACES:
        return f"{target[:60]!r} is outside the op namespaces {', '.join(NAMESPACES)}"
    return None


# ---- writing ---------------------------------------------------------------------------------------
def target_name(target) -> str:
    """The qualified name of an fx node's target, refused unless it is an op overload that the
    name resolves back to."""
    import torch

    if not isinstance(target, torch._ops.OpOverload):
        raise UnsavableProgramError(f"saving a program: CPU fallback target {target!r} is not a torch op overload, "
                                    "which a saved program cannot name safely")
    name = f"{target.namespace}.{target._schema.name.split('::')[-1]}.{target._overloadname}"
    if check_target(name) is not None or resolve(name) is not target:
        raise UnsavableProgramError(f"saving a program: CPU fallback op {name} cannot be named safely "
                                    f"({check_target(name) or 'it does not resolve to itself'})")
    return name


def encode_arg(x, inputs: dict[str, int]):
    """An fx argument as a JSON tree; an fx node becomes {"input": its index in `inputs`}."""
    import torch

    if x is None or isinstance(x, (bool, str)):
        return {"str": x} if isinstance(x, str) else x
    if isinstance(x, int):
        return x
    if isinstance(x, float):
        return {"f": x.hex()}
    if isinstance(x, torch.fx.Node):
        return {"input": inputs[x.name]}
    if isinstance(x, (list, tuple)):
        return {"list" if isinstance(x, list) else "tuple": [encode_arg(v, inputs) for v in x]}
    for kind, cls in (("dtype", torch.dtype), ("layout", torch.layout), ("memory_format", torch.memory_format)):
        if isinstance(x, cls):
            return {kind: str(x).removeprefix("torch.")}
    if isinstance(x, torch.device) and x.type == "cpu":
        return {"device": "cpu"}
    raise UnsavableProgramError(f"saving a program: a CPU fallback argument {str(x)[:40]!r} of type "
                                f"{type(x).__name__} has no encoding")


# ---- checking (no torch) ---------------------------------------------------------------------------
def validate_tree(doc, path: str) -> None:
    """Raise SchemaError unless `doc` is an argument tree (see `encode_arg`)."""
    if doc is None or type(doc) in (bool, int):
        return
    if not isinstance(doc, dict) or len(doc) != 1:
        raise SchemaError(f"{path}: expected null, a boolean, an integer or a one-key object")
    (kind, x), = doc.items()
    if kind in ("list", "tuple"):
        if not isinstance(x, list):
            raise SchemaError(f"{path}.{kind}: expected a list")
        for i, v in enumerate(x):
            validate_tree(v, f"{path}.{kind}[{i}]")
    elif kind == "f":
        try:
            float.fromhex(x)
        except (TypeError, ValueError):
            raise SchemaError(f"{path}: not a hex float: {str(x)[:40]!r}") from None
    elif kind == "str":
        if not isinstance(x, str):
            raise SchemaError(f"{path}.str: expected a string")
    elif kind == "input":
        if type(x) is not int or x < 0:
            raise SchemaError(f"{path}.input: expected an input index")
    elif kind in NAMED:
        if not isinstance(x, str) or not _IDENT.match(x):
            raise SchemaError(f"{path}.{kind}: expected a name, got {str(x)[:40]!r}")
    else:
        raise SchemaError(f"{path}: unknown argument kind {kind[:20]!r}")


def tree_inputs(doc) -> list[int]:
    """Every input index an argument tree refers to."""
    if isinstance(doc, dict):
        (kind, x), = doc.items()
        if kind == "input":
            return [x]
        if kind in ("list", "tuple"):
            return [i for v in x for i in tree_inputs(v)]
    return []


# ---- loading (torch) -------------------------------------------------------------------------------
def resolve(target: str):
    """`torch.ops.<ns>.<op>.<overload>` for a checked name; None when torch has no such op."""
    import torch

    if check_target(target) is not None:
        return None
    ns, op, overload = target.split(".")
    try:
        packet = getattr(getattr(torch.ops, ns), op)
        found = getattr(packet, overload)
    except (AttributeError, RuntimeError):
        return None
    return found if isinstance(found, torch._ops.OpOverload) else None


def decode_arg(doc, inputs: list):
    """The Python value of an argument tree, its {"input": i} replaced by `inputs[i]`."""
    import torch

    if not isinstance(doc, dict):
        return doc
    (kind, x), = doc.items()
    if kind == "input":
        return inputs[x]
    if kind in ("list", "tuple"):
        items = [decode_arg(v, inputs) for v in x]
        return items if kind == "list" else tuple(items)
    if kind == "f":
        return float.fromhex(x)
    if kind == "str":
        return x
    if kind == "device":
        return torch.device("cpu")
    cls = {"dtype": torch.dtype, "layout": torch.layout, "memory_format": torch.memory_format}[kind]
    value = getattr(torch, x, None)
    if not isinstance(value, cls):
        raise SchemaError(f"{x[:40]!r} is not a torch {kind}")
    return value


def host_tensor(array: np.ndarray):
    """A torch tensor over a host array, shape kept (0-d stays 0-d), as CompiledProgram makes."""
    import torch

    return torch.from_numpy(np.ascontiguousarray(array).reshape(np.shape(array)))
