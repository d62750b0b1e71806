"""Measure a device's cost table (`texelflow tune`): the coefficients runtime/graph/costs.py predicts from.

Small models of the ops real networks are made of (elementwise, convolutions, linear, matmul,
attention, norms, pools, reductions, permutes, transitions) are exported and lowered as a user's
model would be, at a few sizes; the full run adds the zoo networks at 224 px. Every distinct
device node (costs.node_signature) then runs alone in every representation its repsets allow
uniformly (its computed tensors in one representation, its weights where the planner puts them;
a transition from another representation into each one), and its kernel time is read from the
GPU timestamps: the least over a few rounds through every job, since load only ever adds time and
comes in bursts longer than one job. Per (cost class, representation),
`time = fixed + per_byte * bytes + per_flop * flops` is fitted by non-negative least squares on
relative error (the FLOP term only for nodes with a reduction), for the op's name and for its
shader template; per storage side and for the catch-alls "*compute" and "*" too. A permute is timed
on its fast path too where that needs two representations (its input's and output's packed dims
matched), and its general-path timings are fitted apart, under "permute_copy!general"
(costs.pair_seconds). The table keeps every node's measured time beside the coefficients and is
written as JSON keyed by the device (name, vendor and device id, driver version) in
costs.table_dir().
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from texelflow.runtime.errors import TexelflowError
from texelflow.runtime.graph.costs import ANY, COMPUTE, GENERAL, TRANSITION, Coeffs, CostModel, charged_bytes, \
    cost_classes, fast_pair, node_flops, node_signature, pair_slots, table_path, value_bytes
from texelflow.runtime.graph.ir import Node, PlanGraph, Role, Value
from texelflow.runtime.graph.repr import REPRS, TensorRepr
from texelflow.runtime.lower_dispatch import DUMMY_BUFFER, node_dispatches
from texelflow.runtime.vulkan.errors import DeviceLostError
from texelflow.runtime.vulkan.program import Dispatch, Program
from texelflow.runtime.vulkan.tensor import VkTensor

# ---- the device's identity ----------------------------------------------------------------------
def device_info(device) -> dict:
    """Name, vendor and device id, driver version, API version and type of a Vulkan device."""
    cached = device.resources.get("tune.device_info")
    if cached is None:
        props = device.vk.vkGetPhysicalDeviceProperties(device.physical)
        cached = device.resources["tune.device_info"] = {
            "name": device.limits.name, "vendor_id": int(props.vendorID), "device_id": int(props.deviceID),
            "driver_version": int(props.driverVersion), "api_version": ".".join(map(str, device.limits.api_version)),
            "device_type": device.limits.device_type}
        if device.limits.device_type == "cpu":
            cached["host_cpu"] = host_cpu()
    return cached


def device_key(device) -> str:
    """The key a device's cost table is stored under: a new driver or another GPU gets its own,
    and a CPU device (lavapipe) on another processor too: its name says only the LLVM version and
    vector width, yet the same lavapipe reads buffers at 10 GB/s on an Intel Xeon and at 1.8 GB/s
    on an AMD EPYC (textures the other way round), so a table measured on one misleads the planner
    on the other."""
    i = device_info(device)
    key = f"{i['name']}-{i['vendor_id']:04x}-{i['device_id']:04x}-{i['driver_version']:x}"
    return f"{key}-{i['host_cpu']}" if i.get("host_cpu") else key


def host_cpu() -> str:
    """The processor's model name (/proc/cpuinfo on Linux, else what `platform` knows), or ""."""
    import platform

    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or ""


