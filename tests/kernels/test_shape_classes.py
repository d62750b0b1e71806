"""Shape classes (plan-time specialization constants) of the elementwise kernels: lowering picks
the class each node is in, and the kernel is right in that class and on the general path alike.

Each case is a one-node plan graph lowered by runtime.lower_dispatch.node_dispatches (the code
programs use). It checks the shape classes lowering gives against the ones expected (direct
and broadcast inputs, a word count or row not a multiple of the span, a packed dim not a
multiple of 4, a reshape that keeps the units, rank 5), then runs the kernel twice in one
Program: specialised with those classes, and as a bare dispatch with the general defaults.
Both must match torch (NaN, +Inf and -Inf injected into the float inputs) and keep padding zero.
"""
from __future__ import annotations

import numpy as np
import pytest

from texelflow.generated.layouts import Layout, Storage
from texelflow.generated.ops import OPS
from texelflow.generated.variants import VARIANTS
from texelflow.runtime.graph.repr import TensorRepr
from texelflow.runtime.lower_dispatch import node_dispatches
from texelflow.runtime.vulkan.program import Dispatch, Program, invocations
from texelflow.runtime.vulkan.tensor import VkTensor
from texelflow.shaders.geometry import units as geometry_units
from texelflow.shaders.node_rules import list_slab_shape

from .nodecheck import (
    SPECIALS,
    Output,
    assert_matches,
    assert_padding_zero,
    build_node,
    explicit_case,
    inject_specials,
    padding_mask,
    raw_elements,
)

BUF_WP = TensorRepr(Storage.BUFFER, Layout.WIDTH_PACKED)
BUF_CP = TensorRepr(Storage.BUFFER, Layout.CHANNELS_PACKED)
BUF_HP = TensorRepr(Storage.BUFFER, Layout.HEIGHT_PACKED)
TEX_CP = TensorRepr(Storage.TEXTURE_3D, Layout.CHANNELS_PACKED)
TEX_WP = TensorRepr(Storage.TEXTURE_3D, Layout.WIDTH_PACKED)

