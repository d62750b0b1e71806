"""The quantization front door: texelflow's PT2E `Quantizer` and `quantize(model, calibration_inputs)`.

torch 2.13 ships no PT2E quantizer for this backend, so texelflow brings one (torchao's PT2E flow:
export, `prepare_pt2e`, calibrate, `convert_pt2e`). It annotates the patterns the q8ta ops
implement, so that `convert_pt2e` leaves the canonical chains the fusion pass turns into q8ta ops:

    conv2d(dequantize_per_tensor(x_int8, scale, zero_point, -128, 127, torch.int8),
           dequantize_per_channel(w_int8, scales, zero_points, 0, -127, 127, torch.int8), bias)
      -> relu -> quantize_per_tensor(..., scale, zero_point, -128, 127, torch.int8)

Activations are per-tensor int8 ([-128, 127], affine unless `symmetric_activations`), weights are
per-channel symmetric int8 along axis 0 ([-127, 127]) and frozen as int8 constants, biases stay
float32 constants (not annotated). Anything not annotated stays float.

Activation observers: HistogramObserver by default, the choice of torchao's own static int8
quantizers: it searches the histogram for the range with the least quantization error, so one
outlier in the calibration set does not widen every step. `observer="minmax"` takes the plain
observed range instead (faster to calibrate, nothing clipped).

This module imports torchao: `texelflow.Quantizer` and `texelflow.quantize` load it on first use.
"""

from __future__ import annotations

import logging
from typing import Sequence

import torch
from torch.fx import GraphModule, Node


def _import_torchao():
    """torchao's PT2E modules, with the warnings its import logs (CUDA kernel libraries it cannot
    load here, a deprecation inside torch) kept out of the user's log: texelflow uses neither."""
    logs = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]
    levels = [log.level for log in logs]
    for log in logs:
        log.setLevel(logging.ERROR)
    try:
        from torchao.quantization.pt2e import observer
        from torchao.quantization.pt2e import quantize_pt2e
        from torchao.quantization.pt2e import quantizer as pt2e_quantizer
    except ImportError as exc:
        raise ImportError("texelflow's quantizer needs torchao==0.18.0 (pip install torchao==0.18.0)") from exc
    finally:
        for log, level in zip(logs, levels):
            log.setLevel(level)
    return observer, quantize_pt2e, pt2e_quantizer


_observer, _quantize_pt2e, _pt2e = _import_torchao()

_ANNOTATION = "quantization_annotation"  # the node.meta key PT2E reads annotations from

aten = torch.ops.aten
_CONVS = {aten.conv2d.default}
_LINEARS = {aten.linear.default}
_MATMULS = {aten.mm.default: 1, aten.matmul.default: 1, aten.addmm.default: 2}  # target -> weight arg
_TRANSPOSES = {aten.t.default, aten.transpose.int, aten.permute.default}
_ADDS = {aten.add.Tensor, aten.add_.Tensor}
_RELUS = {aten.relu.default, aten.relu_.default}
_RELU6S = {aten.relu6.default, aten.relu6_.default}
_HARDTANHS = {aten.hardtanh.default, aten.hardtanh_.default}
_HARDSWISHES = {aten.hardswish.default, aten.hardswish_.default}
_GELUS = {aten.gelu.default}  # the exact (erf) form only: approximate="tanh" stays a float op
_CLAMPS = _RELUS | _RELU6S | _HARDTANHS  # activations any fused q8ta op applies (as its output range)
_WEIGHTED_ACTIVATIONS = _CLAMPS | _HARDSWISHES | _GELUS  # the q8ta convs and linears also apply these
# ops that only move values or pick among them: output quantized like the input, no new observer
_SHARED = {
    aten.max_pool2d.default, aten.pixel_shuffle.default, aten.cat.default,
    aten.upsample_bilinear2d.vec, aten.upsample_nearest2d.vec,
    aten.view.default, aten.reshape.default, aten.flatten.using_ints, aten.permute.default,
    aten.transpose.int, aten.squeeze.dim, aten.unsqueeze.default, aten.clone.default,
}
# ops that average: the output's range is narrower than the input's, so it gets its own observer
_AVERAGING = {aten.avg_pool2d.default, aten.adaptive_avg_pool2d.default, aten.mean.dim}
_FOLLOWING = _SHARED | _AVERAGING
_Q8TA_MOVES = {aten.pixel_shuffle.default}  # a q8ta op: quantized whenever its input is
_OBSERVERS = ("histogram", "minmax")