# ---- what is measured ---------------------------------------------------------------------------
def _models(quick: bool) -> list[tuple[str, Callable]]:
    """(name, factory -> (module, inputs)) at each size: sizes grow by about 4x in bytes."""
    import torch
    from torch import nn
    import torch.nn.functional as F

    class Elementwise(nn.Module):
        def forward(self, x, y):
            return F.gelu(torch.relu(x) + y) * torch.sigmoid(y)

    class Block(nn.Module):  # a conv stage: conv + relu, depthwise conv, pools, a global mean
        def __init__(self, c):
            super().__init__()
            self.conv = nn.Conv2d(c, c, 3, padding=1)
            self.pw = nn.Conv2d(c, c, 1)
            self.dw = nn.Conv2d(c, c, 3, padding=1, groups=c)

        def forward(self, x):
            y = torch.relu(self.conv(x))
            z = F.hardswish(self.dw(self.pw(y)))
            return F.max_pool2d(z, 3, 2, 1), z.mean((2, 3), keepdim=True), z.permute(0, 2, 3, 1).contiguous()

    class Transformer(nn.Module):  # ViT-shaped: norm, qkv linear, attention, softmax, mlp
        def __init__(self, d, heads=4):
            super().__init__()
            self.norm, self.qkv, self.fc = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.heads = heads

        def forward(self, x):
            b, n, d = x.shape
            q, k, v = self.qkv(self.norm(x)).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, d)
            s = torch.softmax(torch.matmul(x, x.transpose(1, 2)), -1)
            return self.fc(a) + x, torch.bmm(s, x)

    class Stem(nn.Module):  # image stems: a strided 7x7 conv, a patch embedding, a wide 3x3 conv
        def __init__(self):
            super().__init__()
            self.conv7 = nn.Conv2d(3, 16, 7, stride=2, padding=3)
            self.patch = nn.Conv2d(3, 64, 8, stride=8)
            self.conv3 = nn.Conv2d(16, 64, 3, padding=1)

        def forward(self, x):
            return self.conv3(self.conv7(x)), self.patch(x)

    sizes = [16, 32] if quick else [8, 16, 32, 64]
    out = []
    for s in sizes:
        out.append((f"elementwise {s}", lambda s=s: (Elementwise(), (torch.randn(1, 32, s, s), torch.randn(1, 32, s, s)))))
        out.append((f"conv block {s}", lambda s=s: (Block(32), (torch.randn(1, 32, s, s),))))
        out.append((f"stem {s * 4}", lambda s=s: (Stem(), (torch.randn(1, 3, s * 4, s * 4),))))
        d = 128 if s < 64 else 384  # the largest size at ViT-S's width: weights past the caches
        out.append((f"transformer {s * 2}", lambda s=s, d=d: (Transformer(d), (torch.randn(1, s * 2, d),))))
    # convolutions at a real network's width (ResNet's 128 channels): per-FLOP cost at 32 channels
    # overstates wide convolutions about 3x, the planner's largest node-level miss.
    s = sizes[-1] // 2
    out.append((f"wide conv block {s}", lambda s=s: (Block(128), (torch.randn(1, 128, s, s),))))
    if not quick:  # the zoo's own nodes at their real sizes, so the fit interpolates rather than extrapolates
        from texelflow.models import ZOO

        out += [(f"{name} {ZOO_SIZE}", lambda name=name: ZOO[name](image_size=ZOO_SIZE)) for name in ZOO_TUNED]
    return out


# Fitted on the small models alone, predictions at 224 px missed by 3-10x per node (ConvNeXt's
# add 0.5 ms predicted, 4.3 measured; ViT's sdpa 9.2 vs 2.3): memory-bound kernels slow down once
# tensors leave the caches. The full run times these networks' distinct nodes at this size too.
ZOO_TUNED = ("resnet18", "mobilenet_v3_small", "convnext_atto", "vit_s16")
ZOO_SIZE = 224


# Both GEMM tilings are timed on every device, so that the planner can choose between them per node
# by the table (runtime/graph/prepack_matmul.py priced_choice) whatever the device's type.
GEMM_TILINGS = ("register", "workgroup")


