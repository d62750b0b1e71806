"""The six local permute passes (runtime/graph/permutes/local.py) on graphs built from small torch
models: each pass alone on the lowered graph, the counts all six leave (the baseline the global
placement improves on: tests for placement.py assert the minimum), and numerics against eager
PyTorch for every case (compiled with permutes="local" on the session's Vulkan device)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch
import torch.nn as nn

import texelflow
from texelflow.models import ZOO, Attention, ConvNeXtBlock
from texelflow.runtime.graph.fusion import PREPACKS, fuse_patterns
from texelflow.runtime.graph.importer import export_program
from texelflow.runtime.graph.lowering import lower
from texelflow.runtime.graph.permutes import local
from texelflow.runtime.graph.permutes.dims import compose, inverse, moves_only_unit_dims, permuted


def _graph(model, inputs):
    """The IR `texelflow.plan` hands the permute passes: lowered and fused, nothing planned."""
    return fuse_patterns(lower(export_program(model, inputs)))


def _permutes(graph) -> list:
    return [n for n in graph.nodes if n.op is not None and n.op.name == "permute_copy"]


def _views(graph) -> list:
    return [n for n in graph.nodes if n.op is not None and n.op.is_identity]


def _consistent(graph) -> None:
    """The IR bookkeeping the passes must keep: topological order, users lists (one entry per use
    site), producers, and what each CPU fallback reads (`fx_inputs`) computed before it."""
    seen = {id(v) for v in graph.inputs} | {id(v) for v in graph.constants}
    nodes = {id(n) for n in graph.nodes}
    for n in graph.nodes:
        for _, v in n.tensor_args():
            assert id(v) in seen, f"{n.name} reads {v.name} before it is computed"
            reads = sum(1 for _, w in n.tensor_args() if w is v)
            assert sum(1 for u in v.users if u is n) == reads, f"{v.name}.users misses {n.name}"
        for _, v in n.outputs:
            assert v.producer is n, f"{v.name}'s producer is not {n.name}"
            assert all(id(u) in nodes for u in v.users), f"{v.name} is read by a removed node"
        if not n.on_device:
            flat = [x for v in graph.fx_inputs.get(n, []) for x in (v if isinstance(v, list) else [v])]
            assert all(id(v) in seen for v in flat), f"CPU node {n.name} reads a value not computed before it"
        for _, v in n.outputs:
            seen.add(id(v))
    assert all(id(v) in seen for v in graph.outputs)


def _local_count(model, inputs, **options) -> int:
    return texelflow.plan(model, inputs, permutes="local", **options).num_permute_nodes


def _matches_eager(device, model, inputs, rtol=1e-4, fallbacks=0, **options):
    """Compile with the local passes (and `options`) and compare every output with eager PyTorch."""
    with torch.no_grad():
        want = model(*inputs)
    with texelflow.compile(model, inputs, device=device, permutes="local", **options) as prog:
        assert len(prog.plan.fallbacks) == fallbacks, prog.plan.fallbacks
        _consistent(prog.plan.graph)
        got = prog(*inputs)
    wants = want if isinstance(want, tuple) else (want,)
    gots = got if isinstance(got, tuple) else (got,)
    for g, w in zip(gots, wants, strict=True):
        assert g.shape == w.shape
        err = (g - w).abs().max() / w.abs().max().clamp_min(1e-6)
        assert err <= rtol, f"max relative error {err:.2e}"


# ---- models ----------------------------------------------------------------------------------------
class RegionToOutputs(nn.Module):
    """A channels-last region left through an inverse permute that is a graph output and one a CPU
    op (special.erfcx) reads; a computed [C] operand needs a view to broadcast in NCHW order."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)

    def forward(self, x, v):
        y = torch.relu(self.conv(x).permute(0, 2, 3, 1) * torch.sigmoid(v))
        return y.permute(0, 3, 1, 2), torch.special.erfcx(y.permute(0, 3, 1, 2))


class PermuteFork(nn.Module):
    """Q(P(x)) where P(x) is also read by another op: Q reads x through one permute, P stays."""

    def forward(self, x):
        y = torch.relu(x).permute(0, 2, 1)
        return torch.sigmoid(y), torch.tanh(y.permute(2, 1, 0))


