"""save(prog, path): a compiled program's device program, constants and SPIR-V as one file.

What is written is what the program built: each segment's recorded dispatches (variant, bound
tensors, scalars, units, layouts, shape classes, SPIR-V), each tensor's representation and
whether its memory is its own or planned by the Program, each constant's logical data once
(prepacked again at load by the same packing code, so the device bytes are the same), and each
CPU-fallback node as data (runtime/saved/fallback.py: op name, argument tree, input sources). The
loader rebuilds the same Program objects from this, so outputs match bit for bit.
"""

from __future__ import annotations

import hashlib
import json
import os
import zlib
from pathlib import Path

import numpy as np

from texelflow.runtime.saved.errors import SchemaError, UnsavableProgramError
from texelflow.runtime.saved.fallback import encode_arg, target_name
from texelflow.runtime.saved.schema import FORMAT, FORMAT_VERSION, METADATA_KEY, PROGRAM_TENSOR, validate


def registry_hash() -> str:
    """sha256 of the generated variant registry this runtime was built with (informational: the
    loader checks each variant's interface itself)."""
    import texelflow.generated.variants as gv

    return hashlib.sha256(Path(gv.__file__).read_bytes()).hexdigest()


def encode_scalar(x):
    """A push-constant value as strict JSON: ints as they are, floats as exact hex strings (NaN and
    infinities included), sequences as lists."""
    if isinstance(x, (bool, np.bool_)):
        return int(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return {"f": float(x).hex()}
    if isinstance(x, (tuple, list, np.ndarray)):
        return [encode_scalar(v) for v in x]
    raise UnsavableProgramError(f"saving a program: push-constant value {x!r} of type {type(x).__name__} "
                                "has no encoding")


def content_hash(program_json: str, tensors: dict[str, np.ndarray]) -> str:
    """sha256 over the description and every tensor (name, dtype, shape, bytes), in name order."""
    h = hashlib.sha256(program_json.encode("utf-8"))
    for name in sorted(tensors):
        a = tensors[name]
        h.update(f"\0{name}\0{a.dtype.str}\0{list(a.shape)}\0".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def dumps(doc) -> str:
    """Canonical JSON: sorted keys, no spaces, strict (no NaN): two saves are byte-identical."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False)


def variant_interface(v) -> dict:
    """A registry variant's interface as the file records it: what its SPIR-V was compiled
    against (the loader refuses a variant whose interface in this runtime differs)."""
    return {"op": v.op, "dtype": v.dtype, "span": int(getattr(v, "span", 1)), "features": list(v.features),
            "bindings": [{"index": b.index, "tensor": b.tensor, "descriptor": b.descriptor, "access": b.access,
                          "storage": b.storage} for b in v.bindings],
            "push_constants": [{"name": p.name, "type": p.type, "offset": p.offset, "size": p.size}
                               for p in v.push_constants],
            "push_constant_size": v.push_constant_size,
            "spec_constants": [{"id": s.id, "name": s.name, "type": s.type, "default": int(s.default)}
                               for s in v.spec_constants]}


class _Collector:
    """Walks one CompiledProgram and gathers the description and the tensors of its file."""

    def __init__(self, prog):
        self.prog = prog
        self.tensors: dict[str, np.ndarray] = {}
        self.tensor_ids: dict[int, int] = {}  # id(VkTensor) -> index in doc["tensors"]
        self.doc_tensors: list[dict] = []
        self.variants: dict[str, dict] = {}
        self.const_of: dict[int, tuple] = {}  # id(VkTensor) -> (key of its Value, Value or None)
        self.const_names: dict[object, str] = {}
        for (v, _repr), t in prog._consts.items():
            self.const_of[id(t)] = (v, None if isinstance(v, str) else v)

    def const_data(self, key, value) -> str:
        """The file's name of a constant's logical data, stored once however many representations."""
        ident = key if isinstance(key, str) else id(key)
        name = self.const_names.get(ident)
        if name is None:
            data = np.zeros(1, np.float32) if value is None else np.asarray(self.prog._const_value(value))
            name = f"const/{len(self.const_names)}"
            self.tensors[name] = np.ascontiguousarray(data)
            self.const_names[ident] = name
        return name

    def spirv(self, code: bytes) -> str:
        digest = hashlib.sha256(code).hexdigest()
        self.tensors.setdefault(f"spirv/{digest}", np.frombuffer(code, np.uint8).copy())
        return digest

    def tensor(self, t, shared: set[int]) -> int:
        i = self.tensor_ids.get(id(t))
        if i is not None:
            return i
        data = None
        if id(t) in self.const_of:
            memory = "constant"
            key, value = self.const_of[id(t)]
            data = self.const_data(key, value)
        else:
            memory = "shared" if id(t) in shared else "dedicated"
        self.doc_tensors.append({"shape": list(t.shape), "dtype": t.dtype, "storage": t.storage.name,
                                 "layout": t.layout.name, "memory": memory, "data": data, "label": t.label})
        self.tensor_ids[id(t)] = len(self.doc_tensors) - 1
        return self.tensor_ids[id(t)]

    def variant(self, v, cache) -> str:
        if v.name not in self.variants:
            self.variants[v.name] = {**variant_interface(v), "spirv": self.spirv(cache.spirv(v))}
        return self.variants[v.name]["spirv"]

    def segment(self, seg, cache) -> dict:
        program = seg.program
        shared = {id(t) for t in program.intermediates}
        dispatches = []
        for d, bound in zip(program.dispatches, program._bound):
            self.variant(d.variant, cache)
            names = [b.tensor for b in sorted(d.variant.bindings, key=lambda b: b.index)]
            dispatches.append({
                "variant": d.variant.name, "label": d.label,
                "tensors": {n: self.tensor(t, shared) for n, t in zip(names, bound)},
                "scalars": {k: encode_scalar(x) for k, x in d.scalars.items()},
                "units": None if d.units is None else int(d.units),
                "local_size_x": None if d.local_size_x is None else int(d.local_size_x),
                "layouts": {k: _layout_name(x) for k, x in d.layouts.items()},
                "spec": {k: int(x) for k, x in d.spec.items()},
                "spirv": None if d.spirv is None else self.spirv(d.spirv)})  # None: the variant's own
        return {"dispatches": dispatches, "inputs": [self.tensor(t, shared) for t in program.inputs],
                "outputs": [self.tensor(t, shared) for t in program.outputs]}


def _layout_name(layout) -> str:
    from texelflow.shaders.geometry import as_layout

    return as_layout(layout).name


def describe(prog) -> tuple[dict, dict[str, np.ndarray]]:
    """(description, tensors) of `prog`; UnsavableProgramError for what the format cannot hold."""
    from texelflow.runtime.call_args import TensorSpec
    from texelflow.runtime.graph.ir import Value
    from texelflow.runtime.vulkan.pipeline import PipelineCache

    if prog.closed:
        raise UnsavableProgramError("saving a program: it was closed; compile it again to save it")
    graph = prog.plan.graph
    specs = getattr(graph, "output_specs", None) or [("user", None, v) for v in graph.outputs]
    literal = [str(target) for kind, target, v in specs if kind != "user" and not isinstance(v, Value)]
    if literal:
        raise UnsavableProgramError(f"saving a program: the model writes a constant to {', '.join(literal[:5])}, "
                                    "which a saved program cannot do")
    if any(not isinstance(s, TensorSpec) for s in prog._input_specs):
        raise UnsavableProgramError("saving a program: the model takes non-tensor inputs; a saved program takes "
                                    "tensors only")
    c = _Collector(prog)
    cache = PipelineCache.shared(prog.device)
    kept = [s for s in prog.segments if (s.program is not None and (s.nodes or s.inputs)) or s.cpu is not None]
    empty = {"dispatches": [], "inputs": [], "outputs": []}  # a fallback with no device work before it
    segments = [c.segment(s, cache) if s.program is not None and (s.nodes or s.inputs) else dict(empty) for s in kept]
    seg_inputs = {}  # graph input (or fallback output) Value -> tensor index
    for seg, doc_seg in zip(kept, segments):
        for v, i in zip(seg.inputs, doc_seg["inputs"]):
            seg_inputs[v] = i
    input_values = list(prog._input_values)
    hosts = _HostRefs(prog, c, input_values)
    for seg, doc_seg in zip(kept, segments):
        if seg.cpu is not None:
            doc_seg["fallback"] = hosts.fallback(seg.cpu, seg_inputs)
    known = set(input_values) | set(hosts.fallback_ids)
    stray = [v.name for v in seg_inputs if v not in known]
    if stray:
        raise UnsavableProgramError(f"saving a program: device inputs {stray[:5]} are not inputs of the model")
    # a bfloat16 input the device holds as float32 (runtime/graph/bfloat16.py) is saved as float32:
    # numpy has no bfloat16, and the program rounds it to bfloat16 where it enters
    inputs = [{"name": s.name, "shape": list(s.shape), "dtype": v.dtype if s.dtype == "bfloat16" else s.dtype,
               "device_dtype": v.dtype,
               "tensor": seg_inputs.get(v), **({"bounds": list(s.bounds)} if s.bounds is not None else {})}
              for s, v in zip(prog._input_specs, input_values)]
    outputs = [_output(prog, c, v, input_values, hosts) for v in prog._user_outputs]
    writes = [{"kind": kind, "target": hosts.buffer_const(target) if kind == "buffer" else int(target),
               "value": _output(prog, c, v, input_values, hosts)} for kind, target, v in specs if kind != "user"]
    out_spec = getattr(prog, "_out_spec", None)
    structure = "single" if out_spec is not None and out_spec.is_leaf() else (
        "list" if out_spec is not None and out_spec.type is list else "tuple")
    if structure == "single" and len(outputs) != 1:
        structure = "tuple"
    import texelflow

    program = {
        "texelflow_version": texelflow.__version__, "registry_hash": registry_hash(),
        "features": sorted({f for v in c.variants.values() for f in v["features"]}),
        "saved_on": str(prog.device.limits.name), "variants": c.variants, "tensors": c.doc_tensors,
        "segments": segments, "inputs": inputs, "outputs": outputs, "output_structure": structure,
        "plan_summary": prog.plan.summary()}
    if writes:
        program["writes"] = writes
    if hosts.fallback_ids or any("fallback" in seg for seg in segments):
        program["torch_version"] = prog._torch.__version__.split("+")[0]  # what runs its CPU fallbacks
    try:  # what a load would refuse is refused here, at save (a dtype outside the schema, say)
        validate(program)
    except SchemaError as exc:
        raise UnsavableProgramError(f"saving a program: the file would not follow its schema ({exc})") from None
    return program, c.tensors


def _views(prog, v) -> list[dict]:
    """The folded views (reshape, permute) from `v`'s root to `v`, in the order they apply."""
    views, cur = [], v
    while cur in prog._folded_by:
        node = prog._folded_by[cur]
        views.append({"op": "permute", "dims": [int(d) for d in node.arg("dims")]} if node.op.name == "permute_copy"
                     else {"op": "reshape", "dims": [int(s) for s in cur.shape]})
        cur = node.arg("self")
    views.reverse()
    return views


def _source(prog, c: _Collector, root, input_values, fallback_ids) -> tuple[str, int] | None:
    """Where a non-constant root value lives on the host: an input, a fallback output, or a
    device tensor read back after its segment."""
    if root in input_values:
        return "input", input_values.index(root)
    if root in fallback_ids:
        return "fallback", fallback_ids[root]
    for seg in prog.segments:
        if seg.program is not None and root in seg.outputs:
            return "device", c.tensor_ids[id(seg.program.outputs[seg.outputs.index(root)])]
    return None


def _output(prog, c: _Collector, v, input_values, hosts) -> dict:
    """Where a user output comes from (a segment output, an input, a fallback, a constant) and the
    folded views applied to its root's value on the host, as the program does."""
    from texelflow.runtime.graph.ir import Role, Value

    if not isinstance(v, Value):
        raise UnsavableProgramError(f"saving a program: output {v!r} is not a tensor")
    base = {"name": v.name, "shape": [int(s) for s in v.shape], "dtype": prog._host_dtype(v), "views": _views(prog, v)}
    if v.role is Role.CONST and v.source in hosts.mutated:  # the live buffer, as the call left it
        return {**base, "source": "constant", "index": hosts.state_const(v), "views": []}
    if v.role is Role.CONST:
        return {**base, "source": "constant", "index": int(c.const_data(v, v).split("/")[1]), "views": []}
    found = _source(prog, c, prog._root(v), input_values, hosts.fallback_ids)
    if found is None:
        raise UnsavableProgramError(f"saving a program: output {v.name} is not read back from the device")
    return {**base, "source": found[0], "index": found[1]}


class _HostRefs:
    """The CPU-fallback nodes of a program as data (runtime/saved/fallback.py): each one's op name,
    argument tree, inputs (where CompiledProgram._fx_values finds them) and outputs."""

    def __init__(self, prog, c: _Collector, input_values):
        self.prog, self.c, self.input_values = prog, c, input_values
        self.fallback_ids: dict = {}  # fallback output Value -> its id in the file
        self.state_consts: dict[object, int] = {}  # state key (or id(Value)) -> const index of its state tensor
        specs = getattr(prog.plan.graph, "output_specs", None) or []
        self.mutated = {target for kind, target, _ in specs if kind == "buffer"}  # written back each call

    def ref(self, v) -> dict:
        """Where one fallback input comes from, as CompiledProgram._value_of finds it."""
        from texelflow.runtime.graph.ir import Role

        prog = self.prog
        base = {"views": [], "dtype": None, "literal": None}
        if v.role is Role.CONST:
            if v.literal is not None:
                return {**base, "source": "literal", "index": 0, "literal": encode_arg(v.literal, {})}
            return {**base, "source": "constant", "index": self.state_const(v)}
        host = prog._host_dtype(v)
        found = _source(prog, self.c, prog._root(v), self.input_values, self.fallback_ids)
        if found is None:
            raise UnsavableProgramError(f"saving a program: fallback input {v.name} is not on the host")
        return {**base, "source": found[0], "index": found[1], "views": _views(prog, v),
                "dtype": host if host != v.dtype else None}

    def state_const(self, v) -> int:
        """The file index of a constant's tensor as the fallback reads it (its state dtype)."""
        key = v.source if v.source is not None else id(v)
        return self._state_index(key, v.name, lambda: self.prog._const_tensor(v))

    def buffer_const(self, target: str) -> int:
        """The file index of a buffer the call writes back (its state tensor, as `state_const`)."""
        return self._state_index(target, target, lambda: self.prog._state[target])

    def _state_index(self, key, name: str, tensor) -> int:
        if key not in self.state_consts:
            t = tensor().detach().cpu().contiguous()
            try:
                data = t.numpy()
            except TypeError:
                raise UnsavableProgramError(f"saving a program: constant {name} ({t.dtype}) has no numpy "
                                            "dtype to store it in") from None
            file_name = f"const/{len(self.c.const_names)}"
            self.c.tensors[file_name] = np.ascontiguousarray(data)
            self.c.const_names[("state", key)] = file_name
            self.state_consts[key] = int(file_name.split("/")[1])
        return self.state_consts[key]

    def fallback(self, node, seg_inputs) -> dict:
        from texelflow.runtime.graph.ir import Value

        prog, fx = self.prog, node.fx
        recorded = prog.plan.graph.fx_inputs.get(node)
        names = {a.name: i for i, a in enumerate(fx.all_input_nodes)}
        inputs = []
        for i, a in enumerate(fx.all_input_nodes):
            v = recorded[i] if recorded is not None else prog._ir_value(a)
            inputs.append(self.ref(v) if isinstance(v, Value) else [self.ref(x) for x in v])
        outputs = []
        for _, v in node.outputs:
            self.fallback_ids[v] = len(self.fallback_ids)
            outputs.append({"id": self.fallback_ids[v], "shape": [int(s) for s in v.shape], "dtype": v.dtype,
                            "tensor": seg_inputs.get(v)})
        return {"target": target_name(fx.target), "label": node.name, "inputs": inputs,
                "args": encode_arg(list(fx.args), names),
                "kwargs": {k: encode_arg(x, names) for k, x in fx.kwargs.items()}, "outputs": outputs}


def save(prog, path) -> Path:
    """Write `prog` to `path` as one safetensors file (format: docs/format.md); returns the path."""
    import safetensors.numpy

    program, tensors = describe(prog)
    program_json = dumps(program)
    envelope = {"format": FORMAT, "format_version": FORMAT_VERSION, "sha256": content_hash(program_json, tensors)}
    tensors[PROGRAM_TENSOR] = np.frombuffer(zlib.compress(program_json.encode("utf-8"), 9), np.uint8)
    data = safetensors.numpy.save(tensors, metadata={METADATA_KEY: dumps(envelope)})
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)  # a reader never sees half a file
    return path
