"""bench/ceilings.py measures what it claims: its trivial kernels run on the device, copy every
element (downloaded and compared), compute the FMA recurrence exactly as the host does, and give
positive ceilings. Tiny sizes, so it runs in seconds."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def ceilings():
    """bench/ceilings.py as a module (bench/ is a folder of scripts, not a package)."""
    spec = importlib.util.spec_from_file_location("bench_ceilings", BENCH / "ceilings.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("storage", ["buffer", "texture3d"])
def test_every_copy_kernel_copies_and_has_a_positive_bandwidth(device, ceilings, storage):
    configs = ceilings.copy_configs(storage)
    results = ceilings.copy_candidates(device, 64 << 10, storage, reps=1)  # each checks its copy
    assert len(results) == len(configs)
    assert all(r.seconds > 0 and r.gbps > 0 and r.nbytes >= 32 << 10 for r in results)


def test_copy_probes_copy_tails_of_odd_sizes(device, ceilings):
    from texelflow.generated.layouts import Storage

    # 13 vec4 words in chunks of 4; a texture 7 texels wide, 3 high, 2 deep, in chunks of 4
    for config, shape in ((ceilings.CopyConfig("buffer", 4, 64), (52,)),
                          (ceilings.CopyConfig("texture3d", 4, 64), (1, 8, 3, 7))):
        probe = ceilings.copy_probe(device, 0, config, shape)
        try:
            src, dst = probe.program.dispatches[0].tensors["self"], probe.program.dispatches[0].tensors["out"]
            assert src.storage == (Storage.BUFFER if config.storage == "buffer" else Storage.TEXTURE_3D)
            x = np.arange(np.prod(src.shape), dtype=np.float32).reshape(src.shape) - 7.5
            src.upload(x)
            assert probe.sample() > 0
            np.testing.assert_array_equal(dst.download(), x)
        finally:
            probe.close()


def test_fma_kernel_computes_the_recurrence(device, ceilings):
    result = ceilings.fma_run(device, invocations=1000, iterations=16, local=64, reps=1)  # checks values
    assert result.flops == 1000 * 16 * ceilings.FMA_CHAINS * 4 * 2
    assert result.gflops > 0
    # the checked closed form is not trivially constant: it depends on the steps and the invocation
    a = ceilings.fma_expected(0.99, 0.01, 16, 0)[0]
    assert a != ceilings.fma_expected(0.99, 0.01, 17, 0)[0] != ceilings.fma_expected(0.99, 0.01, 16, 1)[0]


def test_public_ceilings_are_positive_numbers(device, ceilings):
    assert ceilings.copy_bandwidth(device, 256 << 10, "buffer", reps=1) > 0
    assert ceilings.copy_bandwidth(device, 256 << 10, "texture3d", reps=1) > 0
    assert ceilings.fma_peak(device, invocations=4096, iterations=32, reps=1) > 0


def test_unknown_storage_is_a_one_line_error(device, ceilings):
    with pytest.raises(ValueError, match="bench/ceilings.py: unknown storage 'image2d'"):
        ceilings.copy_candidates(device, 1 << 10, "image2d")
