"""Dim-order contracts (ops.yaml `dim_order`), the channels-last conv2d_nhwc between explicit
permutes (runtime/graph/permutes/dim_order.py), and free buffer permutes (redundant.py, the
narrowing of problem.py)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch

import texelflow
from texelflow.generated.layouts import Layout, Storage
from texelflow.generated.ops import OPS
from texelflow.runtime.graph.fusion import fusion_op_name
from texelflow.runtime.graph.ir import PlanGraph
from texelflow.runtime.graph.permutes.dim_order import apply_dim_orders, insert_dim_order_permutes, inverse
from texelflow.runtime.graph.plan import plan_graph
from texelflow.runtime.graph.problem import Problem
from texelflow.runtime.graph.redundant import fold_free_permutes, permute_is_free
from texelflow.runtime.graph.repr import TensorRepr
from tests.codegen.test_generate import gen_cli, tree_digest
from tests.codegen.test_malformed import edit, line_of

CP_BUF = TensorRepr(Storage.BUFFER, Layout.CHANNELS_PACKED)
WP_BUF = TensorRepr(Storage.BUFFER, Layout.WIDTH_PACKED)
HP_BUF = TensorRepr(Storage.BUFFER, Layout.HEIGHT_PACKED)
WP_TEX = TensorRepr(Storage.TEXTURE_3D, Layout.WIDTH_PACKED)


# ---- the contract in ops.yaml -------------------------------------------------------------------------
def test_registry_lists_dim_orders():
    assert OPS["conv2d_nhwc"].dim_order == (("input", (0, 2, 3, 1)), ("out", (0, 2, 3, 1)))
    assert OPS["conv2d"].dim_order == ()


ENTRY = "    dim_order: {input: [0, 2, 3, 1], out: [0, 2, 3, 1]}"
CASES = [
    ("unknown-tensor", "{inputt: [0, 2, 3, 1], out: [0, 2, 3, 1]}",
     "op 'conv2d_nhwc': dim_order names 'inputt', which is no tensor of the op (did you mean 'input'?)"),
    ("not-a-permutation", "{input: [0, 2, 2, 1], out: [0, 2, 3, 1]}",
     "op 'conv2d_nhwc': dim_order of 'input' must be a permutation of 0 .. rank - 1"),
    ("identity", "{input: [0, 1, 2, 3], out: [0, 2, 3, 1]}",
     "op 'conv2d_nhwc': dim_order of 'input' is the identity"),
    ("weight", "{weight: [3, 2, 0, 1], out: [0, 2, 3, 1]}",
     "op 'conv2d_nhwc': dim_order names weight 'weight'"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_malformed_dim_order_is_reported_with_its_line(scratch_repo: Path, case):
    _, mapping, message = case
    path = scratch_repo / "ops.yaml"
    new = f"    dim_order: {mapping}"
    anchor = "    # puts permute_copy nodes around it, free where the NCHW side is a channels-packed buffer\n"
    edit(path, anchor + ENTRY, anchor + new)  # conv2d_nhwc's (the depthwise NHWC forms declare one too)
    before = tree_digest(scratch_repo)
    run = gen_cli(scratch_repo, "--no-compile")
    assert run.returncode != 0 and "Traceback" not in run.stderr
    matching = [line for line in run.stderr.splitlines() if message in line]
    assert matching, run.stderr
    assert matching[0].startswith(f"ops.yaml:{line_of(path, new.strip())}: "), matching[0]
    assert tree_digest(scratch_repo) == before


# ---- explicit permutes ------------------------------------------------------------------------------------
def _nhwc_conv_graph():
    """x -> conv2d_nhwc(x, w) with the model's NCHW tensors, as a contract-free lowering gives it."""
    g = PlanGraph()
    x = g.add_input("x", (1, 5, 6, 7))
    w = g.add_const("w", (3, 3, 5, 4), source="w")  # [KH, KW, Cin, Cout4]
    conv = g.add_node("conv", OPS["conv2d_nhwc"].targets[0], OPS["conv2d_nhwc"],
                      [("input", x), ("weight", w), ("padding", [1, 1]), ("out_channels", 4)],
                      [("out", (1, 4, 6, 7), "float32")])
    y = conv.outputs[0][1]
    g.add_node("relu", "aten.relu.default", OPS["relu"], [("self", y)], [("out", (1, 4, 6, 7), "float32")])
    g.outputs.append(g.nodes[-1].outputs[0][1])
    return g, x, conv, y


