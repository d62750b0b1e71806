"""The fast call of a compiled program: the common case planned once, at build time.

On lavapipe the driver's worker threads share the CPU with Python, so every Python step after a
submit runs many times slower than in a hot loop (cold caches): the general call (pytree
flattening, per-input checks building new tensors, a dict of values, finish_call, output fixing)
cost about 250 us per call where the Program underneath costs about 45 us. A program qualifies when
one recorded Program does everything (no CPU fallback), every input is a plain tensor passed
positionally in the device's own dtype (no int64 narrowing; bfloat16 held as float32 is widened
and narrowed again by the copies, exactly), nothing is written back (no buffer or
input mutation), and every output is a value the Program reads back as it is (no folded view, no
constant, no input) returned as one tensor, a tuple or a list of tensors.

A call then checks each argument with a few attribute reads against what was compiled and, if all
match, copies it straight into the mapped host memory, submits, and returns a fresh copy of each
output (never a view of the mapped memory, which the next call overwrites). Measured on lavapipe
(bench/overhead.py): each torch or numpy step after a submit costs 10-40 us, so the call is
built from as few as possible.
Any argument that does not match exactly (a subclass, requires_grad, another dtype or shape, a
non-tensor, the wrong count) goes to the general call, which accepts it or raises the error it
always has: the two paths cannot disagree on what is an error.
"""

from __future__ import annotations

from texelflow.runtime.call_args import TensorSpec
from texelflow.runtime.graph.ir import Role, Value


class FastCall:
    """The planned common case of one CompiledProgram's call; see `plan_fast_call`.

    Each input and output whose packed order is NCHW order gets a torch view of its host bytes,
    made once: a call copies an argument in with one `copy_` (any strides) and an output out
    with one `clone` (a new tensor: the next call overwrites the bytes), the fewest torch steps.
    Others go through their Transfer's numpy packing (write/read) as a plain Program call does."""

    def __init__(self, torch, program, checks, uploads, outputs, result_type, held: dict | None = None):
        self.program = program
        self.checks = checks  # per positional argument: (torch dtype, torch.Size) compiled
        self.count = len(checks)
        self.tensor_type, self.strided, self.from_numpy = torch.Tensor, torch.strided, torch.from_numpy
        self.bfloat16 = torch.bfloat16
        # per Program input: (torch view of its host bytes or None, its Transfer, argument index);
        # a bfloat16 argument into a float32 view is widened by copy_ itself
        self.ins = [(self._view(tr, True), tr, i) for tr, i in zip(program.host_writes, uploads)]
        # per Program output: (torch view or None, its Transfer, whether it is bool (int32 lanes),
        # the torch dtype the caller gets where it is not the stored one: bfloat16 held as float32)
        held = held or {}
        reads = [(self._view(tr, False), tr, tr.dtype == "bool", held.get(k)) for k, tr in enumerate(program.host_reads)]
        self.reads = reads
        self.outputs = outputs  # per user output: the index of the Program output holding it
        self.result_type = result_type  # None: a single tensor; else tuple or list
        self.in_order = outputs == list(range(len(reads)))
        first = reads[outputs[0]]
        self.one = first[0] if result_type is None and not first[2] and first[3] is None else None

    def _view(self, transfer, writing: bool):
        elements = transfer.direct(writing)
        return None if elements is None else self.from_numpy(elements)

    def accepts(self, args: tuple) -> bool:
        """Whether every argument is exactly what was compiled (else the general call decides:
        it accepts the argument or raises its usual error)."""
        if len(args) != self.count:
            return False
        tensor, strided = self.tensor_type, self.strided
        for x, (dtype, shape) in zip(args, self.checks):
            if (type(x) is not tensor or x.dtype is not dtype or x.shape != shape or not x.is_cpu
                    or x.layout is not strided or x.requires_grad):
                return False
        return True

    def write(self, args: tuple) -> None:
        """Copy the arguments into the inputs' host bytes (called by Program.call_with)."""
        for view, transfer, i in self.ins:
            if view is not None:
                view.copy_(args[i])
            else:
                x = args[i]
                transfer.put((x.float() if x.dtype is self.bfloat16 else x).numpy())  # numpy has no bfloat16

    def read(self):
        """The outputs as new tensors, in the compiled result structure."""
        one = self.one
        if one is not None:
            return one.clone()
        tensors = [_fresh(view, bool_, caller) if view is not None else _converted(self.from_numpy(transfer.read()), caller)
                   for view, transfer, bool_, caller in self.reads]
        if self.result_type is None:
            return tensors[self.outputs[0]]
        if self.in_order:
            return self.result_type(tensors)
        return self.result_type([tensors[i] for i in self.outputs])

    def run(self, args: tuple):
        """Upload, submit, wait and return the outputs (the caller holds the program's lock)."""
        return self.program.call_with(self.write, args, self.read)


