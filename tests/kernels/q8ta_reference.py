"""PyTorch references of the q8ta ops (docs/quantization.md): dequantize the int8 inputs, run
the float op, quantize the result with the output's parameters, exactly as PT2E's reference graph
computes it. The kernel tests (nodecheck.NO_TORCH_TARGET) call these with the sample's arguments."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import torchao.quantization.pt2e  # noqa: F401  registers torch.ops.quantized_decomposed


def quantize(x: torch.Tensor, scale: float, zero_point: int, quant_min: int, quant_max: int) -> torch.Tensor:
    return torch.ops.quantized_decomposed.quantize_per_tensor.default(
        x.float(), scale, zero_point, quant_min, quant_max, torch.int8)


def dequantize(q: torch.Tensor, scale: float, zero_point: int) -> torch.Tensor:
    return torch.ops.quantized_decomposed.dequantize_per_tensor.default(q, scale, zero_point, -128, 127, torch.int8)


def quantize_dequantize(self, scale, zero_point, quant_min=-128, quant_max=127):
    """The quantize_dequantize op: dequantize(quantize(x)) with one quantization."""
    q = quantize(self, scale, zero_point, quant_min, quant_max)
    return torch.ops.quantized_decomposed.dequantize_per_tensor.default(q, scale, zero_point, quant_min, quant_max,
                                                                         torch.int8)


def dynamic_quantize_dequantize(self, observed_min, observed_max, quant_min=-128, quant_max=127,
                                eps=0.000244140625):
    """The dynamic_quantize_dequantize op: torch's choose_qparams.tensor of a tensor whose minimum
    and maximum are the observed ones, then quantize_per_tensor.tensor and dequantize_per_tensor.tensor
    with the parameters it gives, as a dynamically quantized PT2E graph computes them."""
    dtype = torch.uint8 if quant_max > 127 else torch.int8
    observed = torch.stack([observed_min.float().reshape(()), observed_max.float().reshape(())])
    ops = torch.ops.quantized_decomposed
    scale, zero_point = ops.choose_qparams.tensor(observed, quant_min, quant_max, eps, dtype)
    q = ops.quantize_per_tensor.tensor(self.float(), scale, zero_point, quant_min, quant_max, dtype)
    return ops.dequantize_per_tensor.tensor(q, scale, zero_point, quant_min, quant_max, dtype)


def dequantize_weight(weight, weight_scales, weight_zero_points) -> torch.Tensor:
    """Per-channel dequantization along dim 0 (zero points 0 when absent)."""
    zp = weight_zero_points if weight_zero_points is not None else torch.zeros(weight.shape[0], dtype=torch.int64)
    return torch.ops.quantized_decomposed.dequantize_per_channel.default(
        weight, weight_scales.float(), zp.to(torch.int64), 0, -128, 127, torch.int8)


def _activation(y: torch.Tensor, activation: str) -> torch.Tensor:
    if activation == "hardswish":
        return torch.nn.functional.hardswish(y)
    if activation == "gelu":
        return torch.nn.functional.gelu(y)
    return torch.relu(y) if activation == "relu" else y


def q8ta_add(self, other, self_scale, self_zero_point, other_scale, other_zero_point, out_scale, out_zero_point,
             quant_min=-128, quant_max=127, alpha=1.0, activation="none"):
    y = dequantize(self, self_scale, self_zero_point) + alpha * dequantize(other, other_scale, other_zero_point)
    return quantize(_activation(y, activation), out_scale, out_zero_point, quant_min, quant_max)


def q8ta_relu(self, self_scale, self_zero_point, out_scale, out_zero_point, quant_min=-128, quant_max=127):
    y = torch.relu(dequantize(self, self_scale, self_zero_point))
    return quantize(y, out_scale, out_zero_point, quant_min, quant_max)


def q8ta_pixel_shuffle(self, upscale_factor, self_scale, self_zero_point, out_scale, out_zero_point,
                       quant_min=-128, quant_max=127):
    y = F.pixel_shuffle(dequantize(self, self_scale, self_zero_point), upscale_factor)
    return quantize(y, out_scale, out_zero_point, quant_min, quant_max)


def q8ta_linear(input, weight, weight_scales, weight_zero_points=None, bias=None, input_scale=1.0,
                input_zero_point=0, out_scale=1.0, out_zero_point=0, quant_min=-128, quant_max=127,
                activation="none"):
    y = F.linear(dequantize(input, input_scale, input_zero_point),
                 dequantize_weight(weight, weight_scales, weight_zero_points),
                 bias.float() if bias is not None else None)
    return quantize(_activation(y, activation), out_scale, out_zero_point, quant_min, quant_max)


q8ta_linear_gemv = q8ta_linear


def q8ta_conv2d(input, weight, weight_scales, weight_zero_points=None, bias=None, stride=(1, 1), padding=(0, 0),
                dilation=(1, 1), groups=1, input_scale=1.0, input_zero_point=0, out_scale=1.0, out_zero_point=0,
                quant_min=-128, quant_max=127, activation="none"):
    y = F.conv2d(dequantize(input, input_scale, input_zero_point),
                 dequantize_weight(weight, weight_scales, weight_zero_points),
                 bias.float() if bias is not None else None, stride, padding, dilation, groups)
    return quantize(_activation(y, activation), out_scale, out_zero_point, quant_min, quant_max)


q8ta_conv2d_im2col = q8ta_conv2d


def q8ta_max_pool2d(self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    """max_pool2d of the integers (exact: quantizing is monotone)."""
    return F.max_pool2d(self.float(), kernel_size, stride or None, padding, dilation, ceil_mode).to(torch.int8)
