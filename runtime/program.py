"""Join a planned graph to a Vulkan device: the callable `CompiledProgram`.

The node list is cut into segments at CPU fallbacks. Each segment of device nodes is one recorded
Program (one queue submit per call); fallback nodes run in PyTorch between segments, with their
inputs downloaded and their outputs uploaded straight into the planned representation. Constants
are prepacked once, at load, into every representation their consumers want. Values that live
across segments or leave the program get their own memory; the rest share memory by lifetime.

Threads and lifetime: a call holds the program's lock from the argument upload to the last output
(segments share device memory between them, so calls are serialised per program; programs on one
device run concurrently). What the program holds on the device lives in `_Resources`, freed by
close(), by the context manager, by a finalizer when the program is garbage collected, or by the
device's own close(); a closed program raises ProgramClosedError when called, and closing twice is
a no-op. Call arguments are checked by `runtime/call_args.py` before anything runs.

Calls: a program of one device segment with plain tensor inputs and outputs gets a fast call
planned at build (`runtime/call_fast.py`: a few attribute checks, one copy in, one copy out per
tensor); every other program, and any call whose arguments are not exactly what was compiled,
takes the general path below (which also raises every argument error). `fast_path = False`
forces the general path (benchmarks, tests).
"""

from __future__ import annotations

import threading
import time
import weakref
from dataclasses import dataclass, field

import numpy as np

from texelflow.runtime.call_args import AnySpec, ConstSpec, TensorSpec, check_call
from texelflow.runtime.call_fast import plan_fast_call
from texelflow.runtime.errors import ProgramClosedError
from texelflow.runtime.graph.ir import Node, Role, Value
from texelflow.runtime.lower_dispatch import DUMMY_BUFFER, DispatchSpec, node_dispatches
from texelflow.runtime.vulkan.program import Dispatch, Program
from texelflow.runtime.vulkan.tensor import VkTensor
from texelflow.shaders.geometry import whcn_sizes


class ProfileRow(tuple):
    """(label, measured microseconds), as profile() has always returned, with the node's op and
    predicted microseconds beside (`.op`, `.predicted_us`; `.measured_us` is the second item)."""

    def __new__(cls, label: str, measured_us: float, op: str | None = None, predicted_us: float | None = None):
        row = super().__new__(cls, (label, measured_us))
        row.op, row.predicted_us = op, predicted_us
        return row

    @property
    def label(self) -> str:
        return self[0]

    @property
    def measured_us(self) -> float:
        return self[1]


@dataclass
class _Segment:
    nodes: list[Node] = field(default_factory=list)
    cpu: Node | None = None  # a fallback node ending the segment
    program: Program | None = None
    inputs: list[Value] = field(default_factory=list)  # host values uploaded before the submit
    outputs: list[Value] = field(default_factory=list)  # device values the host needs after it


class _Resources:
    """Everything a CompiledProgram holds on its device, apart from the program object itself, so a
    finalizer (and the device's close()) can free it without keeping the program alive."""

    _close_rank = 0  # Device.close closes compiled programs first (see Device.close)

    def __init__(self, device, owns_device: bool, tensors: dict, consts: dict):
        self.device, self.owns_device = device, owns_device
        self.tensors, self.consts = tensors, consts
        self.segments: list[_Segment] = []
        self.lock = threading.RLock()  # held by every call: one call of a program at a time
        self.closed = False
        device.adopt(self)

    def close(self) -> None:
        with self.lock:  # waits for a call in flight
            if self.closed:
                return
            self.closed = True
            for seg in self.segments:
                if seg.program is not None:
                    seg.program.close()
            for t in list(self.tensors.values()) + list(self.consts.values()):
                t.close()
            self.tensors.clear()
            self.consts.clear()
        self.device.release(self)
        if self.owns_device:
            self.device.close()