def test_permutes_are_inserted_around_a_dim_order_node():
    g, x, conv, y = _nhwc_conv_graph()
    inserted = insert_dim_order_permutes(g)
    assert [n.name for n in g.nodes] == ["conv.input_dims0231", "conv", "conv.out_back", "relu"]
    before, after = inserted
    assert before.arg("self") is x and before.arg("dims") == [0, 2, 3, 1]
    assert conv.arg("input") is before.outputs[0][1] and conv.arg("input").shape == (1, 6, 7, 5)
    assert conv.outputs[0][1].shape == (1, 6, 7, 4) and conv.outputs[0][1].users == [after]
    # the model's value keeps its readers; the back permute now produces it
    assert after.outputs[0][1] is y and y.producer is after and after.arg("dims") == [0, 3, 1, 2]
    assert x.users == [before] and [n.name for n in y.users] == ["relu"]


def test_a_tensor_of_another_rank_is_refused():
    g = PlanGraph()
    x = g.add_input("x", (5, 6, 7))
    w = g.add_const("w", (3, 3, 5, 4), source="w")
    g.add_node("conv", OPS["conv2d_nhwc"].targets[0], OPS["conv2d_nhwc"], [("input", x), ("weight", w)],
               [("out", (1, 4, 4, 5), "float32")])
    with pytest.raises(ValueError, match=r"node 'conv': op 'conv2d_nhwc' computes 'input' in dim order "
                                         r"\[0, 2, 3, 1\], but 'x' has rank 3"):
        insert_dim_order_permutes(g)


@pytest.mark.parametrize("planner", ["optimal", "greedy"])
def test_both_planners_make_the_inserted_permutes_free(planner):
    g, *_ = _nhwc_conv_graph()
    insert_dim_order_permutes(g)
    plan = plan_graph(g, planner)
    assert len(plan.transitions) == 0 and nonfree_permutes(plan) == 0


def test_inserted_permutes_are_visible_in_the_plan_and_free_on_buffers():
    g, *_ = _nhwc_conv_graph()
    insert_dim_order_permutes(g)
    plan = plan_graph(g)
    permutes = [n for n in plan.graph.nodes if n.op.name == "permute_copy"]
    assert len(permutes) == 2 and all(n.folded for n in permutes)  # in the graph, folded: no dispatch
    assert plan.num_permutes == 0 and "permute_copy" not in plan.dispatches
    a = plan.assignment
    slots = {n.name: (a.slots[(n, "self")], a.slots[(n, "out")]) for n in g.nodes if n.op.name == "permute_copy"}
    # x uploads into a channels-packed buffer (NHWC memory): both permutes are free pairs
    assert slots == {"conv.input_dims0231": (CP_BUF, WP_BUF), "conv.out_back": (WP_BUF, CP_BUF)}
    assert len(plan.transitions) == 0 and plan.optimal


def test_free_permutes_fold():
    g, *_ = _nhwc_conv_graph()
    insert_dim_order_permutes(g)
    problem = Problem.build(g)
    plan = plan_graph(g)  # plans the same graph; fold on its assignment
    folded = fold_free_permutes(problem, plan.assignment)
    assert [n.name for n in folded] == ["conv.input_dims0231", "conv.out_back"]
    assert plan.num_permutes == 0


def test_permute_is_free_only_where_memory_lines_up():
    nchw = (2, 3, 5, 7)
    assert permute_is_free(nchw, (0, 2, 3, 1), "float32", CP_BUF, WP_BUF)  # NHWC memory both sides
    assert permute_is_free((2, 5, 7, 3), (0, 3, 1, 2), "float32", WP_BUF, CP_BUF)
    assert not permute_is_free(nchw, (0, 2, 3, 1), "float32", WP_BUF, WP_BUF)
    assert not permute_is_free(nchw, (0, 2, 3, 1), "float32", CP_BUF, WP_TEX)  # a texture moves texels
    assert permute_is_free((5, 7), (1, 0), "float32", WP_BUF, HP_BUF)  # a transpose as H-packing
    assert permute_is_free((1, 3, 1, 7), (2, 1, 0, 3), "float32", WP_BUF, WP_BUF)  # size-1 dims only
    assert inverse((0, 2, 3, 1)) == (0, 3, 1, 2)


def test_unknown_conv_dim_order_is_refused():
    with pytest.raises(ValueError, match="conv_dim_order='nwhc': expected one of nchw, nhwc"):
        apply_dim_orders(PlanGraph(), "nwhc")