# (id, op, sample (tensors as shapes), representation of every tensor, expected shape classes)
CASES = [
    # binary: each input's read class (1 direct, 2 a row along out's packed dim, 3 a single
    # element, 0 general broadcast); 16 words per invocation in buffers
    ("add-direct-tail", "add", {"self": [2, 3, 5, 7], "other": [2, 3, 5, 7], "alpha": 2.0}, BUF_WP,
     {"a_class": 1, "b_class": 1, "tail": 1, "ragged": 1, "rows4": 0, "findex": 1}),  # 210 words: 13 spans and 2 words
    ("add-direct-whole-spans", "add", {"self": [4, 8, 16], "other": [4, 8, 16], "alpha": 1.0}, BUF_WP,
     {"a_class": 1, "b_class": 1, "tail": 0, "ragged": 0, "rows4": 1, "findex": 1}),
    ("add-row-bias", "add", {"self": [2, 5, 3, 7], "other": [7], "alpha": 1.0}, BUF_WP,
     {"a_class": 1, "b_class": 2, "tail": 1, "ragged": 1, "rows4": 0, "findex": 1}),
    ("add-row-bias-vec4", "add", {"self": [2, 3, 5, 8], "other": [8], "alpha": -1.0}, BUF_WP,
     {"a_class": 1, "b_class": 2, "tail": 0, "ragged": 0, "rows4": 0, "findex": 1}),
    ("add-channel-bias-nhwc", "add", {"self": [2, 6, 3, 5], "other": [6, 1, 1], "alpha": 1.0}, BUF_CP,
     {"a_class": 1, "b_class": 2, "tail": 1, "ragged": 1, "rows4": 0, "findex": 1}),
    ("mul-channel-scale-nhwc-vec4", "mul", {"self": [1, 8, 3, 5], "other": [8, 1, 1]}, BUF_CP,
     {"a_class": 1, "b_class": 2, "tail": 1, "ragged": 0, "rows4": 0, "findex": 1}),
    ("add-zero-dim-tensor", "add", {"self": [3, 5, 7], "other": [], "alpha": 1.0}, BUF_WP,
     {"a_class": 1, "b_class": 3, "tail": 1, "ragged": 1, "rows4": 0, "findex": 1}),
    ("div-by-single-vec4", "div", {"self": [2, 4, 8], "other": [1]}, BUF_WP,
     {"a_class": 1, "b_class": 3, "tail": 0, "ragged": 0, "rows4": 1, "findex": 1}),
    # the row block path (one `%` per invocation, the row offset stepped with a wrap): rows
    # shorter than a vec4 that wrap inside one, a row on the left, rows of 4, rank 5, many spans
    ("add-row-3-wraps-in-vec4-rank5", "add", {"self": [2, 1, 3, 2, 3], "other": [3], "alpha": 0.5}, BUF_WP,
     {"a_class": 1, "b_class": 2, "tail": 1, "ragged": 1, "rows4": 0, "findex": 1}),
    ("mul-row-left-5", "mul", {"self": [5], "other": [3, 7, 5]}, BUF_WP,
     {"a_class": 2, "b_class": 1, "tail": 1, "ragged": 1, "rows4": 0, "findex": 1}),
    ("sub-row-4-tail", "sub", {"self": [3, 5, 4], "other": [4], "alpha": 1.0}, BUF_WP,
     {"a_class": 1, "b_class": 2, "tail": 1, "ragged": 0, "rows4": 0, "findex": 1}),
    ("add-row-33-many-spans", "add", {"self": [1, 7, 33], "other": [33], "alpha": 1.0}, BUF_WP,
     {"a_class": 1, "b_class": 2, "tail": 1, "ragged": 1, "rows4": 0, "findex": 1}),
    # `rows4`: one vec4 column of 4 rows per invocation, the row operand read once
    ("add-row-bias-columns", "add", {"self": [2, 4, 3, 8], "other": [8], "alpha": 2.0}, BUF_WP,
     {"a_class": 1, "b_class": 2, "tail": 0, "ragged": 0, "rows4": 1, "findex": 1}),
    ("mul-channel-scale-nhwc-columns", "mul", {"self": [1, 12, 4, 5], "other": [12, 1, 1]}, BUF_CP,
     {"a_class": 1, "b_class": 2, "tail": 0, "ragged": 0, "rows4": 1, "findex": 1}),
    ("sub-row-columns-rank5", "sub", {"self": [2, 2, 2, 3, 8], "other": [8], "alpha": 1.0}, BUF_WP,
     {"a_class": 1, "b_class": 2, "tail": 0, "ragged": 0, "rows4": 1, "findex": 1}),
    ("div-row-12-whole-spans", "div", {"self": [12], "other": [4, 1, 12]}, BUF_WP,
     {"a_class": 2, "b_class": 1, "tail": 0, "ragged": 0, "rows4": 1, "findex": 1}),
    # runs (4 + mode + 3 with a second run; mode 0 one input word a vec4 word of out, 1 one
    # input vec4, 2 lane by lane): out's words in dim-order runs the input keeps or broadcasts
    ("mul-broadcast-both-lanes-nhwc", "mul", {"self": [3, 1, 7], "other": [5, 1]}, BUF_CP,
     {"a_class": 6, "b_class": 6, "tail": 1, "ragged": 1, "rows4": 0, "findex": 1}),
    ("mul-per-sample-channel-scale", "mul", {"self": [2, 4, 3, 8], "other": [2, 4, 1, 1]}, BUF_WP,
     {"a_class": 1, "b_class": 4, "tail": 0, "ragged": 0, "rows4": 1, "findex": 1}),  # GroupNorm's scale
    ("mul-keepdim-row-statistic", "mul", {"self": [2, 7, 12], "other": [2, 7, 1]}, BUF_WP,
     {"a_class": 1, "b_class": 4, "tail": 1, "ragged": 0, "rows4": 0, "findex": 1}),  # RMSNorm's rsqrt
    ("add-plane-over-batches", "add", {"self": [3, 5, 8], "other": [5, 8], "alpha": 1.0}, BUF_WP,
     {"a_class": 1, "b_class": 5, "tail": 1, "ragged": 0, "rows4": 0, "findex": 1}),  # a position table
    ("sub-two-runs-scalar", "sub", {"self": [2, 3, 4, 8], "other": [2, 1, 4, 1], "alpha": 1.0}, BUF_WP,
     {"a_class": 1, "b_class": 7, "tail": 0, "ragged": 0, "rows4": 1, "findex": 1}),
    ("div-two-runs-vec4", "div", {"self": [2, 1, 5, 8], "other": [2, 3, 5, 8]}, BUF_WP,
     {"a_class": 8, "b_class": 1, "tail": 0, "ragged": 0, "rows4": 0, "findex": 1}),
    ("mul-channel-scale-hp-lanes", "mul", {"self": [1, 6, 5, 7], "other": [1, 6, 1, 1]}, BUF_HP,
     {"a_class": 1, "b_class": 6, "tail": 1, "ragged": 1, "rows4": 0, "findex": 1}),
    ("mul-channel-scale-hp-scalar", "mul", {"self": [1, 6, 4, 8], "other": [1, 6, 1, 1]}, BUF_HP,
     {"a_class": 1, "b_class": 4, "tail": 0, "ragged": 0, "rows4": 1, "findex": 1}),
    ("mul-one-element", "mul", {"self": [1], "other": [1]}, BUF_WP,
     {"a_class": 1, "b_class": 1, "tail": 1, "ragged": 1, "rows4": 0, "findex": 1}),
    ("add-rank5-direct", "add", {"self": [2, 1, 3, 2, 5], "other": [2, 1, 3, 2, 5], "alpha": 1.0}, BUF_WP,
     {"a_class": 1, "b_class": 1, "tail": 1, "ragged": 1, "rows4": 0, "findex": 1}),
    ("add-rank5-broadcast", "add", {"self": [2, 2, 3, 1, 5], "other": [3, 2, 1], "alpha": 1.0}, BUF_WP,
     {"a_class": 9, "b_class": 6, "tail": 1, "ragged": 1, "rows4": 0, "findex": 1}),  # out [2, 2, 3, 2, 5]: 120 words
    # textures: 4 texels of a row per invocation; `tail` when the x extent is not a multiple of 4
    ("add-texture-ragged", "add", {"self": [2, 5, 3, 7], "other": [2, 5, 3, 7], "alpha": 1.0}, TEX_CP,
     {"a_class": 1, "b_class": 1, "tail": 1, "ragged": 1, "rows4": 0, "findex": 1}),
    ("mul-texture-packed-div4", "mul", {"self": [1, 8, 3, 8], "other": [1, 8, 3, 8]}, TEX_CP,
     {"a_class": 1, "b_class": 1, "tail": 0, "ragged": 0, "rows4": 0, "findex": 1}),
    ("mul-texture-row-tail", "mul", {"self": [1, 8, 3, 6], "other": [1, 8, 3, 6]}, TEX_CP,
     {"a_class": 1, "b_class": 1, "tail": 1, "ragged": 0, "rows4": 0, "findex": 1}),
    ("mul-texture-channel-scale", "mul", {"self": [1, 6, 5, 7], "other": [1, 6, 1, 1]}, TEX_CP,
     {"a_class": 1, "b_class": 2, "tail": 1, "ragged": 1, "rows4": 0, "findex": 1}),  # MobileNetV3's squeeze-excitation
    ("mul-texture-channel-scale-batch2", "mul", {"self": [1, 8, 1, 1], "other": [2, 8, 3, 4]}, TEX_CP,
     {"a_class": 2, "b_class": 1, "tail": 0, "ragged": 0, "rows4": 0, "findex": 1}),
    ("add-texture-row-wp", "add", {"self": [3, 5, 9], "other": [9], "alpha": 1.0}, TEX_WP,
     {"a_class": 1, "b_class": 2, "tail": 1, "ragged": 1, "rows4": 0, "findex": 1}),
    ("add-texture-single", "add", {"self": [2, 5, 3, 7], "other": [1], "alpha": 1.0}, TEX_CP,
     {"a_class": 1, "b_class": 3, "tail": 1, "ragged": 1, "rows4": 0, "findex": 1}),
    ("sub-texture-broadcast", "sub", {"self": [1, 3, 1, 5], "other": [2, 1, 7, 1], "alpha": 1.0}, TEX_WP,
     {"a_class": 0, "b_class": 0, "tail": 1, "ragged": 1, "rows4": 0, "findex": 1}),  # x extent ceil(5 / 4) = 2: a partial span
    ("sub-texture-broadcast-whole-spans", "sub", {"self": [1, 3, 1, 13], "other": [2, 1, 7, 1], "alpha": 1.0}, TEX_WP,
     {"a_class": 0, "b_class": 0, "tail": 0, "ragged": 1, "rows4": 0, "findex": 1}),  # x extent ceil(13 / 4) = 4
    # unary: 16 words or 4 texels of a row per invocation
    ("relu-buffer-tail", "relu", {"self": [3, 5, 7]}, BUF_WP, {"tail": 1, "ragged": 1}),
    ("exp-buffer-whole", "exp", {"self": [2, 4, 8]}, BUF_WP, {"tail": 0, "ragged": 0}),
    ("sigmoid-rank5", "sigmoid", {"self": [2, 1, 3, 2, 5]}, BUF_WP, {"tail": 1, "ragged": 1}),
    ("relu-texture-ragged", "relu", {"self": [2, 5, 3, 7]}, TEX_CP, {"tail": 1, "ragged": 1}),
    ("exp-texture-div4", "exp", {"self": [1, 4, 3, 8]}, TEX_CP, {"tail": 0, "ragged": 0}),  # 4 texels a span
    ("exp-texture-row-tail", "exp", {"self": [1, 4, 3, 6]}, TEX_CP, {"tail": 1, "ragged": 0}),
    # buffers with whole spans interleave vec4 words across the invocations (word u + j * g)
    ("sigmoid-buffer-interleaved", "sigmoid", {"self": [3, 16, 32]}, BUF_WP,
     {"tail": 0, "ragged": 0}),
    # select: `units_match` when the removed dim lies above the packed one (whole texels / vec4 words)
    ("select-qkv-units", "select", {"self": [3, 1, 2, 7, 8], "dim": 0, "index": 1},
     BUF_WP, {"units_match": 1, "tail": 0, "findex": 1}),
    ("select-qkv-rows-of-16", "select", {"self": [3, 1, 2, 5, 16], "dim": 0, "index": 2},
     BUF_WP, {"units_match": 2, "tail": 0, "findex": 1}),
    ("select-units-partial-span", "select", {"self": [2, 3, 1, 4], "dim": 1, "index": 0},
     BUF_WP, {"units_match": 1, "tail": 1, "findex": 1}),
    ("select-texture-units", "select", {"self": [2, 6, 5, 3], "dim": 2, "index": -2},
     TEX_WP, {"units_match": 1, "tail": 1, "findex": 1}),
    ("select-texture-cp-units", "select", {"self": [2, 6, 5, 3], "dim": 0, "index": 1},
     TEX_CP, {"units_match": 1, "tail": 1, "findex": 1}),
    ("select-packed-dim", "select", {"self": [2, 3, 5, 7], "dim": 3, "index": 4},
     BUF_WP, {"units_match": 0, "tail": 1, "findex": 1}),
    ("select-buffer-ragged-row", "select", {"self": [2, 3, 5, 7], "dim": 1, "index": 2},
     BUF_WP, {"units_match": 0, "tail": 1, "findex": 1}),
    # slice: `units_match` off the packed dim, or along it with step 1 from a multiple of 4
    ("slice-video-frames-rank5", "slice", {"self": [2, 7, 3, 5, 8], "dim": 1, "start": 1, "end": 6, "step": 2},
     BUF_WP, {"units_match": 1, "tail": 0, "findex": 1}),
    ("slice-channels-rows-of-16", "slice", {"self": [2, 9, 3, 16], "dim": 1, "start": -5, "end": 100, "step": 1},
     BUF_WP, {"units_match": 2, "tail": 0, "findex": 1}),
    ("slice-packed-from-4", "slice", {"self": [3, 5, 12], "dim": -1, "start": 4, "end": 12, "step": 1},
     BUF_WP, {"units_match": 1, "tail": 1, "findex": 1}),
    ("slice-packed-nhwc-buffer", "slice", {"self": [2, 8, 3, 5], "dim": 1, "start": 4, "end": 8, "step": 1},
     BUF_CP, {"units_match": 1, "tail": 1, "findex": 1}),
    ("slice-packed-step-2", "slice", {"self": [3, 5, 12], "dim": 2, "start": 4, "end": 12, "step": 2},
     BUF_WP, {"units_match": 0, "tail": 1, "findex": 1}),
    ("slice-packed-from-3", "slice", {"self": [3, 5, 12], "dim": 2, "start": 3, "end": 11, "step": 1},
     BUF_WP, {"units_match": 0, "tail": 1, "findex": 1}),
    ("slice-buffer-ragged-row", "slice", {"self": [2, 6, 5, 7], "dim": 1, "start": 1, "end": 4, "step": 1},
     BUF_WP, {"units_match": 0, "tail": 1, "findex": 1}),
    ("slice-texture-off-packed", "slice", {"self": [2, 6, 5, 7], "dim": 3, "start": 2, "end": 7, "step": 2},
     TEX_CP, {"units_match": 1, "tail": 1, "findex": 1}),
    ("slice-texture-packed-to-end", "slice", {"self": [2, 7, 5, 3], "dim": 1, "start": 4, "end": 7, "step": 1},
     TEX_CP, {"units_match": 1, "tail": 1, "findex": 1}),  # out's padding lane is self's
    ("slice-texture-packed-ragged-end", "slice", {"self": [2, 9, 5, 3], "dim": 1, "start": 0, "end": 7, "step": 1},
     TEX_CP, {"units_match": 0, "tail": 1, "findex": 1}),  # out's padding lane would be self's channel 7
    # constant_pad_nd: `units_match` when nothing is padded along the packed dim
    ("pad-video-frames-rank5", "constant_pad_nd",
     {"self": [2, 5, 3, 2, 8], "pad": [0, 0, 1, 2, 0, 0, 2, 1], "value": 0.0},
     BUF_WP, {"units_match": 1, "tail": 0, "findex": 1}),
    ("pad-rows-of-16-neg-inf", "constant_pad_nd", {"self": [2, 3, 5, 16], "pad": [0, 0, 1, 1], "value": float("-inf")},
     BUF_WP, {"units_match": 2, "tail": 0, "findex": 1}),
    ("pad-crop-off-packed", "constant_pad_nd", {"self": [1, 6, 3, 4], "pad": [0, 0, -1, 1, 1, -2], "value": 1.5},
     BUF_WP, {"units_match": 1, "tail": 1, "findex": 1}),
    ("pad-packed-dim", "constant_pad_nd", {"self": [2, 3, 5, 8], "pad": [1, 3], "value": 2.0},
     BUF_WP, {"units_match": 0, "tail": 1, "findex": 1}),
    ("pad-texture-fill-ragged-packed", "constant_pad_nd", {"self": [2, 3, 5, 7], "pad": [0, 0, 2, 1], "value": -3.0},
     TEX_WP, {"units_match": 0, "tail": 0, "findex": 1}),  # a fill texel's padding lane must stay 0
    ("pad-texture-negative-zero-fill", "constant_pad_nd", {"self": [2, 3, 5, 7], "pad": [0, 0, 2, 1], "value": -0.0},
     TEX_WP, {"units_match": 0, "tail": 0, "findex": 1}),  # -0.0 in a padding lane is not +0
    ("pad-texture-zero-fill", "constant_pad_nd", {"self": [2, 3, 5, 7], "pad": [0, 0, 2, 1], "value": 0.0},
     TEX_WP, {"units_match": 1, "tail": 0, "findex": 1}),
    ("pad-texture-cp", "constant_pad_nd", {"self": [2, 8, 5, 7], "pad": [1, 2, 0, 1], "value": -1.0},
     TEX_CP, {"units_match": 1, "tail": 0, "findex": 1}),
    ("pad-texture-cp-row-tail", "constant_pad_nd", {"self": [2, 8, 5, 7], "pad": [1, 1, 0, 1], "value": -1.0},
     TEX_CP, {"units_match": 1, "tail": 1, "findex": 1}),
    # copies
    ("clone-buffer", "clone", {"self": [2, 3, 5, 7]},
     BUF_CP, {"same_units": 1, "same_shape": 1, "transpose": 0, "tail": 1, "findex": 1}),
    ("clone-texture", "clone", {"self": [2, 5, 3, 7]},
     TEX_CP, {"same_units": 1, "same_shape": 1, "transpose": 0, "tail": 1, "findex": 1}),
    ("clone-rank5", "clone", {"self": [2, 1, 3, 2, 8]},
     BUF_WP, {"same_units": 1, "same_shape": 1, "transpose": 0, "tail": 0, "findex": 1}),
    ("view-contiguous", "view_copy", {"self": [2, 3, 5, 7], "size": [6, 35]}, BUF_WP,
     {"same_units": 1, "same_shape": 0, "transpose": 0, "tail": 1, "findex": 1}),
    ("view-channels-packed-reshape", "view_copy", {"self": [2, 3, 5, 7], "size": [2, 3, 35]}, BUF_CP,
     {"same_units": 0, "same_shape": 0, "transpose": 0, "tail": 1, "findex": 1}),
]