class Quantizer(_pt2e.Quantizer):
    """PT2E quantizer for texelflow's q8ta ops (see the module docstring and docs/quantization.md).

    `per_channel`: weights per output channel (axis 0, symmetric, [-127, 127]); False gives one
    symmetric scale per weight tensor. `symmetric_activations`: activations with zero point 0
    instead of affine. `observer`: "histogram" (default) or "minmax" for activations."""

    def __init__(self, per_channel: bool = True, symmetric_activations: bool = False, observer: str = "histogram"):
        super().__init__()
        if observer not in _OBSERVERS:
            raise ValueError(f"Quantizer: observer must be one of {', '.join(_OBSERVERS)}, not {observer!r}")
        self.per_channel = bool(per_channel)
        self.symmetric_activations = bool(symmetric_activations)
        self.observer = observer
        act_observer = _observer.HistogramObserver if observer == "histogram" else _observer.MinMaxObserver
        self.activation_spec = _pt2e.QuantizationSpec(
            dtype=torch.int8, quant_min=-128, quant_max=127,
            qscheme=torch.per_tensor_symmetric if symmetric_activations else torch.per_tensor_affine,
            observer_or_fake_quant_ctr=act_observer.with_args())
        self.weight_spec = _pt2e.QuantizationSpec(
            dtype=torch.int8, quant_min=-127, quant_max=127,
            qscheme=torch.per_channel_symmetric if per_channel else torch.per_tensor_symmetric,
            ch_axis=0 if per_channel else None,
            observer_or_fake_quant_ctr=(_observer.PerChannelMinMaxObserver if per_channel
                                        else _observer.MinMaxObserver).with_args())

    def __repr__(self) -> str:
        return (f"texelflow.Quantizer(per_channel={self.per_channel}, "
                f"symmetric_activations={self.symmetric_activations}, observer={self.observer!r})")

    def annotate(self, model: GraphModule) -> GraphModule:
        """Compute patterns first (they own their observers), then the ops that follow a
        quantized tensor and keep its quantization; both in graph order."""
        for node in list(model.graph.nodes):
            if node.op == "call_function" and not _annotated(node):
                self._annotate_compute(node)
        for node in model.graph.nodes:
            if node.op == "call_function" and not _annotated(node):
                self._annotate_following(node)
        return model

    def validate(self, model: GraphModule) -> None:
        """Every annotation is made here from checked patterns: nothing left to refuse."""

    # ---- compute patterns: conv2d, linear, mm / matmul / addmm, add (each + relu), relu ------------
    def _annotate_compute(self, node: Node) -> None:
        target = node.target
        if target in _CONVS or target in _LINEARS:
            self._weighted(node, node.args[0], node.args[1], weight_user=node)
        elif target in _MATMULS:
            weight = node.args[_MATMULS[target]]
            if _is_transposed_constant(weight):  # x @ w.t(): observe w [N, K] itself, axis 0
                self._weighted(node, node.args[_MATMULS[target] - 1], weight.args[0], weight_user=weight)
        elif target in _ADDS:
            if all(_is_float_tensor(a) for a in node.args[:2]):
                self._with_activation(node, {node.args[0]: self.activation_spec, node.args[1]: self.activation_spec})
        elif target in _RELUS and _is_float_tensor(node.args[0]):
            _annotate(node, {node.args[0]: self.activation_spec}, self.activation_spec)

    def _weighted(self, node: Node, x, weight, weight_user: Node) -> None:
        """conv / linear / matmul with a constant weight: x per tensor, the weight per channel."""
        if not (_is_float_tensor(x) and _is_constant(weight)):
            return
        if weight_user is not node:  # the weight is observed before its transpose
            _annotate(weight_user, {weight: self.weight_spec}, None)
            self._with_activation(node, {x: self.activation_spec}, _WEIGHTED_ACTIVATIONS)
        else:
            self._with_activation(node, {x: self.activation_spec, weight: self.weight_spec}, _WEIGHTED_ACTIVATIONS)

    def _with_activation(self, node: Node, inputs: dict, activations=_CLAMPS) -> None:
        """Annotate `node`'s inputs; its output is quantized after an activation in `activations`
        (relu, relu6, hardtanh; hardswish or gelu after a conv or linear) that is its only user, so
        that no quantize sits between the op and its activation."""
        activation = _fused_activation(node, activations)
        if activation is None:
            _annotate(node, inputs, self.activation_spec)
        else:
            _annotate(node, inputs, None)
            _annotate(activation, {}, self.activation_spec)

    # ---- ops after a quantized tensor --------------------------------------------------------------
    def _annotate_following(self, node: Node) -> None:
        if node.target not in _FOLLOWING or (node.target not in _Q8TA_MOVES and not _feeds_quantized(node)):
            return  # only float ops read it: a quantize and a dequantize here would buy nothing
        if node.target is aten.cat.default:
            tensors = node.args[0]
            if tensors and all(_is_quantized(t) for t in tensors):
                first = tensors[0]  # every input and the output share the first input's observer
                shared = _pt2e.SharedQuantizationSpec((first, node))
                inputs = {t: shared for t in tensors[1:] if t is not first}
                _annotate(node, {first: self.activation_spec, **inputs}, shared)
        else:
            source = node.args[0]
            if not _is_quantized(source) or not _is_float_tensor(node):
                return
            shared = _pt2e.SharedQuantizationSpec(source)
            _annotate(node, {source: shared}, shared if node.target in _SHARED else self.activation_spec)


