"""Checking the arguments of a compiled program's call, before anything reaches the device.

A program is compiled for fixed inputs: the tensors `torch.export` saw, with their shapes and
dtypes, and any non-tensor input (a Python number) specialised to the value it had. A call must
pass the same: anything else raises, naming the input by its position (and its name in the
exported graph), what was expected and what was given:

- not a torch.Tensor (a numpy array, None, a Python scalar, a list), a tensor without data (on the
  meta device), a sparse or otherwise non-strided tensor, a tensor on another device than the CPU,
  or the wrong number of inputs: `InputTypeError` (a TypeError);
- a tensor of another dtype or shape, or a non-tensor input of another value: `InputValueError`
  (a ValueError). Inputs are never cast: torch would not silently run a float32 model on float64
  data either, and a cast could lose information (floats truncated into an int32 program);
- an int64 input (the device holds it as int32, see TensorSpec.device_dtype) with a value outside
  int32's range, or outside the narrower range the program assumed for it (TensorSpec.bounds):
  `InputValueError` giving the range of the values passed. The caller still passes
  int64, as compiled; the program uploads an int32 copy.
- a bfloat16 input the device holds as float32 (runtime/graph/bfloat16.py) is passed as bfloat16
  and widened here, exactly.

Tensors that pass are returned detached and contiguous, ready to upload.
"""

from __future__ import annotations

from dataclasses import dataclass

from texelflow.runtime.errors import InputTypeError, InputValueError


@dataclass(frozen=True)
class TensorSpec:
    """A tensor input: its placeholder name, shape and dtype name (e.g. "float32"), the dtype the
    caller passes. `device_dtype`, when set, is the narrower dtype the device holds it in (int64
    ids run as int32): every value must then fit that dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    device_dtype: str | None = None
    bounds: tuple[int, int] | None = None  # the narrower range the program assumes (lowering's input_bounds)

    def describe(self) -> str:
        return f"a torch.Tensor of shape {_shape(self.shape)} {self.dtype}"


@dataclass(frozen=True)
class ConstSpec:
    """A non-tensor input (a Python number) that torch.export specialised to `value`."""

    value: object

    def describe(self) -> str:
        return f"the constant {self.value!r} (torch.export fixed this non-tensor input)"


@dataclass(frozen=True)
class AnySpec:
    """An input the program does not read from the call (accepted as it is)."""

    name: str

    def describe(self) -> str:
        return f"a value for {self.name}"


def _shape(shape) -> str:
    return str(tuple(int(s) for s in shape))


def kind_of(obj) -> str:
    """How an error names what the user passed: 'None', 'a numpy.ndarray', 'a float', ..."""
    import torch

    if obj is None:
        return "None"
    if isinstance(obj, torch.Tensor):
        return f"a torch.Tensor of shape {_shape(obj.shape)} {str(obj.dtype).replace('torch.', '')}"
    cls = type(obj)
    mod = cls.__module__
    name = cls.__qualname__ if mod == "builtins" else f"{mod.split('.')[0]}.{cls.__qualname__}"
    article = "an" if name[:1].lower() in "aeiou" else "a"
    return f"{article} {name}"


def _label(i: int, spec) -> str:
    name = getattr(spec, "name", None)
    return f"input {i} ({name})" if name else f"input {i}"


def check_tensor(i: int, spec: TensorSpec, x):
    """`x` as a detached, contiguous CPU tensor of `spec`, or the error naming input `i`."""
    import torch

    label = _label(i, spec)
    if not isinstance(x, torch.Tensor):
        raise InputTypeError(f"{label}: expected {spec.describe()}, got {kind_of(x)}")
    if x.is_meta or x.device.type == "meta":
        raise InputTypeError(f"{label}: expected {spec.describe()}, got a tensor on the meta device "
                             f"(it has no data)")
    if x.layout != torch.strided:
        raise InputTypeError(f"{label}: expected {spec.describe()}, got a tensor of layout {x.layout} "
                             f"(convert it with .to_dense())")
    if x.device.type != "cpu":
        raise InputTypeError(f"{label}: expected {spec.describe()} on the CPU, got a tensor on {x.device} "
                             f"(move it with .cpu())")
    given = str(x.dtype).replace("torch.", "")
    if given != spec.dtype:
        raise InputValueError(f"{label}: expected dtype {spec.dtype}, got {given} (the program was compiled "
                              f"for {spec.dtype}; convert it with .to(torch.{spec.dtype}))")
    if tuple(x.shape) != tuple(spec.shape):
        raise InputValueError(f"{label}: expected shape {_shape(spec.shape)}, got {_shape(x.shape)} "
                              f"(the program was compiled for fixed shapes)")
    x = x.detach().contiguous()
    if spec.device_dtype is not None and spec.device_dtype != spec.dtype:
        if spec.dtype == "bfloat16":  # held as float32: widened exactly, here once
            return x.to(getattr(torch, spec.device_dtype))
        check_fits(label, spec, x)
    return x


def check_fits(label: str, spec: TensorSpec, x) -> None:
    """Raise InputValueError unless every value of `x` fits `spec.device_dtype` (the device holds
    the input narrowed; a value out of range would wrap silently)."""
    import torch

    if x.numel() == 0:
        return
    info = torch.iinfo(getattr(torch, spec.device_dtype))
    low, high = int(x.min()), int(x.max())
    if spec.bounds is not None and (low < spec.bounds[0] or high > spec.bounds[1]):
        raise InputValueError(f"{label}: {spec.dtype} values must lie in [{spec.bounds[0]}, {spec.bounds[1]}] (the "
                              f"program computes with them in int32 on the device, and its int64 arithmetic "
                              f"of them fits int32 only within that range), got values in [{low}, {high}]")
    if low < info.min or high > info.max:
        raise InputValueError(f"{label}: {spec.dtype} values must lie in [{info.min}, {info.max}] (the program "
                              f"runs this input as {spec.device_dtype} on the device), got values in "
                              f"[{low}, {high}]")


def _same_constant(a, b) -> bool:
    import torch

    if isinstance(b, torch.Tensor) or isinstance(b, bool) != isinstance(a, bool):
        return False
    try:
        return bool(a == b)
    except Exception:
        return False


def check_call(args, specs) -> list:
    """Validate the flattened call arguments `args` against `specs` (one per flattened input).

    Returns one entry per spec: the checked tensor for a TensorSpec, the given value otherwise."""
    if len(args) != len(specs):
        plural = "input" if len(specs) == 1 else "inputs"
        wanted = ", ".join(f"{_label(i, s)}: {s.describe()}" for i, s in enumerate(specs))
        raise InputTypeError(f"the program takes {len(specs)} {plural}, got {len(args)}"
                             + (f"; it expects {wanted}" if wanted else ""))
    out = []
    for i, (spec, x) in enumerate(zip(specs, args)):
        if isinstance(spec, TensorSpec):
            out.append(check_tensor(i, spec, x))
        elif isinstance(spec, ConstSpec):
            if not _same_constant(spec.value, x):
                import torch

                if isinstance(x, torch.Tensor) or not isinstance(x, (int, float, bool, str)):
                    raise InputTypeError(f"{_label(i, spec)}: expected {spec.describe()}, got {kind_of(x)}")
                raise InputValueError(f"{_label(i, spec)}: expected {spec.describe()}, got {x!r}")
            out.append(x)
        else:
            out.append(x)
    return out
