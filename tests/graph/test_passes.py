"""Redundant-op removal, transitions, verification and the optimal planner's fallback, on graphs
built inline."""

from __future__ import annotations

import pytest

import texelflow.runtime.graph.optimal.planner as optimal_planner
from texelflow.runtime.graph.optimal import plan_optimal
from texelflow.runtime.graph.plan import plan_graph
from texelflow.runtime.graph.problem import Problem
from texelflow.runtime.graph.repr import TensorRepr, TensorRepSet
from texelflow.runtime.graph.verify import PlanVerificationError, verify
from tests.graph.synthetic import GraphBuilder, variant_of

CP_TEX = variant_of("relu", "cp_texture_op", "CHANNELS_PACKED_TEXTURE")
WP_ANY = variant_of("relu", "wp_any_op", "CONTIGUOUS_ANY")
INT8_4W4C = variant_of("clone", "int8_4w4c_op", "PACKED_INT8_4W4C_BUFFER")
INT8_4C1W = variant_of("clone", "int8_4c1w_op", "PACKED_INT8_4C1W_BUFFER")


def test_identity_ops_in_one_representation_are_folded():
    b = GraphBuilder()
    x = b.input((1, 4, 16, 16))
    c = b.unary("clone", b.unary("relu", x))
    a = b.unary("alias_copy", c)
    u = b.node("unsqueeze_copy", [("self", a), ("dim", 0)], (1, 1, 4, 16, 16))
    plan = plan_graph(b.output(b.unary("sigmoid", u)), "optimal")
    assert sorted(n.op.name for n in plan.folded) == ["alias_copy", "clone", "unsqueeze_copy"]
    assert plan.dispatches == {"relu": 1, "sigmoid": 1}


def test_reshape_that_would_move_texels_is_planned_where_it_folds():
    """[1, 4, 16, 16] -> [64, 16] changes H: a copy in any texture, a relabelling in a width-packed
    buffer. Lowering narrows the view to the representations where it folds, so the chain is
    planned in a buffer and the view dispatches nothing."""
    b = GraphBuilder()
    x = b.input((1, 4, 16, 16))
    v = b.view(b.unary("relu", x), (64, 16))
    plan = plan_graph(b.output(b.unary("relu", v)), "optimal")
    assert [n.op.name for n in plan.folded] == ["view_copy"] and "view_copy" not in plan.dispatches
    assert plan.num_transitions == 0 and set(plan.reprs.values()) == {"BUFFER/WIDTH_PACKED"}


def test_int8_clone_bridges_compatible_layouts_without_a_transition():
    b = GraphBuilder()
    x = b.input((1, 8, 4, 4), "int8")
    q = b.unary(INT8_4W4C, x)
    c = b.unary("clone", q)
    b.output(b.unary(INT8_4C1W, c))
    plan = plan_graph(b.graph, "optimal")
    # 4W4C and 4C1W share packed-dim info: the clone bridges them with no transition.
    assert plan.num_transitions == 0
    clone = next(n for n in b.graph.nodes if n.op.name == "clone")
    slots = {s: str(plan.assignment.slots[(clone, s)]) for s in ("self", "out")}
    assert slots == {"self": "BUFFER/PACKED_INT8_4W4C", "out": "BUFFER/PACKED_INT8_4C1W"}
    assert not clone.folded  # different layouts: the clone really moves bytes


def test_transition_nodes_are_marked_and_shared():
    b = GraphBuilder()
    x = b.input((1, 4, 16, 16))
    p = b.unary(CP_TEX, x)
    plan = plan_graph(b.output(b.unary(WP_ANY, p), b.unary(WP_ANY, p), b.unary(CP_TEX, p)), "optimal")
    (t,) = plan.transitions
    assert t.transition and t.op.name == "to_layout" and not t.folded
    assert len(t.outputs[0][1].users) == 2
    assert plan.reprs[t.name] == "TEXTURE_3D/WIDTH_PACKED"


def test_verification_catches_a_broken_plan():
    b = GraphBuilder()
    x = b.input((1, 4, 16, 16))
    b.output(b.unary(CP_TEX, x))
    problem = Problem.build(b.graph)
    assignment = plan_optimal(problem)
    node = b.graph.nodes[0]
    assignment.slots[(node, "out")] = TensorRepr.parse("BUFFER/WIDTH_PACKED")
    with pytest.raises(PlanVerificationError, match="texelflow bug"):
        verify(problem, assignment)


def test_solver_failure_keeps_the_greedy_plan_uncertified(monkeypatch):
    monkeypatch.setattr(optimal_planner, "solve_component", lambda *a, **k: None)
    b = GraphBuilder()
    x = b.input((1, 4, 16, 16))
    p = b.unary(CP_TEX, x)
    b.output(b.unary(WP_ANY, p))
    plan = plan_graph(b.graph, "optimal")
    assert plan.num_transitions == 1
    assert not plan.optimal and plan.lower_bound == 0
    assert "greedy plan was kept" in " ".join(plan.assignment.notes)


def test_free_value_domain_respects_texture_limits():
    b = GraphBuilder()
    x = b.input((1, 1, 20000, 8))
    problem = Problem.build(b.output(b.unary("relu", x)))
    dom = problem.free_domain(x)
    assert dom.side(TensorRepr.parse("TEXTURE_3D/HEIGHT_PACKED").storage) == frozenset(
        {TensorRepr.parse("TEXTURE_3D/HEIGHT_PACKED").layout}
    )
    assert dom & TensorRepSet.named("ANY_BUFFER") == TensorRepSet.named("ANY_BUFFER")


def test_int8_clone_in_one_layout_is_folded():
    b = GraphBuilder()
    x = b.input((1, 8, 4, 4), "int8")
    c = b.unary("clone", b.unary(INT8_4W4C, x))
    plan = plan_graph(b.output(b.unary(INT8_4W4C, c)), "optimal")
    # the test-only int8 ops are copies of clone, so identity ops too: all three fold away.
    assert sorted(n.op.name for n in plan.folded) == ["clone", "int8_4w4c_op", "int8_4w4c_op"]
    assert plan.num_transitions == 0
