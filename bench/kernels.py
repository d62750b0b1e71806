"""Kernel benchmark: every kernel class as a fraction of the device's own ceiling, in one run.

Memory-bound kernels (elementwise, unary, identity copies, to_layout) are reported as a fraction of
the trivial copy kernel's bandwidth (bench/ceilings.py) for the same bytes moved on the same
storage (a transition between a buffer and a texture: the trivial copy between the two, since on
lavapipe a texture store costs about three times a texture load); compute-bound ones (mm, the
ViT-S/16 linears, ResNet-18 / MobileNetV3 convs, sdpa) as a fraction of the trivial FMA kernel's
GFLOP/s, and of their roofline bound max(FLOPs / FMA peak, bytes / copy bandwidth). Every time is a GPU timestamp (`profile()`), and each kernel's samples
alternate with its ceiling's, call by call, so load from other processes hits both alike, and so
does a GPU's clock: an NVIDIA H200 ran texelflow's short dispatches at 345 MHz, not its 1,980 MHz
boost, after the first 3 s (bench/RESULTS.md), so absolute GPU times say little; the fractions hold.

Kernels are built the way models run them: a tiny torch module through `texelflow.compile` (the
op's dispatches read from `prog.profile()` by node label), in the planner's own choice of storage
and with buffers forced (`texture_limits=(1, 1, 1)`: no texture fits); identity copies and
`to_layout`, which compile folds or inserts only as transitions, as one planned node lowered by
the runtime's `node_dispatches` in representations named here (so is an elementwise kernel in a
texture, "texture forced", when the planner's own choice was not a texture). The "ran" column says
which storage, layout and shader variant ran. Outputs are checked against torch before timing; a
kernel that fails to build or computes a wrong result is a row saying so, and the run goes on.
Host overhead per call has its own benchmark: bench/overhead.py.
Usage: python bench/kernels.py [--quick] [--reps N] [--only SUBSTRING]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # machine, ceilings: beside this file
from ceilings import (FMA_CHAINS, MIXED, Probe, best_copy, best_fma, copy_probe,  # noqa: E402
                      fastest_configs, fma_probe)
from machine import machine  # noqa: E402

import torch  # noqa: E402

import texelflow  # noqa: E402
from texelflow.generated.layouts import Layout, Storage  # noqa: E402
from texelflow.runtime.vulkan.device import Device  # noqa: E402

BUFFER_ONLY = (1, 1, 1)  # texture_limits no tensor fits: the planner must take buffers
STORAGE_NAME = {Storage.BUFFER: "buffer", Storage.TEXTURE_3D: "texture3d"}
LAYOUT_SHORT = {Layout.WIDTH_PACKED: "WP", Layout.HEIGHT_PACKED: "HP", Layout.CHANNELS_PACKED: "CP"}


def _short(storage, layout) -> str:
    return f"{'buf' if storage == Storage.BUFFER else 'tex'} {LAYOUT_SHORT.get(layout, layout.name)}"


# ---- runners: one kernel, sampled call by call ---------------------------------------------------
class CompiledRunner:
    """A torch module through texelflow.compile; a sample is the GPU time of its op's dispatches
    (every dispatch labelled by a non-transition node), transitions reported apart."""

    def __init__(self, device, module, inputs, buffers_only: bool, tolerance: tuple[float, float]):
        self.inputs = inputs
        self.prog = texelflow.compile(module, inputs, device=device, profile=True,
                                      texture_limits=BUFFER_ONLY if buffers_only else None)
        try:
            plan = self.prog.plan
            nodes = [n for n in plan.graph.nodes if n.on_device and not n.folded and not n.transition]
            if not nodes:
                raise RuntimeError("no kernel dispatch: the op was folded or fell back to the CPU"
                                   + "".join(f"; {n.name}: {n.fallback}" for n in plan.graph.nodes if n.fallback))
            self.names = {n.name for n in nodes}
            variants = [v for label, v in self.prog.dispatch_variants if self._is_op(label)]
            out = plan.assignment.values[nodes[-1].outputs[0][1]]
            transitions = len(self.prog.dispatch_variants) - len(variants)
            self.ran = (f"{_short(out.storage, out.layout)}: {', '.join(dict.fromkeys(variants))}"
                        + (f" (+{transitions} transition dispatches, not timed)" if transitions else ""))
            self.storages = [STORAGE_NAME[out.storage]]
            with torch.no_grad():
                want = module(*inputs)
            got = self.prog(*inputs)
            got = got[0] if isinstance(got, (list, tuple)) else got
            _check(np.asarray(got), want.detach().numpy(), tolerance)
        except BaseException:
            self.prog.close()
            raise

    def _is_op(self, label: str) -> bool:
        return label in self.names or label.split("[")[0] in self.names

    def sample(self) -> float:
        self.prog(*self.inputs)
        return sum(us for label, us in self.prog.profile() if self._is_op(label)) * 1e-6

    def close(self) -> None:
        self.prog.close()


class NodeRunner:
    """One planned node of a registry op in representations named by the caller, lowered by the
    runtime's node_dispatches into one Program: identity copies and to_layout as models run them
    when they are not folded, and elementwise ops in a storage the planner did not pick."""

    def __init__(self, device, op_name: str, args: dict, out_shape, reprs: dict, want: np.ndarray,
                 tolerance: tuple[float, float] | None = None):
        """`args`: argument name -> array (a tensor) or value; `reprs`: tensor slot -> TensorRepr
        (the output's slot is "out"); `want`: torch's output; `tolerance`: None for exact."""
        from texelflow.generated.ops import OPS
        from texelflow.runtime.graph.ir import PlanGraph
        from texelflow.runtime.lower_dispatch import node_dispatches
        from texelflow.runtime.vulkan.program import Dispatch, Program
        from texelflow.runtime.vulkan.tensor import VkTensor

        op = OPS[op_name]
        graph = PlanGraph()
        node_args, arrays = [], {}
        for a in op.args:  # in the registry's argument order, as the importer builds nodes
            if a.name in args:
                v = args[a.name]
                if isinstance(v, np.ndarray):
                    arrays[a.name] = v
                    v = graph.add_input(a.name, v.shape, "float32")
                node_args.append((a.name, v))
        node = graph.add_node(op_name, op.targets[0], op, node_args, [("out", tuple(out_shape), "float32")])
        graph.outputs = [node.outputs[0][1]]
        specs = node_dispatches(node, reprs, "float32", device.enabled_features, device.preferred_features)
        shapes = {**{name: x.shape for name, x in arrays.items()}, "out": tuple(out_shape)}
        self.tensors = {}
        try:
            for name, shape in shapes.items():
                self.tensors[name] = VkTensor(device, shape, "float32", reprs[name].storage, reprs[name].layout,
                                              label=name)
            by_value = {v: self.tensors[name] for name, v in node.tensor_args()}
            by_value[node.outputs[0][1]] = self.tensors["out"]
            dispatches = [Dispatch(tensors={k: by_value[v] for k, v in s.tensors.items()}, **_dispatch_fields(s))
                          for s in specs]
            self.arrays = list(arrays.values())
            self.prog = Program(device, dispatches, [self.tensors[name] for name in arrays], [self.tensors["out"]])
            got = self.prog(*self.arrays)[0]
            if tolerance is None:
                np.testing.assert_array_equal(got, want, err_msg=f"{op_name} moved elements wrongly")
            else:
                _check(got, want, tolerance)
        except BaseException:
            self.close()
            raise
        r_in, r_out = reprs["self"], reprs["out"]
        self.ran = (f"{_short(r_out.storage, r_out.layout)}: " if r_in == r_out else
                    f"{_short(r_in.storage, r_in.layout)} -> {_short(r_out.storage, r_out.layout)}: ") + \
            ", ".join(dict.fromkeys(d.variant.name for d in dispatches))
        self.storages = list(dict.fromkeys(STORAGE_NAME[reprs[name].storage] for name in shapes))

    def sample(self) -> float:
        self.prog(*self.arrays)
        return sum(us for _, us in self.prog.profile()) * 1e-6

    def close(self) -> None:
        if getattr(self, "prog", None) is not None:
            self.prog.close()
        for t in self.tensors.values():
            t.close()


def _dispatch_fields(spec) -> dict:
    """Every field a DispatchSpec shares with Dispatch but the tensors (variant, scalars, label,
    units, shape classes...), so a field added to both reaches the program as the runtime's own."""
    from dataclasses import fields

    from texelflow.runtime.vulkan.program import Dispatch

    wanted = {f.name for f in fields(Dispatch)} - {"tensors"}
    return {f.name: getattr(spec, f.name) for f in fields(spec) if f.name in wanted}


def _check(got: np.ndarray, want: np.ndarray, tolerance: tuple[float, float]) -> None:
    rtol, atol = tolerance
    scale = float(np.nanmax(np.abs(want))) if want.size else 1.0
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol * max(scale, 1.0), equal_nan=True,
                               err_msg="texelflow's output differs from torch's")


