"""The Vulkan peers of bench/models.py: ncnn's and IREE's Vulkan paths on the same device.

Each peer converts a zoo model and runs it in a child process of its own (`run_peer`), under a
time limit, so a peer that hangs, crashes its driver or runs for minutes costs the benchmark at
most that limit, and its Vulkan instance never shares a process with texelflow's. The child
prints one JSON line: median seconds per warm call, the first call's seconds, conversion seconds,
and the output's max relative error against eager PyTorch (max |peer - eager| / max |eager|).
Converted models are cached in `$TEXELFLOW_CACHE_DIR/peers` (default ~/.cache/texelflow/peers),
keyed by model, input shape and peer version, so only the first run pays for conversion.

- ncnn: `pnnx` traces the model (TorchScript) and writes ncnn's .param/.bin; run with
  `net.opt.use_vulkan_compute = True` and ncnn's default options otherwise (it stores and computes
  in fp16 where the device reports fp16 support, as lavapipe does).
- IREE: `torch.onnx.export` (dynamo) -> `iree-import-onnx` -> `iree-compile
  --iree-hal-target-device=vulkan` (SPIR-V) -> `iree.runtime` with the `vulkan` driver.

The peers are bench-only (`pip install texelflow[peers]`); nothing in texelflow imports them.
Usage (what bench/models.py runs): python bench/peers.py ncnn resnet18 --reps 3
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

PEERS = ("ncnn", "iree")
MODULES = {"ncnn": ("ncnn", "pnnx"), "iree": ("iree.compiler", "iree.runtime", "onnx", "onnxscript")}
PIP = {"ncnn": "pip install ncnn pnnx", "iree": "pip install iree-base-compiler iree-base-runtime onnx onnxscript"}


@dataclass
class PeerResult:
    """One peer on one model: seconds per call, or why there is none."""

    peer: str
    seconds: float | None = None
    first_s: float | None = None
    convert_s: float | None = None
    error: float | None = None
    why: str = ""  # one line, when seconds is None


def missing(peer: str) -> str | None:
    """Why `peer` cannot run here (a module not installed), or None."""
    import importlib.util

    for mod in MODULES[peer]:
        try:
            found = importlib.util.find_spec(mod) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            return f"not installed (no module {mod}; {PIP[peer]})"
    return None


def run_peer(peer: str, model: str, reps: int, timeout_s: float) -> PeerResult:
    """Run `peer` on zoo `model` in a child process, within `timeout_s` seconds."""
    why = missing(peer)
    if why:
        return PeerResult(peer, why=why)
    cmd = [sys.executable, str(Path(__file__).resolve()), peer, model, "--reps", str(reps)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return PeerResult(peer, why=f"timed out after {timeout_s:.0f} s (conversion and runs; see --peer-timeout)")
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = [ln.strip() for ln in (done.stderr + done.stdout).splitlines() if ln.strip()]
        return PeerResult(peer, why=f"failed (exit {done.returncode}): {tail[-1][:160] if tail else 'no output'}")
    data = json.loads(lines[-1])
    if "why" in data:
        return PeerResult(peer, why=data["why"])
    return PeerResult(peer, data["seconds"], data["first_s"], data["convert_s"], data["error"])


# ---- the child ---------------------------------------------------------------------------------
def cache_dir(peer: str, model: str, shape, version: str) -> Path:
    root = Path(os.environ.get("TEXELFLOW_CACHE_DIR") or Path.home() / ".cache" / "texelflow") / "peers"
    key = hashlib.sha256(f"{peer} {model} {tuple(shape)} {version}".encode()).hexdigest()[:12]
    path = root / f"{peer}-{model}-{key}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def relative_error(got, want) -> float:
    import numpy as np

    got, want = np.asarray(got, np.float64).reshape(want.shape), np.asarray(want, np.float64)
    scale = np.abs(want).max()
    return float(np.abs(got - want).max() / scale) if scale > 0 else float(np.abs(got - want).max())


def timed(fn, reps: int, budget_s: float = 60.0) -> tuple[float, float, object]:
    """(first call seconds, median seconds of warm calls, last output): `reps` warm calls, fewer
    (at least one) where they would take more than `budget_s` (IREE's ViT-S/16 takes a minute)."""
    start = time.perf_counter()
    out = fn()
    first = time.perf_counter() - start
    times = []
    for _ in range(max(1, min(reps, int(budget_s / max(first, 1e-9))))):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return first, statistics.median(times), out


def ncnn_child(model, x, name: str, reps: int) -> dict:
    import ncnn
    import numpy as np
    import pnnx

    folder = cache_dir("ncnn", name, x.shape, f"ncnn {ncnn.__version__}")
    param, weights = folder / "model.ncnn.param", folder / "model.ncnn.bin"
    start = time.perf_counter()
    if not (param.exists() and weights.exists()):
        pt = folder / "model.pt"
        extra = {"pnnxparam": "model.pnnx.param", "pnnxbin": "model.pnnx.bin", "pnnxpy": "model_pnnx.py",
                 "pnnxonnx": "model.pnnx.onnx", "ncnnpy": "model_ncnn.py"}  # pnnx imports the .py it writes
        extra = {k: str(folder / v) for k, v in extra.items()}
        pnnx.export(model, str(pt), (x,), ncnnparam=str(param), ncnnbin=str(weights), **extra)
        if not param.exists():
            return {"why": "pnnx wrote no ncnn model (conversion failed)"}
    convert_s = time.perf_counter() - start
    left = unconverted_layers(param)
    if left:
        return {"why": f"pnnx left layers ncnn cannot run: {left}"}
    net = ncnn.Net()
    net.opt.use_vulkan_compute = True
    if ncnn.get_gpu_count() < 1:
        return {"why": "ncnn sees no Vulkan device"}
    net.load_param(str(param))
    net.load_model(str(weights))
    data = x.numpy()[0] if x.shape[0] == 1 else x.numpy()

    def call():
        ex = net.create_extractor()
        ex.input("in0", ncnn.Mat(data).clone())
        ret, out = ex.extract("out0")
        if ret != 0:
            raise RuntimeError(f"ncnn extract returned {ret}")
        return np.array(out)

    first, seconds, out = timed(call, reps)
    return {"first_s": first, "seconds": seconds, "convert_s": convert_s, "out": out}


def unconverted_layers(param: Path) -> str:
    """The torch ops pnnx could not turn into ncnn layers (their type keeps a dot, e.g.
    `torch.unbind`), counted: '12 torch.unbind, 12 Tensor.reshape'; '' when there are none."""
    counts: dict[str, int] = {}
    for line in param.read_text().splitlines()[2:]:
        kind = line.split(maxsplit=1)[0] if line.strip() else ""
        if "." in kind:
            counts[kind] = counts.get(kind, 0) + 1
    return ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items()))