def _lowered(module, inputs, gemm: str) -> PlanGraph:
    """The model's IR as texelflow.compile lowers it (exported, partitioned, fused), unplanned,
    its GEMMs in the tiling `gemm`."""
    from texelflow.runtime.graph.fusion import fuse_patterns
    from texelflow.runtime.graph.importer import export_program
    from texelflow.runtime.graph.lowering import lower

    return fuse_patterns(lower(export_program(module, inputs)), gemm=gemm)


def uniform_slots(node: Node, r: TensorRepr, limits) -> dict[str, TensorRepr] | None:
    """Every computed tensor slot of `node` in `r` and every constant in its preferred
    representation, where the planner puts it whatever its neighbours' (a linear's weight in a
    texture beside buffer activations ran 2x faster than in a buffer on lavapipe), or None when a
    computed tensor cannot be in `r`."""
    from texelflow.runtime.graph.lowering import node_repsets

    sets = node_repsets(node, limits).sets
    slots = {}
    for name, v in list(node.tensor_args()) + list(node.outputs):
        allowed = sets.get(name)
        if allowed is None:
            return None
        if v.role is Role.CONST and not allowed.is_empty():
            slots[name] = allowed.pick()
        elif r in allowed:
            slots[name] = r
        else:
            return None
    return slots


@dataclass
class Sample:
    classes: tuple[str, ...]  # the cost classes the node's coefficients are looked up under
    repr: TensorRepr
    nbytes: int
    flops: int
    seconds: float
    label: str
    node: str = ""  # costs.node_signature (empty for a transition): the table keeps its time as measured


def _random(v: Value, rng) -> np.ndarray:
    if v.dtype.startswith("float"):
        return rng.standard_normal(v.shape).astype(np.float32)
    if v.dtype == "bool":
        return rng.integers(0, 2, v.shape).astype(bool)
    return rng.integers(-3, 4, v.shape).astype(v.dtype if v.dtype in ("int32", "int8") else np.int32)


def time_node(device, node: Node, slots: dict[str, TensorRepr], reps: int, rng) -> float:
    """Least GPU seconds of the node's dispatches over `reps` runs, its tensors resident in `slots`."""
    dtype = node.outputs[0][1].dtype
    specs = node_dispatches(node, slots, dtype, device.enabled_features, device.preferred_features)
    tensors: dict = {}
    every: list[VkTensor] = []
    try:
        dispatches = []
        for spec in specs:
            bound = {}
            for name, v in spec.tensors.items():
                key = ("dummy",) if v is DUMMY_BUFFER else (v, name if v.role is Role.CONST else "")
                t = tensors.get(key)
                if t is None:
                    if v is DUMMY_BUFFER:
                        t = VkTensor(device, (1,), "float32", label="absent")
                        t.upload(np.zeros(1, np.float32))
                    else:
                        r = slots[name]
                        t = VkTensor(device, v.shape, v.dtype, r.storage, r.layout, label=v.name)
                        if v.role is not Role.NODE or v.producer is not node:
                            t.upload(_random(v, rng))
                    tensors[key] = t
                    every.append(t)
                bound[name] = t
            extra = {"spec": spec.spec} if getattr(spec, "spec", None) else {}  # shape classes, as the program does
            dispatches.append(Dispatch(spec.variant, bound, spec.scalars, label=spec.label, units=spec.units, **extra))
        prog = Program(device, dispatches)
        try:
            prog()
            runs = []
            for _ in range(reps):
                prog()
                runs.append(sum(us for _, us in prog.profile()) * 1e-6)
            return min(runs)
        finally:
            prog.close()
    finally:
        for t in every:
            t.close()