# ---- cases ---------------------------------------------------------------------------------------
@dataclass
class Case:
    name: str
    shape: str
    build: Callable  # device -> runner
    nbytes: int  # logical bytes moved: every input read once, the output written once
    flops: int = 0  # 0: memory-bound
    # run only when this says so, given the rows measured before it (a texture row forced through
    # a node only when the planner's own choice for the same kernel was not a texture)
    wanted: Callable[[list], bool] | None = None


def _module(fn):
    class M(torch.nn.Module):
        def forward(self, *xs):
            return fn(*xs)
    return M().eval()


def _nbytes(*shapes) -> int:
    return 4 * sum(int(np.prod(s)) for s in shapes)


def _elementwise_cases(quick: bool) -> list[Case]:
    big = (1, 64, 64, 64) if quick else (1, 64, 256, 256)
    odd = (1, 61, 17, 19) if quick else (1, 61, 127, 129)
    row = ((197, 384), (384,)) if quick else ((4096, 1024), (1024,))
    odd_row = ((197, 383), (383,))
    g = torch.Generator().manual_seed(0)
    cases = []

    def add(name, fn, shapes, out_shape, tol=(1e-5, 1e-6)):
        label = " + ".join("x".join(map(str, s)) for s in shapes)
        for buffers_only in (False, True):
            def build(device, fn=fn, shapes=shapes, buffers_only=buffers_only):
                xs = tuple(torch.randn(s, generator=g) for s in shapes)
                return CompiledRunner(device, _module(fn), xs, buffers_only, tol)
            cases.append(Case(f"{name}{' (buffers forced)' if buffers_only else ''}", label, build,
                              _nbytes(*shapes, out_shape)))
        planned = cases[-2]

        def build_texture(device, fn=fn, shapes=shapes):  # the node the planner would have built
            arrays = [torch.randn(s, generator=g) for s in shapes]
            want = fn(*arrays).numpy()
            args = dict(zip(("self", "other"), (a.numpy() for a in arrays)))
            reprs = {k: tex_wp for k in (*args, "out")}
            return NodeRunner(device, name.split()[0], args, out_shape, reprs, want, tol)

        def planner_took_no_texture(rows, planned=planned):
            return any(r.case is planned and r.storages != ["texture3d"] for r in rows)

        cases.append(Case(f"{name} (texture forced)", label, build_texture, _nbytes(*shapes, out_shape),
                          wanted=planner_took_no_texture))

    from texelflow.runtime.graph.repr import TensorRepr

    tex_wp = TensorRepr(Storage.TEXTURE_3D, Layout.WIDTH_PACKED)
    for shape in (big, odd):
        add("add", torch.add, (shape, shape), shape)
        add("mul", torch.mul, (shape, shape), shape)
    for shapes in (row, odd_row):
        add("add row bias", torch.add, shapes, shapes[0])
    # broadcasts that are not a row along the packed dim: a per-channel scale, a keepdim statistic
    # (RMSNorm's rsqrt), a position table over batches (buffers: read as runs, node_rules.READ_RUNS)
    chan = (1, 64, 96, 96) if not quick else (1, 64, 32, 32)
    add("mul channel scale", torch.mul, (chan, (1, chan[1], 1, 1)), chan)
    add("mul keepdim statistic", torch.mul, ((1, 256, 512), (1, 256, 1)), (1, 256, 512))
    add("add position table", torch.add, ((8, 197, 384), (197, 384)), (8, 197, 384))

    # where / masked_fill with a bool condition that broadcasts: a decoder's causal mask over the
    # heads' scores, and torch's attention decomposition zeroing fully masked rows (a keepdim
    # condition)
    def add_where(name, fn, cond_shape, x_shape):
        label = f"{'x'.join(map(str, cond_shape))} ? {'x'.join(map(str, x_shape))}"
        for buffers_only in (False, True):
            def build(device, fn=fn, buffers_only=buffers_only):
                xs = (torch.rand(cond_shape, generator=g) < 0.5, torch.randn(x_shape, generator=g))
                return CompiledRunner(device, _module(fn), xs, buffers_only, (0.0, 0.0))
            cases.append(Case(f"{name}{' (buffers forced)' if buffers_only else ''}", label, build,
                              _nbytes(cond_shape, x_shape, x_shape)))

    causal = (1, 1, 64, 256) if quick else (1, 1, 256, 256)
    add_where("where causal mask", lambda m, x: torch.where(m, x, float("-inf")), causal, (1, 8, *causal[2:]))
    add_where("where keepdim condition", lambda m, x: torch.where(m, 0.0, x), (1, 6, 197, 1), (1, 6, 197, 197))
    add_where("masked_fill causal mask", lambda m, x: x.masked_fill(m, float("-inf")), causal, (1, 8, *causal[2:]))
    # reductions along a line (compensated sums, math.glslh tf_sum_add): RMSNorm's statistic, a
    # global pool, a transformer's layer norm and attention softmax; the planner's representation
    # and buffers, as the model would run them
    for name, fn, shape, out_shape in (
            ("mean rows (RMSNorm statistic)", lambda x: x.mean(-1, keepdim=True), (256, 2048), (256, 1)),
            ("mean map (global pool)", lambda x: x.mean((2, 3)), (1, 256, 28, 28), (1, 256)),
            ("layer_norm rows", lambda x: torch.nn.functional.layer_norm(x, (x.shape[-1],)), (197, 384), (197, 384)),
            ("softmax rows (ViT-S scores)", lambda x: torch.softmax(x, -1), (6, 197, 197), (6, 197, 197))):
        if quick:
            shape, out_shape = (min(shape[0], 64), *shape[1:]), (min(out_shape[0], 64), *out_shape[1:])
        for buffers_only in (False, True):
            def build(device, fn=fn, shape=shape, buffers_only=buffers_only):
                return CompiledRunner(device, _module(fn), (torch.randn(shape, generator=g),), buffers_only, (1e-5, 1e-5))
            cases.append(Case(f"{name}{' (buffers forced)' if buffers_only else ''}", "x".join(map(str, shape)), build,
                              _nbytes(shape, out_shape)))
    for shape in (big, odd):
        add("relu", torch.relu, (shape,), shape, (0, 0))
        add("exp", torch.exp, (shape,), shape)
        add("gelu", torch.nn.functional.gelu, (shape,), shape)
    return cases


