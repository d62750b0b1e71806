"""LoadedProgram: a saved program rebuilt on a device, with numpy and the Vulkan binding only.

The file's tensors, dispatches and SPIR-V become the same VkTensor, Dispatch and Program objects
the compiled program had (same order, so the Program plans the same shared memory), and the
constants are packed by the same code: outputs match the saved program bit for bit. No torch,
jinja2, glslc or YAML is imported; torch tensors are accepted (and returned) when torch is there.
CPU-fallback nodes (runtime/saved/fallback.py) need torch: imported at load, never otherwise.
"""

from __future__ import annotations

import importlib
import threading
import weakref

import numpy as np

from texelflow.runtime.errors import InputTypeError, InputValueError, ProgramClosedError
from texelflow.runtime.saved.errors import (MissingDependencyError, MissingDeviceFeatureError, SchemaError,
                                            UnknownVariantError)
from texelflow.runtime.saved import fallback as fb
from texelflow.runtime.saved import contents
from texelflow.runtime.saved.reader import read
from texelflow.runtime.saved.writer import registry_hash, variant_interface

_INTERFACE = ("op", "dtype", "span", "features", "bindings", "push_constants", "push_constant_size",
              "spec_constants")


def _scalar(x):
    if isinstance(x, list):
        return tuple(_scalar(v) for v in x)
    if isinstance(x, dict):
        return float.fromhex(x["f"])
    return x


def _torch_tensor_type():
    import sys

    torch = sys.modules.get("torch")  # only if the caller already imported it: never imported here
    return getattr(torch, "Tensor", None) if torch is not None else None


class _Held:
    """What a loaded program holds on its device, freed by close() or a finalizer."""

    def __init__(self):
        self.programs, self.tensors, self.closed = [], [], False

    def close(self):
        if self.closed:
            return
        self.closed = True
        for p in self.programs:
            p.close()
        for t in self.tensors:
            t.close()
        self.programs, self.tensors = [], []