# ---- models --------------------------------------------------------------------------------------------
class ConvChain(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(5, 7, 3, padding=1)
        self.b = torch.nn.Conv2d(7, 6, 3, stride=2, padding=1)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def nonfree_permutes(plan) -> int:
    """Permute dispatches that really copy: not folded, and not a free (self, out) pair read
    without a transition before it."""
    a = plan.assignment
    count = 0
    for n in plan.graph.device_nodes():
        if n.op.name != "permute_copy" or n.folded:
            continue
        src, r_in, r_out = n.arg("self"), a.slots[(n, "self")], a.slots[(n, "out")]
        if not (a.values.get(src) == r_in and permute_is_free(src.shape, n.arg("dims"), src.dtype, r_in, r_out)):
            count += 1
    return count


def test_nhwc_chain_costs_no_more_copies_than_channels_packed_textures():
    torch.manual_seed(0)
    model, x = ConvChain().eval(), torch.randn(2, 5, 9, 11)
    cp = texelflow.plan(model, (x,))
    nhwc = texelflow.plan(model, (x,), conv_dim_order="nhwc", permutes="none")  # as inserted
    assert Counter(fusion_op_name(n) for n in cp.graph.device_nodes()) == {"conv2d_act": 1, "conv2d": 1} and len(cp.transitions) == 0 and cp.num_permutes == 0
    assert nhwc.dispatches["conv2d_nhwc"] == 2 and nhwc.num_permute_nodes == 4  # explicit, in the plan
    assert nhwc.num_permutes == 0 and "permute_copy" not in nhwc.dispatches  # all free: folded
    assert len(nhwc.transitions) == 0 and nonfree_permutes(nhwc) == 0 and nhwc.optimal
    assert len(nhwc.transitions) + nonfree_permutes(nhwc) <= len(cp.transitions) + nonfree_permutes(cp)
    placed = texelflow.plan(model, (x,), conv_dim_order="nhwc")  # the permute passes cancel the inner pair
    assert placed.num_permute_nodes == 2 and placed.num_permutes == 0 and len(placed.transitions) == 0


def test_nhwc_chain_matches_eager(device):
    torch.manual_seed(1)
    model, x = ConvChain().eval(), torch.randn(2, 5, 9, 11)
    with texelflow.compile(model, (x,), device=device, conv_dim_order="nhwc") as prog:
        assert prog.plan.dispatches["conv2d_nhwc"] == 2
        torch.testing.assert_close(prog(x), model(x), rtol=1e-4, atol=1e-4)


def test_resnet18_nhwc_matches_eager(device):
    from texelflow.models import resnet18

    model, inputs = resnet18(image_size=64)
    with texelflow.compile(model, inputs, device=device, conv_dim_order="nhwc") as prog:
        plan = prog.plan
        assert plan.dispatches["conv2d_nhwc"] == 20 and "conv2d" not in plan.dispatches and not plan.fallbacks
        # every conv is dense: two permutes each (40); the permute passes cancel all but 4, and all
        # but those next to the texture-only max pool are free
        assert plan.num_permute_nodes == 4 and nonfree_permutes(plan) + len(plan.transitions) <= 3
        assert plan.num_permutes == nonfree_permutes(plan)  # the free ones are folded: no dispatch
        torch.testing.assert_close(prog(*inputs), model(*inputs), rtol=1e-3, atol=1e-3)


def test_convnext_texture_path_copies_least():
    """ConvNeXt-atto (64 px): transitions plus permutes that copy. With every dense conv
    channels-last on buffers they were 26 against the channels-packed texture path's 29; since the
    depthwise convs take the permutes around them in (permutes/kernel_orders.py) the texture path,
    the default, copies least (9), and the channels-last path stays under its 26 (12)."""
    from texelflow.models import convnext_atto

    model, inputs = convnext_atto(image_size=64)
    cp = texelflow.plan(model, inputs)
    nhwc = texelflow.plan(model, inputs, conv_dim_order="nhwc")
    assert nhwc.dispatches["conv2d_nhwc"] > 0 and not nhwc.fallbacks
    cp_copies, nhwc_copies = cp.num_transitions + cp.num_permutes, nhwc.num_transitions + nhwc.num_permutes
    assert cp_copies <= nhwc_copies <= 26, (cp_copies, nhwc_copies)


def test_resnet18_pools_on_channels_packed_buffers_keep_the_permutes_free():
    """Beside conv2d_nhwc the max pool reads a channels-packed buffer (NHWC memory), so the
    permutes around it are views: ResNet-18 NHWC copies once (before the global pool) and pays
    no transition; the texture path copies nothing."""
    from texelflow.models import resnet18

    model, inputs = resnet18(image_size=64)
    nhwc = texelflow.plan(model, inputs, conv_dim_order="nhwc")
    (pool,) = [n for n in nhwc.graph.nodes if n.op is not None and n.op.name == "max_pool2d"]
    assert str(nhwc.assignment.slots[(pool, "self")]) == "BUFFER/CHANNELS_PACKED"
    assert nhwc.num_transitions == 0 and nhwc.num_permutes <= 1