def _copy_cases(quick: bool) -> list[Case]:
    from texelflow.runtime.graph.repr import TensorRepr

    shapes = ((1, 64, 64, 64), (1, 61, 17, 19)) if quick else ((1, 64, 256, 256), (1, 61, 127, 129))
    buf_wp, buf_cp = TensorRepr(Storage.BUFFER, Layout.WIDTH_PACKED), TensorRepr(Storage.BUFFER, Layout.CHANNELS_PACKED)
    tex_wp = TensorRepr(Storage.TEXTURE_3D, Layout.WIDTH_PACKED)
    tex_cp = TensorRepr(Storage.TEXTURE_3D, Layout.CHANNELS_PACKED)
    cases = []
    for shape in shapes:
        label = "x".join(map(str, shape))
        n, c, h, w = shape
        flat = (n * c, h, w)  # a reshape that moves elements in a channels-packed texture, fits every storage

        def node(op, out_shape, r_in, r_out, extra=None, shape=shape):
            def build(device):
                x = np.random.default_rng(1).standard_normal(shape, dtype=np.float32)
                return NodeRunner(device, op, {"self": x, **(extra or {})}, out_shape, {"self": r_in, "out": r_out},
                                  x.reshape(out_shape))
            return build

        for storage, r in (("buffer", buf_wp), ("texture", tex_wp)):
            cases.append(Case(f"clone ({storage})", label, node("clone", shape, r, r), _nbytes(shape, shape)))
            cases.append(Case(f"view_copy ({storage})", f"{label} -> {'x'.join(map(str, flat))}",
                              node("view_copy", flat, r, r, {"size": list(flat)}), _nbytes(shape, shape)))
        for r_in, r_out in ((buf_wp, tex_cp), (tex_cp, buf_wp), (tex_wp, tex_cp), (tex_cp, tex_wp),
                            (buf_wp, buf_cp), (buf_cp, buf_wp)):
            cases.append(Case(f"to_layout {_short(r_in.storage, r_in.layout)} -> {_short(r_out.storage, r_out.layout)}",
                              label, node("to_layout", shape, r_in, r_out), _nbytes(shape, shape)))

    # index-mapping copies of the zoo's models, at their sizes (whole units where the packed dim maps through)
    def mapped(op, shape, args, want_fn, r_in, r_out):
        def build(device):
            x = np.random.default_rng(1).standard_normal(shape, dtype=np.float32)
            want = np.ascontiguousarray(want_fn(x))
            return NodeRunner(device, op, {"self": x, **args}, want.shape, {"self": r_in, "out": r_out}, want)
        out_shape = want_fn(np.empty(shape, np.float32)).shape
        return build, _nbytes(out_shape, out_shape)

    for name, op, shape, args, fn, r_in, r_out in (
            ("permute (ViT-S heads, 0 2 1 3)", "permute_copy", (1, 6, 197, 64), {"dims": [0, 2, 1, 3]},
             lambda x: x.transpose(0, 2, 1, 3), buf_wp, buf_wp),
            ("permute (ViT-S qkv, 2 0 3 1 4)", "permute_copy", (1, 197, 3, 6, 64), {"dims": [2, 0, 3, 1, 4]},
             lambda x: x.transpose(2, 0, 3, 1, 4), buf_wp, buf_wp),
            ("select (ViT-S q of qkv)", "select", (3, 1, 6, 197, 64), {"dim": 0, "index": 0}, lambda x: x[0],
             buf_wp, buf_wp),
            ("expand (grouped-query heads)", "expand", (1, 4, 1, 256, 64), {"size": [1, 4, 2, 256, 64]},
             lambda x: np.broadcast_to(x, (1, 4, 2, 256, 64)), buf_wp, buf_wp),
            ("permute (ConvNeXt NCHW -> NHWC)", "permute_copy", (1, 40, 56, 56), {"dims": [0, 2, 3, 1]},
             lambda x: x.transpose(0, 2, 3, 1), tex_cp, tex_wp),
            # W = 56: 14 texels a row, rows not of whole chunks of 4 texels
            ("to_layout tex CP -> tex WP (ResNet stage 1)", "to_layout", (1, 64, 56, 56), {}, lambda x: x,
             tex_cp, tex_wp),
            # a video's frames (conv3d by frame slices): whole vec4 words in a width-packed buffer,
            # element by element in a channels-packed one (3 channels)
            ("slice (video frames, N T C H W)", "slice", (2, 10, 3, 56, 56),
             {"dim": 1, "start": 1, "end": 9, "step": 1}, lambda x: x[:, 1:9], buf_wp, buf_wp),
            ("slice (video frames, channels-packed)", "slice", (2, 10, 3, 56, 56),
             {"dim": 1, "start": 1, "end": 9, "step": 1}, lambda x: x[:, 1:9], buf_cp, buf_cp),
            ("slice (channel half, rows of 16)", "slice", (1, 64, 56, 64),
             {"dim": 1, "start": 32, "end": 64, "step": 1}, lambda x: x[:, 32:], buf_wp, buf_wp),
            ("constant_pad_nd (video frames)", "constant_pad_nd", (2, 8, 3, 56, 56),
             {"pad": [0, 0, 0, 0, 0, 0, 1, 1], "value": 0.0},
             lambda x: np.pad(x, ((0, 0), (1, 1), (0, 0), (0, 0), (0, 0))), buf_wp, buf_wp)):
        if quick:
            continue
        build, nbytes = mapped(op, shape, args, fn, r_in, r_out)
        cases.append(Case(name, "x".join(map(str, shape)), build, nbytes))
    return cases