def _fresh(view, bool_: bool, caller):
    """A new tensor from a view of an output's mapped bytes (overwritten by the next call): bool
    from int32 lanes, the caller's dtype (bfloat16 held as float32, converted exactly), else a copy."""
    if bool_:
        return view != 0
    return view.to(caller) if caller is not None else view.clone()


def _converted(t, caller):
    """An output read through numpy (already a new array) in the caller's dtype."""
    return t.to(caller) if caller is not None else t


def plan_fast_call(prog):
    """A FastCall for compiled program `prog` (built, its segments holding their Programs), or None
    when its calls need the general path (see the module docstring for the conditions)."""
    torch = prog._torch
    segs = prog.segments
    if len(segs) != 1 or segs[0].cpu is not None or segs[0].program is None or not prog._flat_model:
        return None
    seg = segs[0]
    if not (seg.nodes or seg.inputs):
        return None
    specs = prog._input_specs
    if not all(isinstance(s, TensorSpec) and (s.device_dtype is None or s.dtype == "bfloat16") for s in specs):
        return None  # (a bfloat16 input held as float32 is widened by the copy into the float32 bytes)
    dtypes = [getattr(torch, s.dtype, None) for s in specs]
    if not all(isinstance(d, torch.dtype) for d in dtypes):
        return None
    checks = [(d, torch.Size(s.shape)) for d, s in zip(dtypes, specs)]
    arg_of = {v: i for i, v in enumerate(prog._input_values)}
    if not all(v in arg_of for v in seg.inputs):
        return None
    uploads = [arg_of[v] for v in seg.inputs]
    out_specs = getattr(prog.plan.graph, "output_specs", None)
    if out_specs is not None and any(kind != "user" for kind, _, _ in out_specs):
        return None  # a buffer or input mutation is written back by finish_call
    held = prog.plan.graph.bfloat16.outputs if prog.plan.graph.bfloat16 is not None else {}
    outputs = []
    for v in prog._user_outputs:
        if (not isinstance(v, Value) or v.role is Role.CONST or prog._root(v) is not v or v not in seg.outputs
                or prog._host_dtype(v) != v.dtype):
            return None
        k = seg.outputs.index(v)
        if tuple(seg.program.outputs[k].shape) != tuple(v.shape) or not v.shape:
            return None  # (a 0-d bool output reads back as a numpy scalar: the general path)
        outputs.append(k)
    out_spec = prog._out_spec
    if out_spec is None or not outputs:
        return None
    if out_spec.is_leaf():
        result_type = None
        if len(outputs) != 1:
            return None
    elif out_spec.type in (tuple, list) and all(c.is_leaf() for c in out_spec.children()):
        result_type = out_spec.type
        if out_spec.num_children != len(outputs):
            return None
    else:
        return None
    # Program output index -> the caller's torch dtype, for bfloat16 outputs held as float32
    caller = {k: getattr(torch, held[i]) for i, k in enumerate(outputs) if held.get(i) is not None}
    return FastCall(torch, seg.program, checks, uploads, outputs, result_type, caller)
