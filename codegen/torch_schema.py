"""torch's op schemas, the truth for argument names, order, kinds and defaults in ops.yaml.

Importing torch costs seconds, so the facts gen needs (per target: its arguments and number of
returns, or why it does not exist) are cached per torch version in the texelflow cache directory;
a warm `make gen` never imports torch. Targets torch lacks may carry a schema string in torch's
syntax (ours, or another library's ops), parsed by torch's own parser.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

from texelflow.shaders.spirv_cache import CacheWarning

from .diagnostics import Diagnostic, GenError

# torch type (of `Argument.real_type`) -> our argument kind; Optional[...] makes it optional.
KINDS = {
    "Tensor": "tensor",
    "List[Tensor]": "tensor_list",
    "float": "float",
    "number": "float",  # Scalar
    "int": "int",
    "SymInt": "int",
    "bool": "bool",
    "List[int]": "int_list",
    "List[SymInt]": "int_list",
    "str": "str",
}


@dataclass(frozen=True)
class SchemaArg:
    name: str
    kind: str  # tensor, tensor_list, float, int, bool, int_list, str, any
    optional: bool
    has_default: bool
    default: object
    torch_type: str


@dataclass(frozen=True)
class Schema:
    target: str
    args: tuple[SchemaArg, ...]
    returns: int

    def arg(self, name: str) -> SchemaArg | None:
        return next((a for a in self.args if a.name == name), None)


def kind_of(real_type: str) -> tuple[str, bool]:
    """(kind, optional) of a torch argument type."""
    optional = real_type.startswith("Optional[")
    inner = real_type[len("Optional["):-1] if optional else real_type
    return KINDS.get(inner, "any"), optional


def _cache_path() -> Path:
    root = os.environ.get("TEXELFLOW_CACHE_DIR")
    base = Path(root) if root else Path.home() / ".cache" / "texelflow"
    return base / "torch-schemas.json"


def _read_cache(path: Path, version: str) -> dict:
    """The cache for this torch version; a fresh one when it is absent, unreadable or not ours
    (a corrupted file is ignored and rebuilt)."""
    try:
        cache = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        cache = None
    if not isinstance(cache, dict) or cache.get("torch") != version or not isinstance(cache.get("targets"), dict):
        cache = {"torch": version, "targets": {}}
    return cache


def _write_cache(path: Path, cache: dict) -> None:
    """Write atomically within the cache folder; without a usable folder, warn and go on uncached."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(cache, sort_keys=True, default=str))
        os.replace(tmp, path)
    except OSError as exc:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        warnings.warn(f"texelflow: cannot write the torch schema cache {path} ({exc.strerror or exc}); "
                      "going on without it (torch is imported on every gen)", CacheWarning, stacklevel=3)


def _cached(entries: dict, key: str, target: str):
    """The decoded entry, or None when absent or malformed (a hand-edited or foreign file)."""
    entry = entries.get(key)
    if not isinstance(entry, dict):
        return None
    try:
        return _decode(target, entry)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def torch_version() -> str | None:
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def _key(target: str, declared: str | None) -> str:
    if declared is None:
        return target
    return f"{target}#{hashlib.sha256(declared.encode()).hexdigest()[:16]}"


def lookup(wanted: dict[str, str | None]) -> dict[str, Schema | str]:
    """Schema (or the reason there is none) per target; `wanted` maps target -> declared schema
    string or None. Cached per torch version."""
    version = torch_version()
    if version is None:
        raise GenError([Diagnostic("ops.yaml", 0, "torch is needed to check ops.yaml against torch's op schemas: "
                                   "pip install torch==2.13.0 (or run `make gen`, which installs it)")])
    path = _cache_path()
    cache = _read_cache(path, version)
    entries = cache["targets"]
    found = {t: _cached(entries, _key(t, s), t) for t, s in wanted.items()}
    missing = {t: s for t, s in wanted.items() if found[t] is None}
    if missing:
        import torch  # only on a cache miss

        for target, declared in missing.items():
            entries[_key(target, declared)] = _describe(torch, target, declared)
            found[target] = _decode(target, entries[_key(target, declared)])
        _write_cache(path, cache)
    return found


def _describe(torch, target: str, declared: str | None) -> dict:
    """JSON facts of one target: its schema, or {"error": why}."""
    ns, op, overload = target.split(".")
    packet = getattr(getattr(torch.ops, ns, None), op, None) if _has_namespace(torch, ns) else None
    if packet is None or not hasattr(packet, overload):
        if declared is not None:
            try:
                return _schema_json(torch._C.parse_schema(declared))
            except RuntimeError as exc:
                return {"error": f"cannot parse schema: {str(exc).splitlines()[0]}"}
        if packet is None:
            return {"error": f"torch {torch.__version__} has no op '{ns}.{op}'", "overloads": []}
        return {"error": f"torch {torch.__version__} has no overload '{target}'",
                "overloads": sorted(f"{ns}.{op}.{o}" for o in packet.overloads())}
    if declared is not None:
        return {"error": "declares a schema, but torch has this target: drop `schema` and use torch's"}
    return _schema_json(getattr(packet, overload)._schema)


def _has_namespace(torch, ns: str) -> bool:
    try:
        getattr(torch.ops, ns)
        return True
    except (AttributeError, RuntimeError):
        return False


def _schema_json(schema) -> dict:
    args = []
    for a in schema.arguments:
        real = str(a.real_type)
        has_default = a.has_default_value()
        args.append({"name": a.name, "type": real, "has_default": has_default,
                     "default": a.default_value if has_default else None})
    return {"args": args, "returns": len(schema.returns)}


def _decode(target: str, entry: dict) -> Schema | str:
    if "error" in entry:
        near = entry.get("overloads") or []
        return entry["error"] + (f" (it has {', '.join(near)})" if near else "")
    args = []
    for a in entry["args"]:
        kind, optional = kind_of(a["type"])
        args.append(SchemaArg(a["name"], kind, optional, a["has_default"], a["default"], a["type"]))
    return Schema(target, tuple(args), entry["returns"])
