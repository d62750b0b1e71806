"""Every path of the copy template (shaders/copy.glsl.j2): to_layout between every pair of
float representations, and clone / view_copy, on awkward shapes (sizes 1, 3, 5, 7, packed dims
not multiples of 4, rank 1 to 5).

A copy moves bits, so each output is compared bit for bit with its input: NaNs with payloads
and signs, +-Inf, -0.0 and int32 words past 2^24 must come out unchanged. Each node runs twice
in one Program: specialised with the shape classes lowering gives (the vec4, block and stepped
paths), and as a bare dispatch with the general defaults; padding lanes must stay zero.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from texelflow.generated.layouts import Layout, Storage
from texelflow.generated.ops import OPS
from texelflow.runtime.graph.ir import PlanGraph
from texelflow.runtime.graph.repr import TensorRepr
from texelflow.runtime.lower_dispatch import node_dispatches
from texelflow.runtime.vulkan.program import Dispatch, Program
from texelflow.runtime.vulkan.tensor import VkTensor

from .nodecheck import raw_elements

REPRS = {f"{s}-{l}": TensorRepr(st, la)
         for s, st in (("buf", Storage.BUFFER), ("tex", Storage.TEXTURE_3D))
         for l, la in (("wp", Layout.WIDTH_PACKED), ("hp", Layout.HEIGHT_PACKED), ("cp", Layout.CHANNELS_PACKED))}

# Bit patterns a copy must keep: quiet NaNs with payloads (both signs), a signalling-pattern
# NaN, +-Inf, -0.0, the largest finite float.
SPECIAL_BITS = np.array([0x7FC01234, 0xFFC00001, 0x7F800001, 0x7F800000, 0xFF800000, 0x80000000, 0x7F7FFFFF],
                        dtype=np.uint32)

SHAPES = [
    [7],                # rank 1
    [3, 5],             # rank 2
    [1, 3, 5, 7],       # nothing a multiple of 4
    [2, 7, 1, 5],       # size-1 dim, batch 2
    [1, 5, 3, 9],       # C and W ragged: the stepped path, partial last span
    [1, 8, 4, 8],       # whole vec4 words on every side: the 4 x 4 blocks
    [2, 1, 3, 5, 7],    # rank 5
]


def _payload(shape, dtype: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == "int32":  # words a float conversion would round
        return rng.integers(-2**31, 2**31 - 1, size=shape, dtype=np.int64).astype(np.int32)
    x = rng.uniform(-3, 3, size=shape).astype(np.float32)
    flat = x.reshape(-1).view(np.uint32)
    flat[::3] = SPECIAL_BITS[np.arange(flat[::3].size) % SPECIAL_BITS.size]
    return x


def _node(op_name: str, x: np.ndarray, dtype: str, out_shape, extra: dict):
    op = OPS[op_name]
    graph = PlanGraph()
    v = graph.add_input("self", x.shape, dtype)
    args = [(a.name, v if a.name == "self" else extra[a.name]) for a in op.args
            if a.name == "self" or a.name in extra]
    node = graph.add_node(op_name, op.targets[0], op, args, [("out", tuple(out_shape), dtype)])
    graph.outputs = [node.outputs[0][1]]
    return node


def _run(device, op_name: str, x: np.ndarray, dtype: str, r_in, r_out, out_shape=None, extra=None) -> dict:
    """Runs the node specialised and on the general path; checks both bit for bit and their
    padding. Returns the specialised dispatch's shape classes."""
    out_shape = tuple(x.shape if out_shape is None else out_shape)
    node = _node(op_name, x, dtype, out_shape, extra or {})
    [spec] = node_dispatches(node, {"self": r_in, "out": r_out}, dtype)
    what = f"{op_name} {dtype} {list(x.shape)} -> {list(out_shape)}, {r_in} -> {r_out}"
    src = VkTensor(device, x.shape, dtype, r_in.storage, r_in.layout, label="self")
    outs = [VkTensor(device, out_shape, dtype, r_out.storage, r_out.layout, label=label)
            for label in ("out", "general_out")]
    try:
        prog = Program(device, [Dispatch(spec.variant, {"self": src, "out": outs[0]}, spec.scalars, spec=spec.spec),
                                Dispatch(spec.variant, {"self": src, "out": outs[1]}, spec.scalars)],
                       [src], outs, timestamps=False)
        try:
            got = prog(x)
        finally:
            prog.close()
        ones = [t.pack(np.ones(t.shape, dtype=np.float32 if dtype == "float32" else np.int32)).view(np.int32) == 0
                for t in outs]
        raws = raw_elements(device, outs)
        want = x.reshape(out_shape).view(np.uint32)
        for path, g, raw, pad in zip(("specialised", "general"), got, raws, ones):
            g = np.ascontiguousarray(g).view(np.uint32)
            bad = np.flatnonzero(g != want)
            assert bad.size == 0, (f"{what} ({path} {spec.spec}): {bad.size} elements changed, first at "
                                   f"{bad[0]}: {g.reshape(-1)[bad[0]]:#010x} for {want.reshape(-1)[bad[0]]:#010x}")
            assert not raw[pad].any(), f"{what} ({path}): padding lanes not zero"
    finally:
        for t in [src, *outs]:
            t.close()
    return spec.spec


