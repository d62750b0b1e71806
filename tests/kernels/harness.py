"""Run one generated variant on the device and return its outputs, for comparison with torch.

The helpers here fill push constants the way the runtime must (see the header of each template
under shaders/), so they double as executable documentation of those conventions.
"""
from __future__ import annotations

import numpy as np
import torch

from texelflow.generated.layouts import LAYOUT_INFO, REPSETS, Layout, Storage
from texelflow.runtime.vulkan.pipeline import find_variant
from texelflow.runtime.vulkan.program import Dispatch, Program
from texelflow.runtime.vulkan.tensor import VkTensor

AXIS = {Storage.BUFFER: "buffer", Storage.TEXTURE_3D: "texture3d"}
BUF_WP = (Storage.BUFFER, Layout.WIDTH_PACKED)
DUMMY = np.zeros((1,), np.float32)  # bound in place of an absent optional tensor


def reprs(repset: str, family: str = "float") -> list[tuple[Storage, Layout]]:
    """Every (storage, layout) of `repset` holding `family`, in a stable order."""
    return [(s, lay) for s, lays in sorted(REPSETS[repset].items()) for lay in sorted(lays)
            if LAYOUT_INFO[lay].family == family]


def rid(r) -> str:
    return f"{r[0].name}-{LAYOUT_INFO[r[1]].short}"


def rand(*shape, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    """Random floats, or distinct-ish ints for int32 and int8."""
    g = torch.Generator().manual_seed(seed)
    if dtype in (torch.int32, torch.int8):
        return torch.randint(-128, 128, shape, generator=g, dtype=dtype)
    return torch.randn(*shape, generator=g, dtype=dtype)


def run(device, op: str, inputs: dict, outputs: dict, scalars: dict | None = None, *, storage: Storage,
        dtype: str = "float32") -> dict[str, np.ndarray]:
    """Dispatch `op`'s variant for (dtype, storage) once.

    inputs: name -> (array, (storage, layout)); outputs: name -> (shape, (storage, layout)).
    """
    variant = find_variant(op, dtype=dtype, storage=AXIS[storage])
    tensors = {}
    try:
        for name, (arr, (st, lay)) in inputs.items():
            arr = np.asarray(arr)
            tensors[name] = VkTensor(device, arr.shape, str(arr.dtype), st, lay, label=name)
        for name, (shape, (st, lay)) in outputs.items():
            tensors[name] = VkTensor(device, shape, dtype, st, lay, label=name)
        prog = Program(device, [Dispatch(variant, tensors, scalars or {})], [tensors[n] for n in inputs],
                       [tensors[n] for n in outputs])
        try:
            got = prog(*(np.asarray(a) for a, _ in inputs.values()))
        finally:
            prog.close()
        return dict(zip(outputs, got))
    finally:
        for t in tensors.values():
            t.close()


def close(got, want: torch.Tensor, rtol: float = 1e-5, atol: float = 1e-5, msg: str = "") -> None:
    want = want.detach().numpy()
    assert got.shape == want.shape, f"{msg}: shape {got.shape} != {want.shape}"
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=msg)


def pair(v, default=None) -> tuple[int, int]:
    """A torch int_list argument of a 2-D op as (H, W): one value means both; empty means default."""
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    if not v:
        return default
    return (v[0], v[0]) if len(v) == 1 else (v[0], v[1])


def whcn_dim(dim: int, rank: int) -> int:
    """A torch dim (maybe negative) of a rank-`rank` tensor in WHCN numbering."""
    return rank - 1 - (dim % rank)


def permute_dims_whcn(dims, rank: int) -> tuple[int, int, int, int]:
    """torch permute `dims` as the `permute_dims` push constant (see shaders/permute.glsl.j2)."""
    dims = [d % rank for d in dims]
    return tuple(rank - 1 - dims[rank - 1 - d] if d < rank else d for d in range(4))


def affine(w: int, has_weight: bool, has_bias: bool) -> tuple:
    """Optional layer-norm weight/bias: (weight, bias, tensors to bind, has_weight/has_bias scalars)."""
    weight, bias = rand(w, seed=2) if has_weight else None, rand(w, seed=3) if has_bias else None
    tensors = {"weight": (DUMMY if weight is None else weight, BUF_WP),
               "bias": (DUMMY if bias is None else bias, BUF_WP)}
    return weight, bias, tensors, {"has_weight": int(has_weight), "has_bias": int(has_bias)}


def conv_push(stride, padding, dilation, groups: int, has_bias: bool) -> dict:
    """conv2d's push scalars from the FX node's arguments (see shaders/conv2d.glsl.j2)."""
    (sh, sw), (ph, pw), (dh, dw) = pair(stride), pair(padding), pair(dilation)
    return {"groups": groups, "has_bias": int(has_bias), "conv_stride_pad": (sw, sh, pw, ph),
            "conv_dilation": (dw, dh, 0, 0)}


def pool_push(kernel, stride, padding, dilation=(1,)) -> dict:
    """The pools' ivec4 push constants (see shaders/pool2d.glsl.j2); an empty stride means kernel."""
    kh, kw = pair(kernel)
    (sh, sw), (ph, pw), (dh, dw) = pair(stride, (kh, kw)), pair(padding), pair(dilation)
    return {"pool_kernel_stride": (kw, kh, sw, sh), "pool_pad_dilation": (pw, ph, dw, dh)}
