"""Run registry ops as one-node plan graphs on the device, for the generic kernel test.

Nothing here names an op's push constants or bindings: a case is a PlanGraph node built from a
sample of generated/samples.py, `node_dispatches` (the runtime's own lowering) turns it into
dispatches with push constants derived from the registry, and every case of one (variant,
representations) runs in one Program, one submit. Outputs come back unpacked and raw, so padding
lanes can be checked to stay zero.
"""
from __future__ import annotations

import functools
import importlib
import itertools
import math
import os
import zlib
from dataclasses import dataclass

import numpy as np
import torch

from texelflow.generated.layouts import DTYPES, LAYOUT_INFO, STORAGE_BY_AXIS
from texelflow.generated.ops import OPS, OpEntry
from texelflow.generated.samples import SAMPLES, VALUE_RANGES
from texelflow.generated.variants import VARIANTS
from texelflow.runtime.graph.ir import Node, PlanGraph, Role, Value
from texelflow.runtime.graph.op_repsets import OpRepSets
from texelflow.runtime.graph.repr import TensorRepr, TensorRepSet
from texelflow.runtime.lower_dispatch import DUMMY_BUFFER, node_dispatches
from texelflow.runtime.vulkan import commands
from texelflow.runtime.vulkan.memory import staging_buffer
from texelflow.runtime.vulkan.program import Dispatch, Program
from texelflow.runtime.vulkan.tensor import VkTensor
from texelflow.shaders.node_rules import run_checks

DISPATCHED: set[str] = set()  # names of the variants run_nodes dispatched (for the coverage test)

FLOATS = ("float32", "float16")  # float16 inputs are drawn, stored and passed to torch as float32 (below)
DEFAULT_FLOAT_RANGE = (-3.0, 3.0)  # uniform float inputs where the op declares no sample_values;
# integer inputs span their dtype's whole range (int32 arithmetic wraps alike in torch and GLSL)

# Special float values injected into inputs of float elementwise ops (templates below).
SPECIALS = ("nan", "inf", "-inf")
INJECT_TEMPLATES = ("unary", "binary", "copy", "where", "where_scalar", "scale_shift")
# Reductions, softmax, pooling and norms: a NaN or an infinity spreads over what it is reduced with.
INJECT_TEMPLATES += ("reduce", "softmax", "adaptive_pool2d", "global_avg_pool_wg", "group_norm")
INJECT_TEMPLATES += ("batch_norm",)  # elementwise per channel: NaN / Inf in input or statistics
INJECT_TEMPLATES += ("matmul", "linear")  # a NaN or Inf spreads over its row and column of the product
INJECT_TEMPLATES += ("linear_packed", "linear_packed_gemv", "linear_wg", "mm_tiled", "mm_wg")  # the same (linear_packed: padding rows included)
INJECT_TEMPLATES += ("linear_gemv_wg", "conv2d_pw_gemv_wg", "linear_wg_splitk", "linear_splitk_sum")  # the same per slice; then over the slices
INJECT_TEMPLATES += ("permute", "slice", "select", "expand", "pad", "pixel_shuffle", "cat")  # moved bit for bit
INJECT_TEMPLATES += ("layer_norm",)  # a NaN or an infinity spreads over its row
INJECT_TEMPLATES += ("masked_fill", "roll", "embedding", "index_select", "phase_shuffle")  # select or move elements bit for bit
INJECT_TEMPLATES += ("conv_im2col",)  # moves input elements bit for bit
INJECT_TEMPLATES += ("pad_mode", "max_pool1d", "pool2d")  # move or select elements bit for bit (pool2d: max and sums)
INJECT_TEMPLATES += ("scan",)  # a NaN or an infinity spreads along the rest of its line
INJECT_TEMPLATES += ("quantize",)  # +Inf / -Inf clamp to quant_max / quant_min (NaN: NOT_INJECTED)

# Special values not injected into an op's inputs, where torch and the kernel legitimately differ.
NOT_INJECTED = {
    # torch's own exact gelu is inconsistent at +Inf: its vectorized CPU kernel returns NaN (a
    # 16-element tensor), its scalar path +Inf (a 1-element one; the limit, which the kernel returns).
    "gelu": (("inf",), "torch.nn.functional.gelu(+inf) is NaN or +inf depending on the tensor size"),
    # torch casts a NaN to int8 (undefined: 0 on x86); the kernel gives zero_point (docs/quantization.md)
    "quantize_per_tensor": (("nan",), "quantizing NaN is undefined in torch (a float -> int cast)"),
    "quantize_dequantize": (("nan",), "quantizing NaN is undefined in torch (a float -> int cast)"),
    # An infinite observed minimum or maximum makes the scale infinite, so torch quantizes NaN too
    # (x * 1 / inf); tests/kernels/test_dynamic_quantize.py injects them into `self` alone.
    "dynamic_quantize_dequantize": (("nan", "inf", "-inf"), "quantizing NaN is undefined in torch (a float -> int cast)"),
}



# ---- the registry, queried ---------------------------------------------------------------------
def template_of(op_name: str) -> str:
    """The shader template of an op (shaders/TEMPLATE.glsl.j2)."""
    return OPS[op_name].template

def injected_specials(op_name: str, dtype: str) -> tuple[str, ...]:
    """The special values injected into the op's inputs: none unless a float op whose template is
    in INJECT_TEMPLATES, less those NOT_INJECTED names for it."""
    if dtype not in ("float32", "float16") or template_of(op_name) not in INJECT_TEMPLATES:
        return ()
    skipped = NOT_INJECTED.get(op_name, ((), ""))[0]
    return tuple(v for v in SPECIALS if v not in skipped)