# to_layout between two representations: (id, shape, in repr, out repr, expected classes)
TRANSITIONS = [
    # 4 x 4 blocks (`transpose`): the packed dims differ, buffer sides hold whole vec4 words
    ("buffer-wp-to-texture-cp-blocks", [2, 5, 3, 8], BUF_WP, TEX_CP,
     {"same_units": 0, "same_shape": 1, "transpose": 1, "tail": 0, "findex": 1}),
    ("texture-cp-to-buffer-wp-blocks", [1, 8, 3, 8], TEX_CP, BUF_WP,
     {"same_units": 0, "same_shape": 1, "transpose": 1, "tail": 0, "findex": 1}),
    ("buffer-wp-to-buffer-cp-blocks", [2, 8, 1, 4], BUF_WP, BUF_CP,
     {"same_units": 0, "same_shape": 1, "transpose": 1, "tail": 0, "findex": 1}),
    ("buffer-hp-to-buffer-wp-blocks", [1, 8, 12], TensorRepr(Storage.BUFFER, Layout.HEIGHT_PACKED), BUF_WP,
     {"same_units": 0, "same_shape": 1, "transpose": 1, "tail": 0, "findex": 1}),
    ("texture-wp-to-texture-cp-blocks", [1, 3, 4, 8], TEX_WP, TEX_CP,
     {"same_units": 0, "same_shape": 1, "transpose": 1, "tail": 0, "findex": 1}),
    ("texture-wp-to-texture-cp-row-tail", [2, 6, 3, 7], TEX_WP, TEX_CP,  # 7 texels a row: 4 + a tail of 3
     {"same_units": 0, "same_shape": 1, "transpose": 1, "tail": 1, "findex": 1}),
    # blocks from a buffer whose W is not whole vec4 words: gathered word by word (`transpose` 2),
    # each row's last block storing only the texels inside W
    ("buffer-wp-to-texture-cp-gathered", [2, 5, 3, 7], BUF_WP, TEX_CP,
     {"same_units": 0, "same_shape": 1, "transpose": 2, "tail": 1, "findex": 1}),
    ("buffer-wp-to-texture-cp-gathered-w1", [1, 6, 5, 1], BUF_WP, TEX_CP,
     {"same_units": 0, "same_shape": 1, "transpose": 2, "tail": 1, "findex": 1}),
    # the element path: a buffer side that is not whole vec4 words, or a texture's x not the input's packed dim
    ("buffer-cp-to-texture-cp", [2, 5, 3, 7], BUF_CP, TEX_CP,
     {"same_units": 0, "same_shape": 1, "transpose": 0, "tail": 1, "findex": 1}),
    ("texture-cp-to-buffer-wp", [2, 5, 3, 7], TEX_CP, BUF_WP,
     {"same_units": 0, "same_shape": 1, "transpose": 0, "tail": 1, "findex": 1}),
    ("buffer-wp-to-buffer-cp", [1, 6, 1, 5], BUF_WP, BUF_CP,
     {"same_units": 0, "same_shape": 1, "transpose": 0, "tail": 1, "findex": 1}),
    ("rank5-buffer-cp-to-wp", [2, 1, 3, 4, 8], BUF_CP, BUF_WP,
     {"same_units": 0, "same_shape": 1, "transpose": 0, "tail": 0, "findex": 1}),  # C = 3: not whole words
    # channels-packed -> width-packed textures with C % 4 == 0: input texels along W read once, any W
    ("texture-cp-to-texture-wp", [1, 8, 3, 8], TEX_CP, TEX_WP,  # x extent 8 / 4 = 2: a partial span
     {"same_units": 0, "same_shape": 1, "transpose": 1, "tail": 1, "findex": 1}),
    ("texture-cp-to-texture-wp-whole", [2, 8, 3, 64], TEX_CP, TEX_WP,  # x extent 16: whole chunks
     {"same_units": 0, "same_shape": 1, "transpose": 1, "tail": 0, "findex": 1}),
    ("texture-cp-to-texture-wp-ragged-c", [2, 5, 3, 7], TEX_CP, TEX_WP,  # C % 4 != 0: the element path
     {"same_units": 0, "same_shape": 1, "transpose": 0, "tail": 1, "findex": 1}),
    ("texture-cp-to-texture-wp-c3", [3, 3, 5, 29], TEX_CP, TEX_WP,  # C % 4 != 0: the element path
     {"same_units": 0, "same_shape": 1, "transpose": 0, "tail": 0, "findex": 1}),
    ("texture-cp-to-texture-wp-c8-w1", [2, 8, 4, 1], TEX_CP, TEX_WP,  # one texel a row
     {"same_units": 0, "same_shape": 1, "transpose": 1, "tail": 1, "findex": 1}),
    ("texture-cp-to-texture-wp-c4-w17", [3, 4, 2, 17], TEX_CP, TEX_WP,  # x extent 5: a chunk of 1
     {"same_units": 0, "same_shape": 1, "transpose": 1, "tail": 1, "findex": 1}),
]

