"""Errors of saved programs: one class per problem a file can have, each raised with one line
that names the file and the problem (never a traceback from deep in a parser)."""

from texelflow.runtime.errors import TexelflowError, UnsupportedModelError


class SavedProgramError(TexelflowError, ValueError):
    """A saved program file that cannot be loaded."""


class CorruptFileError(SavedProgramError):
    """Not a texelflow program file, truncated, or its contents do not match its hash."""


class FormatVersionError(SavedProgramError):
    """A texelflow program file of a format version this runtime does not read."""


class SchemaError(SavedProgramError):
    """The program description does not follow the declared schema (tampered, or another writer)."""


class UnknownVariantError(SavedProgramError):
    """A dispatch names a shader variant this runtime does not know, or knows with another interface."""


class MissingDeviceFeatureError(SavedProgramError):
    """The program needs device features the device it is loaded on lacks."""


class MissingDependencyError(SavedProgramError):
    """The program has CPU-fallback nodes, which need PyTorch, and torch cannot be imported here."""


class UnsavableProgramError(UnsupportedModelError):
    """A compiled program this format cannot hold (said at save, never discovered at load)."""