class ChannelsLastRegion(nn.Module):
    """Two convs enter channels-last through the same permute; scale, shift (a [8, C] constant that
    must be permuted, not just reshaped), cat, softmax, a keepdim mean, a slice and relu run there;
    one permute leads back to a conv. All three permutes can go."""

    def __init__(self, c=4):
        super().__init__()
        self.a, self.b, self.out = nn.Conv2d(3, c, 3, padding=1), nn.Conv2d(3, c, 1), nn.Conv2d(c, c, 1)
        self.scale = nn.Parameter(torch.rand(c) + 0.5)
        self.shift = nn.Parameter(torch.randn(8, c))
        self.c = c

    def forward(self, x):
        y = self.a(x).permute(0, 2, 3, 1)
        z = self.b(x).permute(0, 2, 3, 1)
        h = torch.cat([y * self.scale + self.shift, z], dim=-1)
        h = torch.softmax(h, dim=3) - h.mean(dim=-1, keepdim=True)
        h = torch.relu(h[..., : self.c])
        return self.out(h.permute(0, 3, 1, 2))


class QuantizedRegion(nn.Module):
    """A per-tensor quantize / dequantize pair and relu between a permute and its inverse."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 8, 1), nn.Conv2d(8, 8, 1)

    def forward(self, x):
        import torch.ao.quantization.fx._decomposed  # noqa: F401 (registers quantized_decomposed)

        q = torch.ops.quantized_decomposed
        y = q.quantize_per_tensor(self.a(x).permute(0, 2, 3, 1), 0.05, 3, -128, 127, torch.int8)
        y = q.dequantize_per_tensor(y, 0.05, 3, -128, 127, torch.int8)
        return self.b(torch.relu(y).permute(0, 3, 1, 2))


class JoinsUnpermuted(nn.Module):
    """add(permute(x), w) with w a computed tensor in the permuted order: the region cannot take w
    (only a permute would), so the local pass gives up."""

    def forward(self, x, w):
        return torch.relu(x.permute(0, 2, 1) + w).permute(0, 2, 1)


class InverseConsumers(nn.Module):
    """One permute read only by two inverse permutes (each feeding a conv)."""

    def __init__(self):
        super().__init__()
        self.c0, self.c1, self.c2 = nn.Conv2d(3, 6, 1), nn.Conv2d(6, 6, 1), nn.Conv2d(6, 6, 3)

    def forward(self, x):
        y = self.c0(x).permute(0, 2, 3, 1)
        return self.c1(y.permute(0, 3, 1, 2)), self.c2(y.permute(0, 3, 1, 2))


class UnitDimPermute(nn.Module):
    """A permute of [2, 1, 3, 1] that only moves the size-1 dims."""

    def forward(self, x):
        return torch.relu(torch.relu(x).permute(1, 0, 3, 2))


class PermuteUnsqueezePermute(nn.Module):
    """permute, unsqueeze, then the permute that undoes the first in 4-d: they meet once the first
    sinks below the unsqueeze."""

    def forward(self, x):
        y = torch.relu(x).permute(2, 0, 1).unsqueeze(0)  # [4, 2, 3] -> [1, 4, 2, 3]
        return torch.relu(y.permute(0, 2, 3, 1))  # [1, 2, 3, 4]


class PatchEmbedding(nn.Module):
    """A ViT patch embedding's tail as timm writes it, after an NHWC producer (the im2col GEMM that
    runs the conv hands an NHWC result to a permute back to NCHW): permute to NCHW, flatten(2),
    transpose(1, 2). flatten merges H and W, which lie side by side in NHWC too, so the view moves
    above the first permute and the two permutes cancel."""

    def forward(self, x):
        return torch.relu(torch.relu(x).permute(0, 3, 1, 2).flatten(2).transpose(1, 2))


class CascadedPermutes(nn.Module):
    def __init__(self, second):
        super().__init__()
        self.second = second

    def forward(self, x):
        return torch.relu(torch.relu(x).permute(0, 2, 1, 3).permute(*self.second))


class CascadedViews(nn.Module):
    def forward(self, x):
        y = torch.relu(x).reshape(2, 12).reshape(24)  # two views: one
        z = torch.relu(x).flatten().reshape(2, 3, 4)  # a view back to the input's shape: none
        return torch.relu(y), torch.relu(z)


class ConvChain(nn.Module):
    """conv -> pointwise ops -> conv: on the NHWC path each conv sits between explicit permutes."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        return self.b(torch.sigmoid(self.a(x)) * 2.0 + 1.0)