def iree_child(model, x, name: str, reps: int) -> dict:
    import iree.compiler
    import iree.runtime as rt
    import torch

    version = getattr(iree.compiler, "__version__", "") or getattr(rt, "__version__", "")
    folder = cache_dir("iree", name, x.shape, f"iree {version}")
    vmfb = folder / "model.vmfb"
    start = time.perf_counter()
    if not vmfb.exists():
        onnx_path, mlir = folder / "model.onnx", folder / "model.mlir"
        torch.onnx.export(model, (x,), str(onnx_path), input_names=["x"], output_names=["y"], dynamo=True,
                          external_data=False)
        bindir = Path(sys.executable).parent
        for step in ([str(bindir / "iree-import-onnx"), str(onnx_path), "-o", str(mlir)],
                     [str(bindir / "iree-compile"), str(mlir), "--iree-hal-target-device=vulkan",
                      "-o", str(vmfb) + ".tmp"]):
            done = subprocess.run(step, capture_output=True, text=True)
            if done.returncode != 0:
                tail = [ln for ln in done.stderr.splitlines() if ln.strip()]
                return {"why": f"{Path(step[0]).name} failed: {tail[-1][:160] if tail else done.returncode}"}
        os.replace(str(vmfb) + ".tmp", vmfb)
    convert_s = time.perf_counter() - start
    config = rt.Config("vulkan")
    ctx = rt.SystemContext(config=config)
    ctx.add_vm_module(rt.VmModule.mmap(ctx.instance, str(vmfb)))
    fn = ctx.modules.module["main_graph"]
    data = x.numpy()

    def call():
        return device_to_host(fn(data))

    first, seconds, out = timed(call, reps)
    return {"first_s": first, "seconds": seconds, "convert_s": convert_s, "out": out}


def device_to_host(array):
    """An IREE result copied to a numpy array through a staging buffer: `to_host()` tries to
    import a numpy allocation, which lavapipe refuses (minImportedHostPointerAlignment 4096)."""
    from iree.runtime import BufferUsage, HalElementType, HalFence, MemoryType

    view, dev = array._buffer_view, array._device
    src = view.get_buffer()
    host = dev.allocator.allocate_buffer(
        memory_type=int(MemoryType.HOST_LOCAL | MemoryType.DEVICE_VISIBLE),
        allowed_usage=int(BufferUsage.TRANSFER_TARGET | BufferUsage.MAPPING_SCOPED),
        allocation_size=src.byte_length())
    sem = dev.create_semaphore(0)
    dev.queue_copy(src, host, wait_semaphores=HalFence.create_at(sem, 0), signal_semaphores=HalFence.create_at(sem, 1))
    HalFence.create_at(sem, 1).wait()
    return host.map().asarray(view.shape, HalElementType.map_to_dtype(view.element_type)).copy()


def child(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("peer", choices=PEERS)
    ap.add_argument("model")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    import warnings

    import torch

    from texelflow.models import ZOO

    warnings.filterwarnings("ignore")
    model, inputs = ZOO[args.model]()
    with torch.no_grad():
        want = model(*inputs).numpy()
    run = ncnn_child if args.peer == "ncnn" else iree_child
    try:
        result = run(model, inputs[0], args.model, args.reps)
    except Exception as exc:  # a conversion or runtime refusal: one line for the table
        result = {"why": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ''}"}
    if "out" in result:
        out = result.pop("out")
        if out.size != want.size:
            result = {"why": f"output of {out.size} values, eager has {want.size}"}
        else:
            result["error"] = relative_error(out, want)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(child())
