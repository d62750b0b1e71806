"""The declared schema of a saved program's description (format version 1; docs/format.md).

Validated on load before anything is built, so a tampered or foreign description fails with
the path of the first bad field instead of a KeyError deep in the loader. The schema is data
(nested dicts and tuples below), checked by one small walker: no code comes from the file.
"""

from __future__ import annotations

from texelflow.runtime.saved.errors import SchemaError
from texelflow.runtime.saved.fallback import check_target, tree_inputs, validate_tree

FORMAT = "texelflow.program"
FORMAT_VERSION = 1
METADATA_KEY = "texelflow"  # the one safetensors metadata key: the envelope (format, version, hash)
# the description: UTF-8 JSON, zlib-compressed (u8 bytes; a tenth of the size, which on small
# models is the difference between a file within 5% of its constants + SPIR-V and one over)
PROGRAM_TENSOR = "texelflow/program.json.zlib"
MAX_PROGRAM_BYTES = 256 * 1024 * 1024  # decompressed; a larger one is refused, never inflated

INT, STR, BOOL = "int", "str", "bool"
SCALAR = "scalar"  # an int, a float as {"f": float.hex()}, or a list of those
OPT_INT = ("optional", INT)
DTYPES = ("float32", "float16", "int32", "int8", "bool", "int64", "float64", "uint8")


TREE = "tree"  # a CPU fallback's argument tree (runtime/saved/fallback.py)


def absent_ok(item):
    """A field a writer may leave out (added within format version 1: files without it stay valid)."""
    return ("absent_ok", item)


def listof(item):
    return ("list", item)


def mapof(item):
    return ("map", item)


def oneof(*values):
    return ("enum", values)


BINDING = {"index": INT, "tensor": STR, "descriptor": STR, "access": oneof("read", "write", "readwrite"),
           "storage": STR}
PUSH = {"name": STR, "type": STR, "offset": INT, "size": INT}
SPEC_CONST = {"id": INT, "name": STR, "type": STR, "default": INT}
VARIANT = {"op": STR, "dtype": STR, "bindings": listof(BINDING), "push_constants": listof(PUSH),
           "push_constant_size": INT, "spec_constants": listof(SPEC_CONST), "features": listof(STR),
           "span": INT, "spirv": STR}
TENSOR = {"shape": listof(INT), "dtype": oneof(*DTYPES), "storage": STR, "layout": STR,
          "memory": oneof("constant", "dedicated", "shared"), "data": ("optional", STR), "label": STR}
DISPATCH = {"variant": STR, "label": STR, "tensors": mapof(INT), "scalars": mapof(SCALAR), "units": OPT_INT,
            "local_size_x": OPT_INT, "layouts": mapof(STR), "spec": mapof(INT), "spirv": ("optional", STR)}
VIEW = {"op": oneof("reshape", "permute"), "dims": listof(INT)}
REF = {"source": oneof("input", "device", "fallback", "constant", "literal"), "index": INT, "views": listof(VIEW),
       "dtype": ("optional", oneof(*DTYPES)), "literal": TREE}
# a fallback output's dtype is torch's name (it may be one the device cannot hold: it stays on the host)
FALLBACK_OUTPUT = {"id": INT, "shape": listof(INT), "dtype": STR, "tensor": OPT_INT}
FALLBACK = {"target": STR, "label": STR, "inputs": listof(("ref_or_refs", REF)), "args": TREE,
            "kwargs": mapof(TREE), "outputs": listof(FALLBACK_OUTPUT)}
SEGMENT = {"dispatches": listof(DISPATCH), "inputs": listof(INT), "outputs": listof(INT),
           "fallback": absent_ok(FALLBACK)}
INPUT = {"name": STR, "shape": listof(INT), "dtype": oneof(*DTYPES), "device_dtype": oneof(*DTYPES),
         "tensor": OPT_INT, "bounds": absent_ok(listof(INT))}  # bounds: [low, high] the program assumes
OUTPUT = {"name": STR, "shape": listof(INT), "dtype": oneof(*DTYPES),
          "source": oneof("device", "input", "constant", "fallback"), "index": INT, "views": listof(VIEW)}
