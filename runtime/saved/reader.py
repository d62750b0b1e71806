"""Reading a saved program file safely: every check before anything is built.

Order: the safetensors header (its length fits the file, it is a JSON object), the envelope's
format name and version, the tensors (parsed by safetensors, which checks their offsets cover the
data exactly), the sha256 over the description's bytes and every other tensor, then the
description's JSON, its declared schema and the references inside the file. Only JSON and raw arrays are ever parsed: nothing in the file is
code, and nothing in it is executed. Each failure is one line naming the file and the problem.
"""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import numpy as np

from texelflow.runtime.saved.errors import CorruptFileError, FormatVersionError, SavedProgramError, SchemaError
from texelflow.runtime.saved.schema import (ENVELOPE, FORMAT, FORMAT_VERSION, MAX_PROGRAM_BYTES, METADATA_KEY,
                                            PROGRAM_TENSOR, check_references, validate)
from texelflow.runtime.saved.writer import content_hash

MAX_HEADER = 100 * 1024 * 1024  # safetensors' own limit on the JSON header


def read(path) -> tuple[dict, dict[str, np.ndarray], int]:
    """(program description, tensors, file size) of the file at `path`, checked."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SavedProgramError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    try:
        envelope = _envelope(path, data)
        if envelope.get("format") != FORMAT:
            raise CorruptFileError(f"not a texelflow program file (format {str(envelope.get('format'))[:40]!r})")
        version = envelope.get("format_version")
        if version != FORMAT_VERSION or type(version) is not int:
            raise FormatVersionError(f"format version {str(version)[:20]}, but this texelflow reads version "
                                     f"{FORMAT_VERSION} only; save the program again with this texelflow")
        validate(envelope, ENVELOPE, "envelope")
        tensors = _tensors(path, data)
        raw = tensors.pop(PROGRAM_TENSOR, None)
        if raw is None or raw.dtype != np.uint8 or raw.ndim != 1:
            raise CorruptFileError(f"not a texelflow program file (no {PROGRAM_TENSOR} bytes)")
        text = _inflate(raw.tobytes())
        if text is None or content_hash(text, tensors) != envelope["sha256"]:
            raise CorruptFileError("corrupted or modified: its contents do not match the sha256 recorded when "
                                   "it was saved")
        try:
            program = json.loads(text, parse_constant=_no_constant)
        except ValueError as exc:
            raise SchemaError(f"program: not JSON ({str(exc)[:80]})") from None
        validate(program)
        check_references(program, tensors)
    except SavedProgramError as exc:
        raise type(exc)(f"{path}: {exc}") from None
    return program, tensors, len(data)


def _inflate(raw: bytes) -> str | None:
    """The description's text, or None when its bytes do not inflate to UTF-8 within the limit."""
    inflater = zlib.decompressobj()
    try:
        text = inflater.decompress(raw, MAX_PROGRAM_BYTES)
        if not inflater.eof or inflater.unconsumed_tail or inflater.unused_data:
            return None
        return text.decode("utf-8")
    except (zlib.error, UnicodeDecodeError):
        return None


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _envelope(path: Path, data: bytes) -> dict:
    """The texelflow envelope from the safetensors header, read without safetensors so that a
    file that is not one (a pickle renamed, say) is refused before any parser sees its body."""
    if len(data) < 8:
        raise CorruptFileError(f"not a texelflow program file (only {len(data)} bytes)")
    (n,) = struct.unpack("<Q", data[:8])
    if n > MAX_HEADER or 8 + n > len(data):
        raise CorruptFileError(f"not a texelflow program file, or truncated (header of {n} bytes in a "
                               f"file of {len(data)})")
    if data[8:9] != b"{":
        raise CorruptFileError("not a texelflow program file (no safetensors header)")
    try:
        header = json.loads(data[8:8 + n].decode("utf-8"))
        meta = header["__metadata__"][METADATA_KEY]
        envelope = json.loads(meta)
    except (UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise CorruptFileError("not a texelflow program file, or corrupted (header: "
                               f"{type(exc).__name__})") from None
    if not isinstance(envelope, dict):
        raise CorruptFileError("not a texelflow program file (its envelope is not an object)")
    return envelope


def _tensors(path: Path, data: bytes) -> dict[str, np.ndarray]:
    import safetensors.numpy

    try:
        return safetensors.numpy.load(data)
    except Exception as exc:  # safetensors raises its own SafetensorError (and ValueError) on bad input
        line = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        raise CorruptFileError(f"truncated or corrupted tensor data ({line})") from None
