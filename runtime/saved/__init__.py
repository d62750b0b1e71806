"""Saved programs: `save(prog, path)` writes one safe file; `load(path)` runs it without torch.

Format (docs/format.md): one safetensors file whose tensors are the constants, the SPIR-V and
the schema-checked JSON description of the device program (zlib-compressed), and whose one
metadata entry is the envelope: format name, version and the sha256 over everything else. CPU
fallbacks are stored as data (op names resolved only through `torch.ops`) and need torch at load.
"""

from texelflow.runtime.saved.errors import (CorruptFileError, FormatVersionError, MissingDependencyError,
                                            MissingDeviceFeatureError,
                                            SavedProgramError, SchemaError, UnknownVariantError,
                                            UnsavableProgramError)
from texelflow.runtime.saved.contents import inspect
from texelflow.runtime.saved.loaded import LoadedProgram
from texelflow.runtime.saved.schema import FORMAT_VERSION
from texelflow.runtime.saved.writer import save

__all__ = ["save", "load", "inspect", "LoadedProgram", "FORMAT_VERSION", "SavedProgramError", "CorruptFileError",
           "FormatVersionError", "SchemaError", "MissingDependencyError", "UnknownVariantError",
           "MissingDeviceFeatureError", "UnsavableProgramError"]


def load(path, device=None) -> LoadedProgram:
    """The saved program at `path`, built on `device` (default: the process-wide default device)."""
    return LoadedProgram(path, device)
