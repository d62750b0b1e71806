"""Find the push-constant hooks of shaders/hooks.py without running it.

A hook is a top-level function decorated with `@hook("TYPE")`; gen reads them from the source
(with `ast`) so it knows each hook's name, type and line while importing nothing of the runtime.
"""

from __future__ import annotations

import ast
from pathlib import Path

from .diagnostics import Collector

HOOK_TYPES = ("int", "float", "ivec4")


def scan_hooks(path: Path, out: Collector) -> dict[str, tuple[str, int]]:
    """Hook name -> (type, line); a file that is absent declares no hooks."""
    file = "shaders/hooks.py"
    if not path.exists():
        return {}
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except SyntaxError as exc:
        out.error(file, exc.lineno or 0, f"syntax error: {exc.msg}")
        return {}
    hooks: dict[str, tuple[str, int]] = {}
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        for dec in node.decorator_list:
            if isinstance(dec, ast.Call) and getattr(dec.func, "id", None) == "hook":
                arg = dec.args[0] if dec.args else None
                htype = arg.value if isinstance(arg, ast.Constant) else None
                if htype not in HOOK_TYPES:
                    out.error(file, node.lineno, f"hook '{node.name}' must be declared @hook(\"int\"|\"float\"|\"ivec4\")")
                    continue
                hooks[node.name] = (htype, node.lineno)
    return hooks