# Every pair of representations and shape; rank 5 in buffers only (textures hold rank <= 4).
PAIR_SHAPES = [(a, b, shape) for a, b in itertools.product(REPRS, REPRS) for shape in SHAPES
               if len(shape) <= 4 or not (a.startswith("tex") or b.startswith("tex"))]


@pytest.mark.parametrize("a,b,shape", PAIR_SHAPES,
                         ids=[f"{a}-to-{b}-{'x'.join(map(str, s))}" for a, b, s in PAIR_SHAPES])
def test_to_layout_moves_bits(device, a, b, shape):
    x = _payload(shape, "float32", len(shape))
    _run(device, "to_layout", x, "float32", REPRS[a], REPRS[b])


@pytest.mark.parametrize("pair", [("buf-wp", "buf-cp"), ("buf-cp", "buf-wp"), ("tex-cp", "buf-wp"),
                                  ("buf-hp", "buf-cp"), ("tex-wp", "buf-hp")],
                         ids=lambda p: "-to-".join(p) if isinstance(p, tuple) else p)
def test_int32_to_layout_moves_words(device, pair):
    x = _payload([2, 5, 3, 7], "int32", 3)
    _run(device, "to_layout", x, "int32", REPRS[pair[0]], REPRS[pair[1]])


def test_int32_texel_blocks_move_words(device):
    x = _payload([2, 8, 3, 13], "int32", 4)  # tex CP -> tex WP texel blocks, padding lanes past W
    spec = _run(device, "to_layout", x, "int32", REPRS["tex-cp"], REPRS["tex-wp"])
    assert spec["transpose"] == 1, f"int32 tex CP -> tex WP [2, 8, 3, 13]: shape classes {spec}, not the texel blocks"