# permute between two representations: (id, shape, dims, in repr, out repr, expected classes)
PERMUTES = [
    # `units_match`: dims take out's packed dim to self's, so texels / vec4 words move whole
    ("convnext-nchw-to-nhwc-textures", [1, 6, 3, 5], [0, 2, 3, 1], TEX_CP,
     TEX_WP, {"units_match": 1, "tail": 0, "findex": 1}),
    ("convnext-nhwc-to-nchw-textures", [2, 3, 5, 7], [0, 3, 1, 2], TEX_WP,
     TEX_CP, {"units_match": 1, "tail": 1, "findex": 1}),
    ("vit-head-transpose-buffers", [1, 3, 5, 8], [0, 2, 1, 3], BUF_WP,
     BUF_WP, {"units_match": 1, "tail": 1, "findex": 1}),
    ("vit-head-transpose-rows-of-16", [1, 3, 5, 16], [0, 2, 1, 3], BUF_WP,
     BUF_WP, {"units_match": 2, "tail": 0, "findex": 1}),
    ("vit-qkv-rank5-buffers", [1, 5, 3, 2, 8], [2, 0, 3, 1, 4], BUF_WP,
     BUF_WP, {"units_match": 1, "tail": 0, "findex": 1}),
    ("wp-buffer-to-nhwc-buffer", [2, 3, 5, 4], [0, 3, 1, 2], BUF_WP,
     BUF_CP, {"units_match": 1, "tail": 1, "findex": 1}),
    # the element path: the packed dim moves, a buffer row not whole vec4 words, or mixed storages
    ("textures-packed-dim-moves", [2, 3, 5, 7], [0, 2, 3, 1], TEX_WP,
     TEX_WP, {"units_match": 0, "tail": 1, "findex": 1}),
    ("buffer-kept-dim-ragged", [2, 3, 5, 7], [0, 2, 1, 3], BUF_WP, BUF_WP, {"units_match": 0, "tail": 1, "findex": 1}),
    ("rank5-buffer-kept-dim-ragged", [1, 5, 3, 2, 7], [2, 0, 3, 1, 4], BUF_WP,
     BUF_WP, {"units_match": 0, "tail": 1, "findex": 1}),
    ("buffer-to-texture", [1, 6, 3, 4], [0, 2, 3, 1], BUF_CP, TEX_WP, {"units_match": 0, "tail": 0, "findex": 1}),
]