# a buffer (`const/<target>`, kept live by the loaded program) or a call input (`target`: its
# index) that each call writes `value` into, after computing the outputs
WRITE = {"kind": oneof("buffer", "input"), "target": INT, "value": OUTPUT}
PROGRAM = {"texelflow_version": STR, "registry_hash": STR, "features": listof(STR), "saved_on": STR,
           "variants": mapof(VARIANT), "tensors": listof(TENSOR), "segments": listof(SEGMENT),
           "inputs": listof(INPUT), "outputs": listof(OUTPUT), "output_structure": oneof("single", "tuple", "list"),
           "plan_summary": STR, "torch_version": absent_ok(STR), "writes": absent_ok(listof(WRITE))}
ENVELOPE = {"format": STR, "format_version": INT, "sha256": STR}


def validate(doc, schema=PROGRAM, path: str = "program") -> None:
    """Raise SchemaError naming the first field of `doc` that does not follow `schema`."""
    def bad(what):
        raise SchemaError(f"{path}: {what}")

    if isinstance(schema, dict):
        if not isinstance(doc, dict):
            bad(f"expected an object, got {type(doc).__name__}")
        optional = {k for k, sub in schema.items() if isinstance(sub, tuple) and sub[0] == "absent_ok"}
        missing, extra = sorted(set(schema) - set(doc) - optional), sorted(set(doc) - set(schema))
        if missing or extra:
            bad(f"missing fields {missing}" if missing else f"unknown fields {extra}")
        for key, sub in schema.items():
            if key in doc:
                validate(doc[key], sub[1] if key in optional else sub, f"{path}.{key}")
    elif schema == INT:
        if type(doc) is not int:
            bad(f"expected an integer, got {type(doc).__name__}")
    elif schema == STR:
        if not isinstance(doc, str):
            bad(f"expected a string, got {type(doc).__name__}")
    elif schema == SCALAR:
        if isinstance(doc, list):
            for i, x in enumerate(doc):
                validate(x, SCALAR, f"{path}[{i}]")
        elif isinstance(doc, dict):
            if set(doc) != {"f"} or not isinstance(doc["f"], str):
                bad('expected {"f": hex float}')
            try:
                float.fromhex(doc["f"])
            except ValueError:
                bad(f"not a hex float: {doc['f'][:40]!r}")
        elif type(doc) is not int:
            bad(f"expected an integer, hex float or list, got {type(doc).__name__}")
    elif schema == TREE:
        validate_tree(doc, path)
    elif schema[0] == "ref_or_refs":
        if isinstance(doc, list):
            for i, x in enumerate(doc):
                validate(x, schema[1], f"{path}[{i}]")
        else:
            validate(doc, schema[1], path)
    elif schema[0] == "optional":
        if doc is not None:
            validate(doc, schema[1], path)
    elif schema[0] == "enum":
        if doc not in schema[1]:
            bad(f"expected one of {list(schema[1])}, got {str(doc)[:40]!r}")
    elif schema[0] == "list":
        if not isinstance(doc, list):
            bad(f"expected a list, got {type(doc).__name__}")
        for i, x in enumerate(doc):
            validate(x, schema[1], f"{path}[{i}]")
    elif schema[0] == "map":
        if not isinstance(doc, dict):
            bad(f"expected an object, got {type(doc).__name__}")
        for k, x in doc.items():
            validate(x, schema[1], f"{path}.{k}")
    else:  # pragma: no cover - a mistake in the schema above, not in a file
        raise AssertionError(f"unknown schema node {schema!r}")


