"""Issue 10, shape ops in whole exported models: views, splits, rank-5 attention, resampling.

Each model is exported by texelflow itself (torch.export's training IR, lowered directly) and
compiled on the device; the plan must keep every node on Vulkan and the outputs must equal
torch's. Views of contiguous buffers must cost no dispatch; views that move words or texels
must stay copies, and correct ones.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import texelflow
from texelflow.runtime.graph.prepack_matmul import attention_form, gemm_tiles, subgroup_facts

from .models import Call

VIEW_OPS = ("reshape", "view_copy", "flatten", "unflatten", "squeeze_copy", "unsqueeze_copy", "contiguous")


def _run(device, model, inputs, **kw):
    """(plan, outputs as a tuple) of the compiled model, after checking it against torch."""
    with texelflow.compile(model, inputs, device=device, **kw) as prog:
        got = prog(*inputs)
    with torch.no_grad():
        want = model(*inputs)
    got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    return prog.plan


def _reshape_chain(x):
    y = (x * 2).reshape(6, 35).view(2, 3, 35).flatten(0, 1).unflatten(1, (5, 7))
    return y.unsqueeze(0).squeeze(0).reshape(2, 3, 5, 7).contiguous() + 1


def test_views_of_a_contiguous_buffer_dispatch_nothing(device):
    x = torch.randn(2, 3, 5, 7)
    plan = _run(device, Call(_reshape_chain), (x,), texture_limits=(1, 1, 1))
    assert plan.fallbacks == []
    assert set(plan.reprs.values()) == {"BUFFER/WIDTH_PACKED"}
    assert not any(op in plan.dispatches for op in VIEW_OPS), plan.dispatches
    assert plan.dispatches == {"mul": 1, "add": 1}


def test_views_that_would_move_texels_are_planned_where_they_fold(device):
    """In width-packed textures a view that changes W or H would move texels (a copy dispatch);
    lowering narrows such a view to the representations where it only relabels (here every
    buffer layout keeps it), so the planner puts the chain in a contiguous buffer and both views
    fold: no copy, no transition."""
    def fn(x):
        moved = (x * 2).reshape(2, 105).relu()  # W 7 -> 105: a copy
        kept = (x * 3).reshape(6, 5, 7).relu()  # W, H kept: folded
        return moved, kept

    x = torch.randn(2, 3, 5, 7)
    plan = _run(device, Call(fn), (x,))
    assert plan.fallbacks == []
    assert set(plan.reprs.values()) == {"BUFFER/WIDTH_PACKED"} and plan.num_transitions == 0
    assert "reshape" not in plan.dispatches
    assert sorted(n.name for n in plan.folded) == ["reshape", "reshape_1"]


def test_channels_packed_view_that_changes_channels_takes_one_transition(device, register_tiles):
    """conv2d's output is a channels-packed texture: regrouping its 8 channels as 2 x 4 would move
    texels there. Both views keep W and H, so in a width-packed texture they only relabel: the
    plan pays one shared transition to width packing and both views fold (the copy the view
    would have been is the transition)."""
    conv = torch.nn.Conv2d(3, 8, 3, padding=1).eval()

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = conv

        def forward(self, x):
            y = self.conv(x)
            return y.reshape(2, 4, 5, 7) * 2, y.reshape(8, 5, 7) * 3

    x = torch.randn(1, 3, 5, 7)
    with texelflow.compile(Model(), (x,), device=device) as prog:
        got = prog(x)
        plan = prog.plan
    with torch.no_grad():
        want = Model()(x)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    assert plan.fallbacks == []
    assert plan.reprs["conv2d"] == "TEXTURE_3D/CHANNELS_PACKED"
    assert plan.num_transitions == 1 and plan.reprs["reshape"] == "TEXTURE_3D/WIDTH_PACKED"
    assert "reshape" not in plan.dispatches and sorted(n.name for n in plan.folded) == ["reshape", "reshape_1"]


def test_split_chunk_unbind_run_one_dispatch_per_piece(device):
    def fn(x):
        a, b = x.split(2, dim=1)  # uneven: 2 + 1
        c, d, e = x.split_with_sizes([1, 3, 1], dim=2)
        f, g = x.chunk(2, dim=-1)  # uneven: 4 + 3
        h = x.unbind(1)
        return a + 1, b * 2, c - 1, d * 3, e + 2, f.relu(), g * 4, h[2] + 1, h[0] * 2

    x = torch.randn(2, 3, 5, 7)
    plan = _run(device, Call(fn), (x,))
    assert plan.fallbacks == []
    assert plan.dispatches["slice"] == 2 + 3 + 2
    assert plan.dispatches["select"] == 2  # h[1] is never read: its select is dropped


def test_transposes_run_as_permutes(device):
    """transpose, t and mT decompose to permute: one permute_copy each, counted as permutes."""
    def fn(x):
        return x.transpose(1, 3) * 2, x[0, 0].t() + 1, x.mT - 1, x.reshape(2, 3, 5, 7, 1).transpose(0, 4) * 3

    x = torch.randn(2, 3, 5, 7)
    plan = _run(device, Call(fn), (x,), texture_limits=(1, 1, 1))
    assert plan.fallbacks == []
    assert plan.dispatches["permute_copy"] == 4 and plan.num_permutes == 4


class _Attention(torch.nn.Module):
    """timm's Attention: qkv reshaped to (B, N, 3, heads, head_dim), permuted to rank-5
    (3, B, heads, N, head_dim) and unbound into q, k, v."""

    def __init__(self, dim=20, heads=4, fused=True):
        super().__init__()
        self.qkv = torch.nn.Linear(dim, dim * 3)
        self.proj = torch.nn.Linear(dim, dim)
        self.heads, self.fused = heads, fused
        self.scale = (dim // heads) ** -0.5

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        if self.fused:
            x = F.scaled_dot_product_attention(q, k, v)
        else:
            x = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1) @ v
        x = x.transpose(1, 2).reshape(B, N, C)
        return self.proj(x)


@pytest.mark.parametrize("fused", [True, False], ids=["sdpa", "matmul-softmax"])
@pytest.mark.parametrize("batch", [1, 2])
def test_timm_attention_rank5_shapes_run_on_vulkan(device, batch, fused):
    torch.manual_seed(batch)
    model, x = _Attention(fused=fused).eval(), torch.randn(batch, 7, 20)
    with texelflow.compile(model, (x,), device=device) as prog:
        got = prog(x)
        plan = prog.plan
    with torch.no_grad():
        want = model(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    # only ops other helpers own may run on the CPU (none do once sdpa, matmul, softmax are in)
    shape_targets = ("permute", "select", "unbind", "transpose", "reshape", "view")
    cpu = [(n, why) for n, why in plan.fallbacks if any(t in why or t in n for t in shape_targets)]
    assert cpu == [], cpu
    # the qkv permute and the output's transpose are permutes, and k's where q @ k^T runs on
    # workgroup tiles (mm_wg, a GPU's): on register tiles it is bmm_nt, which reads k as it is
    facts = subgroup_facts(device.limits)
    one_node = fused and attention_form(facts)[0] == "fused"
    k_transposed = not one_node and gemm_tiles(facts)[0] != "register"
    assert plan.dispatches["permute_copy"] == (3 if k_transposed else 2) and plan.dispatches["select"] == 3
    assert "reshape" not in plan.dispatches  # both reshapes are views of contiguous buffers


def test_resampling_padding_and_pixel_shuffle_models(device):
    def fn(x):
        up = F.interpolate(x, scale_factor=2, mode="nearest") + 1
        down = F.interpolate(x, size=(3, 4), mode="nearest") * 2
        shuffled = F.pixel_shuffle(torch.cat([x, x[:, :1]], 1), 2)
        unshuffled = F.pixel_unshuffle(x[:, :, :4, :6], 2)
        padded = F.pad(x, (1, 2, -1, 0), value=1.5) * 3
        grown = x[:, :1].expand(2, 4, 5, 7) - 1
        return up, down, shuffled, unshuffled, padded, grown

    x = torch.randn(2, 3, 5, 7)
    plan = _run(device, Call(fn), (x,))
    assert plan.fallbacks == []
    for op in ("upsample_nearest2d", "pixel_shuffle", "pixel_unshuffle", "constant_pad_nd", "expand"):
        assert plan.dispatches[op] >= 1, (op, plan.dispatches)


@pytest.mark.parametrize("align_corners", [False, True])
def test_bilinear_resampling_model(device, align_corners):
    def fn(x):
        return (F.interpolate(x, size=(9, 4), mode="bilinear", align_corners=align_corners),
                F.interpolate(x, scale_factor=1.5, mode="bilinear", align_corners=align_corners))

    x = torch.randn(2, 3, 5, 7)
    with texelflow.compile(Call(fn), (x,), device=device) as prog:
        got = prog(x)
        plan = prog.plan
    for g, w in zip(got, fn(x)):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    assert plan.fallbacks == [] and plan.dispatches["upsample_bilinear2d"] == 2


def test_unsupported_padding_mode_falls_back_with_its_reason(device):
    def fn(x):  # circular, reflect and replicate run on Vulkan; a circular pad that crops does not
        return F.pad(x * 2, (-1, 2, 1, 0), mode="circular") + 1

    x = torch.randn(1, 3, 5, 7)
    with texelflow.compile(Call(fn), (x,), device=device) as prog:
        got = prog(x)
        plan = prog.plan
    torch.testing.assert_close(got, fn(x), rtol=0, atol=0)
    (name, why), = plan.fallbacks
    assert "\n" not in why and "aten.pad" in why and "circular pad that crops" in why, why


@pytest.mark.parametrize("name, fn", [
    ("narrow", lambda x: x.narrow(2, 1, 3) + 1),
    ("movedim", lambda x: x.movedim(1, -1) + 1),
    ("tensor_split", lambda x: x.tensor_split(3, dim=3)[2] + 1),
    ("split_list", lambda x: x.split([2, 5], dim=3)[1] + 1),
    ("expand_as", lambda x: x[:, :1].expand_as(x) + 1),
    ("indexing", lambda x: x[1, :, -2] + x[0, ..., None, 1:3].sum()),
    ("repeat", lambda x: x.repeat(1, 2, 1, 1) + 1),
    ("repeat_lead", lambda x: x.repeat(2, 1, 3, 1, 2) + 1),
    ("tile", lambda x: x.tile((2, 1)) + 1),
    ("repeat_interleave", lambda x: x.repeat_interleave(2, dim=1) + 1),
    ("stack", lambda x: torch.stack([x, x * 2], 1) + 1),
    ("zero_pad", lambda x: torch.nn.ZeroPad2d((1, 1, 2, 0))(x) + 1),
])
def test_torch_shape_functions_reach_the_device(device, name, fn):
    """Shape functions torch decomposes (or texelflow does) into the ops above, all on Vulkan;
    `indexing` also sums on the CPU when no reduction op is registered."""
    x = torch.randn(2, 3, 5, 7)
    with texelflow.compile(Call(fn), (x,), device=device) as prog:
        got = prog(x)
        plan = prog.plan
    torch.testing.assert_close(got, fn(x), rtol=1e-6, atol=1e-6)
    shape_fallbacks = [(n, why) for n, why in plan.fallbacks if "sum" not in n]
    assert shape_fallbacks == [], shape_fallbacks


def test_unused_split_pieces_dispatch_nothing(device):
    """tensor_split decomposes into one slice per piece; the pieces the model never reads are
    dropped with everything only they read."""
    plan = _run(device, Call(lambda x: x.tensor_split(3, 1)[2] * 2), (torch.randn(2, 9),))
    assert plan.fallbacks == [] and dict(plan.dispatches) == {"slice": 1, "mul": 1}


def _longformer_chunks(h):
    """Longformer's `_chunk`: windows of 2w overlapping by w, written with as_strided."""
    b, t, d = h.shape
    h = (h * 2).view(b, t // 4, 4, d)
    size, stride = list(h.size()), list(h.stride())
    size[1], stride[1] = size[1] * 2 - 1, stride[1] // 2
    return h.as_strided(size=size, stride=stride)


AS_STRIDED = {
    "longformer_chunks": (_longformer_chunks, (3, 12, 5)),
    "broadcast_stride_0": (lambda x: x.as_strided((3, 4), (0, 1), 1) + 1, (5, 2)),
    "of_a_transpose": (lambda x: x.t().as_strided((2, 3), (1, 2)), (3, 4)),
    "of_a_slice_own_offset": (lambda x: x[1:].as_strided((2, 3), (1, 2)), (3, 4)),
    "of_a_slice_given_offset": (lambda x: x[1:].as_strided((2, 3), (1, 2), 5), (3, 4)),
    "of_a_column_slice": (lambda x: x[:, 1:].as_strided((2, 2), (4, 1)), (3, 4)),
}


@pytest.mark.parametrize("name", sorted(AS_STRIDED))
def test_as_strided_reads_its_inputs_elements_on_the_device(device, name):
    """as_strided as a gather of its input's elements (own_decompositions.as_strided), views of
    other tensors included: each storage position read maps back to the element that holds it."""
    fn, shape = AS_STRIDED[name]
    x = torch.randn(*shape)
    x.view(-1)[0] = float("-inf")
    plan = _run(device, Call(fn), (x,))
    assert plan.fallbacks == [], plan.fallbacks


@pytest.mark.parametrize("fn", [lambda x: x[:, 1:].as_strided((2, 2), (4, 3)),  # x[1, 0]: sliced away
                                lambda x: x[1:].as_strided((2, 3), (1, 2), 1)])  # before the slice
def test_as_strided_outside_its_input_is_one_clear_error(fn):
    with pytest.raises(texelflow.UnsupportedModelError, match="reads storage positions that are not elements"):
        texelflow.plan(Call(fn), (torch.randn(3, 4),))