class CompiledProgram:
    """`prog(*inputs)` runs the planned model; `prog.plan` is its Plan.

    Safe to call from any number of threads (calls of one program are serialised). Free it with
    close() or `with texelflow.compile(...) as prog:`; a program dropped without either is freed
    by a finalizer."""

    def __init__(self, plan, exported, device, owns_device: bool = False, progress=None, profile: bool = False):
        import torch

        self.plan, self.device, self.exported = plan, device, exported
        self._owns_device = owns_device
        self._torch = torch
        graph, assignment = plan.graph, plan.assignment
        # A folded node's output is its input's memory: an identity op read with its own sizes, a
        # free permute also with its own layout (runtime/graph/redundant.py).
        self._alias: dict[Value, Value] = {}
        self._folded_by: dict[Value, Node] = {}
        for n in graph.device_nodes():
            if n.folded:
                self._alias[n.outputs[0][1]] = self._root(n.arg("self"))
                self._folded_by[n.outputs[0][1]] = n
        self._by_name = None
        self._fast = None  # the planned common case of a call (runtime/call_fast.py), if it applies
        self.fast_path = True  # False: every call takes the general path (benchmarks, tests)
        self._tensors: dict[Value, VkTensor] = {}
        self._consts: dict[tuple[Value, object], VkTensor] = {}
        self._res = _Resources(device, owns_device, self._tensors, self._consts)
        self._finalizer = weakref.finalize(self, self._res.close)
        self._state = self._constant_data(exported)
        self.segments = self._res.segments
        self.segments.extend(self._cut(graph))
        self._input_specs = self._build_input_specs()
        self._call_facts()
        persistent = self._persistent(graph)
        # compile's timings ("prepacking", "pipelines") join the plan's: prog.timings is plan.timings
        self.timings = getattr(plan, "timings", None)
        if self.timings is None:
            self.timings = plan.timings = {}
        report = progress or (lambda stage, done, total: None)
        try:
            seg_specs = [self._segment_specs(seg, assignment) for seg in self.segments]
            start = time.perf_counter()
            self._prepack(seg_specs, assignment, report)
            self.timings["prepacking"] = time.perf_counter() - start
            start = time.perf_counter()
            seg_dispatches = [[self._dispatch(s, assignment, persistent) for s in specs] for specs in seg_specs]
            self._create_pipelines([d for ds in seg_dispatches for d in ds], report)
            for seg, dispatches in zip(self.segments, seg_dispatches):
                ins = [self._tensor(v, assignment, persistent) for v in seg.inputs]
                outs = [self._tensor(v, assignment, persistent) for v in seg.outputs]
                seg.program = Program(device, dispatches, ins, outs, profiling=profile)
            self.timings["pipelines"] = time.perf_counter() - start
            self._fast = plan_fast_call(self)
        except BaseException:
            self.close()
            raise

    # ---- building ---------------------------------------------------------------------------------
    def _segment_specs(self, seg: _Segment, assignment) -> list[DispatchSpec]:
        specs = []
        for node in seg.nodes:
            if node.folded:
                continue
            slots = {name: assignment.slots[(node, name)]
                     for name in set([n for n, _ in node.tensor_args()] + [n for n, _ in node.outputs])}
            dtype = node.outputs[0][1].dtype
            specs += node_dispatches(node, slots, dtype, self.device.enabled_features, self.device.preferred_features)
        return specs

    def _prepack(self, seg_specs, assignment, report) -> None:
        """Upload every constant into each representation its dispatches want, reporting each."""
        wanted = {}
        for specs in seg_specs:
            for spec in specs:
                for name, v in spec.tensors.items():
                    if isinstance(v, Value) and v.role is Role.CONST:
                        wanted.setdefault((v, self._const_slot(v, name, spec.label, assignment)), None)
        report("prepacking", 0, len(wanted))
        for i, (v, repr_) in enumerate(wanted, 1):
            self._const(v, repr_)
            report("prepacking", i, len(wanted))

    def _create_pipelines(self, dispatches: list[Dispatch], report) -> None:
        """Create each distinct pipeline once, in the device's shared cache, before the programs
        that use it are built (so the progress callback sees them one by one)."""
        from texelflow.runtime.vulkan.pipeline import PipelineCache

        cache = PipelineCache.shared(self.device)
        wanted = {}
        for d in dispatches:
            spec = d.specialization(d.bound(), self.device.limits)
            wanted.setdefault((d.variant.name, tuple(sorted(spec.items())), d.spirv), (d, spec))
        report("pipelines", 0, len(wanted))
        for i, (d, spec) in enumerate(wanted.values(), 1):
            cache.get(d.variant, spec, spirv=d.spirv)
            report("pipelines", i, len(wanted))

    def _root(self, v: Value) -> Value:
        while v in self._alias:
            v = self._alias[v]
        return v

    def _cut(self, graph) -> list[_Segment]:
        segments, current = [], _Segment()
        on_device: set[Value] = set()
        for node in graph.nodes:
            if node.on_device:
                current.nodes.append(node)
                for _, v in node.outputs:
                    on_device.add(v)
            else:
                current.cpu = node
                segments.append(current)
                current = _Segment()
        segments.append(current)
        # Host -> device: inputs and CPU results a segment reads; device -> host: what leaves it.
        produced_in: dict[Value, int] = {}
        for i, seg in enumerate(segments):
            for node in seg.nodes:
                for _, v in node.outputs:
                    produced_in[v] = i
        need_host: set[Value] = set(graph.outputs)
        for seg in segments:
            if seg.cpu is not None:
                need_host.update(v for _, v in seg.cpu.tensor_args())
        for i, seg in enumerate(segments):
            seen = set()
            for node in seg.nodes:
                for _, v in node.tensor_args():
                    v = self._root(v)
                    if v.role is not Role.CONST and v not in produced_in and v not in seen:
                        seen.add(v)
                        seg.inputs.append(v)
            for v in need_host:
                r = self._root(v)
                if produced_in.get(r) == i and r not in seg.outputs:
                    seg.outputs.append(r)
        return segments

    def _persistent(self, graph) -> set[Value]:
        """Values whose memory must outlive their segment (read later, or read by the host)."""
        keep = set()
        for seg in self.segments:
            keep.update(seg.outputs)
        for i, seg in enumerate(self.segments):
            for node in seg.nodes:
                for _, v in node.tensor_args():
                    r = self._root(v)
                    if r.producer is not None and r.producer.on_device and self._segment_of(r.producer) != i:
                        keep.add(r)
        return keep

    def _segment_of(self, node: Node) -> int:
        for i, seg in enumerate(self.segments):
            if node in seg.nodes:
                return i
        return -1

    def _tensor(self, v: Value, assignment, persistent) -> VkTensor:
        v = self._root(v)
        t = self._tensors.get(v)
        if t is None:
            r = assignment.values[v]
            t = VkTensor(self.device, v.shape, v.dtype, r.storage, r.layout, allocate=v in persistent, label=v.name)
            self._tensors[v] = t
        return t

    def _const(self, v: Value, repr_) -> VkTensor:
        t = self._consts.get((v, repr_))
        if t is None:
            data = self._const_value(v)
            t = VkTensor(self.device, v.shape, v.dtype, repr_.storage, repr_.layout, label=v.name)
            t.upload(data)  # prepacked once, at load
            self._consts[(v, repr_)] = t
        return t

    def _dispatch(self, spec: DispatchSpec, assignment, persistent) -> Dispatch:
        tensors, scalars, layouts = {}, dict(spec.scalars), {}
        for name, v in spec.tensors.items():
            if v is DUMMY_BUFFER:
                tensors[name] = self._dummy()
            elif isinstance(v, VkTensor):
                tensors[name] = v
            elif v.role is Role.CONST:
                tensors[name] = self._const(v, self._const_slot(v, name, spec.label, assignment))
            else:
                tensors[name] = self._tensor(v, assignment, persistent)
                if self._root(v) is not v:  # a folded view: its root's memory, read with its own sizes
                    scalars[f"{name}_sizes"] = whcn_sizes(v.shape)
                    own = assignment.values[v].layout  # and its own layout (a free permute's differs)
                    if own != tensors[name].layout:
                        layouts[name] = own
        return Dispatch(spec.variant, tensors, scalars, label=spec.label, units=spec.units, layouts=layouts,
                        spec=spec.spec)

    @staticmethod
    def _const_slot(v: Value, name: str, label: str, assignment):
        """The representation the dispatch labelled `label` (its node's name, or NAME[i] for one
        element of a per-element dispatch) wants for constant `v` in slot `name`: a constant read
        by several nodes is prepacked once per representation they want, not the first one's."""
        users = [n for n in v.users if (n, name) in assignment.slots]
        node = next((n for n in users if label == n.name or label.startswith(n.name + "[")), users[0])
        return assignment.slots[(node, name)]

    def _dummy(self) -> VkTensor:
        """The 1-element buffer bound where an optional tensor (a bias, say) is absent."""
        if getattr(self, "_dummy_tensor", None) is None:
            self._dummy_tensor = VkTensor(self.device, (1,), "float32", label="absent")
            self._dummy_tensor.upload(np.zeros(1, np.float32))
            self._consts[("absent", None)] = self._dummy_tensor
        return self._dummy_tensor

    def _constant_data(self, ep) -> dict:
        state = dict(ep.state_dict)
        state.update(getattr(ep, "constants", {}) or {})
        return state

    def _const_value(self, v: Value) -> np.ndarray:
        torch = self._torch
        if v.literal is not None:
            return np.array(v.literal, dtype=np.dtype(v.dtype)).reshape(v.shape)
        data = self._const_tensor(v)
        return data.detach().to(getattr(torch, v.dtype)).contiguous().numpy()

    def _const_tensor(self, v: Value):
        """A constant's torch tensor: its state-dict entry, or a derived constant computed from
        its sources (runtime/graph/derived.py), never stored back into the model."""
        if v.derive is not None:
            from texelflow.runtime.graph.derived import evaluate

            return evaluate(v, lambda s: self._state[s.source] if s.literal is None else self._torch.tensor(s.literal))
        return self._state[v.source]

    # ---- running ----------------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        if kwargs:
            args = self._positional(args, kwargs)
        fast = self._fast if self.fast_path else None
        if fast is not None:  # the common case, planned at build (runtime/call_fast.py)
            if fast.accepts(args):
                with self._res.lock:
                    self._check_open()
                    return fast.run(args)
        return self._general_call(args)

    def _general_call(self, args):
        """Any call: pytree arguments, CPU fallbacks, narrowed inputs, mutations written back."""
        torch = self._torch
        flat = self._flat_args(args)
        self._check_open()
        env: dict[Value, object] = self._checked_inputs(flat)
        with self._res.lock:
            self._check_open()
            for seg in self.segments:
                if seg.program is not None and (seg.nodes or seg.inputs):
                    arrays = [self._host(env[v], v) for v in seg.inputs]
                    for v, out in zip(seg.outputs, seg.program(*arrays)):
                        # (np.ascontiguousarray makes a 0-d array 1-d: keep the shape)
                        env[v] = torch.from_numpy(np.ascontiguousarray(out).reshape(np.shape(out)))
                if seg.cpu is not None:
                    self._run_cpu(seg.cpu, env)
            from texelflow.runtime.call_results import finish_call

            result = finish_call(self, flat, env)  # outputs; buffer and input mutations written back
        return self._finished_outputs(result)

    # ---- call arguments and results (runtime/call_args.py) -----------------------------------------
    def _build_input_specs(self) -> list:
        """One spec per flattened call argument, from the exported signature's user inputs."""
        by_name = {v.name: v for v in self.plan.graph.inputs}
        sig = getattr(self.exported, "graph_signature", None)
        names = list(sig.user_inputs) if sig is not None else [v.name for v in self.plan.graph.inputs]
        held = self.plan.graph.bfloat16  # a bfloat16 input the device holds as float32
        specs = []
        for entry in names:
            if isinstance(entry, str) and entry in by_name:
                v = by_name[entry]
                host = held.inputs.get(v.name, self._host_dtype(v)) if held is not None else self._host_dtype(v)
                specs.append(TensorSpec(v.name, tuple(v.shape), host, v.dtype if host != v.dtype else None,
                                        self.plan.graph.input_bounds.get(v.name)))
            elif isinstance(entry, str):
                specs.append(AnySpec(entry))
            else:  # a non-tensor input torch.export specialised to its value
                specs.append(ConstSpec(entry))
        return specs

    def _host_dtype(self, v: Value) -> str:
        """The dtype the caller passes (and gets back) for `v`: its own, or for a value the device
        holds narrowed (an int64 input, constant or view of one as int32: lowering's
        `input_host_dtypes`) the wider one."""
        return self.plan.graph.input_host_dtypes.get(v.name, v.dtype)

    def _call_facts(self) -> None:
        """What every call needs from the exported signature, read once: `call_spec` builds new
        namedtuple classes on each access (hundreds of microseconds), and the rest never changes."""
        spec = getattr(self.exported, "call_spec", None)
        in_spec = getattr(spec, "in_spec", None)
        self._out_spec = getattr(spec, "out_spec", None)
        try:
            arg_spec = in_spec.child(0)
            self._flat_model = all(c.is_leaf() for c in arg_spec.children())
        except (AttributeError, IndexError, TypeError):
            self._flat_model = False
        by_name = {v.name: v for v in self.plan.graph.inputs}
        self._input_values = [by_name[s.name] if isinstance(s, TensorSpec) else None for s in self._input_specs]
        specs = getattr(self.plan.graph, "output_specs", None)
        self._user_outputs = ([v for kind, _, v in specs if kind == "user"] if specs is not None
                              else list(self.plan.graph.outputs))

    def _positional(self, args: tuple, kwargs: dict) -> tuple:
        """Inputs passed by name (`prog(x, mask=m)`) in their places: the names are the exported
        program's input names, forward's parameter names for a model of plain tensor arguments."""
        from texelflow.runtime.errors import InputTypeError

        names = [getattr(s, "name", None) for s in self._input_specs]
        if not self._flat_model:
            raise InputTypeError("keyword arguments need a model whose inputs are plain tensors; pass them by position")
        twice = sorted(k for k in kwargs if k in names[:len(args)])
        unknown = sorted(k for k in kwargs if k not in names)
        if twice or unknown:
            what = f"input {twice[0]!r} given by position and by name" if twice else f"no input named {unknown[0]!r}"
            raise InputTypeError(f"{what}; the program's inputs are {', '.join(str(n) for n in names)}")
        out = list(args)
        for i in range(len(args), len(names)):
            if names[i] not in kwargs:
                raise InputTypeError(f"input {i} ({names[i]}) is missing: the program takes {len(names)} inputs")
            out.append(kwargs[names[i]])
        return tuple(out)

    def _flat_args(self, args: tuple) -> list:
        """The call's arguments, one per flattened input of the exported signature: positional
        as they are when the model takes plain arguments (so a list passed where a tensor is
        expected is reported as a list), else pytree-flattened like torch.export's inputs."""
        return list(args) if self._flat_model else self._torch.utils._pytree.tree_flatten(args)[0]

    def _checked_inputs(self, flat: list) -> dict:
        """Graph input value -> checked tensor; raises InputTypeError/InputValueError first."""
        checked = check_call(flat, self._input_specs)
        return {v: x for v, x in zip(self._input_values, checked) if v is not None}

    def _finished_outputs(self, result):
        """Every returned tensor with torch's shape and dtype (0-d stays 0-d), contiguous."""
        torch = self._torch
        leaves, spec = torch.utils._pytree.tree_flatten(result)
        outs = self._user_outputs
        if len(outs) != len(leaves):
            outs = [None] * len(leaves)
        held = self.plan.graph.bfloat16.outputs if self.plan.graph.bfloat16 is not None else {}
        fixed = []
        for i, (x, v) in enumerate(zip(leaves, outs)):
            if isinstance(x, torch.Tensor) and isinstance(v, Value) and x is not v:
                if tuple(x.shape) != tuple(v.shape) and x.numel() == v.numel:
                    x = x.reshape(v.shape)
                want = getattr(torch, held.get(i) or self._host_dtype(v), None)
                if isinstance(want, torch.dtype) and x.dtype != want:
                    x = x.to(want)
                if not x.is_contiguous():
                    x = x.contiguous()
            fixed.append(x)
        return torch.utils._pytree.tree_unflatten(fixed, spec)

    def _check_open(self) -> None:
        if self._res.closed:
            dev = self.device
            why = " (its device was closed)" if dev is not None and dev.closed else ""
            raise ProgramClosedError(f"this compiled program was closed{why}; compile it again to run it")

    def _host(self, value, v: Value) -> np.ndarray:
        """The host data uploaded for `v`, in its device dtype (a narrowed int64 input becomes the
        int32 copy here, its range checked by the call; `env` keeps the caller's tensor)."""
        return value.detach().to(getattr(self._torch, v.dtype)).contiguous().numpy()

    def _run_cpu(self, node: Node, env: dict) -> None:
        torch = self._torch
        fx = node.fx
        by_fx = self._fx_values(fx, node, env)
        args = torch.fx.node.map_arg(fx.args, lambda a: by_fx[a.name])
        kwargs = torch.fx.node.map_arg(fx.kwargs, lambda a: by_fx[a.name])
        result = fx.target(*args, **kwargs)
        outs = result if isinstance(result, (tuple, list)) else (result,)
        for (_, v), r in zip(node.outputs, [o for o in outs if o is not None]):
            env[v] = r

    def _value_of(self, v: Value, env: dict):
        """The host value of `v` for a CPU fallback or an output: in the host's dtype (a narrowed
        view computed on the device comes back from int32 to int64, exactly: its values fit)."""
        if v.role is Role.CONST:
            return v.literal if v.literal is not None else self._const_tensor(v)
        r = self._root(v)
        value = self._viewed(env[r], v)
        host = self._host_dtype(v)
        if host != v.dtype and isinstance(value, self._torch.Tensor) and str(value.dtype) != f"torch.{host}":
            value = value.to(getattr(self._torch, host))
        return value

    def _viewed(self, value, v: Value):
        """The host value of `v` from its root's: the folded views between them applied in order
        (a reshape for an identity op, the permute for a free permute)."""
        node = self._folded_by.get(v)
        if node is None:
            return value
        value = self._viewed(value, node.arg("self"))
        if node.op.name == "permute_copy":
            return value.permute(*node.arg("dims"))
        return value.reshape(v.shape)

    def _fx_values(self, fx, node: Node, env: dict) -> dict:
        """fx input node name -> torch value, for the fx node behind a fallback IR node."""
        out = {}
        recorded = self.plan.graph.fx_inputs.get(node)  # lowering's record, when it has one
        for i, a in enumerate(fx.all_input_nodes):
            v = recorded[i] if recorded is not None else self._ir_value(a)
            out[a.name] = self._value_of(v, env) if isinstance(v, Value) else tuple(self._value_of(x, env) for x in v)
        return out

    def _ir_value(self, fx_node):
        """The IR value (or list of values, for a multi-output node) behind an fx node."""
        import operator

        if self._by_name is None:
            self._by_name = {v.name: v for v in self.plan.graph.values()}
            self._nodes_by_name = {n.name: n for n in self.plan.graph.nodes}
        if fx_node.target is operator.getitem:  # a getitem of a multi-output node
            src, idx = fx_node.args
            base = self._ir_value(src)
            return base[idx] if isinstance(base, list) else base  # (fusion may leave one output)
        node = self._nodes_by_name.get(fx_node.name)
        if node is not None and len(node.outputs) > 1:
            return [v for _, v in node.outputs]
        return self._by_name[fx_node.name]

    # ---- introspection ----------------------------------------------------------------------------
    @property
    def num_submits_per_call(self) -> int:
        return sum(1 for s in self.segments if s.program is not None and (s.nodes or s.inputs))

    @property
    def dispatch_variants(self) -> list[tuple[str, str]]:
        """(dispatch label, shader variant name) per dispatch, in order: which code path (e.g.
        int_dot plain or dot4x8) the device got."""
        return [(d.label, d.variant.name) for seg in self.segments if seg.program is not None
                for d in seg.program.dispatches]

    def profile(self, costs=None) -> list["ProfileRow"]:
        """(label, measured microseconds) per dispatch of the last call, from GPU timestamps; each
        row also has `.op` and `.predicted_us`, the plan's predicted time for its node (on the
        node's first dispatch; None on the others) under `costs`, else the plan's cost model, else
        the device's cost table, else the built-in estimate (runtime/graph/costs.py)."""
        rows = []
        for seg in self.segments:
            if seg.program is not None and seg.program.dispatches:
                rows += seg.program.profile()
        predicted = self.plan.predicted(costs or self._profile_costs())
        ops = {n.name: n.op.name for n in self.plan.graph.device_nodes()}
        out, seen = [], set()
        for label, us in rows:
            node = label.split("[")[0]  # NAME[i]: the i-th dispatch of a per-element node
            first = node not in seen
            seen.add(node)
            out.append(ProfileRow(label, us, ops.get(node), predicted[node] * 1e6 if first and node in predicted else None))
        return out

    def profile_summary(self, costs=None) -> str:
        """A table of predicted beside measured time per dispatch of the last call, and totals."""
        rows = self.profile(costs)
        lines = [f"{'dispatch':40s} {'op':24s} {'predicted us':>12s} {'measured us':>12s}"]
        for r in rows:
            pred = f"{r.predicted_us:12.1f}" if r.predicted_us is not None else f"{'-':>12s}"
            lines.append(f"{r.label[:40]:40s} {str(r.op)[:24]:24s} {pred} {r.measured_us:12.1f}")
        total_p = sum(r.predicted_us or 0.0 for r in rows)
        total_m = sum(r.measured_us for r in rows)
        lines.append(f"{'total':40s} {'':24s} {total_p:12.1f} {total_m:12.1f}")
        return "\n".join(lines)

    def _profile_costs(self):
        if self.plan.costs is not None:
            return self.plan.costs
        from texelflow.runtime.graph.costs import resolve
        from texelflow.runtime.tune import device_key

        return resolve("table", device_key(self.device))

    def save(self, path):
        """Write this program to one file that `texelflow.load` runs without torch
        (runtime/saved, docs/format.md); returns the path."""
        from texelflow.runtime.saved import save

        return save(self, path)

    @property
    def profiling(self) -> bool:
        """Whether calls record GPU timestamps around each dispatch, for profile(). Off by default:
        on lavapipe a timestamp pair costs about as much device time as a small kernel."""
        return any(s.program.profiling for s in self.segments if s.program is not None and s.program.dispatches)

    @profiling.setter
    def profiling(self, on: bool) -> None:
        for seg in self.segments:
            if seg.program is not None:
                seg.program.profiling = on

    @property
    def closed(self) -> bool:
        return self._res.closed

    def close(self) -> None:
        """Free the program's device memory, pipelines' descriptor sets and command buffers (the
        device itself stays, unless the program owns it). Idempotent; waits for a call in flight."""
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None:
            finalizer()  # runs _Resources.close once, and detaches the finalizer
        elif getattr(self, "_res", None) is not None:
            self._res.close()

    def __enter__(self) -> "CompiledProgram":
        self._check_open()
        return self

    def __exit__(self, *exc) -> None:
        self.close()
