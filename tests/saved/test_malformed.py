"""Malformed saved programs: each gives one clear one-line error naming the file and the
problem, and nothing in a file is ever executed (issue 14)."""

from __future__ import annotations

import json
import pickle
import struct
import zlib

import numpy as np
import pytest
import safetensors.numpy

import texelflow
from texelflow.models import tiny_resnet
from texelflow.runtime.saved import (CorruptFileError, FormatVersionError, MissingDeviceFeatureError,
                                     SavedProgramError, SchemaError, UnknownVariantError)
from texelflow.runtime.saved.schema import METADATA_KEY, PROGRAM_TENSOR
from texelflow.runtime.saved.writer import content_hash, dumps


@pytest.fixture(scope="module")
def saved(tmp_path_factory, device):
    """A good file, and the outputs of the program it was saved from."""
    path = tmp_path_factory.mktemp("saved") / "good.tflow"
    model, inputs = tiny_resnet()
    with texelflow.compile(model, inputs, device=device) as prog:
        prog.save(path)
    return path


def _header(data: bytes) -> tuple[int, dict]:
    (n,) = struct.unpack("<Q", data[:8])
    return n, json.loads(data[8:8 + n])


def _rewrite(src, dst, edit, rehash=True):
    """Copy `src` to `dst` with its envelope and description edited by `edit(e)` (`e`: the envelope
    with the description under "program"); the hash recomputed (as someone forging a file would)
    unless `rehash` is False."""
    data = src.read_bytes()
    envelope = json.loads(_header(data)[1]["__metadata__"][METADATA_KEY])
    tensors = safetensors.numpy.load(data)
    envelope["program"] = json.loads(zlib.decompress(tensors.pop(PROGRAM_TENSOR).tobytes()))
    edit(envelope)
    text = dumps(envelope.pop("program"))
    if rehash:
        envelope["sha256"] = content_hash(text, tensors)
    tensors[PROGRAM_TENSOR] = np.frombuffer(zlib.compress(text.encode()), np.uint8)
    dst.write_bytes(safetensors.numpy.save(tensors, metadata={METADATA_KEY: dumps(envelope)}))
    return dst


def _refused(path, device, error, *words):
    with pytest.raises(error) as info:
        texelflow.load(path, device=device)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(str(path)), msg
    for w in words:
        assert w in msg, msg
    return msg


def test_the_good_file_loads(saved, device):
    texelflow.load(saved, device=device).close()


@pytest.mark.parametrize("keep", [0, 5, 100, 0.5, -1])
def test_truncated_file(saved, device, tmp_path, keep):
    data = saved.read_bytes()
    n = keep if isinstance(keep, int) and keep >= 0 else int(len(data) * keep) if keep > 0 else len(data) - 3
    bad = tmp_path / "cut.tflow"
    bad.write_bytes(data[:n])
    _refused(bad, device, CorruptFileError)