class ForkToOutput(nn.Module):
    """conv -> permute -> relu -> {permute -> conv, permute -> conv, output}."""

    def __init__(self):
        super().__init__()
        self.c0, self.c1, self.c2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 1), nn.Conv2d(8, 4, 1)

    def forward(self, x):
        y = torch.relu(self.c0(x).permute(0, 2, 3, 1))
        return self.c1(y.permute(0, 3, 1, 2)), self.c2(y.permute(0, 3, 1, 2)), y


class PermutedJoin(nn.Module):
    """add of two permuted inputs, feeding a permute (back, to a conv) and a graph output."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(6, 6, 1)

    def forward(self, a, b):
        s = a.permute(0, 2, 3, 1) + b.permute(0, 2, 3, 1)  # NCHW inputs, NHWC sum
        return self.conv(s.permute(0, 3, 1, 2)), s


class DuplicateSiblings(nn.Module):
    """The same permute of one tensor, twice, each read by its own op."""

    def forward(self, x):
        x = torch.relu(x)
        return torch.sigmoid(x.permute(0, 2, 1)), torch.tanh(x.permute(0, 2, 1))


# ---- the permutation algebra -------------------------------------------------------------------------
def test_permutation_algebra():
    dims = (0, 2, 3, 1)
    x = torch.randn(2, 3, 4, 5)
    assert torch.equal(x.permute(dims).permute(inverse(dims)), x)
    assert torch.equal(x.permute(dims).permute(1, 0, 3, 2), x.permute(compose(dims, (1, 0, 3, 2))))
    assert permuted(x.shape, dims) == tuple(x.permute(dims).shape)
    assert moves_only_unit_dims((2, 1, 3, 1), (1, 0, 3, 2)) and not moves_only_unit_dims((2, 1, 3, 1), (2, 1, 0, 3))


# ---- each pass alone --------------------------------------------------------------------------------
def test_region_permutes_are_removed(device):
    model, x = ChannelsLastRegion().eval(), torch.randn(1, 3, 8, 8)
    graph = _graph(model, (x,))
    assert len(_permutes(graph)) == 3
    assert local.remove_region_permutes(graph)
    _consistent(graph)
    assert _permutes(graph) == []
    kernel_prepacks = {recipe for recipe, _ in PREPACKS.values()}  # the conv kernels' own weights
    recipes = sorted(v.derive.recipe for v in graph.constants
                     if v.derive is not None and v.users and v.derive.recipe not in kernel_prepacks)
    assert recipes == ["permuted", "reshaped"]  # shift [8, C] -> [C, 8, 1]; scale [C] -> [C, 1, 1]
    assert _local_count(model, (x,)) == 0
    _matches_eager(device, model, (x,))


def test_region_through_quantize_and_dequantize(device):
    model, x = QuantizedRegion().eval(), torch.randn(1, 3, 6, 6)
    graph = _graph(model, (x,))
    assert len(_permutes(graph)) == 2
    assert local.remove_region_permutes(graph)
    _consistent(graph)
    assert _permutes(graph) == []
    _matches_eager(device, model, (x,))


def test_region_exits_to_an_output_and_a_cpu_op(device):
    model, inputs = RegionToOutputs().eval(), (torch.randn(1, 3, 5, 5), torch.randn(4))
    graph = _graph(model, inputs)
    assert local.remove_region_permutes(graph)
    _consistent(graph)
    assert _permutes(graph) == []
    # the exit that was a graph output stays as a view; the computed [4] operand becomes [1, 4, 1, 1]
    assert sorted(tuple(n.outputs[0][1].shape) for n in _views(graph)) == [(1, 4, 1, 1), (1, 4, 5, 5)]
    _matches_eager(device, model, inputs, fallbacks=1)


def test_region_with_an_unpermuted_operand_is_left(device):
    model, inputs = JoinsUnpermuted(), (torch.randn(2, 3, 5), torch.randn(2, 5, 3))
    graph = _graph(model, inputs)
    assert not local.remove_region_permutes(graph)
    assert _local_count(model, inputs) == 2
    _matches_eager(device, model, inputs)


def test_permute_with_inverse_consumers_vanishes(device):
    model, x = InverseConsumers().eval(), torch.randn(1, 3, 6, 6)
    graph = _graph(model, (x,))
    assert len(_permutes(graph)) == 3
    assert local.fuse_inverse_consumers(graph)
    _consistent(graph)
    assert _permutes(graph) == []
    _matches_eager(device, model, (x,))


def test_unit_dim_permute_becomes_a_view(device):
    model, x = UnitDimPermute(), torch.randn(2, 1, 3, 1)
    graph = _graph(model, (x,))
    assert local.unit_dim_permutes_to_views(graph)
    _consistent(graph)
    assert _permutes(graph) == [] and [n.op.name for n in _views(graph)] == ["view_copy"]
    assert _local_count(model, (x,)) == 0
    _matches_eager(device, model, (x,))


@pytest.mark.parametrize("model,shape", [
    (PermuteUnsqueezePermute(), (2, 3, 4)),  # a view that adds a size-1 dim
    (PatchEmbedding(), (1, 4, 3, 8)),  # a view that merges H and W, side by side in NHWC too
])
def test_permute_sinks_below_a_view_and_meets_its_inverse(device, model, shape):
    x = torch.randn(*shape)
    graph = _graph(model, (x,))
    assert len(_permutes(graph)) == 2
    assert local.sink_permutes_below_views(graph)
    _consistent(graph)
    first, second = _permutes(graph)
    assert second.arg("self") is first.outputs[0][1]  # the two permutes now meet
    assert _local_count(model, (x,)) == 0
    _matches_eager(device, model, (x,))


@pytest.mark.parametrize("second,left", [((0, 1, 3, 2), 1), ((0, 2, 1, 3), 0)])
def test_cascaded_permutes_fuse(device, second, left):
    model, x = CascadedPermutes(second), torch.randn(2, 3, 4, 5)
    graph = _graph(model, (x,))
    assert local.fuse_cascaded_permutes(graph)
    _consistent(graph)
    assert len(_permutes(graph)) == left
    assert _local_count(model, (x,)) == left
    _matches_eager(device, model, (x,))


def test_cascaded_permute_with_a_fork_keeps_the_first(device):
    model, x = PermuteFork(), torch.randn(2, 3, 5)
    graph = _graph(model, (x,))
    assert local.fuse_cascaded_permutes(graph)
    _consistent(graph)
    assert sorted(p.arg("self").name for p in _permutes(graph)) == ["relu", "relu"]  # both read relu
    assert _local_count(model, (x,)) == 2  # never more than before
    _matches_eager(device, model, (x,))


def test_cascaded_views_fuse(device):
    model, x = CascadedViews(), torch.randn(2, 3, 4)
    graph = _graph(model, (x,))
    assert len(_views(graph)) == 4
    assert local.fuse_cascaded_views(graph)
    _consistent(graph)
    assert local.fuse_cascaded_views(graph)  # the merged flatten + reshape is then to x's own shape
    assert [tuple(n.outputs[0][1].shape) for n in _views(graph)] == [(24,)]
    _matches_eager(device, model, (x,))


def test_nhwc_conv_chain_keeps_only_the_outer_permutes(device):
    # The permute back after the first conv and the one into the second enclose the pointwise
    # region: both go; the model's input and output permutes stay (4 -> 2).
    model, x = ConvChain().eval(), torch.randn(1, 3, 8, 8)
    assert texelflow.plan(model, (x,), permutes="none", conv_dim_order="nhwc").num_permute_nodes == 4
    assert _local_count(model, (x,), conv_dim_order="nhwc") == 2
    _matches_eager(device, model, (x,), conv_dim_order="nhwc")


# ---- what the local passes leave (the global placement asserts the minimum) ---------------------------
def test_fork_to_a_graph_output_keeps_every_permute(device):
    # relu's result is a graph output in the permuted order: the region (relu) is not left only
    # through inverse permutes, and the first permute is read by relu, not by an inverse. All 3
    # stay; the minimum is 1 (relu in NCHW between the convs, one permute for the output).
    model, x = ForkToOutput().eval(), torch.randn(1, 3, 6, 6)
    assert _local_count(model, (x,)) == 3
    _matches_eager(device, model, (x,))


def test_permuted_join_feeding_an_output_keeps_every_permute(device):
    # The sum is a graph output: the add cannot move into its inputs' order locally, so both input
    # permutes and the one back stay: 3. The minimum is 1 (add in NCHW, one permute for the output).
    model, inputs = PermutedJoin().eval(), (torch.randn(1, 6, 5, 5), torch.randn(1, 6, 5, 5))
    assert _local_count(model, inputs) == 3
    _matches_eager(device, model, inputs)


def test_duplicate_sibling_permutes_stay(device):
    # Two equal permutes of one tensor, each read by another op: no pass merges siblings (that
    # needs one permute shared by all readers, the global placement's job). Local 2, minimum 1.
    model, x = DuplicateSiblings(), torch.randn(2, 3, 5)
    assert _local_count(model, (x,)) == 2
    _matches_eager(device, model, (x,))


def test_convnext_block_keeps_its_two_permutes(device):
    # layer_norm over the last dim and the linears need channels last; the permute back is read by
    # the residual add with the NCHW input. The region behind the second permute (mul by gamma) is
    # entered from a linear, not a permute: nothing to cancel. Local 2.
    model, x = ConvNeXtBlock(16).eval(), torch.randn(1, 16, 8, 8)
    assert _local_count(model, (x,)) == 2
    _matches_eager(device, model, (x,))


def test_attention_keeps_its_head_permutes(device):
    # qkv's [B, N, 3, H, D] -> [3, B, H, N, D] feeds selects and attention, and the heads'
    # transpose back feeds a reshape that merges dims (not a squeeze-like view): no inverse pair
    # ever meets. Local 2.
    model, x = Attention(32, 4).eval(), torch.randn(1, 5, 32)
    assert _local_count(model, (x,)) == 2
    _matches_eager(device, model, (x,))


# ---- random programs --------------------------------------------------------------------------------
class RandomPermuteProgram(nn.Module):
    """A random chain over [2, 3, 4, 5] tensors mixing the two NCHW <-> NHWC permutes with what the
    passes look at (pointwise ops, broadcast constants, joins, softmax, keepdim sums, unsqueeze /
    squeeze) and what stops them (layer norm over the last dim, extra graph outputs)."""

    STEPS = ("permute", "permute", "unary", "add", "scale", "softmax", "sum", "unsqueeze", "norm", "output")

    def __init__(self, seed: int, length: int = 14):
        super().__init__()
        rng = torch.Generator().manual_seed(seed)
        pick = lambda n: int(torch.randint(n, (1,), generator=rng))  # noqa: E731
        self.plan = [(self.STEPS[pick(len(self.STEPS))], pick(1000)) for _ in range(length)]
        self.scale = nn.Parameter(torch.rand(5) + 0.5)

    def forward(self, x):
        values, extra = [x], []
        for step, r in self.plan:
            v = values[-1]
            if step == "permute":
                v = v.permute(0, 2, 3, 1) if r % 2 else v.permute(0, 3, 1, 2)
            elif step == "unary":
                v = (torch.relu, torch.sigmoid, torch.tanh)[r % 3](v)
            elif step == "add":
                same = [w for w in values if w.shape == v.shape]
                v = v + same[r % len(same)]
            elif step == "scale" and v.shape[-1] == 5:
                v = v * self.scale
            elif step == "softmax":
                v = torch.softmax(v, dim=r % 4)
            elif step == "sum":
                v = v - v.sum(dim=r % 4, keepdim=True) * 0.1
            elif step == "unsqueeze":
                v = torch.relu(v.unsqueeze(0)).squeeze(0)
            elif step == "norm":
                v = nn.functional.layer_norm(v, v.shape[-1:])
            elif step == "output":
                extra.append(v)
            values.append(v)
        return (values[-1], *extra)


@pytest.mark.parametrize("seed", range(8))
def test_random_programs_keep_numerics(device, seed):
    model, x = RandomPermuteProgram(seed).eval(), torch.randn(2, 3, 4, 5)
    assert _local_count(model, (x,)) <= texelflow.plan(model, (x,), permutes="none").num_permute_nodes
    _matches_eager(device, model, (x,))


# ---- the zoo -------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,size", [("convnext_atto", 64), ("vit_tiny", 32)])
def test_zoo_models_keep_numerics(device, name, size):
    model, inputs = ZOO[name](image_size=size)
    assert _local_count(model, inputs) <= texelflow.plan(model, inputs, permutes="none").num_permute_nodes
    _matches_eager(device, model, inputs, rtol=1e-3)


def test_vit_patch_embedding_permutes_go():
    """ViT-S/16 (32 px): the patch embedding's im2col permute and the model's transpose cancel."""
    model, inputs = ZOO["vit_tiny"]()
    plan = texelflow.plan(model, inputs, permutes="local")
    names = [n.name for n in plan.graph.device_nodes() if n.op.name == "permute_copy"]
    assert not any(name.startswith(("conv2d", "transpose/")) for name in names), names


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_a_view_moves_above_a_permute_exactly_when_it_can(data):
    """_sunk's answer is torch's: view(P(x)) == P'(view'(x)) for random shapes, permutations and
    views (merges, splits, size-1 dims); it declines only where the view mixes dims of x that are not
    side by side in order."""
    rank = data.draw(st.integers(1, 5))
    x_shape = tuple(data.draw(st.lists(st.sampled_from([1, 2, 3, 4, 6]), min_size=rank, max_size=rank)))
    dims = tuple(data.draw(st.permutations(range(rank))))
    y_shape = permuted(x_shape, dims)
    # a view of y: merge some neighbouring dims, split a dim of size 4 or 6, insert size-1 dims
    z = list(y_shape)
    for _ in range(data.draw(st.integers(0, 3))):
        op = data.draw(st.sampled_from(["merge", "split", "unit", "drop"]))
        if op == "merge" and len(z) > 1:
            k = data.draw(st.integers(0, len(z) - 2))
            z[k:k + 2] = [z[k] * z[k + 1]]
        elif op == "split":
            k = data.draw(st.integers(0, len(z) - 1)) if z else 0
            if z and z[k] in (4, 6):
                z[k:k + 1] = [2, z[k] // 2]
        elif op == "unit":
            z.insert(data.draw(st.integers(0, len(z))), 1)
        elif op == "drop" and 1 in z:
            z.remove(1)
    z_shape = tuple(z)
    x = torch.arange(int(torch.tensor(x_shape).prod()), dtype=torch.float32).reshape(x_shape)
    want = x.permute(dims).reshape(z_shape)
    got = local._sunk(x_shape, dims, y_shape, z_shape)
    if got is None:  # only a merge or split of dims apart in x declines; size-1 dims alone never do
        assert [s for s in y_shape if s != 1] != [s for s in z_shape if s != 1]
        return
    shape, sunk = got
    assert torch.equal(x.reshape(shape).permute(sunk), want)


class HiddenInnermost(nn.Module):
    """A rank-6 permute whose size-1 dims hide that its innermost dim maps through (Swin's window
    partition as the placement leaves it: (8, 7, 8, 7, 96, 1) -> (1, 8, 8, 7, 7, 96))."""

    def forward(self, x):
        return x.permute(5, 0, 2, 1, 3, 4) * 2


@pytest.mark.parametrize("shape", [(2, 3, 2, 3, 8, 1), (2, 1, 3, 5, 12, 1)])
def test_unit_dims_leave_a_buffer_permute_whole_units(device, shape):
    """unit_dims.squeeze_unit_dims: views around a permute of the dims of size > 1, both folded, the
    permute now moving whole vec4 words (packed_permute); a NaN and an Inf go through."""
    from texelflow.runtime.graph.permutes.unit_dims import squeeze_unit_dims

    model = HiddenInnermost()
    x = torch.randn(shape)
    x.view(-1)[3], x.view(-1)[-5] = float("nan"), float("-inf")
    graph = _graph(model, (x,))
    assert squeeze_unit_dims(graph)
    _consistent(graph)
    (permute,) = _permutes(graph)
    assert 1 not in permute.arg("self").shape and permute.arg("self").shape[-1] == shape[-2]
    assert not squeeze_unit_dims(graph)  # once is enough
    with texelflow.compile(model, (x,), device=device) as prog:
        _consistent(prog.plan.graph)
        assert all(n.folded for n in prog.plan.graph.nodes if n.op is not None and n.op.name == "view_copy")
        got = prog(x)
    torch.testing.assert_close(got, model(x), equal_nan=True)


def test_unit_dims_stay_at_texture_ranks():
    """At rank <= 4 a view may be a texture copy: the pass leaves such permutes alone."""
    from texelflow.runtime.graph.permutes.unit_dims import squeeze_unit_dims

    class Rank4(nn.Module):
        def forward(self, x):
            return x.permute(3, 0, 2, 1) * 2

    graph = _graph(Rank4(), (torch.randn(3, 5, 8, 1),))
    assert not squeeze_unit_dims(graph)