# expand between width-packed buffers: out's word w reads self's word (w / i1) % p1 + ((w / i2) %
# p2) p1 where self keeps at most two runs of out's dims (`runs` 1 or 2), else the general path
EXPANDS = [  # runs: 1 + mode (0 one word per vec4, 1 one vec4, 2 word by word) + 3 with a second run
    ("grouped-query-heads", [1, 4, 1, 6, 8], [1, 4, 2, 6, 8], BUF_WP, {"runs": 5, "tail": 0, "findex": 1}),
    ("rows-over-batches-vec4", [6, 8], [3, 6, 8], BUF_WP, {"runs": 2, "tail": 0, "findex": 1}),
    ("row-over-batches", [5, 7], [3, 5, 7], BUF_WP, {"runs": 3, "tail": 1, "findex": 1}),
    ("column-repeated", [5, 1], [5, 6], BUF_WP, {"runs": 3, "tail": 1, "findex": 1}),
    ("column-repeated-vec4", [3, 1], [3, 8], BUF_WP, {"runs": 1, "tail": 1, "findex": 1}),
    ("single", [1], [5, 7], BUF_WP, {"runs": 1, "tail": 1, "findex": 1}),
    ("single-whole-spans", [1, 1], [4, 16], BUF_WP, {"runs": 1, "tail": 0, "findex": 1}),
    ("two-runs-vec4-words", [2, 1, 3, 1], [2, 5, 3, 4], BUF_WP, {"runs": 4, "tail": 1, "findex": 1}),
    ("two-runs-by-word", [2, 1, 3, 1], [2, 5, 3, 3], BUF_WP, {"runs": 6, "tail": 1, "findex": 1}),
    ("three-kept-runs", [2, 1, 3, 1, 5], [2, 3, 3, 2, 5], BUF_WP, {"runs": 0, "tail": 1, "findex": 1}),
    ("channels-packed", [1, 6, 1, 1], [2, 6, 3, 5], BUF_CP, {"runs": 0, "tail": 1, "findex": 1}),
    ("texture", [1, 6, 1, 1], [2, 6, 3, 5], TEX_CP, {"runs": 0, "tail": 0, "findex": 1}),
]