# ---- graph helpers ----------------------------------------------------------------------------------
def _annotate(node: Node, inputs: dict, output) -> None:
    node.meta[_ANNOTATION] = _pt2e.QuantizationAnnotation(input_qspec_map=inputs, output_qspec=output,
                                                          _annotated=True)


def _annotated(node: Node) -> bool:
    annotation = node.meta.get(_ANNOTATION)
    return annotation is not None and annotation._annotated


def _is_quantized(node) -> bool:
    """Whether `node`'s output is observed (so it is quantized after convert)."""
    return isinstance(node, Node) and _annotated(node) and node.meta[_ANNOTATION].output_qspec is not None


def _is_float_tensor(node) -> bool:
    value = node.meta.get("val") if isinstance(node, Node) else None
    return isinstance(value, torch.Tensor) and value.dtype.is_floating_point


def _is_constant(node) -> bool:
    return isinstance(node, Node) and node.op == "get_attr" and _is_float_tensor(node)


def _is_transposed_constant(node) -> bool:
    """`w.t()` (or transpose(0, 1), permute([1, 0])) of a constant 2-d weight [N, K]."""
    if not isinstance(node, Node) or node.op != "call_function" or node.target not in _TRANSPOSES:
        return False
    weight = node.args[0]
    if not _is_constant(weight) or weight.meta["val"].dim() != 2:
        return False
    if node.target is aten.transpose.int:
        return sorted(d % 2 for d in node.args[1:3]) == [0, 1]
    if node.target is aten.permute.default:
        return [d % 2 for d in node.args[1]] == [1, 0]
    return True


def _feeds_quantized(node: Node) -> bool:
    """Whether a consumer of `node` reads it quantized: a compute pattern annotated it as an input,
    or an op that keeps quantization passes it on to one."""
    for user in node.users:
        annotation = user.meta.get(_ANNOTATION)
        if annotation is not None and node in annotation.input_qspec_map:
            return True
        if annotation is None and user.op == "call_function" and user.target in _FOLLOWING and _feeds_quantized(user):
            return True
    return False


def _fused_activation(node: Node, activations):
    """The activation in `activations` (relu, relu6, hardtanh, hardswish, gelu's erf form; in place
    or not) that is `node`'s only user, else None: the fused q8ta op applies it (hardtanh's
    bounds, whatever they are, as its output range; hardswish and gelu in float before its
    quantize)."""
    if len(node.users) != 1:
        return None
    user = next(iter(node.users))
    if user.op != "call_function" or _annotated(user) or user.args[0] is not node:
        return None
    if user.target in _GELUS and user.kwargs.get("approximate", user.args[1] if len(user.args) > 1 else "none") != "none":
        return None
    return user if user.target in activations else None


