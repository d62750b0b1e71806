"""Problems found in the YAML sources, reported all at once as `file:line: message`."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Iterable


@dataclass(frozen=True, order=True)
class Diagnostic:
    file: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.message}"


class GenError(Exception):
    """Raised with every problem found; the CLI prints one line per problem, no traceback."""

    def __init__(self, diagnostics: Iterable[Diagnostic]):
        self.diagnostics = sorted(set(diagnostics))
        super().__init__("\n".join(str(d) for d in self.diagnostics))


@dataclass
class Collector:
    """Accumulates diagnostics so validation reports every problem, not just the first."""

    items: list[Diagnostic] = field(default_factory=list)

    def error(self, file: str, line: int, message: str) -> None:
        self.items.append(Diagnostic(file, line, message))

    def raise_if_any(self) -> None:
        if self.items:
            raise GenError(self.items)


def did_you_mean(name: object, choices: Iterable[str]) -> str:
    """A ' (did you mean X?)' suffix when a close match exists, else ''."""
    match = difflib.get_close_matches(str(name), sorted(choices), n=1, cutoff=0.6)
    return f" (did you mean '{match[0]}'?)" if match else ""
