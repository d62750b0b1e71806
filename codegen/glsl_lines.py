"""`#line` markers from rendered GLSL back to the shader templates, and the way back for errors.

A shader template's output lines do not line up with its own lines: `{% if %}` / `{% for %}`
lines vanish, loops repeat their bodies and `{% include %}` splices in another template. So that a
GLSL error can be reported at the template line that produced it, `install(env)` makes a jinja2
environment render GLSL with `#line N "shaders/NAME.glsl.j2"` markers (GL_GOOGLE_cpp_style_line_directive,
which glslc understands), placed only where the mapping is not the plain continuation of the line
before, so the rendered GLSL stays reviewable. Blank lines and whole-line `//` comments need no
exact line; a loop whose body is one line still costs a marker per iteration (each iteration's line
is that same template line).

How: a jinja2 extension prefixes every text chunk of a template (and every `{{ ... }}`) with an
invisible sentinel naming its template and source line; the template's `render()` then turns the
sentinels into per-line origins, drops them, and writes a marker before each line whose origin is
not implied by the previous marker. Apart from the markers (and the extension line that enables
them, right after `#version`), the output is byte-for-byte what the template renders without this
module: only jinja's own data chunks are annotated, after its whitespace control has run.

Known limits: a template value containing newlines (a multi-line parameter) maps its extra lines to
the following template lines; `{% filter %}` and block `{% set %}...{% endset %}` would see the
sentinels (no shader template uses them; the one-line `{% set x = ... %}` is fine).

The way back (`SourceMap`): the origin of every line of a rendered file, read from its markers, so
a glslc message about generated line L names the template line as well.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import jinja2
import jinja2.ext
from jinja2.lexer import Token

EXTENSION_LINE = "#extension GL_GOOGLE_cpp_style_line_directive : require"
_SENTINEL = "\x1f{file}\x1f{line}\x1e"
_SENTINEL_RE = re.compile("\x1f([^\x1f\x1e]*)\x1f([0-9]+)\x1e")
_MARKER_RE = re.compile(r'^[ \t]*#[ \t]*line[ \t]+([0-9]+)(?:[ \t]+"([^"]*)")?[ \t]*$')


class LineOriginExtension(jinja2.ext.Extension):
    """Prefixes each data chunk and each `{{ ... }}` with a sentinel (template path, source line)."""

    def filter_stream(self, stream):
        prefix = getattr(self.environment, "glsl_line_prefix", "")
        path = f"{prefix}{stream.name}" if stream.name else "<string>"
        for tok in stream:
            if tok.type == "data":
                yield Token(tok.lineno, "data", _SENTINEL.format(file=path, line=tok.lineno) + tok.value)
            elif tok.type == "variable_begin":
                yield Token(tok.lineno, "data", _SENTINEL.format(file=path, line=tok.lineno))
                yield tok
            else:
                yield tok


class LineMarkedTemplate(jinja2.Template):
    """A template whose `render()` returns GLSL with `#line` markers (see `add_markers`)."""

    def render(self, *args, **kwargs) -> str:
        return add_markers(super().render(*args, **kwargs))

    def generate(self, *args, **kwargs):  # stream() too: the markers need the whole text
        yield self.render(*args, **kwargs)


def install(env: jinja2.Environment, prefix: str = "shaders/") -> jinja2.Environment:
    """Make `env` render line-marked GLSL; `prefix` + template name is the path markers name."""
    env.glsl_line_prefix = prefix
    env.add_extension(LineOriginExtension)
    env.template_class = LineMarkedTemplate
    return env


Origin = tuple  # (template path, 1-based line)


def split_origins(raw: str) -> tuple[list[str], list[Origin | None]]:
    """Rendered text with sentinels -> (its lines without sentinels, the origin of each line).

    A line's origin is where its first character came from (for an empty line, its newline).
    """
    lines: list[str] = []
    origins: list[Origin | None] = []
    current: list[str] = []
    origin: Origin | None = None
    state: Origin | None = None  # where the next character comes from
    pos = 0
    for m in [*_SENTINEL_RE.finditer(raw), None]:
        chunk = raw[pos : m.start() if m else len(raw)]
        parts = chunk.split("\n")
        for i, part in enumerate(parts):
            if i > 0:  # a newline ends the current line
                lines.append("".join(current))
                origins.append(origin if origin is not None else state)
                current, origin = [], None
                if state is not None:
                    state = (state[0], state[1] + 1)
            if part:
                if origin is None and not current:
                    origin = state
                current.append(part)
        if m is None:
            break
        state = (m.group(1), int(m.group(2)))
        pos = m.end()
    lines.append("".join(current))
    origins.append(origin if origin is not None else state)
    return lines, origins


def add_markers(raw: str) -> str:
    """Sentinel-annotated render -> GLSL with the fewest `#line` markers that keep every non-blank
    line mapped to its template line. Text without a `#version` line is only cleaned."""
    lines, origins = split_origins(raw)
    version = next((i for i, line in enumerate(lines) if line.lstrip().startswith("#version")), None)
    if version is None:
        return "\n".join(lines)
    out = lines[: version + 1] + [EXTENSION_LINE]
    implied: Origin | None = None  # origin the next line has without a new marker
    for line, origin in zip(lines[version + 1 :], origins[version + 1 :]):
        if _matters(line) and origin is not None and origin != implied:
            same_file = implied is not None and implied[0] == origin[0]
            out.append(f"#line {origin[1]}" if same_file else f'#line {origin[1]} "{origin[0]}"')
            implied = origin
        out.append(line)
        if implied is not None:
            implied = (implied[0], implied[1] + 1)
    return "\n".join(out)


def _matters(line: str) -> bool:
    """Lines glslc can complain about: not blank, not a whole-line `//` comment. Only these need
    their exact template line; a marker is written only when one of them would be off."""
    text = line.strip()
    return bool(text) and not text.startswith("//")


def remove_markers(text: str) -> str:
    """The same GLSL with every `#line` marker turned into a comment (line numbers unchanged), so
    that glslc reports lines of the file itself."""
    return "\n".join("//" + line.lstrip() if _MARKER_RE.match(line) else line for line in text.split("\n"))


@dataclass(frozen=True)
class SourceMap:
    """Origin (template path, line) of each line of a line-marked GLSL file; None where unknown."""

    origins: tuple[Origin | None, ...]

    @classmethod
    def of(cls, text: str) -> "SourceMap":
        origins: list[Origin | None] = []
        state: Origin | None = None
        for line in text.split("\n"):
            m = _MARKER_RE.match(line)
            if m:
                origins.append(None)
                state = (m.group(2) if m.group(2) is not None else (state[0] if state else None), int(m.group(1)))
                continue
            origins.append(state if state is not None and state[0] is not None else None)
            if state is not None:
                state = (state[0], state[1] + 1)
        return cls(tuple(origins))

    def origin(self, line: int) -> Origin | None:
        """Template (path, line) of 1-based generated line `line`, if known."""
        if 1 <= line <= len(self.origins):
            return self.origins[line - 1]
        return None
