"""Elementwise kernels against the trivial copy kernel, before and after shape classes.

For each memory-bound kernel (binary, unary, identity copies, to_layout) on buffers and textures,
three dispatches are sampled in turn in one process, GPU timestamps, median of the runs: the
trivial copy of bench/ceilings.py moving the same bytes (its fastest configuration on this
device), the kernel as generated at a git revision (`--old`, default HEAD: its GLSL from
`git show`, one unit per invocation, no shape classes), and the kernel as generated now, with
the shape classes lowering gives it. GB/s are of tensor bytes moved (every input read once, the
output written once); `x copy` is the median over the runs of the copy's time over the kernel's
(each run samples the copy, then the old and the new kernel, so load swings cancel out).
Usage: python bench/elementwise.py [--quick] [--reps N] [--old REV] [--only NAME,...]
"""
from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ceilings import Probe, copy_probe, fastest_configs  # noqa: E402
from machine import machine  # noqa: E402

import texelflow.generated as generated  # noqa: E402
import texelflow.shaders as shaders  # noqa: E402
from texelflow.generated.layouts import Layout, Storage  # noqa: E402
from texelflow.runtime.graph.repr import TensorRepr  # noqa: E402
from texelflow.runtime.lower_dispatch import shape_classes  # noqa: E402
from texelflow.runtime.vulkan.device import Device  # noqa: E402
from texelflow.runtime.vulkan.pipeline import find_variant  # noqa: E402
from texelflow.runtime.vulkan.program import Dispatch  # noqa: E402
from texelflow.runtime.vulkan.tensor import VkTensor  # noqa: E402
from texelflow.shaders import spirv_cache  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
B, T = Storage.BUFFER, Storage.TEXTURE_3D
WP, CP = Layout.WIDTH_PACKED, Layout.CHANNELS_PACKED


@dataclasses.dataclass(frozen=True)
class Case:
    """One kernel: op, variant axes, the tensors as (name, shape, storage, layout), scalars."""

    label: str
    op: str
    axes: dict
    tensors: tuple
    scalars: dict = dataclasses.field(default_factory=dict)


def cases(big: tuple, odd: tuple) -> list[Case]:
    """`big`: an NCHW shape of a few M elements; `odd`: one with channels and width not
    multiples of 4 (tail and padding lanes)."""
    flat = (big[0] * big[1], big[2] * big[3])
    out = []
    for tag, shape in (("", big), (" odd", odd)):
        for st, lay, sname in ((B, WP, "buffer"), (T, CP, "texture3d")):
            ax = {"dtype": "float32", "storage": sname}
            io = (("out", shape, st, lay), ("self", shape, st, lay))
            out += [
                Case(f"add {sname}{tag}", "add", ax, io + (("other", shape, st, lay),), {"alpha": 1.0}),
                Case(f"mul {sname}{tag}", "mul", ax, io + (("other", shape, st, lay),)),
                Case(f"relu {sname}{tag}", "relu", ax, io),
                Case(f"exp {sname}{tag}", "exp", ax, io),
                Case(f"clone {sname}{tag}", "clone", ax, io),
            ]
        out.append(Case(f"add row bias buffer{tag}", "add", {"dtype": "float32", "storage": "buffer"},
                        (("out", shape, B, WP), ("self", shape, B, WP), ("other", (shape[-1],), B, WP)),
                        {"alpha": 1.0}))
        out.append(Case(f"mul channel scale texture3d{tag}", "mul", {"dtype": "float32", "storage": "texture3d"},
                        (("out", shape, T, CP), ("self", shape, T, CP), ("other", (1, shape[1], 1, 1), T, CP))))
        for a, b in (((B, WP), (T, CP)), ((T, CP), (B, WP)), ((B, WP), (B, CP)), ((T, WP), (T, CP))):
            name = f"to_layout {a[0].name.lower()}/{a[1].name[:2]} -> {b[0].name.lower()}/{b[1].name[:2]}{tag}"
            ax = {"dtype": "float32", "in_storage": "buffer" if a[0] == B else "texture3d",
                  "out_storage": "buffer" if b[0] == B else "texture3d"}
            out.append(Case(name, "to_layout", ax, (("out", shape, *b), ("self", shape, *a))))
    out.append(Case("view_copy buffer", "view_copy", {"dtype": "float32", "storage": "buffer"},
                    (("out", flat, B, WP), ("self", big, B, WP)), {"size": list(flat)}))
    return out


class _Facts:
    """The node facts shape-class rules read, from the bound tensors (as lowering has them)."""

    def __init__(self, tensors: dict):
        self.tensors = tensors

    def value(self, name):
        return self.tensors.get(name)

    def shape(self, name):
        return self.tensors[name].shape


def old_spirv(variant, rev: str) -> bytes | None:
    """The variant's SPIR-V as generated at git revision `rev` (None when it did not exist)."""
    path = f"generated/glsl/{variant.source}"
    got = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, capture_output=True, text=True)
    if got.returncode:
        return None
    incs = [Path(generated.__file__).parent / "glsl" / "include", Path(shaders.__file__).parent / "include"]
    return spirv_cache.spirv(got.stdout, incs, variant.target_env, variant.name + "_old")


