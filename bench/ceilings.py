"""The device's own ceilings: what a trivial kernel reaches, as the yardstick for every real one.

A kernel's speed means little on its own; on a CPU device like lavapipe and on a GPU alike it is
judged against what the device can do at all. Two ceilings, measured with GPU timestamps:

- copy bandwidth per storage: the best of trivial copy kernels (buffer: one float per invocation,
  or 1/2/4 vec4 words per invocation; texture: 1/2/4 rgba32f texels of a row per invocation; each
  at workgroup widths 64/128/256), in GB/s of bytes moved (read + written), for a given number of
  bytes, because caches make small copies faster than large ones; and between the two storages
  (a transition's ceiling: vec4 word i of a buffer to texel i of a texture, or back, 1/2/4 texels
  a row per invocation), since a texture store and a texture load cost very differently. A copy
  that reads a buffer is tried both ways: through the storage buffer, and through a uniform texel
  buffer view of it, as kernels with contract texel_reads read (on lavapipe on an AMD EPYC the
  latter is 3-4x faster);
- FMA peak: 8 independent vec4 FMA chains in registers per invocation, in GFLOP/s (an FMA is
  2 FLOPs), over enough invocations to fill the device.
Every copy is checked element for element, and the FMA kernel's output against the closed form
of its recurrence, so a ceiling never comes from a kernel that skipped its work.

The GLSL lives in bench/shaders/ and goes through the project's SPIR-V cache; each kernel is
dispatched by texelflow's own Program with a small hand-made reflection (ShaderVariant), so the
ceilings pay the same dispatch path as generated kernels. For other benchmarks:
`copy_bandwidth(device, nbytes, storage)` and `fma_peak(device)` return numbers; `copy_probe` and
`fma_probe` return a Probe to sample call by call, alternated with the kernel under test (what
bench/kernels.py does, so load from other processes hits both alike).
`python bench/ceilings.py [--quick] [--all]` prints the ceilings.
"""
from __future__ import annotations

import argparse
import functools
import os
import statistics
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from texelflow.generated.layouts import Layout, Storage
from texelflow.generated.variants import Binding, PushConstant, ShaderVariant, SpecConstant
from texelflow.runtime.vulkan.program import TEXEL_DESCRIPTOR, Dispatch, Program
from texelflow.runtime.vulkan.tensor import VkTensor
from texelflow.shaders import spirv_cache

SHADERS = Path(__file__).resolve().parent / "shaders"
LOCAL_SIZES = (64, 128, 256)  # workgroup widths tried; the best is kept (lavapipe: subgroup 8)
FMA_CHAINS = 8  # independent vec4 chains per invocation in fma_peak.comp
DEFAULT_COPY_BYTES = 64 << 20  # bytes moved (half read, half written) for the headline figure


@dataclass(frozen=True)
class CopyResult:
    storage: str  # "buffer" or "texture3d"
    kernel: str  # the trivial copy that was best, e.g. "vec4 x2/invocation, local 128"
    nbytes: int  # bytes moved (read + written)
    seconds: float  # median GPU time of one dispatch

    @property
    def gbps(self) -> float:
        return self.nbytes / self.seconds / 1e9


@dataclass(frozen=True)
class FmaResult:
    kernel: str
    flops: int
    seconds: float

    @property
    def gflops(self) -> float:
        return self.flops / self.seconds / 1e9


def _local_size_specs() -> tuple[SpecConstant, ...]:
    return (SpecConstant(0, "local_size_x", "int", 64), SpecConstant(1, "local_size_y", "int", 1),
            SpecConstant(2, "local_size_z", "int", 1))