def ops_with_variants() -> list[str]:
    return sorted(name for name, op in OPS.items() if op.variants)


def declared_repsets(op: OpEntry) -> dict[str, str]:
    """Every tensor slot of the op (tensor arguments, then outputs) -> its repset name."""
    out = {a.name: a.repset for a in op.args if a.repset is not None}
    out.update({o.name: o.repset for o in op.outputs})
    return out


def short(r: TensorRepr) -> str:
    return f"{r.storage.name}-{LAYOUT_INFO[r.layout].short}"


def repr_combos(op: OpEntry, variant) -> list[dict[str, TensorRepr]]:
    """Every assignment of representations to the op's tensor slots that the planner may choose
    for this variant: each slot in its repset (its dtype's family, the variant's storage for that
    binding), weights in their repset's preferred representation, and the members of each sync
    group on one packed-dim info (for floats: one representation)."""
    storage = {b.tensor: STORAGE_BY_AXIS[b.storage] for b in variant.bindings}
    choices = {}
    for name, repset in declared_repsets(op).items():
        family = DTYPES[op.tensor_dtype(name, variant.dtype)].family  # dtype_of may fix a slot's dtype
        allowed = [r for r in TensorRepSet.named(repset).filter_for_family(family) if r.storage == storage[name]]
        if name in op.weights and allowed:
            allowed = [TensorRepSet.of(*allowed).pick()]
        choices[name] = allowed
    names = list(choices)
    sync = OpRepSets(op, {}, op.sync)
    combos = []
    for picked in itertools.product(*(choices[n] for n in names)):
        combo = dict(zip(names, picked))
        if sync.is_sync_compatible(combo):
            combos.append(combo)
    return combos


def combo_id(op: OpEntry, combo: dict[str, TensorRepr]) -> str:
    """One representation's name when every non-weight slot shares it, else slot=repr pairs."""
    slots = {n: r for n, r in combo.items() if n not in op.weights}
    if len(set(slots.values())) == 1:
        return short(next(iter(slots.values())))
    return ",".join(f"{n}={short(r)}" for n, r in slots.items())


EVERY_COMBO_ENV = "TEXELFLOW_TEST_EVERY_COMBO"  # =1: every variant in every combination


def variant_family(vname: str) -> tuple:
    """A variant's op and its axes other than dtype: the variants that differ only in dtype."""
    v = VARIANTS[vname]
    return (v.op, tuple(axis for axis in v.axes if axis[0] != "dtype"))


def variant_cases(every: bool | None = None) -> list[tuple[str, dict[str, TensorRepr]]]:
    """(variant name, representations) cases for the generic kernel test.

    Layout code (index math, packing, shape classes) is the same for every dtype of a template;
    what a dtype changes is how its words are loaded, converted and stored. So the variants that
    differ only in dtype (a family) share the combinations: the family's reference dtype (float32,
    else its first) runs in every combination, each other dtype in the combinations no earlier
    dtype of the family ran (an int8 layout, say) or else in one, rotated over the dtypes and the
    families. Every variant runs, and every combination of every family; float32 variants all of
    theirs. `every=True` (or TEXELFLOW_TEST_EVERY_COMBO=1) runs each variant in every
    combination: about 1.6x the cases (2548 against 1584 when this was written), and of the time."""
    if every is None:
        every = os.environ.get(EVERY_COMBO_ENV, "") not in ("", "0")
    families: dict[tuple, dict[str, list[str]]] = {}
    for op_name in ops_with_variants():
        for vname in OPS[op_name].variants:
            families.setdefault(variant_family(vname), {}).setdefault(VARIANTS[vname].dtype, []).append(vname)
    out = []
    for family, by_dtype in families.items():
        reference = "float32" if "float32" in by_dtype else min(by_dtype)
        ran: set[str] = set()
        for rank, dtype in enumerate([reference] + sorted(d for d in by_dtype if d != reference)):
            for vname in by_dtype[dtype]:
                op = OPS[VARIANTS[vname].op]
                combos = repr_combos(op, VARIANTS[vname])
                picked = combos if every or dtype == reference else [c for c in combos if combo_id(op, c) not in ran]
                if not picked and combos:
                    picked = [combos[(rank + zlib.crc32(repr(family).encode())) % len(combos)]]
                ran.update(combo_id(op, c) for c in picked)
                out.extend((vname, combo) for combo in picked)
    return out


# ---- samples: inputs and torch's answer ----------------------------------------------------------
def _seed(*key) -> int:
    return zlib.crc32(repr(key).encode())  # stable across processes


def random_array(rng: np.random.Generator, shape, dtype: str, value_range=None) -> np.ndarray:
    """Uniform values in `value_range` (default: DEFAULT_FLOAT_RANGE, or an integer dtype's range)."""
    if dtype in FLOATS:
        low, high = value_range or DEFAULT_FLOAT_RANGE
        return rng.uniform(low, high, size=shape).astype(dtype)
    if dtype == "bool":
        return rng.integers(0, 1, size=shape, endpoint=True).astype(bool)
    info = np.iinfo(dtype)
    low, high = (int(np.ceil(value_range[0])), int(np.floor(value_range[1]))) if value_range else (info.min, info.max)
    return rng.integers(low, high, size=shape, endpoint=True, dtype=np.int64).astype(dtype)