def old_variant(variant):
    """The reflection the old kernel had: one unit per invocation, no shape classes."""
    return dataclasses.replace(variant, span=1,
                               spec_constants=tuple(s for s in variant.spec_constants if not s.rule))


def kernel_probes(device, case: Case, rev: str):
    """(bytes moved, old probe or None, new probe, the shape classes taken)."""
    variant = find_variant(case.op, **case.axes)
    rng = np.random.default_rng(0)
    ts = {name: VkTensor(device, shape, "float32", st, lay, label=name) for name, shape, st, lay in case.tensors}
    for name, t in ts.items():
        t.upload(rng.standard_normal(t.shape, dtype=np.float32) if name != "out" else np.zeros(t.shape, np.float32))
    moved = sum(int(np.prod(t.shape)) * 4 for t in ts.values())
    reprs = {name: TensorRepr(t.storage, t.layout) for name, t in ts.items()}
    classes = shape_classes(_Facts(ts), variant, reprs)
    new = Probe(device, Dispatch(variant, ts, dict(case.scalars), label="new", spec=classes), "new", moved)
    code = old_spirv(variant, rev)
    old = None
    if code is not None:
        old = Probe(device, Dispatch(old_variant(variant), ts, dict(case.scalars), label="old", spirv=code),
                    "old", moved)
    want = new_result = ts["out"].download()
    if old is not None:
        old.program()
        np.testing.assert_array_equal(ts["out"].download(), want, err_msg=f"{case.label}: old and new kernels differ")
    del new_result
    return moved, old, new, classes, list(ts.values())


def run(device, case: Case, rev: str, reps: int, copy_config) -> tuple:
    moved, old, new, classes, owned = kernel_probes(device, case, rev)
    copy = copy_probe(device, moved, copy_config)
    try:
        samples = {"copy": [], "old": [], "new": []}
        for _ in range(reps):
            samples["copy"].append(copy.sample())
            if old is not None:
                samples["old"].append(old.sample())
            samples["new"].append(new.sample())
        med = {k: float(np.median(v)) if v else None for k, v in samples.items()}
        # the load of a shared machine swings by 3x within seconds: the ratio to the copy is the
        # median of the per-run ratios (each kernel beside the copy sampled just before it)
        ratio = {k: float(np.median(np.array(samples["copy"]) / np.array(v))) if v else None
                 for k, v in samples.items() if k != "copy"}
        return moved, med, ratio, classes
    finally:
        for p in (copy, old, new):
            if p is not None:
                p.close()
        for t in owned:
            t.close()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small tensors (256K elements), 3 runs")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--old", default="HEAD", help="git revision of the generated GLSL to compare with")
    ap.add_argument("--only", default="", help="comma-separated substrings of the kernels to run")
    args = ap.parse_args(argv)
    reps = args.reps or (3 if args.quick else 7)
    big, odd = ((1, 16, 128, 128), (1, 15, 129, 131)) if args.quick else ((1, 64, 256, 256), (1, 63, 255, 257))
    wanted = [s for s in args.only.split(",") if s]
    with Device() as device:
        lim = device.limits
        print(f"# elementwise kernels vs the trivial copy\n\n- device: {lim.name} ({lim.device_type}, subgroup "
              f"{lim.subgroup_size})\n- machine: {machine()}\n- GPU timestamps, median of {reps} alternating runs; "
              f"old = generated GLSL at {args.old}; shapes {big} and {odd} (NCHW)\n")
        configs = {s: fastest_configs(device, s, 1)[0] for s in ("buffer", "texture3d")}
        print(f"- copy kernels: buffer {configs['buffer'].label}; texture {configs['texture3d'].label}\n")
        print("| kernel | MB moved | copy GB/s | old GB/s | new GB/s | old x copy | new x copy | shape classes |")
        print("|---|---:|---:|---:|---:|---:|---:|---|")
        for case in cases(big, odd):
            if wanted and not any(w in case.label for w in wanted):
                continue
            out_storage = case.tensors[0][2]
            moved, med, ratio, classes = run(device, case, args.old, reps,
                                             configs["buffer" if out_storage == B else "texture3d"])
            gbps = {k: (moved / v / 1e9 if v else None) for k, v in med.items()}
            fmt = lambda x: f"{x:.2f}" if x is not None else "-"  # noqa: E731
            cls = ", ".join(f"{k}={v}" for k, v in sorted(classes.items()))
            print(f"| {case.label} | {moved / 1e6:.1f} | {fmt(gbps['copy'])} | {fmt(gbps['old'])} | "
                  f"{fmt(gbps['new'])} | {fmt(ratio['old'])} | {fmt(ratio['new'])} | {cls} |", flush=True)


if __name__ == "__main__":
    main()