def _fast_pair_jobs(node: Node, limits) -> list:
    """Jobs for a pair-priced node (costs.pair_slots: a permute) on its fast path where that
    needs its input and output in different representations (NCHW -> NHWC: a channels-packed input,
    a width-packed output), which no uniform job times: (node, slots, label) per fast pair."""
    pair = pair_slots(node)
    if pair is None:
        return []
    from texelflow.runtime.graph.lowering import node_repsets

    sets = node_repsets(node, limits).sets
    jobs = []
    for r_out in sets[pair[1]]:
        for r_in in sets[pair[0]]:
            if r_in != r_out and fast_pair(node, r_in, r_out):
                slots = uniform_slots(node, r_out, limits)
                if slots is not None:
                    slots[pair[0]] = r_in
                    shape = "x".join(map(str, node.outputs[0][1].shape))
                    jobs.append((node, slots, f"{node.op.name} {r_in} -> {r_out} {shape}"))
    return jobs


def _transition_node(v: Value) -> Node:
    from texelflow.generated.ops import OPS

    node = Node(f"to_layout_{v.name}", "texelflow.to_layout.default", OPS["to_layout"], [("self", v)], [])
    node.outputs.append(("out", Value(node.name, v.shape, v.dtype, Role.NODE, producer=node)))
    node.transition = True
    return node


def measure(device, quick: bool = False, progress: Callable[[int, int, str], None] | None = None,
            reps: int | None = None, skipped: list | None = None, rounds: int | None = None) -> list[Sample]:
    """Every (node, representation) of the tuning models, timed; progress(done, total, what).
    A kernel that fails to build or run is left out, with its reason appended to `skipped`."""
    skipped = [] if skipped is None else skipped
    from texelflow.runtime.graph.repr import TensorRepSet

    from texelflow.runtime.graph.redundant import same_placement

    reps = reps or 2
    rounds = rounds or (2 if quick else 3)
    limits = _limits(device)
    rng = np.random.default_rng(0)
    jobs = []  # (node, slots, label)
    seen = set()
    for name, factory in _models(quick):
        module, inputs = factory()
        graphs = [_lowered(module, inputs, gemm) for gemm in GEMM_TILINGS]
        for node in [n for graph in graphs for n in graph.device_nodes()]:
            if node.op.is_identity and same_placement(node.arg("self").shape, node.outputs[0][1].shape, REPRS[0]):
                continue  # a view: folded wherever it can be, priced by costs.moves_no_data
            sig = node_signature(node)  # names aside: a network's repeated blocks are timed once
            if sig in seen:
                continue
            seen.add(sig)
            for r in REPRS:
                slots = uniform_slots(node, r, limits)
                if slots is not None:
                    jobs.append((node, slots, f"{node.op.name} {r} {'x'.join(map(str, node.outputs[0][1].shape))}"))
            jobs += _fast_pair_jobs(node, limits)
        for v in [v for n in graphs[0].device_nodes() for _, v in n.outputs if n.op.template in ("unary", "binary")][:1]:
            t = _transition_node(v)
            allowed = TensorRepSet.named("ANY_STORAGE").filter_invalid_reprs(v.shape, limits)
            for r in allowed:
                src = next(s for s in allowed if s.storage != r.storage)
                jobs.append((t, {"self": src, "out": r}, f"to_layout {src} -> {r} {'x'.join(map(str, v.shape))}"))
    # Rounds over every job, each job's least time across them: on a device shared with other work
    # load comes in bursts longer than one job's runs (the same ViT linear read 4.0 and 8.9 ms back
    # to back on lavapipe), so runs spread over the whole tune, not repeated in place, find its floor.
    best: dict[int, float] = {}
    failed: set[int] = set()
    total = rounds * len(jobs)
    for k in range(rounds):
        for i, (node, slots, label) in enumerate(jobs):
            if i in failed:
                continue
            if progress:
                progress(k * len(jobs) + i, total, label)
            try:
                seconds = time_node(device, node, slots, reps, rng)
            except DeviceLostError:
                raise  # the device is gone: nothing more can be measured
            except (KeyError, ValueError, TexelflowError) as exc:  # a kernel this device cannot run here
                skipped.append((label, f"{type(exc).__name__}: {exc}".splitlines()[0]))
                failed.add(i)
                continue
            best[i] = min(seconds, best.get(i, seconds))
    samples = []
    for i, (node, slots, label) in enumerate(jobs):
        if i not in best:
            continue
        out_r = slots["out"] if node.transition else slots[node.outputs[0][0]]
        if node.transition:  # fitted as measured: the margin is applied when predicting
            nbytes = 2 * value_bytes(node.arg("self"), out_r)
        else:
            nbytes = charged_bytes(node, slots)
        pair = pair_slots(node)
        general = pair is not None and not fast_pair(node, slots[pair[0]], slots[pair[1]])
        samples.append(Sample(cost_classes(node, general), out_r, nbytes, node_flops(node), best[i], label,
                              "" if node.transition else node_signature(node) + (GENERAL if general else "")))
    if progress:
        progress(total, total, "done")
    return samples