# (id, shape, in repr, out repr, the path the specialised kernel must take)
PATHS = [
    ("stepped-buf-wp-to-buf-cp-ragged", [1, 5, 3, 9], "buf-wp", "buf-cp", "stepped"),
    ("stepped-buf-cp-to-buf-wp-ragged", [1, 61, 3, 7], "buf-cp", "buf-wp", "stepped"),
    ("stepped-tex-cp-to-buf-wp-ragged", [2, 7, 1, 5], "tex-cp", "buf-wp", "stepped"),
    ("stepped-buf-hp-to-buf-wp-whole-spans", [1, 3, 3, 16], "buf-hp", "buf-wp", "stepped"),
    ("blocks-buf-wp-to-buf-cp", [1, 8, 4, 8], "buf-wp", "buf-cp", "blocks"),
    ("vec4-buf-wp-same", [1, 3, 5, 7], "buf-wp", "buf-wp", "units"),
    # texel blocks (`transpose` between textures): tex CP -> tex WP with C % 4 == 0; batches,
    # H of 1, 3, 5, 7, rank 3
    ("texels-tex-cp-to-tex-wp", [1, 4, 3, 16], "tex-cp", "tex-wp", "blocks"),
    ("texels-tex-cp-to-tex-wp-batches", [3, 8, 5, 32], "tex-cp", "tex-wp", "blocks"),
    ("texels-tex-cp-to-tex-wp-h1", [2, 12, 1, 48], "tex-cp", "tex-wp", "blocks"),
    ("texels-tex-cp-to-tex-wp-h7", [1, 4, 7, 16], "tex-cp", "tex-wp", "blocks"),
    ("texels-tex-cp-to-tex-wp-rank3", [4, 5, 16], "tex-cp", "tex-wp", "blocks"),
    # W not a multiple of 4 with whole chunks (13, 29, 61): the last texel's padding lanes
    ("texels-w13-padding-lanes", [2, 4, 5, 13], "tex-cp", "tex-wp", "blocks"),
    ("texels-w29-padding-lanes", [1, 8, 1, 29], "tex-cp", "tex-wp", "blocks"),
    ("texels-w61-padding-lanes", [1, 4, 3, 61], "tex-cp", "tex-wp", "blocks"),
    # a row's partial last chunk (W 8, 9, 21, 129, 56: ResNet's stage 1): the texels past the row skipped
    ("texels-w8-partial-chunk", [2, 4, 3, 8], "tex-cp", "tex-wp", "blocks"),
    ("texels-w9-partial-chunk", [1, 8, 3, 9], "tex-cp", "tex-wp", "blocks"),
    ("texels-w21-partial-chunk", [1, 4, 7, 21], "tex-cp", "tex-wp", "blocks"),
    ("texels-w129-partial-chunk", [1, 12, 3, 129], "tex-cp", "tex-wp", "blocks"),
    ("texels-w56-partial-chunk", [1, 64, 2, 56], "tex-cp", "tex-wp", "blocks"),
    # just off it: C not a multiple of 4, input HP
    ("texels-off-c-ragged", [1, 7, 3, 16], "tex-cp", "tex-wp", "general"),
    ("texels-off-c-5", [3, 5, 7], "tex-cp", "tex-wp", "general"),
    ("texels-off-tex-hp", [1, 4, 3, 16], "tex-hp", "tex-wp", "general"),
]


def _path(spec: dict, out: str) -> str:
    if spec["same_units"]:
        return "units"
    if spec["transpose"]:
        return "blocks"
    if out.startswith("tex"):  # no stepped path for texture outputs: one element per lane
        return "general"
    return "stepped" if spec["same_shape"] else "general"


@pytest.mark.parametrize("case", PATHS, ids=[c[0] for c in PATHS])
def test_each_path_is_taken_and_right(device, case):
    _, shape, a, b, path = case
    spec = _run(device, "to_layout", _payload(shape, "float32", 5), "float32", REPRS[a], REPRS[b])
    got = _path(spec, b)
    assert got == path, f"{case[0]}: shape classes {spec} give the {got} path, not {path}"


CLONES = [(r, shape) for r in ("buf-wp", "buf-cp", "tex-wp", "tex-cp")
          for shape in ([7], [3, 5], [1, 3, 5, 7], [2, 1, 3, 5, 7]) if len(shape) <= 4 or r.startswith("buf")]


@pytest.mark.parametrize("r,shape", CLONES, ids=[f"{r}-{'x'.join(map(str, s))}" for r, s in CLONES])
def test_clone_and_view_copy_move_bits(device, r, shape):
    x = _payload(shape, "float32", 11)
    _run(device, "clone", x, "float32", REPRS[r], REPRS[r])
    flat = [int(np.prod(shape))]
    _run(device, "view_copy", x, "float32", REPRS[r], REPRS[r], flat, {"size": flat})
