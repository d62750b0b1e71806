"""Running generated op variants on the device for numeric tests, with raw access to the output.

Each call runs one Program of several dispatches of one variant (one per shape case), so a test
covers many shapes with one submit. Every dispatched variant name is logged in DISPATCHED for the
coverage tests. `raw` returns the output's packed words / texels exactly as stored, padding
included, so tests can check that padding lanes stay zero.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from texelflow.generated.layouts import LAYOUT_INFO, Storage
from texelflow.runtime.vulkan import commands
from texelflow.runtime.vulkan.memory import staging_buffer
from texelflow.runtime.vulkan.program import Dispatch, Program
from texelflow.runtime.vulkan.tensor import VkTensor

FLOAT_LAYOUTS = sorted(lay for lay, info in LAYOUT_INFO.items() if info.family == "float")
INT8_LAYOUTS = sorted(lay for lay, info in LAYOUT_INFO.items() if info.family == "int8x4")
STORAGE_AXIS = {Storage.BUFFER: "buffer", Storage.TEXTURE_3D: "texture3d"}
FLOAT_REPRS = [(s, lay) for s in (Storage.BUFFER, Storage.TEXTURE_3D) for lay in FLOAT_LAYOUTS]
INT8_REPRS = [(Storage.BUFFER, lay) for lay in INT8_LAYOUTS]

DISPATCHED: set[str] = set()  # variant names some test dispatched (checked by the coverage tests)


def repr_id(r) -> str:
    return f"{r[0].name}-{r[1].name}"


@dataclass
class Case:
    """One dispatch: input arrays by binding name, the output shape, and push-constant scalars."""

    inputs: dict
    out_shape: tuple
    scalars: dict = field(default_factory=dict)


@dataclass
class Result:
    got: np.ndarray  # the output, unpacked to a contiguous array
    raw: np.ndarray  # the packed output: int32 words (float family) or int8 lanes (int8 family)
    padding: np.ndarray  # bool mask over `raw`: True where the representation has padding


def raw_bytes(device, t: VkTensor) -> np.ndarray:
    """The tensor's packed bytes as stored on the device (textures and buffers alike)."""
    vk = device.vk
    stage = staging_buffer(device, t.nbytes)

    def record(cmd):
        commands.work_to_work(vk, cmd)
        t.record_copy_out(cmd, stage.handle)
        commands.work_to_host(vk, cmd)

    device.run_once(record, "a raw download")
    return stage.view(t.nbytes).copy()


def _elements(raw: np.ndarray, dtype: str) -> np.ndarray:
    """Bytes -> storage elements: int8 lanes for int8, 32-bit words (as int32) otherwise."""
    return raw.view(np.int8) if dtype == "int8" else raw.view(np.int32)


def padding_mask(t: VkTensor) -> np.ndarray:
    """True for every stored element that is padding (the host packer writes 1 nowhere there)."""
    ones = _elements(t.pack(np.ones(t.shape, dtype=np.float32 if t.dtype == "float32" else np.int8)), t.dtype)
    return ones == 0


def run_cases(device, variant, cases: list[Case], storage, layout, dtype: str,
              out_storage=None, out_layout=None) -> list[Result]:
    """Run `variant` once per case in one Program; every tensor in (storage, layout) unless the
    output's representation is given separately. Returns one Result per case."""
    out_storage = storage if out_storage is None else out_storage
    out_layout = layout if out_layout is None else out_layout
    dispatches, ins, outs, every = [], [], [], []
    try:
        for i, case in enumerate(cases):
            ts = {"out": VkTensor(device, case.out_shape, dtype, out_storage, out_layout, label=f"out{i}")}
            every.append(ts["out"])
            for name, arr in case.inputs.items():
                ts[name] = VkTensor(device, np.shape(arr), dtype, storage, layout, label=f"{name}{i}")
                every.append(ts[name])
                ins.append((ts[name], arr))
            outs.append(ts["out"])
            dispatches.append(Dispatch(variant, ts, dict(case.scalars), label=f"{variant.name}[{i}]"))
        prog = Program(device, dispatches, [t for t, _ in ins], outs, timestamps=False)
        try:
            got = prog(*(a for _, a in ins))
            DISPATCHED.add(variant.name)
            results = []
            for t, g in zip(outs, got):
                results.append(Result(g, _elements(raw_bytes(device, t), dtype), padding_mask(t)))
            return results
        finally:
            prog.close()
    finally:
        for t in every:
            t.close()


def check_padding(res: Result, what: str) -> None:
    bad = np.flatnonzero(res.padding & (res.raw != 0))
    assert bad.size == 0, f"{what}: {bad.size} padding elements are not zero (first at {bad[:8].tolist()})"