def _limits(device):
    from texelflow.generated.layouts import TEXTURE_LIMITS

    ext = device.limits.max_image_extent_3d
    return tuple(min(a, b) for a, b in zip(ext, TEXTURE_LIMITS))


# ---- fitting ------------------------------------------------------------------------------------
def fit(samples: list[Sample], compute: bool) -> Coeffs:
    """Non-negative least squares on relative error: fixed, per byte, per FLOP (when `compute`)."""
    from scipy.optimize import nnls

    t = np.array([s.seconds for s in samples])
    cols = [np.ones(len(samples)), np.array([s.nbytes for s in samples], float)]
    if compute:
        cols.append(np.array([s.flops for s in samples], float))
    a = np.stack(cols, axis=1)
    scale = a.max(axis=0)
    scale[scale == 0] = 1.0
    w = 1.0 / np.maximum(t, 1e-9)
    x, _ = nnls(a / scale * w[:, None], t * w)
    x = x / scale
    return Coeffs(float(x[0]), float(x[1]), float(x[2]) if compute else 0.0)


def fit_table(samples: list[Sample], device: str) -> CostModel:
    """Coefficients per (class, representation) and per (class, storage side), for op names,
    templates and the two catch-alls ("*compute" for nodes with a reduction, "*" for the rest)."""
    groups: dict[tuple[str, str], list[Sample]] = {}
    for s in samples:
        sides = (str(s.repr), f"{s.repr.storage.name}/{ANY}")
        for c in s.classes:
            if c == ANY and TRANSITION in s.classes:
                continue  # transitions are not kernels of the catch-all class
            for side in sides:
                groups.setdefault((c, side), []).append(s)
    entries = {}
    for (c, side), group in groups.items():
        # the FLOP term for nodes with a reduction (costs.COMPUTE in their classes)
        entries[(c, side)] = fit(group, COMPUTE in group[0].classes)
    measured = {(s.node, str(s.repr)): s.seconds for s in samples if s.node}
    return CostModel("table", device, entries, measured=measured)


def tune(device, quick: bool = False, progress=None, write: bool = True,
         skipped: list | None = None) -> tuple[CostModel, list[Sample], str]:
    """Measure, fit and (when `write`) store the device's table; (model, samples, path)."""
    start = time.perf_counter()
    samples = measure(device, quick, progress, skipped=skipped)
    info = device_info(device)
    model = fit_table(samples, info["name"])
    path = table_path(device_key(device))
    model.path = str(path)
    if write:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(model.to_json(info, {"quick": quick, "samples": len(samples),
                                            "seconds": round(time.perf_counter() - start, 1)}))
        tmp.replace(path)
    return model, samples, str(path)


def fit_error(model: CostModel, samples: list[Sample]) -> float:
    """Median |predicted / measured - 1| over the samples: how well the table fits what it measured."""
    errs = [abs(model.coeffs(s.classes, s.repr).seconds(s.nbytes, s.flops) / s.seconds - 1)
            for s in samples if s.seconds > 0]
    return statistics.median(errs) if errs else float("nan")