def _variant(name: str, storage: str, push: tuple[tuple[str, str], ...], extra_spec=(), reads: bool = True,
             in_storage: str | None = None, texel: bool = False):
    """A reflection for one hand-written shader: binding 0 `out` (written, in `storage`), binding 1
    `self` (read, in `in_storage`, else `storage`; a buffer read as a uniform texel buffer of vec4
    texels when `texel`, as kernels with contract texel_reads do)."""
    def descriptor(st):
        return "STORAGE_IMAGE" if st == "texture3d" else "STORAGE_BUFFER"

    bindings = (Binding(0, "out", descriptor(storage), "write", storage),)
    if reads:
        src = in_storage or storage
        bindings += (Binding(1, "self", TEXEL_DESCRIPTOR if texel else descriptor(src), "read", src),)
    sizes = {"int": 4, "float": 4, "ivec4": 16}
    offset, constants = 0, []
    for pname, ptype in push:
        offset = -(-offset // sizes[ptype]) * sizes[ptype]
        constants.append(PushConstant(pname, ptype, offset, sizes[ptype]))
        offset += sizes[ptype]
    specs = _local_size_specs() + tuple(SpecConstant(3 + i, n, "int", d) for i, (n, d) in enumerate(extra_spec))
    return ShaderVariant(name=f"bench_{name}", op=f"bench_{name}", axes=(("dtype", "float32"), ("storage", storage)),
                         dtype="float32", source=f"{name}.comp", bindings=bindings, push_constants=tuple(constants),
                         push_constant_size=-(-offset // 16) * 16, spec_constants=specs, target_env="vulkan1.1")


COPY_SCALAR = _variant("copy_scalar", "buffer", (("units", "int"),))
COPY_VEC4 = _variant("copy_vec4", "buffer", (("units", "int"), ("words", "int")), (("per_invocation", 1), ("pairs", 0)))
# the same copy reading its source as a uniform texel buffer (on lavapipe a storage buffer is read
# lane by lane, a texel buffer through the image path: 3-4x faster on an AMD EPYC)
COPY_VEC4_TEXEL = _variant("copy_vec4_texel", "buffer", (("units", "int"), ("words", "int")), (("per_invocation", 1), ("pairs", 0)),
                           texel=True)
COPY_TEXEL = _variant("copy_texel", "texture3d", (("extents", "ivec4"), ("units", "int")), (("per_invocation", 1),))
# between storages (a transition's ceiling): vec4 word i <-> texel i, no re-layout
COPY_BUFFER_TEXEL = _variant("copy_buffer_texel", "texture3d", (("extents", "ivec4"), ("units", "int")),
                             (("per_invocation", 1),), in_storage="buffer")
COPY_TEXEL_BUFFER = _variant("copy_texel_buffer", "buffer", (("extents", "ivec4"), ("units", "int")),
                             (("per_invocation", 1),), in_storage="texture3d")
COPY_BUFFER_TEXEL_TEXEL = _variant("copy_buffer_texel_texel", "texture3d", (("extents", "ivec4"), ("units", "int")),
                                   (("per_invocation", 1),), in_storage="buffer", texel=True)
MIXED = {"buffer>texture3d": COPY_BUFFER_TEXEL, "texture3d>buffer": COPY_TEXEL_BUFFER}
FMA = _variant("fma_peak", "buffer", (("units", "int"), ("a", "float"), ("b", "float")), (("iterations", 256),),
               reads=False)


@functools.lru_cache(maxsize=None)
def shader_spirv(name: str) -> bytes:
    """SPIR-V of bench/shaders/NAME.comp through the shared SPIR-V cache (glslc on a miss)."""
    source = (SHADERS / f"{name}.comp").read_text(encoding="utf-8")
    return spirv_cache.spirv(source, [], "vulkan1.1", name)


class Probe:
    """One dispatch recorded once into its own Program, sampled call by call (GPU timestamps), so
    a benchmark can alternate it with the kernel it is compared with."""

    def __init__(self, device, dispatch: Dispatch, label: str, work: int, owned=()):
        self.label, self.work, self._owned = label, work, list(owned)  # work: bytes moved, or FLOPs
        self.program = Program(device, [dispatch])
        self.program()  # warm-up: first touches of the memory, pipeline creation

    def sample(self) -> float:
        """GPU seconds of one call."""
        self.program()
        return self.program.profile()[0][1] * 1e-6

    def seconds(self, reps: int) -> float:
        return statistics.median(self.sample() for _ in range(reps))

    def close(self) -> None:
        self.program.close()
        for t in self._owned:
            t.close()


def _dispatch(variant, tensors, units: int, local: int, spec=None, scalars=None) -> Dispatch:
    d = Dispatch(variant, tensors, dict(scalars or {}), label=variant.name, local_size_x=local,
                 spirv=shader_spirv(variant.source[:-5]), units=units)
    if spec:  # Dispatch carries only local_size_x; the other constants go in through a derived variant
        specs = tuple(SpecConstant(s.id, s.name, s.type, spec.get(s.name, s.default)) for s in variant.spec_constants)
        d.variant = ShaderVariant(**{**variant.__dict__, "spec_constants": specs,
                                     "name": variant.name + "".join(f"_{k}{v}" for k, v in sorted(spec.items()))})
    return d


@dataclass(frozen=True)
class CopyConfig:
    """One trivial copy kernel: which shader, words or texels per invocation, workgroup width."""

    storage: str  # "buffer", "texture3d", or between them "buffer>texture3d" / "texture3d>buffer"
    per_invocation: int  # 0: the scalar float copy (buffer only)
    local: int
    texel: bool = False  # a buffer copy reading its source as a uniform texel buffer
    pairs: bool = False  # a buffer copy's words in pairs: 2u, 2u + 1 of each region (_span_main.glsl.j2's order)

    @property
    def label(self) -> str:
        if self.per_invocation == 0:
            return f"scalar float, local {self.local}"
        unit = {"buffer": "vec4", "texture3d": "rgba32f texel"}.get(self.storage, "vec4 word <-> texel")
        reads = " (texel-buffer reads)" if self.texel else ""
        order = " in pairs" if self.pairs else ""
        return f"{unit} x{self.per_invocation}/invocation{order}{reads}, local {self.local}"


def copy_configs(storage: str) -> list[CopyConfig]:
    if storage == "buffer":
        pers = (0, 1, 2, 4)
    elif storage == "texture3d" or storage in MIXED:
        pers = (1, 2, 4)
    else:
        raise ValueError(f"bench/ceilings.py: unknown storage {storage!r}; use 'buffer', 'texture3d', "
                         f"{' or '.join(repr(k) for k in MIXED)}")
    configs = [CopyConfig(storage, per, ls) for per in pers for ls in LOCAL_SIZES]
    if storage in ("buffer", "buffer>texture3d"):  # the vec4 reads through a texel view, as texel_reads kernels do
        configs += [CopyConfig(storage, per, ls, texel=True) for per in (1, 2, 4) for ls in LOCAL_SIZES]
    if storage == "buffer":  # the order of the kernels' whole spans (_span_main.glsl.j2)
        configs += [CopyConfig(storage, per, ls, texel=texel, pairs=True) for per in (2, 4) for texel in (False, True)
                    for ls in LOCAL_SIZES]
    return configs


def _texture_shape(texels: int) -> tuple[int, int, int, int]:
    """An NCHW shape whose channels-packed texture holds `texels` texels or a little more (whole
    rows of up to 256 texels, planes of up to 256 rows; C = 4 per texel)."""
    w = max(1, min(256, texels))
    rows = -(-texels // w)
    planes = -(-rows // 256)
    return (1, 4 * planes, -(-rows // planes), w)


def copy_probe(device, nbytes: int, config: CopyConfig, shape: tuple[int, ...] | None = None) -> Probe:
    """A trivial copy moving about `nbytes` (half read, half written), or of a tensor of `shape`
    (a buffer's element count a multiple of 4); its result is checked once."""
    if config.storage in MIXED:
        return _mixed_copy_probe(device, nbytes, config)
    if config.storage == "buffer":
        shape = shape or (max(4, nbytes // 8 // 4 * 4),)
        layout, storage = Layout.WIDTH_PACKED, Storage.BUFFER
        if int(np.prod(shape)) % 4:
            raise ValueError(f"bench/ceilings.py: a buffer copy needs a multiple of 4 elements, got shape {shape}")
        shape = (int(np.prod(shape)),)
    else:
        shape = shape or _texture_shape(max(1, nbytes // 32))
        layout, storage = Layout.CHANNELS_PACKED, Storage.TEXTURE_3D
    x = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
    src = VkTensor(device, shape, "float32", storage, layout, label="self")
    dst = VkTensor(device, shape, "float32", storage, layout, label="out")
    try:
        src.upload(x)
        dst.upload(np.zeros_like(x))
        tensors = {"out": dst, "self": src}
        if config.storage == "texture3d":
            ext = tuple(src.extents)
            units = ext[1] * ext[2] * -(-ext[0] // config.per_invocation)
            d = _dispatch(COPY_TEXEL, tensors, units, config.local, {"per_invocation": config.per_invocation},
                          {"extents": (*ext, 0)})
            moved = 2 * ext[0] * ext[1] * ext[2] * 16
        elif config.per_invocation == 0:
            d = _dispatch(COPY_SCALAR, tensors, shape[0], config.local)
            moved = 2 * shape[0] * 4
        else:
            words = shape[0] // 4
            kernel = COPY_VEC4_TEXEL if config.texel else COPY_VEC4
            d = _dispatch(kernel, tensors, -(-words // config.per_invocation), config.local,
                          {"per_invocation": config.per_invocation, "pairs": int(config.pairs)}, {"words": words})
            moved = 2 * shape[0] * 4
        probe = Probe(device, d, config.label, moved, (src, dst))
    except BaseException:
        src.close(), dst.close()
        raise
    np.testing.assert_array_equal(dst.download(), x, err_msg=f"bench copy kernel {config.label} copied wrongly")
    return probe


def _mixed_copy_probe(device, nbytes: int, config: CopyConfig) -> Probe:
    """The trivial copy between a buffer and a channels-packed texture (config.storage "buffer>texture3d"
    or "texture3d>buffer") moving about `nbytes`: vec4 word i <-> texel i; checked once."""
    shape = _texture_shape(max(1, nbytes // 32))
    ex, ey, ez = shape[3], shape[2], shape[1] // 4  # texels along x, y, z (C = 4 per texel)
    words = np.random.default_rng(0).standard_normal((ez, ey, ex, 4), dtype=np.float32)
    as_texture = np.ascontiguousarray(words.transpose(0, 3, 1, 2).reshape(shape))  # texel (x, y, z) = word
    buf = VkTensor(device, (words.size,), "float32", Storage.BUFFER, Layout.WIDTH_PACKED,
                   label="self" if config.storage.startswith("buffer") else "out")
    tex = VkTensor(device, shape, "float32", Storage.TEXTURE_3D, Layout.CHANNELS_PACKED,
                   label="out" if config.storage.startswith("buffer") else "self")
    try:
        src, dst = (buf, tex) if config.storage.startswith("buffer") else (tex, buf)
        src.upload(words.reshape(-1) if src is buf else as_texture)
        dst.upload(np.zeros(dst.shape, np.float32))
        units = ey * ez * -(-ex // config.per_invocation)
        kernel = COPY_BUFFER_TEXEL_TEXEL if config.texel else MIXED[config.storage]
        d = _dispatch(kernel, {"out": dst, "self": src}, units, config.local,
                      {"per_invocation": config.per_invocation}, {"extents": (ex, ey, ez, 0)})
        probe = Probe(device, d, config.label, 2 * words.size * 4, (buf, tex))
    except BaseException:
        buf.close(), tex.close()
        raise
    want = as_texture if dst is tex else words.reshape(-1)
    np.testing.assert_array_equal(dst.download(), want, err_msg=f"bench copy kernel {config.storage} "
                                                                f"{config.label} copied wrongly")
    return probe


def copy_candidates(device, nbytes: int, storage: str, reps: int = 5,
                    configs: list[CopyConfig] | None = None) -> list[CopyResult]:
    """Every trivial copy of `storage` (or `configs`) moving about `nbytes`, each checked."""
    results = []
    for config in configs or copy_configs(storage):
        probe = copy_probe(device, nbytes, config)
        try:
            results.append(CopyResult(storage, config.label, probe.work, probe.seconds(reps)))
        finally:
            probe.close()
    return results


_sweeps: dict[tuple, list[tuple[CopyConfig, CopyResult]]] = {}


def sweep(device, storage: str, nbytes: int = 16 << 20, reps: int = 3) -> list[tuple[CopyConfig, CopyResult]]:
    """Every trivial copy of `storage` for about `nbytes` moved, fastest first (memoised per device,
    storage, size and repetitions)."""
    key = (id(device), storage, nbytes, reps)
    if key not in _sweeps:
        configs = copy_configs(storage)
        results = copy_candidates(device, nbytes, storage, reps, configs)
        _sweeps[key] = sorted(zip(configs, results), key=lambda cr: -cr[1].gbps)
    return _sweeps[key]


def fastest_configs(device, storage: str, count: int = 2, reps: int = 3) -> list[CopyConfig]:
    """The `count` fastest copy configs of `storage` on `device` (all tried once, at 16 MiB moved)."""
    return [config for config, _ in sweep(device, storage, 16 << 20, reps)[:count]]


def best_copy(device, nbytes: int = DEFAULT_COPY_BYTES, storage: str = "buffer", reps: int = 5) -> CopyResult:
    """The fastest of every trivial copy of `storage` for about `nbytes` moved."""
    return sweep(device, storage, nbytes, reps)[0][1]


def copy_bandwidth(device, nbytes: int = DEFAULT_COPY_BYTES, storage: str = "buffer", reps: int = 5) -> float:
    """GB/s of bytes moved by the best trivial copy of `storage`, for about `nbytes` moved."""
    return best_copy(device, nbytes, storage, reps).gbps


def fma_expected(a: float, b: float, iterations: int, unit: int) -> np.ndarray:
    """The vec4 fma_peak.comp writes for invocation `unit` (float64 closed form of c <- c*a + b)."""
    s = (unit & 7) * 0.125
    total = 0.0
    for k in range(FMA_CHAINS):
        c0 = s + k
        fixed = b / (1 - a)
        total += fixed + (c0 - fixed) * a ** iterations
    return np.full(4, total)


_fma_memo: dict[tuple, FmaResult] = {}


FMA_A, FMA_B = 0.99, 0.01  # c <- c * a + b converges slowly to 1: the value depends on every step


def fma_probe(device, invocations: int, iterations: int, local: int = 256) -> Probe:
    """The FMA kernel as a Probe (its `work` is FLOPs); its output is checked once."""
    if iterations % 8:
        raise ValueError(f"fma_probe: iterations={iterations} must be a multiple of 8 (the kernel's unrolled body)")
    out = VkTensor(device, (invocations, 4), "float32", Storage.BUFFER, Layout.WIDTH_PACKED, label="out")
    try:
        d = _dispatch(FMA, {"out": out}, invocations, local, {"iterations": iterations}, {"a": FMA_A, "b": FMA_B})
        flops = invocations * iterations * FMA_CHAINS * 4 * 2
        probe = Probe(device, d, f"{FMA_CHAINS} vec4 fma chains x {iterations} steps, {invocations} invocations, "
                                 f"local {local}", flops, (out,))
    except BaseException:
        out.close()
        raise
    got = out.download()
    for u in sorted({0, 1, 7, invocations - 1}):
        np.testing.assert_allclose(got[u], fma_expected(FMA_A, FMA_B, iterations, u), rtol=1e-4,
                                   err_msg=f"bench FMA kernel computed a wrong value at invocation {u}")
    return probe


def fma_run(device, invocations: int, iterations: int, local: int, reps: int = 5) -> FmaResult:
    """One run of the FMA kernel, its output checked against the closed form."""
    probe = fma_probe(device, invocations, iterations, local)
    try:
        return FmaResult(probe.label, probe.work, probe.seconds(reps))
    finally:
        probe.close()


def best_fma(device, invocations: int = 1 << 16, iterations: int = 256, reps: int = 5) -> FmaResult:
    """The best FMA run over the workgroup widths in LOCAL_SIZES (memoised per device and size)."""
    key = (id(device), invocations, iterations, reps)
    if key not in _fma_memo:
        _fma_memo[key] = max((fma_run(device, invocations, iterations, ls, reps) for ls in LOCAL_SIZES),
                             key=lambda r: r.gflops)
    return _fma_memo[key]


def fma_peak(device, invocations: int = 1 << 16, iterations: int = 256, reps: int = 5) -> float:
    """GFLOP/s of the trivial FMA kernel (an FMA counts 2 FLOPs)."""
    return best_fma(device, invocations, iterations, reps).gflops


def main(argv=None) -> None:
    from machine import machine

    from texelflow.runtime.vulkan.device import Device

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, few repetitions")
    ap.add_argument("--all", action="store_true", help="print every candidate copy kernel, not only the best")
    args = ap.parse_args(argv)
    reps = 3 if args.quick else 7
    sizes = (1 << 20, 16 << 20) if args.quick else (1 << 20, 16 << 20, 64 << 20)
    with Device() as device:
        lim = device.limits
        print(f"# device ceilings\n\n- device: {lim.name} ({lim.device_type}, Vulkan "
              f"{'.'.join(map(str, lim.api_version))}, subgroup {lim.subgroup_size})\n- machine: {machine()}\n"
              f"- GPU timestamps, median of {reps} runs; load average {os.getloadavg()[0]:.1f} (other processes "
              "on the same cores lower every figure)\n")
        print("| storage | bytes moved | best trivial copy | GB/s |\n|---|---:|---|---:|")
        for storage in ("buffer", "texture3d", *MIXED):
            for nbytes in sizes:
                cands = copy_candidates(device, nbytes, storage, reps)
                best = max(cands, key=lambda r: r.gbps)
                shown = sorted(cands, key=lambda r: -r.gbps) if args.all else [best]
                for r in shown:
                    print(f"| {storage} | {r.nbytes / 2**20:.0f} MiB | {r.kernel} | {r.gbps:.2f} |")
        fma = best_fma(device, 1 << (14 if args.quick else 16), 256, reps)
        print(f"\n| FMA peak | GFLOP/s |\n|---|---:|\n| {fma.kernel} | {fma.gflops:.2f} |")


if __name__ == "__main__":
    main()