@contextlib.contextmanager
def _gemm_tiles(tiles: str | None):
    """TEXELFLOW_GEMM set to `tiles` while a case compiles (None: the device's own choice);
    "workgroup" keeps every linear whole (TEXELFLOW_SPLITK=off), "workgroup, split K" lets the
    split-K pass cut the GEMMs of few blocks (its default)."""
    from texelflow.runtime.graph.prepack_matmul import GEMM_ENV, SPLITK_ENV

    env = {} if tiles is None else {GEMM_ENV: tiles.split(",")[0], SPLITK_ENV: "auto" if "split" in tiles else "off"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _compute_cases(quick: bool) -> list[Case]:
    g = torch.Generator().manual_seed(2)
    cases = []

    def add(name, shape_label, module, input_shapes, flops, weight_numel=0, out_shape=None, tol=(1e-3, 1e-3),
            gemm=None):
        def build(device):
            xs = tuple(torch.randn(s, generator=g) for s in input_shapes)
            with _gemm_tiles(gemm):
                return CompiledRunner(device, module.eval(), xs, False, tol)
        nbytes = _nbytes(*input_shapes) + 4 * weight_numel + _nbytes(out_shape)
        cases.append(Case(name, shape_label, build, nbytes, flops))

    # "mm" and "linear" rows take the device's own GEMM tiling (register tiles on a CPU device,
    # workgroup tiles on a GPU: runtime/graph/prepack_matmul.py gemm_tiles); the rows naming a
    # tiling force it (TEXELFLOW_GEMM), so both are timed on every device
    n = 256 if quick else 1024
    add("mm", f"{n}x{n} @ {n}x{n}", _module(torch.mm), ((n, n), (n, n)), 2 * n ** 3, out_shape=(n, n))
    for tiles in ("register", "workgroup"):
        add(f"mm ({tiles} tiles)", f"{n}x{n} @ {n}x{n}", _module(torch.mm), ((n, n), (n, n)), 2 * n ** 3,
            out_shape=(n, n), gemm=tiles)
    for k, m in ((384, 1152), (384, 384), (384, 1536), (1536, 384)):
        lin = torch.nn.Linear(k, m)
        add("linear (ViT-S/16)", f"197x{k} @ {k}x{m} + bias", lin, ((197, k),), 2 * 197 * k * m,
            lin.weight.numel() + m, (197, m))
    for k, m in ((384, 1152), (1536, 384)):
        lin = torch.nn.Linear(k, m)
        for tiles in ("register", "workgroup", "workgroup, split K"):
            add(f"linear (ViT-S/16, {tiles.replace(',', ' tiles,') if ',' in tiles else tiles + ' tiles'})",
                f"197x{k} @ {k}x{m} + bias", lin, ((197, k),), 2 * 197 * k * m, lin.weight.numel() + m, (197, m),
                gemm=tiles)

    for k, m in ((576, 144), (576, 1024)):  # one row: MobileNetV3-small's squeeze-excite, its classifier
        lin = torch.nn.Linear(k, m)
        for tiles in ("register", "workgroup"):
            add(f"linear (one row, {tiles} tiles)", f"1x{k} @ {k}x{m} + bias", lin, ((1, k),), 2 * k * m,
                lin.weight.numel() + m, (1, m), gemm=tiles)

    se = torch.nn.Conv2d(576, 144, 1)  # a squeeze-excite conv of one pixel: conv2d_pw, or conv2d_pw_gemv_wg on a GPU
    for tiles in ("register", "workgroup"):
        add(f"conv2d one pixel 1x1 ({tiles} tiles' form)", "576->144 @1", se, ((1, 576, 1, 1),), 2 * 576 * 144,
            se.weight.numel() + 144, (1, 144, 1, 1), gemm=tiles)
    pool = _module(lambda x: torch.nn.functional.adaptive_avg_pool2d(x, 1))
    for shape in ((1, 96, 28, 28), (1, 576, 7, 7)):  # MobileNetV3-small's squeeze-excite and head pools
        for tiles in ("register", "workgroup"):  # adaptive_pool2d, or global_avg_pool_wg where GEMMs take workgroup tiles
            add(f"global average pool ({tiles} tiles' form)", "x".join(map(str, shape)), pool, (shape,),
                int(np.prod(shape)), out_shape=shape[:2] + (1, 1), gemm=tiles)

    def conv(name, cin, cout, k, stride, size, groups=1):
        c = torch.nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2, groups=groups)
        out = (size + 2 * (k // 2) - k) // stride + 1
        flops = 2 * cout * out * out * (cin // groups) * k * k
        add(name, f"{cin}->{cout} {k}x{k} s{stride} @{size}", c, ((1, cin, size, size),), flops,
            c.weight.numel() + cout, (1, cout, out, out))

    s = 4 if quick else 1  # quick: planes a quarter the side
    if not quick:
        conv("conv2d ResNet-18 stem", 3, 64, 7, 2, 224)
    conv("conv2d ResNet-18 3x3", 64, 64, 3, 1, 56 // s)
    if not quick:
        conv("conv2d ResNet-18 3x3 layer4", 512, 512, 3, 1, 7)
    conv("conv2d ResNet-18 1x1 downsample", 128, 256, 1, 2, 14 if quick else 28)
    conv("conv2d MobileNetV3 1x1", 24, 88, 1, 1, 28)
    conv("conv2d MobileNetV3 depthwise", 88, 88, 3, 1, 28, groups=88)
    if not quick:
        conv("conv2d MobileNetV3 depthwise s2", 72, 72, 3, 2, 56, groups=72)
    sdpa = _module(torch.nn.functional.scaled_dot_product_attention)
    q = (1, 6, 197, 64)
    add("sdpa (ViT-S/16)", "1x6x197x64", sdpa, (q, q, q), 2 * 2 * 6 * 197 * 197 * 64, out_shape=q)
    return cases


# ---- measuring -----------------------------------------------------------------------------------
@dataclass
class Row:
    case: Case
    ran: str = ""
    seconds: float = 0.0
    ceiling_gbps: float = 0.0  # memory-bound: the trivial copy for the same bytes and storage(s)
    fraction: float = 0.0  # memory-bound: kernel GB/s / ceiling GB/s; compute-bound: of FMA peak
    best_fraction: float = 0.0  # the same from each side's best round (load only ever slows a run down)
    fma_gflops: float = 0.0  # compute-bound: the FMA kernel, alternated with this kernel
    bound_seconds: float = 0.0  # compute-bound: max(FLOPs / FMA peak, bytes / buffer copy GB/s)
    of_bound: float = 0.0  # compute-bound: roofline bound / kernel time
    storages: list[str] = field(default_factory=list)  # the storages the kernel's tensors ran in
    error: str = ""


def _one_line(exc: BaseException) -> str:
    """The exception on one table cell: its non-blank lines joined (numpy's mismatch summary too)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip() and not ln.strip().startswith(("x:", "y:"))]
    return f"{type(exc).__name__}: {'; '.join(lines)}"[:240].replace("|", "/")


def fma_size_for(device, flops: int) -> tuple[int, int]:
    """(invocations, steps) of an FMA probe doing about `flops`: a ceiling run as long as the kernel
    it is compared with, so both are preempted alike on a loaded machine (a short kernel often runs
    within one time slice, a long one does not). At least enough invocations to fill the device:
    4096 on a CPU device (16 workgroups of 256 over its threads), 2^18 on a GPU."""
    per_step = FMA_CHAINS * 4 * 2
    least = 1 << 12 if device.limits.device_type == "cpu" else 1 << 18
    invocations = min(max(least, flops // (per_step * 64)), 1 << 18)
    steps = round(flops / (per_step * invocations) / 8) * 8  # a multiple of 8: the kernel's body is unrolled by 8
    return invocations, min(max(16, steps), 4096)


def measure(device, case: Case, reps: int, budget_s: float, configs) -> Row:
    """The kernel alternated with its ceilings' probes, `reps` rounds (fewer when a round takes
    long: at least 2 after `budget_s` seconds of kernel time)."""
    row = Row(case)
    probes: dict[str, list[Probe]] = {}
    try:
        runner = case.build(device)
    except Exception as exc:  # the benchmark goes on; the row says why this kernel did not run
        row.error = _one_line(exc)
        return row
    try:
        row.ran = runner.ran
        storages = row.storages = runner.storages
        if case.flops:
            probes["fma"] = [fma_probe(device, *fma_size_for(device, case.flops))]
            probes["copy"] = [copy_probe(device, case.nbytes, cfg) for cfg in configs["buffer"]]
        else:  # a transition between storages: the trivial copy between them (bench/ceilings.py MIXED)
            key = ">".join(storages) if len(storages) == 2 else storages[0]
            probes[key] = [copy_probe(device, case.nbytes, cfg) for cfg in configs[key]]
        kernel: list[float] = []
        samples = {id(p): [] for ps in probes.values() for p in ps}
        start = time.perf_counter()
        for i in range(reps):
            kernel.append(runner.sample())
            for ps in probes.values():
                for p in ps:
                    samples[id(p)].append(p.sample())
            if i >= 1 and sum(kernel) > budget_s and time.perf_counter() - start > budget_s:
                break
        row.seconds = statistics.median(kernel)
        # Ratios are taken round by round (kernel and ceilings sampled back to back, under the same
        # load), then the median over rounds.
        rounds = range(len(kernel))

        def best_gbps(ps, i):  # the fastest copy config of round i
            return max(p.work / samples[id(p)][i] for p in ps) / 1e9

        if case.flops:
            fma = probes["fma"][0]
            peak = [fma.work / samples[id(fma)][i] / 1e9 for i in rounds]
            bound = [max(case.flops / (peak[i] * 1e9), case.nbytes / (best_gbps(probes["copy"], i) * 1e9))
                     for i in rounds]
            row.fma_gflops = statistics.median(peak)
            row.fraction = statistics.median(case.flops / kernel[i] / 1e9 / peak[i] for i in rounds)
            row.best_fraction = case.flops / min(kernel) / 1e9 / max(peak)
            row.bound_seconds = statistics.median(bound)
            row.of_bound = statistics.median(bound[i] / kernel[i] for i in rounds)
        else:
            [ps] = probes.values()
            ceiling = [best_gbps(ps, i) for i in rounds]
            row.ceiling_gbps = statistics.median(ceiling)
            row.fraction = statistics.median(case.nbytes / kernel[i] / 1e9 / ceiling[i] for i in rounds)
            row.best_fraction = case.nbytes / min(kernel) / 1e9 / max(ceiling)
    except Exception as exc:
        row.error = _one_line(exc)
    finally:
        runner.close()
        for ps in probes.values():
            for p in ps:
                p.close()
    return row


def print_memory(rows: list[Row]) -> None:
    print("\n## Memory-bound kernels: fraction of the trivial copy's bandwidth (same bytes, same storage)\n\n"
          "MB moved: logical bytes (each input read once, the output written once). fraction: median over "
          "rounds of kernel GB/s / copy GB/s of the same round (a buffer <-> texture to_layout: against the "
          "trivial copy between those storages, word i <-> texel i); best/best: the kernel's best round over the copy's best "
          "(other processes' load only ever slows a round down).\n")
    print("| kernel | shape | ran (out storage/layout: variant) | MB moved | ms | GB/s | copy GB/s | fraction "
          "| best/best |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        c = r.case
        if r.error:
            print(f"| {c.name} | {c.shape} | not run: {r.error} | {c.nbytes / 1e6:.2f} | | | | | |")
            continue
        gbps = c.nbytes / r.seconds / 1e9
        print(f"| {c.name} | {c.shape} | {r.ran} | {c.nbytes / 1e6:.2f} | {r.seconds * 1e3:.3f} | {gbps:.2f} | "
              f"{r.ceiling_gbps:.2f} | {r.fraction:.2f}x | {r.best_fraction:.2f}x |")


def print_compute(rows: list[Row]) -> None:
    print("\n## Compute-bound kernels: fraction of the trivial FMA kernel's GFLOP/s (FLOPs = 2 per multiply-add)\n\n"
          "% of peak and % of bound: medians over rounds of per-round ratios; best/best: best round over best "
          "round; roofline bound = max(FLOPs / FMA "
          "peak, logical bytes / buffer copy GB/s for the same bytes).\n")
    print("| kernel | shape | ran (out storage/layout: variant) | GFLOP | ms | GFLOP/s | FMA peak | % of peak "
          "| best/best | roofline bound ms | % of bound |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        c = r.case
        if r.error:
            print(f"| {c.name} | {c.shape} | not run: {r.error} | {c.flops / 1e9:.3f} | | | | | | | |")
            continue
        gflops = c.flops / r.seconds / 1e9
        print(f"| {c.name} | {c.shape} | {r.ran} | {c.flops / 1e9:.3f} | {r.seconds * 1e3:.2f} | {gflops:.2f} | "
              f"{r.fma_gflops:.1f} | {100 * r.fraction:.1f}% | {100 * r.best_fraction:.1f}% | {r.bound_seconds * 1e3:.2f} "
              f"| {100 * r.of_bound:.1f}% |")


def _load() -> str:
    try:
        return " / ".join(f"{x:.1f}" for x in os.getloadavg()) + " (1 / 5 / 15 min)"
    except OSError:
        return "unknown"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, few repetitions (under a minute)")
    ap.add_argument("--reps", type=int, default=None, help="timed rounds per kernel (default 3 quick, 7 full)")
    ap.add_argument("--only", default=None, help="run only the kernels whose name contains this")
    args = ap.parse_args(argv)
    reps = args.reps or (3 if args.quick else 7)
    budget = 1.0 if args.quick else 6.0
    # torch only builds inputs and references here; its OpenMP workers spin for a while after each
    # parallel op, and on a CPU device (lavapipe) they then take cores from the device's threads:
    # on this 2-core machine a dispatch ran at the speed of one core or of two at random, kernel
    # and copy alike, so per-round ratios swung 0.5x-1.7x. One torch thread keeps both sides steady.
    torch.set_num_threads(1)
    start = time.perf_counter()
    with Device() as device:
        lim = device.limits
        print(f"# texelflow kernels against the device's own ceilings\n\n- device: {lim.name} ({lim.device_type}, "
              f"Vulkan {'.'.join(map(str, lim.api_version))}, subgroup {lim.subgroup_size})\n"
              f"- machine: {machine()}, {platform.system()} {platform.machine()}; torch {torch.__version__}\n"
              f"- {'quick' if args.quick else 'full'} mode: median of {reps} rounds (at least 2 when a kernel is "
              f"slow), GPU timestamps; each kernel alternated call by call with its ceiling kernels: the "
              f"copies for the same bytes, an FMA run of about the same FLOPs\n"
              f"- load average at the start: {_load()} (other processes share the {os.cpu_count()} cores; "
              "the fractions are per-round ratios for that reason)\n"
              "- host overhead per call: see `python bench/overhead.py`")
        configs = {s: fastest_configs(device, s, count=2) for s in ("buffer", "texture3d", *MIXED)}
        print("- copy kernels used as ceilings (the 2 fastest of bench/ceilings.py at 16 MiB): "
              + "; ".join(f"{s}: {', '.join(c.label for c in cs)}" for s, cs in configs.items()))
        print("\n## The device's ceilings in this run (bench/ceilings.py)\n\n| ceiling | kernel | value |\n|---|---|---:|")
        for storage in ("buffer", "texture3d", *MIXED):
            best = best_copy(device, 16 << 20, storage, reps=3)
            print(f"| copy, {storage.replace('>', ' -> ')}, 16 MiB moved | {best.kernel} | {best.gbps:.2f} GB/s |")
        fma = best_fma(device, 1 << 16, 256, reps=3)
        print(f"| FMA peak | {fma.kernel} | {fma.gflops:.1f} GFLOP/s |")
        cases = _elementwise_cases(args.quick) + _copy_cases(args.quick) + _compute_cases(args.quick)
        if args.only:
            cases = [c for c in cases if args.only in c.name]
        rows = []
        try:
            for c in cases:
                if c.wanted is None or c.wanted(rows):
                    rows.append(measure(device, c, reps, budget, configs))
        except KeyboardInterrupt:  # Ctrl-C (or a time limit's SIGINT): the rows measured so far still print
            print(f"\n(interrupted after {len(rows)} of {len(cases)} kernels)")
        memory = [r for r in rows if not r.case.flops]
        compute = [r for r in rows if r.case.flops]
        if memory:
            print_memory(memory)
        if compute:
            print_compute(compute)
        print(f"\n({time.perf_counter() - start:.0f} s; load average at the end: {_load()})")


if __name__ == "__main__":
    main()