# where and masked_fill: each tensor's read class (where: in0 condition, in1 / in2 self and other;
# masked_fill: in0 self, in1 mask); the buffer takes vec4 words where every class is direct, single,
# a row of whole vec4s, or runs by vec4
WHERES = [
    ("direct", "where", {"condition": [2, 3, 5, 8], "self": [2, 3, 5, 8], "other": [2, 3, 5, 8]}, BUF_WP,
     {"in0_class": 1, "in1_class": 1, "in2_class": 1, "tail": 0, "ragged": 0, "findex": 1}),
    ("keepdim-condition-scalar-tensor", "where", {"condition": [1, 6, 7, 1], "self": [], "other": [1, 6, 7, 8]},
     BUF_WP, {"in0_class": 4, "in1_class": 3, "in2_class": 1, "tail": 0, "ragged": 0, "findex": 1}),
    ("row", "where", {"condition": [3, 5, 8], "self": [8], "other": [1]}, BUF_WP,
     {"in0_class": 1, "in1_class": 2, "in2_class": 3, "tail": 1, "ragged": 0, "findex": 1}),
    ("ragged-row", "where", {"condition": [3, 5, 7], "self": [7], "other": [3, 5, 7]}, BUF_WP,
     {"in0_class": 1, "in1_class": 2, "in2_class": 1, "tail": 1, "ragged": 1, "findex": 1}),
    ("causal-mask-runs", "where", {"condition": [1, 1, 8, 8], "self": [2, 4, 8, 8], "other": []}, BUF_WP,
     {"in0_class": 5, "in1_class": 1, "in2_class": 3, "tail": 0, "ragged": 0, "findex": 1}),
    ("two-runs-by-word", "where", {"condition": [2, 1, 3, 1], "self": [1, 3, 1, 5], "other": [2, 3, 3, 5]}, BUF_WP,
     {"in0_class": 9, "in1_class": 9, "in2_class": 1, "tail": 1, "ragged": 1, "findex": 1}),
    ("texture-channel-row", "where", {"condition": [1, 6, 1, 1], "self": [2, 6, 3, 5], "other": [1]}, TEX_CP,
     {"in0_class": 2, "in1_class": 1, "in2_class": 3, "tail": 1, "ragged": 1, "findex": 1}),
    ("texture-general", "where", {"condition": [2, 1, 3, 1], "self": [1, 3, 1, 5], "other": [2, 3, 3, 5]}, TEX_WP,
     {"in0_class": 0, "in1_class": 0, "in2_class": 1, "tail": 1, "ragged": 1, "findex": 1}),
    ("texture-row", "where", {"condition": [3, 5, 8], "self": [8], "other": [3, 5, 8]}, TEX_WP,
     {"in0_class": 1, "in1_class": 2, "in2_class": 1, "tail": 1, "ragged": 0, "findex": 1}),
    ("scalar-other", "where_scalar_other", {"condition": [4, 1, 8], "self": [4, 3, 8], "other": -2.0}, BUF_WP,
     {"in0_class": 8, "in1_class": 1, "tail": 0, "ragged": 0, "findex": 1}),
    ("masked-fill-causal", "masked_fill", {"self": [2, 4, 8, 8], "mask": [1, 1, 8, 8], "value": float("-inf")}, BUF_WP,
     {"in0_class": 1, "in1_class": 5, "tail": 0, "ragged": 0, "findex": 1}),
    ("masked-fill-texture", "masked_fill", {"self": [2, 3, 5, 7], "mask": [5, 7], "value": -3.0}, TEX_WP,
     {"in0_class": 1, "in1_class": 0, "tail": 1, "ragged": 1, "findex": 1}),
    ("scalar-self", "where_scalar_self", {"condition": [4, 3, 8], "self": 1.5, "other": [3, 8]}, BUF_WP,
     {"in0_class": 1, "in1_class": 5, "tail": 0, "ragged": 0, "findex": 1}),
]


def _inputs(op, sample, specials: bool) -> dict:
    rng = np.random.default_rng(7)
    arrays = {}
    for a in op.args:
        if a.kind == "tensor" and a.name in sample and dict(op.dtype_of).get(a.name) == "bool":
            arrays[a.name] = rng.uniform(size=sample[a.name]) < 0.5  # where's condition
        elif a.kind == "tensor" and a.name in sample:
            x = rng.uniform(-3, 3, size=sample[a.name]).astype(np.float32)
            arrays[a.name] = inject_specials(x, 1, tuple(float(v) for v in SPECIALS)) if specials else x
    return arrays