# ---- quantize(): export, prepare, calibrate, convert -------------------------------------------------
def quantize(model, calibration_inputs, quantizer: Quantizer | None = None) -> GraphModule:
    """Quantize `model` with PT2E: export it, insert observers (`quantizer`, texelflow's own by
    default), run every calibration input through it, and convert. Returns the converted
    GraphModule (int8 weights frozen as constants), ready for `texelflow.compile(qmodel, inputs)`.

    `model`: an nn.Module (a GraphModule from `torch.export(...).module()` included), exported in
    inference mode through a shallow copy, never changed; or an ExportedProgram.
    `calibration_inputs`: a sequence of input tuples, one tuple per forward call (the first also
    gives the shapes to export with); a single tuple of tensors, or a single tensor, is one call.
    Calibrate with inputs like the ones the model will see: they set every activation's range."""
    calibration = _calibration_set(calibration_inputs)
    if quantizer is None:
        quantizer = Quantizer()
    elif not isinstance(quantizer, _pt2e.Quantizer):
        raise TypeError(f"quantize: quantizer must be a torchao PT2E Quantizer, not a {type(quantizer).__name__}")
    exported = _export(model, calibration[0])
    prepared = _quantize_pt2e.prepare_pt2e(exported, quantizer)
    with torch.no_grad():
        for args in calibration:
            prepared(*args)
    return _quantize_pt2e.convert_pt2e(prepared, fold_quantize=True)


def _calibration_set(calibration_inputs) -> list[tuple]:
    """One tuple of tensors per forward call; a lone tuple of tensors (or tensor) is one call."""
    from texelflow.runtime.errors import InputTypeError, InputValueError

    if isinstance(calibration_inputs, torch.Tensor) or (
            isinstance(calibration_inputs, tuple) and calibration_inputs
            and all(isinstance(x, torch.Tensor) for x in calibration_inputs)):
        calibration_inputs = [calibration_inputs]
    if not isinstance(calibration_inputs, Sequence) or isinstance(calibration_inputs, (str, bytes)):
        raise InputTypeError(f"quantize: calibration_inputs must be a sequence of input tuples, "
                             f"not a {type(calibration_inputs).__name__}")
    if len(calibration_inputs) == 0:
        raise InputValueError("quantize: calibration_inputs is empty; give at least one input tuple")
    calls = []
    for i, args in enumerate(calibration_inputs):
        args = (args,) if isinstance(args, torch.Tensor) else args
        if not isinstance(args, (tuple, list)):
            raise InputTypeError(f"quantize: calibration_inputs[{i}] must be a tuple of tensors, "
                                 f"not a {type(args).__name__}")
        if not args:
            raise InputValueError(f"quantize: calibration_inputs[{i}] is empty; give the model's inputs")
        for j, x in enumerate(args):
            if not isinstance(x, torch.Tensor):
                raise InputTypeError(f"quantize: calibration_inputs[{i}][{j}] is a {type(x).__name__}, not a tensor")
        calls.append(tuple(args))
    return calls


def _export(model, example_args: tuple) -> GraphModule:
    """The GraphModule prepare_pt2e takes, exported from a copy of `model` in inference mode."""
    from texelflow.runtime.errors import UnsupportedModelError
    from texelflow.runtime.graph.importer import inference_copy

    if isinstance(model, torch.export.ExportedProgram):
        exported = model.module()
    elif not isinstance(model, torch.nn.Module):
        raise UnsupportedModelError(f"quantize: model must be an nn.Module or a torch.export ExportedProgram, "
                                    f"not a {type(model).__name__}")
    else:
        try:
            exported = torch.export.export(inference_copy(model), example_args).module()
        except Exception as exc:  # torch's own error stays attached as __cause__
            first = (str(exc).strip().splitlines() or [""])[0]
            raise UnsupportedModelError(f"quantize: torch.export could not export the model: "
                                        f"{type(exc).__name__}: {first}") from exc
    for node in exported.graph.nodes:
        if node.op == "call_function" and str(node.target).startswith("quantized_decomposed."):
            raise UnsupportedModelError(f"quantize: the model is quantized already (node {node.name}: "
                                        f"{node.target}); compile it as it is")
    return exported
