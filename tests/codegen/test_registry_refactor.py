"""The op-class refactor of ops.yaml kept every fact of the expanded registry, apart from the
deliberate fixes listed here (each one a place where the hand-typed YAML disagreed with torch's
schema or carried dead data).

`data/registry_before_classes.json` is generated/ops.py's OPS as it was before classes, push
derivations and schema-derived arguments (dumped once, field by field).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from texelflow.generated.ops import OPS

BEFORE = json.loads((Path(__file__).parent / "data" / "registry_before_classes.json").read_text())

# Fields the refactor added (push, checks, grid) or removed as dead (dim_order; issue 12 brought it
# back with a meaning: the dim order a kernel computes in, empty for every op listed here).
NEW_FIELDS = {"push", "checks", "grid", "template", "dtype_of", "dim_order"}
# Dtypes added since (issue 10: bool joined the ALL set of identity ops and transitions; issue 13:
# float16 variants for precision="fp16", docs/precision.md).
NEW_DTYPES = {"bool", "float16"}
# Ops given int32 variants since (third-party integer arithmetic: `ids.abs()`, `-ids`, a clamp).
NEW_OP_DTYPES = {"abs": {"int32"}, "neg": {"int32"}, "clamp": {"int32"}}
REMOVED_FIELDS = {"dim_order"}
# Flags added since (issue 10: permute and cat run rank <= 7 tensors in buffers).
NEW_FLAGS = {"permute_copy": ["supports_highdim"], "cat": ["supports_highdim"]}
# (op, arg) -> {field: (before, after)}: arguments now taken from torch's schema.
ARG_FIXES = {
    ("avg_pool2d", "padding"): {"default": ([0], [0, 0])},
    ("avg_pool2d", "divisor_override"): {"default": (0, None)},  # "0 = None" is now `none: 0` on its push
    ("max_pool2d", "padding"): {"default": ([0], [0, 0])},
    ("max_pool2d", "dilation"): {"default": ([1], [1, 1])},
    ("clamp", "min"): {"default": (-3.4028234663852886e38, None)},  # FLT_MAX is now `none: -inf`
    ("clamp", "max"): {"default": (3.4028234663852886e38, None)},
    ("layer_norm", "cudnn_enable"): {"kind": ("any", "bool")},
}
# Schema arguments the hand-written entries left out.
ADDED_ARGS = {"clone": ["memory_format"], "clone_dim_order": ["non_blocking", "dim_order"]}
# Ops whose self and out lost their sync group for storage axes of their own (issue 10: a
# permute re-lays out for free): each variant of one storage became one per (in, out) storage pair.
RELAYOUT = {"permute_copy": ("in_storage", "out_storage")}
STORAGE_AXIS_VALUES = ("buffer", "texture3d")
# Ops whose channels-packed texture tensors also take a channels-packed buffer (issue 12: beside
# conv2d_nhwc a pool reads NHWC memory, so the permutes around it are free): a buffer variant more.
BUFFER_TOO = {"avg_pool2d": "CHANNELS_PACKED_ANY", "max_pool2d": "CHANNELS_PACKED_ANY"}


def _plain(x):
    if dataclasses.is_dataclass(x):
        return {f.name: _plain(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, (tuple, list)):
        return [_plain(i) for i in x]
    if isinstance(x, frozenset):
        return sorted(x)
    return x


def _fixed_before(name: str, entry: dict) -> dict:
    """The old entry with the deliberate fixes applied."""
    entry = {k: v for k, v in entry.items() if k not in REMOVED_FIELDS}
    entry["flags"] = [f for f in entry["flags"] if f != "supports_resize"]  # dead flag, removed
    args = []
    for a in entry["args"]:
        a = dict(a)
        for field, (old, new) in ARG_FIXES.get((name, a["name"]), {}).items():
            assert a[field] == old, f"{name}.{a['name']}.{field}: the snapshot says {a[field]!r}, not {old!r}"
            a[field] = new
        args.append(a)
    entry["args"] = args
    if name in RELAYOUT:
        assert entry["shader_axes"] == ["dtype", "storage"] and entry["sync"] == [["self", "out"]], name
        entry["sync"] = []
        entry["shader_axes"] = ["dtype", *RELAYOUT[name]]
        stems = list(dict.fromkeys(v.rsplit("_", 1)[0] for v in entry["variants"]))
        entry["variants"] = [f"{s}_{i}_{o}" for s in stems for i in STORAGE_AXIS_VALUES for o in STORAGE_AXIS_VALUES]
    if name in BUFFER_TOO:
        entry["args"] = [dict(a, repset=BUFFER_TOO[name]) if a["repset"] == "CHANNELS_PACKED_TEXTURE" else a
                         for a in entry["args"]]
        entry["outputs"] = [dict(o, repset=BUFFER_TOO[name]) for o in entry["outputs"]]
        entry["variants"] = sorted(entry["variants"] + [v.replace("_texture3d", "_buffer") for v in entry["variants"]])
    return entry


def test_every_op_survives_the_refactor():
    assert sorted(OPS) == sorted(BEFORE) or set(BEFORE) <= set(OPS)


def test_expanded_entries_equal_apart_from_listed_fixes():
    for name, before in sorted(BEFORE.items()):
        after = json.loads(json.dumps(_plain(OPS[name])))
        for field in NEW_FIELDS:
            after.pop(field)
        added = ADDED_ARGS.get(name, [])
        assert [a["name"] for a in after["args"] if a["name"] in added] == added, name
        after["args"] = [a for a in after["args"] if a["name"] not in added]
        new_dtypes = NEW_DTYPES | NEW_OP_DTYPES.get(name, set())
        after["dtypes"] = [d for d in after["dtypes"] if d not in new_dtypes]
        after["flags"] = [f for f in after["flags"] if f not in NEW_FLAGS.get(name, ())]
        after["variants"] = [v for v in after["variants"] if not any(f"_{d}_" in v for d in new_dtypes)]
        assert after == _fixed_before(name, before), f"op '{name}' changed beyond the listed fixes"