def _run_both(device, dispatches, ins, in_arrays, outs, want, op_name: str, label: str, whats) -> None:
    """Run `dispatches` in one Program; each of `outs` (specialised, general) must match `want`
    and keep its padding zero."""
    prog = Program(device, dispatches, ins, outs, timestamps=False)
    try:
        got = prog(*in_arrays)
    finally:
        prog.close()
    for what, g, raw, t in zip(whats, got, raw_elements(device, outs), outs):
        assert_matches(g, want, op_name, f"{label} {what}")
        assert_padding_zero(Output(g, raw, padding_mask(t)), f"{label} {what}")


def _run(device, op_name: str, sample: dict, reprs: dict, expected: dict, specials: bool = True) -> None:
    op = OPS[op_name]
    case = explicit_case(op, sample, _inputs(op, sample, specials), f"{op_name} {sample}")
    node, arrays = build_node(op, "float32", case)
    [spec] = node_dispatches(node, reprs, "float32")
    # (bf16_out marks a bfloat16 program's node, not a shape: 0 here; tests/kernels/test_bfloat16_stores.py)
    classes = {k: v for k, v in spec.spec.items() if k != "bf16_out"}
    assert spec.spec.get("bf16_out", 0) == 0
    assert classes == expected, f"{op_name} {sample}: shape classes {classes}, expected {expected}"
    tensors, ins, in_arrays = {}, [], []
    for name, v in list(spec.tensors.items()):
        r = reprs[name]
        tensors[name] = VkTensor(device, v.shape, v.dtype, r.storage, r.layout, label=name)
        if v in arrays:
            ins.append(tensors[name])
            in_arrays.append(arrays[v])
    general = {n: VkTensor(device, t.shape, t.dtype, t.storage, t.layout, label="general_" + n)
               for n, t in tensors.items() if n == "out"}
    bare = {**tensors, **general}  # the general path reads the same inputs, writes its own out
    outs = [tensors["out"], general["out"]]
    every = list(tensors.values()) + list(general.values())
    try:
        _run_both(device, [Dispatch(spec.variant, tensors, spec.scalars, spec=spec.spec),
                           Dispatch(spec.variant, bare, spec.scalars)], ins, in_arrays, outs, case.want[0],
                  op_name, f"{op_name} {sample}", (f"specialised ({spec.spec})", "general (defaults)"))
    finally:
        for t in every:
            t.close()


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_shape_class_taken_and_right(device, case):
    _, op_name, sample, r, expected = case
    op = OPS[op_name]
    names = [a.name for a in op.args if a.kind == "tensor" and a.name in sample] + [o.name for o in op.outputs]
    _run(device, op_name, sample, {n: r for n in names}, expected)


@pytest.mark.parametrize("case", TRANSITIONS, ids=[c[0] for c in TRANSITIONS])
def test_to_layout_shape_classes(device, case):
    _, shape, r_in, r_out, expected = case
    _run(device, "to_layout", {"self": shape}, {"self": r_in, "out": r_out}, expected)


@pytest.mark.parametrize("case", PERMUTES, ids=[c[0] for c in PERMUTES])
def test_permute_shape_classes(device, case):
    _, shape, dims, r_in, r_out, expected = case
    _run(device, "permute_copy", {"self": shape, "dims": dims}, {"self": r_in, "out": r_out}, expected)


@pytest.mark.parametrize("case", EXPANDS, ids=[c[0] for c in EXPANDS])
def test_expand_shape_classes(device, case):
    _, shape, size, r, expected = case
    _run(device, "expand", {"self": shape, "size": size}, {"self": r, "out": r}, expected)


@pytest.mark.parametrize("case", WHERES, ids=[c[0] for c in WHERES])
def test_where_shape_classes(device, case):
    _, op_name, sample, r, expected = case
    names = [n for n, v in sample.items() if isinstance(v, list)] + ["out"]
    _run(device, op_name, sample, {n: r for n in names}, expected)


def test_model_size_elementwise_at_every_class(device):
    """A ResNet stage's add (64 x 56 x 56, whole spans) and an odd one (63 x 55 x 57): direct on
    buffers and textures, with NaN / Inf, beside the general path."""
    for shape in ([1, 64, 56, 56], [1, 63, 55, 57]):
        tail = int(np.prod(shape) % 16 != 0)
        _run(device, "add", {"self": shape, "other": shape, "alpha": 1.0}, {n: BUF_WP for n in ("self", "other", "out")},
             {"a_class": 1, "b_class": 1, "tail": tail, "ragged": int(shape[-1] % 4 != 0),
              "rows4": int(shape[-1] % 4 == 0 and np.prod(shape[:-1]) % 4 == 0), "findex": 1})
        _run(device, "relu", {"self": shape}, {"self": TEX_CP, "out": TEX_CP},
             {"tail": int(shape[-1] % 4 != 0), "ragged": int(shape[1] % 4 != 0)})