def inject_specials(arr: np.ndarray, offset: int, values: tuple[float, ...]) -> np.ndarray:
    """A copy with `values` (NaN, +Inf, -Inf) at spread-out elements (rotated by `offset`)."""
    out = arr.copy()
    flat = out.reshape(-1)
    n = flat.size
    for k, value in enumerate(values):
        if n:
            flat[(k * n // len(values) + offset) % n] = value
    return out


def tensor_args(op: OpEntry, sample: dict) -> list[tuple[str, object]]:
    """(name, shape or list of shapes) of the tensor arguments the sample gives, in schema order."""
    return [(a.name, sample[a.name]) for a in op.args
            if a.kind in ("tensor", "tensor_list") and sample.get(a.name) is not None]


def gives_bool(op: OpEntry) -> bool:
    """Whether the op computes a bool (comparisons, logical_not): its inputs then take few
    values (multiples of 0.5 in [-3, 3], integers in [-3, 3]) so that ties and zeros occur."""
    return any(dict(op.dtype_of).get(o.name) == "bool" for o in op.outputs)


def sample_inputs(op: OpEntry, dtype: str, index: int, specials: tuple = ()) -> dict[str, object]:
    """Random input arrays for sample `index` of the op (lists for a tensor list), reproducible;
    `specials`: values injected into every float input array."""
    sample = SAMPLES[op.name][index]
    rng = np.random.default_rng(_seed(op.name, dtype, index))
    ranges = VALUE_RANGES.get(op.name, {})
    out = {}
    for k, (name, shape) in enumerate(tensor_args(op, sample)):
        is_list = next(a for a in op.args if a.name == name).kind == "tensor_list"
        shapes = shape if is_list else [shape]
        own = op.tensor_dtype(name, dtype)  # the variant's dtype, or fixed by dtype_of
        arrays = [random_array(rng, s, own, ranges.get(name) or ((-3, 3) if gives_bool(op) else None))
                  for s in shapes]
        if gives_bool(op) and own in FLOATS:
            arrays = [np.asarray(np.round(a * 2) / 2, dtype=own) for a in arrays]
        if specials and own in FLOATS:
            arrays = [inject_specials(a, k + i, specials) for i, a in enumerate(arrays)]
        out[name] = arrays if is_list else arrays[0]
    return out


def _resolve(target: str):
    """The torch OpOverload of a target 'ns.op.overload', or None when torch does not have it."""
    ns, name, overload = target.split(".")
    if ns == "quantized_decomposed":
        import torchao.quantization.pt2e  # noqa: F401  torchao registers these ops
    try:
        return getattr(getattr(getattr(torch.ops, ns), name), overload)
    except (AttributeError, RuntimeError):
        return None


# Ops none of whose targets torch implements, and their reference.
NO_TORCH_TARGET = {
    "to_layout": "identity",  # texelflow's transition: a copy into another representation
    "conv2d_act": "texelflow.runtime.graph.fusion.conv2d_act_reference",  # conv2d + activation, fused
    "conv2d_dw": "texelflow.runtime.graph.fusion.conv2d_act_reference",  # depthwise conv2d
    "conv2d_dw_act": "texelflow.runtime.graph.fusion.conv2d_act_reference",  # depthwise conv2d + activation
    "add_act": "texelflow.runtime.graph.fusion.add_act_reference",  # add + relu / hardtanh, fused
    # channels-last conv: conv2d of the NCHW-permuted input, its result permuted back
    "conv2d_nhwc": "texelflow.runtime.graph.permutes.dim_order.conv2d_nhwc_reference",
    # specialised convs on prepacked weights (runtime/graph/prepack_conv.py)
    "conv2d_pw": "texelflow.runtime.graph.prepack_conv.conv2d_pw_reference",
    "conv2d_pw_scaled": "texelflow.runtime.graph.prepack_conv.conv2d_pw_scaled_reference",
    "linear_packed": "texelflow.runtime.graph.prepack_matmul.linear_packed_reference",
    "linear_packed_gemv": "texelflow.runtime.graph.prepack_matmul.linear_packed_reference",
    "linear_wg": "texelflow.runtime.graph.prepack_matmul.linear_packed_reference",
    "mm_wg": "texelflow.runtime.graph.prepack_matmul.mm_wg_reference",
    "bmm_nt": "texelflow.runtime.graph.prepack_matmul.bmm_nt_reference",  # B stored transposed
    "linear_gemv_wg": "texelflow.runtime.graph.prepack_matmul.linear_packed_reference",
    "conv2d_pw_gemv_wg": "texelflow.runtime.graph.prepack_matmul.conv2d_pw_gemv_reference",
    "global_avg_pool_wg": "texelflow.runtime.graph.fusion.global_avg_pool_reference",
    "adaptive_max_pool2d_values": "texelflow.runtime.graph.fusion.adaptive_max_pool2d_values_reference",
    "linear_wg_splitk": "texelflow.runtime.graph.prepack_matmul.linear_wg_splitk_reference",
    "linear_splitk_sum": "texelflow.runtime.graph.prepack_matmul.linear_splitk_sum_reference",
    "conv2d_pw_act": "texelflow.runtime.graph.prepack_conv.conv2d_pw_reference",
    "conv2d_wino": "texelflow.runtime.graph.prepack_conv.conv2d_wino_reference",
    "conv2d_wino_runs": "texelflow.runtime.graph.prepack_conv.conv2d_wino_reference",
    "conv2d_gemm": "texelflow.runtime.graph.prepack_conv.conv2d_gemm_reference",
    "conv2d_wino4_input": "texelflow.runtime.graph.prepack_conv.conv2d_wino4_input_reference",
    "conv2d_wino4_output": "texelflow.runtime.graph.prepack_conv.conv2d_wino4_output_reference",
    "conv_im2col": "texelflow.runtime.graph.prepack_conv.conv_im2col_reference",
    "phase_shuffle": "texelflow.runtime.graph.conv_transpose.phase_shuffle_reference",  # a transposed conv's phases
    "conv_transpose2d_tiles": "texelflow.runtime.graph.conv_transpose.conv_transpose2d_tiles_reference",
    "scale_shift": "texelflow.runtime.graph.fusion.scale_shift_reference",  # an inference batch norm
    "conv2d_dw3_s1": "texelflow.runtime.graph.prepack_conv.conv2d_dw_s1_reference",
    "conv2d_dw5_s1": "texelflow.runtime.graph.prepack_conv.conv2d_dw_s1_reference",
    "conv2d_dw7_s1": "texelflow.runtime.graph.prepack_conv.conv2d_dw_s1_reference",
    "conv2d_dw3_s1_nhwc": "texelflow.runtime.graph.prepack_conv.conv2d_dw_s1_nhwc_reference",
    "conv2d_dw5_s1_nhwc": "texelflow.runtime.graph.prepack_conv.conv2d_dw_s1_nhwc_reference",
    "conv2d_dw7_s1_nhwc": "texelflow.runtime.graph.prepack_conv.conv2d_dw_s1_nhwc_reference",
    "conv2d_dw3_s2": "texelflow.runtime.graph.prepack_conv.conv2d_dw_s2_reference",
    "conv2d_dw5_s2": "texelflow.runtime.graph.prepack_conv.conv2d_dw_s2_reference",
}
# the precision pass's casts (docs/precision.md): torch's .half() / .float()
NO_TORCH_TARGET.update({name: f"texelflow.runtime.graph.precision.{name}_reference"
                        for name in ("cast_to_float16", "cast_to_float32")})
NO_TORCH_TARGET["cast_to_int32"] = "texelflow.runtime.graph.lowering.cast_to_int32_reference"  # torch's .int()
NO_TORCH_TARGET["bitonic_step"] = "texelflow.runtime.graph.own_decompositions.bitonic_step_reference"
NO_TORCH_TARGET["sort_lines"] = "texelflow.runtime.graph.own_decompositions.sort_lines_reference"
NO_TORCH_TARGET["arg_extreme"] = "texelflow.runtime.graph.own_decompositions.arg_extreme_reference"
NO_TORCH_TARGET["round_bfloat16"] = "texelflow.runtime.graph.bfloat16.round_bfloat16_reference"  # .bfloat16().float()
# q8ta ops: dequantize, the float op, quantize (tests/kernels/q8ta_reference.py)
NO_TORCH_TARGET.update({name: f"tests.kernels.q8ta_reference.{name}" for name in (
    "quantize_dequantize", "dynamic_quantize_dequantize", "q8ta_add", "q8ta_relu", "q8ta_pixel_shuffle", "q8ta_max_pool2d", "q8ta_linear", "q8ta_linear_gemv", "q8ta_conv2d",
    "q8ta_conv2d_im2col")})


def _torch_input(array: np.ndarray) -> torch.Tensor:
    """A sample input for torch: float16 arrays (already rounded to float16) as float32, so the
    reference of a float16 variant is torch's float32 answer on the float16 inputs (docs/precision.md)."""
    t = torch.from_numpy(array.copy())
    return t.float() if t.dtype == torch.float16 else t


def torch_reference(op: OpEntry, sample: dict, inputs: dict) -> list[np.ndarray]:
    """The outputs torch gives for the sample: the first target that accepts its arguments.

    Ops torch does not know at all (namespace texelflow, or a library torch lacks) copy their
    input when they are identity ops or listed in NO_TORCH_TARGET.
    """
    kwargs = {}
    for a in op.args:
        if a.name not in sample:
            if a.kind == "tensor" and a.optional:
                kwargs[a.name] = None  # absent (torch's schema may give it no default)
            continue
        v = sample[a.name]
        if a.kind == "tensor" and v is not None:
            v = _torch_input(inputs[a.name])
        elif a.kind == "tensor_list":
            v = [_torch_input(x) for x in inputs[a.name]]
        elif isinstance(v, tuple):
            v = list(v)
        elif a.kind == "any" and isinstance(getattr(torch, str(v), None), torch.dtype):
            v = getattr(torch, v)  # a ScalarType argument, named in the sample (to_float's dtype)
        kwargs[a.name] = v
    targets = [(t, _resolve(t)) for t in op.targets]
    known = [(t, fn) for t, fn in targets if fn is not None]
    reference = NO_TORCH_TARGET.get(op.name, "")
    if not known and "." in reference:  # a torch function of texelflow's, by module path
        module, _, fn = reference.rpartition(".")
        results = getattr(importlib.import_module(module), fn)(**kwargs)
    elif not known:
        assert op.is_identity or reference == "identity", (
            f"{op.name}: torch implements none of {op.targets} and no reference is declared")
        results = (kwargs["self"].clone(),)
    else:
        errors = []
        for t, fn in known:
            names = {a.name for a in fn._schema.arguments}
            extra = [k for k, v in kwargs.items() if k not in names and v is not None]
            if extra:  # this overload lacks an argument the sample gives
                errors.append(f"{t}: no argument {extra}")
                continue
            try:
                results = fn(**{k: v for k, v in kwargs.items() if k in names})
                break
            except (RuntimeError, TypeError) as exc:  # this overload does not take these arguments
                errors.append(f"{t}: {str(exc).splitlines()[0]}")
        else:
            raise AssertionError(f"{op.name}: no target accepts sample {sample}: " + "; ".join(errors))
    if isinstance(results, torch.Tensor):
        results = (results,)
    assert len(results) == len(op.outputs), f"{op.name}: torch gives {len(results)} outputs"
    return [r.contiguous().numpy() for r in results]


@dataclass
class SampleCase:
    """One sample with its input arrays and torch's outputs."""

    label: str
    sample: dict  # argument -> value, as generated/samples.py has it
    specials: tuple  # the special values injected into its inputs
    inputs: dict  # tensor argument -> array (list of arrays for a tensor list)
    want: list  # torch's outputs, in op.outputs order
    shapes: dict  # every present tensor slot -> shape (list of shapes for a tensor list)


def _integral_numbers(op: OpEntry, dtype: str, sample: dict) -> dict:
    """The sample with its finite float numbers floored for an int32 variant: a number beside an
    int32 tensor reaching the device is an integer (torch promotes an int tensor with a float
    number to float, which no int32 variant takes), while the float variants keep the samples'
    fractions (clamp's bounds of -0.5)."""
    if dtype != "int32":
        return sample
    numbers = {a.name for a in op.args if a.kind not in ("tensor", "tensor_list")}
    return {k: math.floor(v) if k in numbers and isinstance(v, float) and math.isfinite(v) else v
            for k, v in sample.items()}


@functools.lru_cache(maxsize=None)
def sample_case(op_name: str, dtype: str, index: int, specials: tuple[str, ...] = ()) -> SampleCase:
    """Sample `index` of the op with random inputs; `specials` (of "nan", "inf", "-inf")
    injected into every input array."""
    op = OPS[op_name]
    sample = _integral_numbers(op, dtype, SAMPLES[op_name][index])
    inputs = sample_inputs(op, dtype, index, tuple(float(v) for v in specials))
    label = f"sample {index}{' with ' + '/'.join(specials) if specials else ''} {dict(sample)}"
    return explicit_case(op, sample, inputs, label, specials)


def explicit_case(op: OpEntry, sample: dict, inputs: dict, label: str, specials: tuple = ()) -> SampleCase:
    """A case of given input arrays: `sample` as in SAMPLES (tensors as shapes), `inputs` the
    array of each tensor argument it gives (a list of arrays for a tensor list)."""
    want = torch_reference(op, sample, inputs)
    shapes = {name: shape for name, shape in tensor_args(op, sample)}
    shapes.update({o.name: w.shape for o, w in zip(op.outputs, want)})
    return SampleCase(label, sample, specials, inputs, want, shapes)


def build_node(op: OpEntry, dtype: str, case: SampleCase) -> tuple[Node, dict]:
    """A PlanGraph of one node for the sample: tensor inputs as graph inputs, weights as
    constants. Returns the node and the array of every input / constant Value."""
    sample = case.sample
    graph = PlanGraph()
    arrays, args = {}, []
    for a in op.args:
        if a.name not in sample:
            continue
        v = sample[a.name]
        if a.kind in ("tensor", "tensor_list") and v is not None:
            add = graph.add_const if a.name in op.weights else graph.add_input
            data = case.inputs[a.name]
            own = op.tensor_dtype(a.name, dtype)
            if a.kind == "tensor_list":
                v = [add(f"{a.name}{i}", x.shape, own) for i, x in enumerate(data)]
                arrays.update(zip(v, data))
            else:
                v = add(a.name, data.shape, own)
                arrays[v] = data
        args.append((a.name, v))
    outputs = [(o.name, w.shape, op.tensor_dtype(o.name, dtype)) for o, w in zip(op.outputs, case.want)]
    node = graph.add_node(op.name, op.targets[0], op, args, outputs)
    graph.outputs = [v for _, v in node.outputs]
    return node, arrays


def sample_problem(op: OpEntry, node: Node) -> str | None:
    """Why the sample cannot be a Vulkan node at all (then the sample is wrong), else None."""
    if "supports_highdim" not in op.flags:
        ranks = [len(v.shape) for _, v in node.tensor_args()] + [len(v.shape) for _, v in node.outputs]
        if max(ranks) > 4:
            return f"rank {max(ranks)} tensors, but {op.name} lacks supports_highdim"
    return run_checks(node, op.checks)


def fits(op: OpEntry, dtype: str, case: SampleCase, combo: dict[str, TensorRepr]) -> bool:
    """Whether the planner could give the sample's tensors these representations (texture
    extents and rank, sync groups narrowed as the planner narrows them)."""
    sets = OpRepSets.build(op, case.shapes, dtype=dtype).sets
    return all(combo[name] in sets[name] for name in case.shapes)


# ---- running -------------------------------------------------------------------------------------
@dataclass
class Output:
    got: np.ndarray  # unpacked, NCHW
    raw: np.ndarray  # the stored elements: int32 words (float family) or int8 lanes
    padding: np.ndarray  # True where `raw` is padding


def padding_mask(t: VkTensor) -> np.ndarray:
    """True for every stored element (as raw_elements gives them) that is padding: where the
    host packer puts none of the ones of an all-ones tensor."""
    ones = t.pack(np.ones(t.shape, dtype=t.dtype if t.dtype in FLOATS else np.int8))
    return ones.view(_raw_type(t)) == 0


def _raw_type(t: VkTensor):
    """The integer type of one stored element: int32 words, int16 float16 lanes, int8 lanes."""
    return {"int8": np.int8, "float16": np.int16}.get(t.dtype, np.int32)


def raw_elements(device, ts: list[VkTensor]) -> list[np.ndarray]:
    """The stored elements of every tensor (int32 words, or int8 lanes for int8), padding
    included, copied out with one submit."""
    offsets, total = [], 0
    for t in ts:
        offsets.append(total)
        total += -(-t.nbytes // 16) * 16
    stage = staging_buffer(device, total)
    vk = device.vk

    def record(cmd):
        commands.work_to_work(vk, cmd)
        for t, off in zip(ts, offsets):
            t.record_copy_out(cmd, stage.handle, off)
        commands.work_to_host(vk, cmd)

    device.run_once(record, "raw downloads")
    view = stage.view(total)
    return [view[off:off + t.nbytes].copy().view(_raw_type(t)) for t, off in zip(ts, offsets)]


def variant_at(op_name: str, **axes: str) -> str:
    """The one variant of `op_name` at these axis values; an axis the op does not have is ignored
    (int_dot="plain" names q8ta_conv2d's only variant too)."""
    [name] = [n for n in OPS[op_name].variants
              if all(dict(VARIANTS[n].axes).get(a, value) == value for a, value in axes.items())]
    return name


def run_nodes(device, nodes: list[tuple[Node, dict]], slot_reprs: dict[str, TensorRepr], dtype: str,
              expect_variant: str | None = None, general: bool = False) -> list[list[Output]]:
    """Lower every node with node_dispatches and run all their dispatches in one Program.

    nodes: (node, {input or constant Value: array}). `general`: dispatch without the shape
    classes lowering gives (every spec constant at its general default, right for any node).
    Returns each node's outputs."""
    tensors: dict[Value, VkTensor] = {}
    ins, in_arrays, dispatches, every = [], [], [], []
    dummy = None
    # Lower as a device with exactly the expected variant's features would: of variants differing
    # only on a choice axis (int_dot), that picks the expected one (a plain one among dot4x8 ones).
    features = VARIANTS[expect_variant].features if expect_variant is not None else None
    try:
        for node, arrays in nodes:
            present = {n for n, v in node.tensor_args()} | {n for n, _ in node.outputs}
            for spec in node_dispatches(node, {n: r for n, r in slot_reprs.items() if n in present}, dtype, features):
                if expect_variant is not None:
                    assert spec.variant.name == expect_variant, f"lowered to {spec.variant.name}, not {expect_variant}"
                bound = {}
                for name, v in spec.tensors.items():
                    if v is DUMMY_BUFFER:
                        if dummy is None:
                            dummy = VkTensor(device, (1,), "float32", label="absent")
                            every.append(dummy)
                            ins.append(dummy)
                            in_arrays.append(np.zeros(1, np.float32))
                        bound[name] = dummy
                        continue
                    t = tensors.get(v)
                    if t is None:
                        r = slot_reprs[name]
                        t = VkTensor(device, v.shape, v.dtype, r.storage, r.layout, label=v.name)
                        tensors[v] = t
                        every.append(t)
                        if v.role is not Role.NODE:
                            ins.append(t)
                            in_arrays.append(arrays[v])
                    bound[name] = t
                dispatches.append(Dispatch(spec.variant, bound, spec.scalars, label=spec.label, units=spec.units,
                                           spec={} if general else spec.spec))
        outs = [tensors[v] for node, _ in nodes for _, v in node.outputs]
        prog = Program(device, dispatches, ins, outs, timestamps=False)
        try:
            got = prog(*in_arrays)
        finally:
            prog.close()
        for d in dispatches:
            DISPATCHED.add(d.variant.name)
        raws = raw_elements(device, outs)
        results = [Output(g, raw, padding_mask(t)) for g, raw, t in zip(got, raws, outs)]
        grouped, k = [], 0
        for node, _ in nodes:
            grouped.append(results[k:k + len(node.outputs)])
            k += len(node.outputs)
        return grouped
    finally:
        for t in every:
            t.close()


# ---- comparing -----------------------------------------------------------------------------------
# (rtol, atol) of float32 outputs per shader template (an op's name overrides its template's
# entry); None: bit-exact, NaN payloads and the sign of zero included. Integers: exact, but where
# the entry is an int: the most |got - want| of integer outputs, in quantization steps (q8ta kernels).
TOLERANCES: dict[str, tuple[float, float] | int | None] = {
    "copy": None,  # identity ops and to_layout move elements
    "permute": None,
    "conv_im2col": None,  # moves elements (zeros outside the input)
    "cat": None,
    "flip": None,
    "where": None,  # selects elements
    "where_scalar": None,
    "unary": (1e-5, 1e-6),  # GLSL's exp/tanh/erf approximations against libm
    # their float32 formulas add terms of the result's size or larger (lgamma's reflection, digamma's
    # 1 / x steps): near their zeros an absolute error of a few ulps of those terms (test_gamma.py)
    "lgamma": (1e-5, 1e-5),
    "digamma": (1e-5, 1e-5),
    "binary": (1e-5, 1e-6),
    "scale_shift": (1e-6, 1e-6),  # a multiply-add the compiler may fuse (one rounding, torch's two)
    "pool2d": (1e-5, 1e-6),  # avg: a sum of up to 9 elements, then a division
    # ops that only select, negate or clamp elements are exact (an op's name overrides its template)
    "max_pool2d": None,
    "abs": None,
    "neg": None,
    "relu": None,
    "clamp": None,
    "hardtanh": None,
    "relu6": None,
    "minimum": None,
    "maximum": None,
    "matmul": (1e-4, 1e-5),  # dot products accumulated in another order than torch's
    "linear": (1e-4, 1e-5),
    "linear_packed": (1e-4, 1e-5),  # dot products in another order (runtime/graph/prepack_matmul.py)
    "linear_packed_gemv": (1e-4, 1e-5),
    "linear_wg": (1e-4, 1e-5),
    "linear_gemv_wg": (1e-4, 1e-5),
    "conv2d_pw_gemv_wg": (1e-4, 1e-4),  # as conv2d: sums of up to 576 products in 64 parts
    "linear_wg_splitk": (1e-4, 1e-5),
    "linear_splitk_sum": (1e-4, 1e-5),  # the slices' sum, then exp / tanh / erf approximations
    "mm_wg": (1e-4, 1e-5),
    "mm_tiled": (1e-4, 1e-5),  # dot products accumulated in another order than torch's
    "conv2d": (1e-4, 1e-4),
    "conv2d_act": (1e-4, 1e-4),  # conv2d's sums, then exp / tanh / erf approximations
    "conv2d_dw": (1e-4, 1e-4),
    "conv2d_dw_act": (1e-4, 1e-4),
    "conv2d_nhwc": (1e-4, 1e-4),  # conv2d_act's sums and activations, channels-last
    "conv2d_pw": (1e-4, 1e-4),  # conv2d's sums over input channels (runtime/graph/prepack_conv.py)
    "conv2d_pw_act": (1e-4, 1e-4),
    "conv2d_dw_s1": (1e-4, 1e-4),  # conv2d_dw's sums and activations
    "conv2d_gemm": (1e-4, 1e-4),  # conv2d_act's sums and activations
    "conv2d_wino": (1e-4, 1e-4),  # Winograd F(2x2, 3x3): its transforms' sums, in another order
    "conv2d_wino_runs": (1e-4, 1e-4),
    # Winograd F(4x4, 3x3)'s transforms: sums of up to 16 terms with coefficients up to 25 (input)
    # and 64 (output), in another order
    "conv2d_wino4_input": (1e-5, 1e-4),
    "conv2d_wino4_output": (1e-5, 1e-4),
    "batch_norm": (1e-5, 1e-5),  # one multiply-add per element, torch's order
    "layer_norm": (1e-4, 1e-4),  # mean and variance reductions, rsqrt
    "sdpa": (1e-4, 1e-5),  # dot products, exp and an online softmax in another order than torch's
    "reduce": (1e-5, 1e-5),  # sums accumulated in another order than torch's
    "amax": None,  # max and min select an element
    "amin": None,
    "softmax": (1e-5, 1e-6),  # exp and log approximations, a sum in another order
    "adaptive_pool2d": (1e-5, 1e-5),  # a sum of up to 49 elements, then a division
    "adaptive_max_pool2d_values": None,  # the max selects an element
    "bitonic_step": None,  # each element is its own pair's or its partner's
    "sort_lines": None,  # each value is one of the row's, moved whole
    "arg_extreme": None,  # a position, exact
    "global_avg_pool_wg": (1e-5, 1e-5),  # the same sums in 64 parts, then a division
    "group_norm": (1e-4, 1e-4),  # mean and variance reductions, rsqrt
    "scan": (1e-5, 1e-4),  # running float32 sums of up to 1000 terms (torch adds float32 in float64)
}

# Shape ops move elements (bit-exact); bilinear upsampling mixes four with torch's float32 weights.
TOLERANCES.update({
    "expand": None,
    "slice": None,
    "select": None,
    "pad": None,
    "pixel_shuffle": None,
    "upsample": (1e-5, 1e-6),
    "grid_sample": (1e-5, 1e-6),  # torch may fuse a step into an FMA where the kernel keeps two roundings
    "upsample_nearest2d": None,
})
TOLERANCES.update({"masked_fill": None, "roll": None, "embedding": None, "index_select": None,
                   "phase_shuffle": None})  # exact: elements are moved
TOLERANCES.update({"conv1d": (1e-4, 1e-4), "conv_transpose1d": (1e-4, 1e-4), "conv_transpose2d": (1e-4, 1e-4),
                   "conv_transpose2d_tiles": (1e-4, 1e-4)})  # sums in another order than torch's
TOLERANCES.update({"cast_to_float16": None, "cast_to_float32": None})  # torch's .half() (to nearest even), .float()
TOLERANCES.update({"pad_mode": None})  # reflection / replication pads move elements
TOLERANCES.update({"max_pool1d": None})  # selects an element
TOLERANCES.update({name: None for name in (  # rounding, sign and selects are exact, -0.0 included
    "floor", "ceil", "round", "trunc", "sign", "hardshrink", "nan_to_num")})
# quantize / dequantize: torchao's float32 operations in its order, exact. q8ta ops quantize a float
# result; one computed in another order may land across a rounding boundary: one step (docs/quantization.md).
TOLERANCES.update({"quantize": None, "dequantize": None, "q8ta_elementwise": 1, "q8ta_pixel_shuffle": 1,
                   "q8ta_max_pool2d": None})  # None: exact
TOLERANCES.update({"q8ta_linear": 1, "q8ta_linear_gemv": 1})  # int32 sums, then a float multiply-add
TOLERANCES.update({"q8ta_conv2d": 1, "q8ta_conv2d_im2col": 1})  # int32 sums, then a float multiply-add


def tolerance(op_name: str) -> tuple[float, float] | int | None:
    key = op_name if op_name in TOLERANCES else template_of(op_name)
    assert key in TOLERANCES, f"no tolerance for template '{key}' (op '{op_name}') in nodecheck.TOLERANCES"
    return TOLERANCES[key]


# float16 outputs (docs/precision.md): the kernel computes in float32 and rounds once on the store,
# so it is compared with torch's float32 answer rounded to float16, within the template's tolerance
# or FP16_TOLERANCE, whichever is wider (two roundings of nearly equal values differ by one ulp,
# 2**-10 relative); a bit-exact template (None) stays bit-exact on the rounded answer.
FP16_TOLERANCE = (2e-3, 1e-4)


def flush_subnormals(x: np.ndarray) -> np.ndarray:
    """x with every float32 subnormal replaced by a zero of its sign, as a device without
    DenormPreserve for 32 bits reads it (runtime/vulkan/float_controls.py)."""
    tiny = (x != 0) & (np.abs(x) < np.finfo(np.float32).tiny)
    return np.where(tiny, np.copysign(np.float32(0), x), x).astype(np.float32)


def assert_matches(got: np.ndarray, want: np.ndarray, op_name: str, what: str) -> None:
    assert got.shape == want.shape, f"{what}: shape {got.shape} != torch's {want.shape}"
    if got.dtype == np.int32 and want.dtype == np.int64:  # torch's integer sums are int64; the int32
        want = want.astype(np.int32)  # kernels wrap as int32 does (lowering runs them only where the
        # sums fit: runtime/graph/int_ranges.py)
    tol = tolerance(op_name)
    if got.dtype == np.float16 and want.dtype in (np.float32, np.float16):
        _assert_matches_fp16(got, want, tol, what)
        return
    if isinstance(tol, int):
        assert want.dtype != np.float32, f"{what}: a tolerance in steps ({tol}) is for integer outputs"
        diff = np.abs(got.astype(np.int64) - want.astype(np.int64)).reshape(-1)
        i = np.flatnonzero(diff > tol)
        if i.size:
            raise AssertionError(f"{what}: {i.size} elements differ from torch by more than {tol}; first at "
                                 f"{i[:6].tolist()}: got {got.reshape(-1)[i[:6]]}, want {want.reshape(-1)[i[:6]]}")
        return
    if want.dtype != np.float32 or tol is None:
        if want.dtype == np.float32:
            # Bit for bit, -0.0 included; any NaN matches any NaN (payload and sign carry no meaning).
            bad = (got.view(np.int32) != want.view(np.int32)) & ~(np.isnan(got) & np.isnan(want))
            if bad.any():
                i = np.flatnonzero(bad.reshape(-1))
                raise AssertionError(f"{what}: {i.size} elements differ from torch bit for bit; first at "
                                     f"{i[:6].tolist()}: got {got.reshape(-1)[i[:6]]}, want {want.reshape(-1)[i[:6]]}")
        else:
            np.testing.assert_array_equal(got, want, err_msg=what)
        return
    np.testing.assert_allclose(got, want, rtol=tol[0], atol=tol[1], equal_nan=True, err_msg=what)


def _assert_matches_fp16(got: np.ndarray, want: np.ndarray, tol, what: str) -> None:
    with np.errstate(over="ignore"):
        want16 = want.astype(np.float16)  # past 65504: +-Inf, as the kernel's store
    if tol is None:
        bad = (got.view(np.int16) != want16.view(np.int16)) & ~(np.isnan(got) & np.isnan(want16))
        if bad.any():
            i = np.flatnonzero(bad.reshape(-1))
            raise AssertionError(f"{what}: {i.size} float16 elements differ from torch's (rounded) bit for bit; "
                                 f"first at {i[:6].tolist()}: got {got.reshape(-1)[i[:6]]}, want {want16.reshape(-1)[i[:6]]}")
        return
    rtol, atol = max(tol[0], FP16_TOLERANCE[0]), max(tol[1], FP16_TOLERANCE[1])
    np.testing.assert_allclose(got.astype(np.float32), want16.astype(np.float32), rtol=rtol, atol=atol,
                               equal_nan=True, err_msg=f"{what} (float16, rtol={rtol}, atol={atol})")


def assert_padding_zero(out: Output, what: str) -> None:
    bad = np.flatnonzero(out.padding & (out.raw != 0))
    assert bad.size == 0, f"{what}: {bad.size} padding elements are not zero (first at {bad[:8].tolist()})"


def check_variant(device, vname: str, combo: dict[str, TensorRepr], cases: list[SampleCase],
                  general: bool = False) -> list[tuple[SampleCase, str]]:
    """Run the cases that fit `combo` on one variant (one Program); (case, message) per failure.
    `general`: without shape classes (run_nodes).

    Raises when a case cannot be a Vulkan node at all (a bad sample) or when no case fits."""
    variant = VARIANTS[vname]
    op, dtype = OPS[variant.op], variant.dtype
    where = f"{vname} {combo_id(op, combo)}"
    runs = []
    for case in cases:
        if not fits(op, dtype, case, combo):
            continue
        node, arrays = build_node(op, dtype, case)
        problem = sample_problem(op, node)
        assert problem is None, f"{op.name} {case.label} cannot run on Vulkan: {problem}"
        runs.append((case, node, arrays))
    assert runs, f"{where}: no sample of '{op.name}' fits these representations; add one to ops.yaml"
    results = run_nodes(device, [(node, arrays) for _, node, arrays in runs], combo, dtype, expect_variant=vname,
                        general=general)
    failures = []
    for (case, _, _), outs in zip(runs, results):
        for spec, want, out in zip(op.outputs, case.want, outs):
            what = f"{where} {case.label}: output '{spec.name}'"
            for check in (lambda: assert_matches(out.got, want, op.name, what),
                          lambda: assert_padding_zero(out, what)):
                try:
                    check()
                except AssertionError as exc:
                    failures.append((case, str(exc).strip()))
    return failures