@pytest.mark.parametrize("where", ["start", "middle", "end"])
def test_flipped_byte_in_the_graph(saved, device, tmp_path, where):
    data = bytearray(saved.read_bytes())
    n, header = _header(bytes(data))
    start, end = header[PROGRAM_TENSOR]["data_offsets"]
    at = {"start": start + 2, "middle": (start + end) // 2, "end": end - 1}[where]
    data[8 + n + at] ^= 0x01
    bad = tmp_path / "graph.tflow"
    bad.write_bytes(bytes(data))
    _refused(bad, device, CorruptFileError, "do not match the sha256")


def test_a_decompression_bomb_is_refused(saved, device, tmp_path):
    data = saved.read_bytes()
    envelope = json.loads(_header(data)[1]["__metadata__"][METADATA_KEY])
    tensors = safetensors.numpy.load(data)
    tensors[PROGRAM_TENSOR] = np.frombuffer(zlib.compress(b" " * (300 * 1024 * 1024), 9), np.uint8)
    bad = tmp_path / "bomb.tflow"
    bad.write_bytes(safetensors.numpy.save(tensors, metadata={METADATA_KEY: dumps(envelope)}))
    _refused(bad, device, CorruptFileError, "do not match the sha256")


def test_flipped_byte_breaking_the_safetensors_header(saved, device, tmp_path):
    data = bytearray(saved.read_bytes())
    data[data.index(b'"data_offsets"')] = ord("#")
    bad = tmp_path / "json.tflow"
    bad.write_bytes(bytes(data))
    _refused(bad, device, CorruptFileError)


@pytest.mark.parametrize("where", ["const", "spirv"])
def test_flipped_byte_in_a_tensor(saved, device, tmp_path, where):
    data = bytearray(saved.read_bytes())
    n, header = _header(bytes(data))
    name = next(k for k in sorted(header) if k.startswith(where + "/"))
    start, end = header[name]["data_offsets"]
    data[8 + n + (start + end) // 2] ^= 0x40
    bad = tmp_path / "tensor.tflow"
    bad.write_bytes(bytes(data))
    _refused(bad, device, CorruptFileError, "do not match the sha256")


def test_edited_description_without_a_new_hash(saved, device, tmp_path):
    bad = _rewrite(saved, tmp_path / "edit.tflow", lambda e: e["program"]["features"].append("x"), rehash=False)
    _refused(bad, device, CorruptFileError, "sha256")


def test_wrong_format_version(saved, device, tmp_path):
    bad = _rewrite(saved, tmp_path / "v2.tflow", lambda e: e.update(format_version=2))
    _refused(bad, device, FormatVersionError, "format version 2", "reads version 1")


def test_another_format_name(saved, device, tmp_path):
    bad = _rewrite(saved, tmp_path / "other.tflow", lambda e: e.update(format="someone.else"))
    _refused(bad, device, CorruptFileError, "not a texelflow program")


def _rename_variant(envelope):
    prog = envelope["program"]
    name = sorted(prog["variants"])[0]
    prog["variants"]["no_such_variant_float32"] = prog["variants"].pop(name)
    for seg in prog["segments"]:
        for d in seg["dispatches"]:
            if d["variant"] == name:
                d["variant"] = "no_such_variant_float32"


def test_unknown_variant(saved, device, tmp_path):
    bad = _rewrite(saved, tmp_path / "variant.tflow", _rename_variant)
    _refused(bad, device, UnknownVariantError, "'no_such_variant_float32'", "not in this runtime's registry")


def test_variant_with_another_interface(saved, device, tmp_path):
    def edit(e):
        v = e["program"]["variants"][sorted(e["program"]["variants"])[0]]
        v["push_constant_size"] += 16

    bad = _rewrite(saved, tmp_path / "iface.tflow", edit)
    _refused(bad, device, UnknownVariantError, "another interface")


def test_missing_device_feature(saved, device, tmp_path):
    bad = _rewrite(saved, tmp_path / "feature.tflow", lambda e: e["program"]["features"].append("shaderFloat128"))
    _refused(bad, device, MissingDeviceFeatureError, "shaderFloat128", str(device.limits.name))


@pytest.mark.parametrize("edit, where", [
    (lambda e: e["program"]["segments"][0]["inputs"].__setitem__(0, "0"), "segments[0].inputs[0]"),
    (lambda e: e["program"]["segments"][0]["outputs"].__setitem__(0, 10**6), "outside"),
    (lambda e: e["program"].pop("tensors"), "missing fields ['tensors']"),
    (lambda e: e["program"]["tensors"][0].update(memory="mmap"), "tensors[0].memory"),
    (lambda e: e["program"]["tensors"][0].update(storage="TEXTURE9D"), "unknown representation"),
    (lambda e: e["program"]["segments"][0]["dispatches"][0]["scalars"].update(bad={"f": "zz"}), "not a hex float"),
    (lambda e: e["program"]["segments"][0]["dispatches"][0]["scalars"].update(nope=1), "do not match variant"),
    (lambda e: e["program"]["segments"][0]["dispatches"][0]["tensors"].update(extra=0), "do not match variant"),
    (lambda e: e["program"]["outputs"][0].update(index=10**6), "not read back"),
    (lambda e: e["program"]["outputs"][0].update(source="input", index=5), "no input 5"),
])
def test_description_outside_the_schema(saved, device, tmp_path, edit, where):
    bad = _rewrite(saved, tmp_path / "schema.tflow", edit)
    _refused(bad, device, SchemaError, where)


def test_a_pickle_renamed_to_the_extension_is_refused_and_never_run(device, tmp_path):
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):  # unpickling calls open(marker, "w"): the file appears
            return (open, (str(marker), "w"))

    blob = pickle.dumps(Payload())
    probe = tmp_path / "probe"  # the payload is live: unpickling it does create its file
    pickle.loads(pickle.dumps(type("P", (), {"__reduce__": lambda self: (open, (str(probe), "w"))})())).close()
    assert probe.exists()
    bad = tmp_path / "model.tflow"
    bad.write_bytes(blob)
    _refused(bad, device, CorruptFileError, "not a texelflow program")
    assert not marker.exists()


def test_a_missing_file_is_one_line(device, tmp_path):
    _refused(tmp_path / "absent.tflow", device, SavedProgramError, "cannot read")


def test_torch_state_dict_safetensors_is_not_a_program(device, tmp_path):
    bad = tmp_path / "weights.tflow"
    bad.write_bytes(safetensors.numpy.save({"w": np.ones(3, np.float32)}))
    _refused(bad, device, CorruptFileError, "not a texelflow program")