def test_grid_covers_every_unit_once(device):
    """A span variant launches ceil(words / 16) invocations on a buffer and ceil(x / span) per row
    of a texture (relu: 4 texels); a variant without span one per unit."""
    t = VkTensor(device, (3, 5, 7), "float32", Storage.BUFFER, Layout.WIDTH_PACKED, allocate=False)
    tex = VkTensor(device, (2, 5, 3, 7), "float32", Storage.TEXTURE_3D, Layout.CHANNELS_PACKED, allocate=False)
    try:
        vb = next(VARIANTS[n] for n in OPS["relu"].variants if dict(VARIANTS[n].axes)["storage"] == "buffer")
        vt = next(VARIANTS[n] for n in OPS["relu"].variants if dict(VARIANTS[n].axes)["storage"] == "texture3d")
        assert invocations(vb, t) == -(-105 // 16)
        x, y, z = tex.extents
        assert vt.span == 4 and invocations(vt, tex) == -(-x // 4) * y * z
        single = next(v for v in VARIANTS.values() if v.span == 1 and dict(v.axes).get("storage") == "buffer")
        assert invocations(single, t) == t.units
    finally:
        t.close(), tex.close()


def test_span_kernels_take_their_workgroup_size_from_the_device(device):
    """128 invocations rounded up to whole subgroups, within the device's limits; the device's
    own choice is what a span variant's pipeline gets."""
    from types import SimpleNamespace

    from texelflow.runtime.vulkan.program import vector_local_size

    def limits(sub, most=1024):
        return SimpleNamespace(subgroup_size=sub, max_workgroup_size=(most, most, 64), max_workgroup_invocations=most)

    assert vector_local_size(limits(8)) == 128 and vector_local_size(limits(32)) == 128
    assert vector_local_size(limits(48)) == 144 and vector_local_size(limits(None)) == 128
    assert vector_local_size(limits(64, most=32)) == 32
    t = VkTensor(device, (3, 5, 7), "float32", Storage.BUFFER, Layout.WIDTH_PACKED, allocate=False)
    try:
        vb = next(VARIANTS[n] for n in OPS["relu"].variants if dict(VARIANTS[n].axes)["storage"] == "buffer")
        spec = Dispatch(vb, {"out": t, "self": t}).specialization([t, t], device.limits)
        assert spec["local_size_x"] == vector_local_size(device.limits)
        assert "tail" not in spec  # not given: the pipeline keeps the general default
    finally:
        t.close()


# cat: per input, whether its units move whole into out (shape class `whole`, rule list_units)
CATS = [
    ("cat-channels-texels", [[1, 4, 3, 5], [1, 8, 3, 5], [1, 3, 3, 5]], 1, TEX_CP, [1, 1, 1]),  # the last ends out
    ("cat-channels-ragged", [[1, 3, 3, 5], [1, 4, 3, 5]], 1, TEX_CP, [2, 2]),  # 3 channels: offset 3 (slabs)
    ("cat-channels-middle-ragged", [[1, 4, 3, 5], [1, 5, 3, 5], [1, 2, 3, 5]], 1, TEX_CP, [1, 2, 2]),
    ("cat-densenet-channels", [[2, 6, 5, 7], [2, 5, 5, 7], [2, 5, 5, 7], [2, 1, 5, 7]], 1, TEX_CP, [2, 2, 2, 1]),  # the last ends out
    ("cat-width-ragged-wp", [[2, 3, 5, 3], [2, 3, 5, 6], [2, 3, 5, 1]], 3, TEX_WP, [2, 2, 2]),
    ("cat-height-texture", [[2, 5, 3, 7], [2, 5, 1, 7]], 2, TEX_CP, [1, 1]),
    ("cat-width-texture-wp", [[2, 3, 5, 4], [2, 3, 5, 8], [2, 3, 5, 3]], 3, TEX_WP, [1, 1, 1]),
    ("cat-batch-texture", [[1, 3, 5, 7], [2, 3, 5, 7]], 0, TEX_CP, [1, 1]),
    ("cat-channels-buffer-wp", [[2, 3, 5, 7], [2, 2, 5, 7]], 1, BUF_WP, [1, 1]),
    ("cat-width-buffer-wp", [[3, 5], [3, 2]], -1, BUF_WP, [1, 1]),  # along the packed dim: one element per word
    ("cat-channels-buffer-cp", [[1, 3, 2, 5], [1, 6, 2, 5]], 1, BUF_CP, [1, 1]),
    ("cat-rank5-general", [[2, 1, 3, 2, 5], [2, 3, 3, 2, 5]], 1, BUF_WP, [0, 0]),  # leading dims: general
]


@pytest.mark.parametrize("case", CATS, ids=[c[0] for c in CATS])
def test_cat_inputs_move_whole_units(device, case):
    """cat lowers to one dispatch per input; where an input's units move whole into out (class
    `whole` 1) its dispatch runs over its own units, where a texture input is not whole texels
    along the packed dim (2) over the slab of out's texels that hold it. Specialised and general (bare dispatches over
    all of out) must both give torch's cat, NaN / Inf included, with out's padding zero."""
    _, shapes, dim, r, expected = case
    op = OPS["cat"]
    rng = np.random.default_rng(3)
    xs = [inject_specials(rng.uniform(-3, 3, size=s).astype(np.float32), 1, tuple(float(v) for v in SPECIALS))
          for s in shapes]
    sample = {"tensors": shapes, "dim": dim}
    case_ = explicit_case(op, sample, {"tensors": xs}, f"cat {sample}")
    node, arrays = build_node(op, "float32", case_)
    specs = node_dispatches(node, {"tensors": r, "out": r}, "float32")
    assert [s.spec["whole"] for s in specs] == expected, f"cat {sample}: {[s.spec for s in specs]}"
    offset = 0
    for s, shape in zip(specs, shapes):  # whole: the input's own units; a slab: out's texels holding it; else out's (None)
        d = dim % len(shape)
        slab = list_slab_shape(specs[0].tensors["out"].shape, offset, shape[d], d)
        want = {1: geometry_units(shape, r.storage, r.layout), 2: geometry_units(slab, r.storage, r.layout)}
        assert s.units == want.get(s.spec["whole"])
        offset += shape[d]
    out_value = specs[0].tensors["out"]
    made = []

    def tensor(shape, label):
        made.append(VkTensor(device, shape, "float32", r.storage, r.layout, label=label))
        return made[-1]

    try:
        ins = [tensor(x.shape, f"in{i}") for i, x in enumerate(xs)]
        outs = [tensor(out_value.shape, "out"), tensor(out_value.shape, "general_out")]
        dispatches = [Dispatch(s.variant, {"out": outs[0], "tensors": t}, s.scalars, units=s.units, spec=s.spec)
                      for s, t in zip(specs, ins)]
        dispatches += [Dispatch(s.variant, {"out": outs[1], "tensors": t}, s.scalars) for s, t in zip(specs, ins)]
        _run_both(device, dispatches, ins, xs, outs, case_.want[0], "cat", f"cat {sample}", ("specialised", "general"))
    finally:
        for t in made:
            t.close()