def check_references(prog: dict, tensors: dict) -> None:
    """Indices and names that must point inside the file: raise SchemaError on the first that does not."""
    n = len(prog["tensors"])
    tensor_names = set(tensors)
    for name, a in tensors.items():
        if name.startswith("spirv/") and (a.dtype.str != "|u1" or a.ndim != 1 or a.size % 4):
            raise SchemaError(f"tensor {name}: SPIR-V must be bytes (u8, 1-D, whole words), got {a.dtype}{list(a.shape)}")

    def index(i, path):
        if not 0 <= i < n:
            raise SchemaError(f"program.{path}: tensor index {i} outside 0..{n - 1}")

    for i, t in enumerate(prog["tensors"]):
        if (t["memory"] == "constant") != (t["data"] is not None):
            raise SchemaError(f"program.tensors[{i}]: a constant, and only a constant, has data")
        if t["data"] is not None and t["data"] not in tensor_names:
            raise SchemaError(f"program.tensors[{i}].data: no tensor {t['data']!r} in the file")
        if any(s < 0 for s in t["shape"]):
            raise SchemaError(f"program.tensors[{i}].shape: negative size")
    for name, v in prog["variants"].items():
        if f"spirv/{v['spirv']}" not in tensor_names:
            raise SchemaError(f"program.variants.{name}.spirv: no SPIR-V {v['spirv']} in the file")
    for s, seg in enumerate(prog["segments"]):
        for i in seg["inputs"] + seg["outputs"]:
            index(i, f"segments[{s}]")
        for d, disp in enumerate(seg["dispatches"]):
            for i in disp["tensors"].values():
                index(i, f"segments[{s}].dispatches[{d}]")
            if disp["spirv"] is not None and f"spirv/{disp['spirv']}" not in tensor_names:
                raise SchemaError(f"program.segments[{s}].dispatches[{d}].spirv: no such SPIR-V")
    for i, inp in enumerate(prog["inputs"]):
        if inp["tensor"] is not None:
            index(inp["tensor"], f"inputs[{i}]")
    read_back = {i for seg in prog["segments"] for i in seg["outputs"]}
    made = check_fallbacks(prog, tensor_names, index)
    for i, out in enumerate(prog["outputs"]):
        k, where = out["index"], f"program.outputs[{i}].index"
        if out["source"] == "device" and k not in read_back:
            raise SchemaError(f"{where}: tensor {k} is not read back by any segment")
        if out["source"] == "fallback" and k not in made:
            raise SchemaError(f"{where}: no fallback output {k}")
        if out["source"] == "input" and not 0 <= k < len(prog["inputs"]):
            raise SchemaError(f"{where}: no input {k}")
        if out["source"] == "constant" and f"const/{k}" not in tensor_names:
            raise SchemaError(f"{where}: no constant const/{k} in the file")
    for i, w in enumerate(prog.get("writes", [])):
        out, k = w["value"], w["value"]["index"]
        if w["kind"] == "buffer" and f"const/{w['target']}" not in tensor_names:
            raise SchemaError(f"program.writes[{i}].target: no constant const/{w['target']} in the file")
        if w["kind"] == "input" and not 0 <= w["target"] < len(prog["inputs"]):
            raise SchemaError(f"program.writes[{i}].target: no input {w['target']}")
        if {"device": k in read_back, "input": 0 <= k < len(prog["inputs"]), "fallback": k in made,
                "constant": f"const/{k}" in tensor_names}[out["source"]] is False:
            raise SchemaError(f"program.writes[{i}].value.index: no {out['source']} {k}")
    if prog["output_structure"] == "single" and len(prog["outputs"]) != 1:
        raise SchemaError("program.output_structure: single, with "
                          f"{len(prog['outputs'])} outputs")


def check_fallbacks(prog: dict, tensor_names: set, index) -> set[int]:
    """Each fallback's target is an allowed op name and its inputs exist before it runs (an input,
    a tensor read back by this or an earlier segment, an earlier fallback's output, a constant);
    returns the ids of all fallback outputs."""
    read_back, made = set(), set()
    for s, seg in enumerate(prog["segments"]):
        read_back.update(seg["outputs"])
        fb = seg.get("fallback")
        if fb is None:
            continue
        where = f"program.segments[{s}].fallback"
        why = check_target(fb["target"])
        if why is not None:
            raise SchemaError(f"{where}.target: {why}")
        for j, ref in enumerate(r for x in fb["inputs"] for r in (x if isinstance(x, list) else [x])):
            k, src = ref["index"], ref["source"]
            ok = {"input": 0 <= k < len(prog["inputs"]), "device": k in read_back, "fallback": k in made,
                  "constant": f"const/{k}" in tensor_names, "literal": True}[src]
            if not ok:
                raise SchemaError(f"{where}.inputs: {src} {k} is not available before this fallback runs")
        used = tree_inputs(fb["args"]) + [i for t in fb["kwargs"].values() for i in tree_inputs(t)]
        if any(i >= len(fb["inputs"]) for i in used):
            raise SchemaError(f"{where}.args: an input index outside 0..{len(fb['inputs']) - 1}")
        for out in fb["outputs"]:
            if out["id"] in made:
                raise SchemaError(f"{where}.outputs: id {out['id']} defined twice")
            made.add(out["id"])
            if out["tensor"] is not None:
                index(out["tensor"], f"segments[{s}].fallback.outputs")
    return made
