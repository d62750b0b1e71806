"""Small shape checks shared by the two schema readers; each records a diagnostic and moves on."""

from __future__ import annotations

from .diagnostics import Collector, did_you_mean
from .yamlsrc import LList, LMap


class Checker:
    """Type and key checks that report `file:line:` and keep going."""

    def __init__(self, file: str, out: Collector):
        self.file = file
        self.out = out

    def error(self, line: int, message: str) -> None:
        self.out.error(self.file, line, message)

    def mapping(self, value, line: int, what: str) -> LMap | None:
        if isinstance(value, LMap):
            return value
        self.error(line, f"{what} must be a mapping, found {_kind(value)}")
        return None

    def listing(self, value, line: int, what: str) -> LList | None:
        if isinstance(value, LList):
            return value
        self.error(line, f"{what} must be a list, found {_kind(value)}")
        return None

    def keys(self, m: LMap, what: str, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> bool:
        ok = True
        allowed = required + optional
        for key in m:
            if key not in allowed:
                self.error(m.line_of(key), f"unknown key '{key}' in {what}{did_you_mean(key, allowed)}")
                ok = False
        for key in required:
            if key not in m:
                self.error(m.line, f"{what} is missing required key '{key}'")
                ok = False
        return ok

    def typed(self, value, types, line: int, what: str):
        """`value` if it has one of `types` (bool is never an int here), else None with an error."""
        if isinstance(value, bool) and bool not in _as_tuple(types):
            self.error(line, f"{what} must be {_names(types)}, found bool")
            return None
        if isinstance(value, _as_tuple(types)):
            return value
        self.error(line, f"{what} must be {_names(types)}, found {_kind(value)}")
        return None

    def name_in(self, value, choices, line: int, what: str) -> bool:
        if isinstance(value, str) and value in choices:
            return True
        self.error(line, f"unknown {what} '{value}'{did_you_mean(value, choices)}")
        return False


def _as_tuple(types) -> tuple:
    return types if isinstance(types, tuple) else (types,)


def _names(types) -> str:
    names = {str: "a string", int: "an integer", float: "a number", bool: "true or false", list: "a list", dict: "a mapping"}
    return " or ".join(names.get(t, t.__name__) for t in _as_tuple(types))


def _kind(value) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return f"string '{value}'"
    return type(value).__name__