class LoadedProgram:
    """`prog(*arrays)` runs a saved program; `input_specs`, `output_specs`, `summary()`, close()."""

    def __init__(self, path, device=None):
        from texelflow.runtime.vulkan.device import default_device

        self.path = str(path)
        doc, self._data, self.file_bytes = read(path)
        self._doc = doc
        self.device = default_device() if device is None else device
        self.device.check_open("loading a saved program")
        lacking = sorted(set(doc["features"]) - set(self.device.enabled_features))
        if lacking:
            raise MissingDeviceFeatureError(f"{path}: the program needs device features {', '.join(lacking)}, which "
                                            f"{self.device.limits.name} does not offer")
        self._variants = self._resolve_variants(doc)
        self._ops = self._resolve_fallbacks(doc)
        self.input_specs = [{k: inp[k] for k in ("name", "shape", "dtype")} for inp in doc["inputs"]]
        self.output_specs = [{k: out[k] for k in ("name", "shape", "dtype")} for out in doc["outputs"]]
        self._lock = threading.Lock()
        self._held = _Held()
        self._finalizer = weakref.finalize(self, self._held.close)
        try:
            self._build(doc)
        except BaseException:
            self.close()
            raise

    # ---- building ---------------------------------------------------------------------------------
    def _resolve_variants(self, doc) -> dict:
        """name -> this runtime's variant, refused when unknown or when its interface differs from
        the file's (the file's SPIR-V was compiled against the file's interface)."""
        from texelflow.generated.variants import VARIANTS

        out = {}
        for name, recorded in doc["variants"].items():
            v = VARIANTS.get(name)
            if v is None:
                raise UnknownVariantError(f"{self.path}: shader variant {name!r} is not in this runtime's registry; "
                                          "save the program again with this texelflow")
            if {k: recorded[k] for k in _INTERFACE} != variant_interface(v):
                raise UnknownVariantError(f"{self.path}: shader variant {name!r} has another interface in this "
                                          f"runtime (registry {registry_hash()[:12]}); save the program again")
            out[name] = v
        for s, seg in enumerate(doc["segments"]):
            for d, disp in enumerate(seg["dispatches"]):
                v = out.get(disp["variant"])
                if v is None:
                    raise UnknownVariantError(f"{self.path}: dispatch {s}.{d} names variant {disp['variant']!r}, which "
                                              "the file does not describe")
                self._check_dispatch(f"segments[{s}].dispatches[{d}]", disp, v)
        return out

    def _resolve_fallbacks(self, doc) -> list:
        """Per segment, the torch op of its CPU fallback (None: it has none), resolved only through
        `torch.ops` (runtime/saved/fallback.py). Without torch: MissingDependencyError, here at load."""
        nodes = [seg.get("fallback") for seg in doc["segments"]]
        named = [f"{n['label']} ({n['target']})" for n in nodes if n is not None]
        if not named:
            return nodes
        try:
            importlib.import_module("torch")  # only a program with CPU fallbacks ever imports it
        except ImportError:
            version = doc.get("torch_version", "")
            raise MissingDependencyError(
                f"{self.path}: nodes {', '.join(named[:5])}{' ...' if len(named) > 5 else ''} run on the CPU in "
                f"PyTorch, which cannot be imported here; `pip install torch{'==' + version if version else ''}` "
                "makes this program run") from None
        ops = []
        for s, node in enumerate(nodes):
            op = None if node is None else fb.resolve(node["target"])
            if node is not None and op is None:
                raise SchemaError(f"{self.path}: segments[{s}].fallback.target: {node['target'][:60]!r} is not an op "
                                  "of this torch")
            ops.append(op)
        for node in nodes:  # names in the argument trees (dtypes, layouts) resolve now, not at a call
            if node is not None:
                try:
                    fb.decode_arg({"list": [node["args"], *node["kwargs"].values()]}, [None] * len(node["inputs"]))
                except SchemaError as exc:
                    raise SchemaError(f"{self.path}: fallback {node['label']}: {exc}") from None
        return ops

    def _check_dispatch(self, where: str, disp: dict, v) -> None:
        """The names a dispatch uses are its variant's: bindings, push constants, spec constants."""
        bindings = {b.tensor for b in v.bindings}
        checks = (("tensors", set(disp["tensors"]) ^ bindings),
                  ("scalars", set(disp["scalars"]) - {p.name for p in v.push_constants}),
                  ("spec", set(disp["spec"]) - {c.name for c in v.spec_constants}),
                  ("layouts", set(disp["layouts"]) - bindings))
        for field, wrong in checks:
            if wrong:
                raise SchemaError(f"{self.path}: {where}.{field}: {sorted(wrong)[:5]} do not match variant {v.name}")

    def _build(self, doc) -> None:
        from texelflow.generated.layouts import Layout, Storage
        from texelflow.runtime.vulkan.program import Dispatch, Program
        from texelflow.runtime.vulkan.tensor import VkTensor

        tensors = []
        for i, t in enumerate(doc["tensors"]):
            try:
                storage, layout = Storage[t["storage"]], Layout[t["layout"]]
            except KeyError:
                raise SchemaError(f"{self.path}: tensor {i} has an unknown representation "
                                  f"{t['storage'][:20]}/{t['layout'][:20]}") from None
            vt = VkTensor(self.device, t["shape"], t["dtype"], storage, layout,
                          allocate=t["memory"] != "shared", label=t["label"])
            self._held.tensors.append(vt)
            if t["data"] is not None:
                data = self._data[t["data"]]
                if data.dtype != np.dtype(t["dtype"]) or data.size != int(np.prod(t["shape"], dtype=np.int64)):
                    raise SchemaError(f"{self.path}: constant {t['data']} is {data.dtype}{list(data.shape)}, its "
                                      f"tensor {t['dtype']}{t['shape']}")
                vt.upload(data.reshape(t["shape"]))
            tensors.append(vt)
        self._tensors = tensors
        self._segments = []
        for seg, op in zip(doc["segments"], self._ops):
            if not (seg["dispatches"] or seg["inputs"] or seg["outputs"]):  # a fallback alone
                self._segments.append((None, [], [], seg.get("fallback"), op))
                continue
            dispatches = []
            for disp in seg["dispatches"]:
                variant = self._variants[disp["variant"]]
                dispatches.append(Dispatch(
                    variant, {name: tensors[i] for name, i in disp["tensors"].items()},
                    {k: _scalar(x) for k, x in disp["scalars"].items()}, label=disp["label"],
                    local_size_x=disp["local_size_x"], spirv=self._spirv(disp),
                    units=disp["units"], layouts={k: Layout[x] for k, x in disp["layouts"].items()},
                    spec=dict(disp["spec"])))
            program = Program(self.device, dispatches, [tensors[i] for i in seg["inputs"]],
                              [tensors[i] for i in seg["outputs"]], profiling=False)
            self._held.programs.append(program)
            self._segments.append((program, seg["inputs"], seg["outputs"], seg.get("fallback"), op))
        self._sizes = contents.file_sizes(self._data, self.file_bytes)
        self._data = {k: v for k, v in self._data.items() if k.startswith("const/")}  # outputs may read these
        # buffers the model writes back: live host copies that calls read (fallbacks, outputs) and write
        self._state = {w["target"]: self._data[f"const/{w['target']}"].copy()
                       for w in doc.get("writes", []) if w["kind"] == "buffer"}

    def _spirv(self, disp) -> bytes:
        digest = disp["spirv"] or self._doc["variants"][disp["variant"]]["spirv"]
        return self._data[f"spirv/{digest}"].tobytes()

    # ---- running ----------------------------------------------------------------------------------
    def __call__(self, *args):
        if self._held.closed:
            raise ProgramClosedError(f"this loaded program ({self.path}) was closed; load it again to run it")
        specs = self._doc["inputs"]
        if len(args) != len(specs):
            raise InputTypeError(f"the program takes {len(specs)} inputs "
                                 f"({', '.join(s['name'] for s in specs)}), got {len(args)}")
        torch_type = _torch_tensor_type()
        as_torch = torch_type is not None and any(isinstance(a, torch_type) for a in args)
        host = [self._checked(a, s, torch_type) for a, s in zip(args, specs)]
        env, fenv = {}, {}  # tensor index -> host array; fallback output id -> torch tensor
        for a, s in zip(host, specs):
            if s["tensor"] is not None:
                env[s["tensor"]] = a if s["device_dtype"] == s["dtype"] else a.astype(s["device_dtype"])
        with self._lock:
            if self._held.closed:
                raise ProgramClosedError(f"this loaded program ({self.path}) was closed; load it again to run it")
            for program, ins, outs, node, op in self._segments:
                if program is not None:
                    for i, out in zip(outs, program(*[env[i] for i in ins])):
                        env[i] = out
                if node is not None:
                    self._run_fallback(node, op, env, fenv, host)
            results = [self._output(o, env, host, fenv) for o in self._doc["outputs"]]
            self._write_back(args, env, host, fenv)
        if as_torch:
            import torch

            results = [torch.from_numpy(r) for r in results]
        structure = self._doc["output_structure"]
        if structure == "single":
            return results[0]
        return list(results) if structure == "list" else tuple(results)

    def _write_back(self, args, env, host, fenv) -> None:
        """What CompiledProgram's finish_call writes after a call: buffers into their live copies,
        mutated inputs into the caller's arrays or tensors (all values read before any write)."""
        writes = self._doc.get("writes", [])
        values = [self._output(w["value"], env, host, fenv) for w in writes]
        for w, value in zip(writes, values):
            if w["kind"] == "buffer":
                dest = self._state[w["target"]]
                np.copyto(dest, value.reshape(dest.shape), casting="unsafe")
            elif isinstance(args[w["target"]], np.ndarray):
                dest = args[w["target"]]
                np.copyto(dest, value.reshape(dest.shape), casting="unsafe")
            else:  # a torch tensor (the only other kind `_checked` accepts)
                import torch

                dest = args[w["target"]]
                with torch.no_grad():
                    dest.copy_(torch.from_numpy(np.ascontiguousarray(value)).reshape(dest.shape))

    def _run_fallback(self, node, op, env, fenv, host) -> None:
        """One CPU-fallback node, as CompiledProgram._run_cpu runs it: its inputs found and viewed
        like `_value_of`, its outputs kept for later readers and uploaded where a segment reads them."""
        import torch

        inputs = [[self._ref(r, env, fenv, host) for r in x] if isinstance(x, list) else self._ref(x, env, fenv, host)
                  for x in node["inputs"]]
        inputs = [tuple(x) if isinstance(x, list) else x for x in inputs]
        result = op(*fb.decode_arg(node["args"], inputs),
                    **{k: fb.decode_arg(t, inputs) for k, t in node["kwargs"].items()})
        outs = [o for o in (result if isinstance(result, (tuple, list)) else (result,)) if o is not None]
        for out, r in zip(node["outputs"], outs):
            fenv[out["id"]] = r
            if out["tensor"] is not None:
                t = self._doc["tensors"][out["tensor"]]
                env[out["tensor"]] = r.detach().to(getattr(torch, t["dtype"])).contiguous().numpy()

    def _ref(self, ref, env, fenv, host):
        """A fallback input's torch value (see runtime/saved/fallback.py, `Ref` in docs/format.md)."""
        import torch

        src, k = ref["source"], ref["index"]
        if src == "literal":
            return fb.decode_arg(ref["literal"], [])
        if src == "constant":  # a buffer the call writes back: its live copy, as the compiled program reads it
            return torch.from_numpy(self._state[k] if k in self._state else self._data[f"const/{k}"].copy())
        value = (fenv[k] if src == "fallback" else
                 fb.host_tensor(env[k] if src == "device" else host[k]))
        for view in ref["views"]:
            value = value.permute(*view["dims"]) if view["op"] == "permute" else value.reshape(view["dims"])
        if ref["dtype"] is not None and value.dtype != getattr(torch, ref["dtype"]):
            value = value.to(getattr(torch, ref["dtype"]))
        return value

    def _checked(self, a, spec, torch_type) -> np.ndarray:
        name = spec["name"]
        if torch_type is not None and isinstance(a, torch_type):
            a = a.detach().cpu().contiguous().numpy()
        if not isinstance(a, np.ndarray):
            raise InputTypeError(f"input {name!r}: expected a numpy array (or torch tensor), got {type(a).__name__}")
        if list(a.shape) != spec["shape"]:
            raise InputValueError(f"input {name!r}: expected shape {tuple(spec['shape'])}, got {a.shape}")
        if a.dtype != np.dtype(spec["dtype"]):
            raise InputValueError(f"input {name!r}: expected dtype {spec['dtype']}, got {a.dtype}")
        narrow = spec["device_dtype"]
        if narrow != spec["dtype"] and np.issubdtype(np.dtype(narrow), np.integer) and a.size:
            info = np.iinfo(narrow)
            if a.min() < info.min or a.max() > info.max:
                raise InputValueError(f"input {name!r}: values outside the {narrow} range the device holds it in")
            low, high = spec.get("bounds") or (info.min, info.max)
            if a.min() < low or a.max() > high:
                raise InputValueError(f"input {name!r}: values outside [{low}, {high}], the range the program "
                                      f"assumes for it (its int64 arithmetic runs in {narrow})")
        return np.ascontiguousarray(a)

    def _output(self, out, env, host, fenv) -> np.ndarray:
        if out["source"] == "device":
            value = env[out["index"]]
        elif out["source"] == "fallback":
            value = fenv[out["index"]].detach().contiguous().numpy()
        elif out["source"] == "input":
            value = host[out["index"]]
        else:
            value = self._state.get(out["index"])
            value = self._data[f"const/{out['index']}"] if value is None else value
        for view in out["views"]:
            value = value.reshape(view["dims"]) if view["op"] == "reshape" else value.transpose(view["dims"])
        value = np.ascontiguousarray(value).reshape(out["shape"])
        if value.dtype != np.dtype(out["dtype"]):
            value = value.astype(out["dtype"])
        return value.copy() if out["source"] in ("input", "constant") else value

    # ---- introspection ----------------------------------------------------------------------------
    @property
    def dispatch_variants(self) -> list[tuple[str, str]]:
        """(dispatch label, variant name) per dispatch, in order, as CompiledProgram has."""
        return contents.dispatch_variants(self._doc)

    def sizes(self) -> dict[str, int]:
        """Bytes of the file, of its constants and of its SPIR-V."""
        return dict(self._sizes)

    def summary(self) -> str:
        """The plan summary, the variants used (with dispatch counts) and the sizes: `texelflow inspect`."""
        return contents.summary(self.path, self._doc, self.sizes())

    @property
    def closed(self) -> bool:
        return self._held.closed

    def close(self) -> None:
        """Free the device memory, pipelines' descriptor sets and command buffers (not the device)."""
        with self._lock:
            self._finalizer()

    def __enter__(self) -> "LoadedProgram":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
