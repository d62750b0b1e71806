"""Planner properties on graphs built from the registry: optimal is exact, never worse than
greedy, and every plan passes verification; plus the reference's known weak spots."""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from texelflow.runtime.graph.greedy import plan_greedy
from texelflow.runtime.graph.optimal import plan_optimal
from texelflow.runtime.graph.plan import plan_graph
from texelflow.runtime.graph.problem import Assignment, Problem
from texelflow.runtime.graph.repr import TensorRepSet
from texelflow.runtime.graph.verify import verify
from tests.graph.synthetic import GraphBuilder, variant_of

# Registry ops plus test-only copies with the constraining repsets of the reference's kernels.
CP_TEX = variant_of("relu", "cp_texture_op", "CHANNELS_PACKED_TEXTURE")
WP_ANY = variant_of("relu", "wp_any_op", "CONTIGUOUS_ANY")
HP_TEX = variant_of("relu", "hp_texture_op", "HEIGHT_PACKED_TEXTURE")
BUF = variant_of("relu", "buffer_op", "ANY_BUFFER")
BIN_CP = variant_of("add", "cp_binary_op", "CHANNELS_PACKED_TEXTURE")
BIN_WP = variant_of("add", "wp_binary_op", "CONTIGUOUS_ANY")
UNARY = ["relu", "sigmoid", "tanh", "clone", CP_TEX, WP_ANY, HP_TEX, BUF]
BINARY = ["add", "mul", BIN_CP, BIN_WP]
INT8_OPS = [
    variant_of("clone", "int8_4w4c_op", "PACKED_INT8_4W4C_BUFFER"),
    variant_of("clone", "int8_4h4w_op", "PACKED_INT8_4H4W_BUFFER"),
    variant_of("clone", "int8_4c1w_op", "PACKED_INT8_4C1W_BUFFER"),
    "clone",
    "alias_copy",
]


def brute_force_count(problem: Problem) -> int:
    """The minimum number of transitions over every legal assignment (small graphs only)."""
    nodes = list(problem.repsets)
    per_node = []
    for n in nodes:
        sets = problem.repsets[n]
        slots = list(sets.sets)
        configs = []
        for combo in itertools.product(*(list(sets.sets[s]) for s in slots)):
            chosen = dict(zip(slots, combo))
            if sets.is_sync_compatible(chosen):
                configs.append(chosen)
        per_node.append(configs)
    free = [v for v in problem.planned if v.producer is None or v.producer not in problem.repsets]
    free_domains = [list(problem.free_domain(v)) for v in free]
    best = None
    for configs in itertools.product(*per_node):
        a = Assignment()
        for n, chosen in zip(nodes, configs):
            for s, r in chosen.items():
                a.slots[(n, s)] = r
            for name, v in n.outputs:
                a.values[v] = chosen[name]
        # Each free value best takes one of the representations its consumers want (or any).
        for picks in itertools.product(*[_useful(problem, v, a, d) for v, d in zip(free, free_domains)]):
            for v, r in zip(free, picks):
                a.values[v] = r
            count = len(a.transitions(problem))
            best = count if best is None else min(best, count)
    return best


def _useful(problem, v, a, domain):
    wanted = {a.slots[key] for key in problem.consumer_slots(v)}
    return sorted(wanted, key=lambda r: r.preference_key()) or domain[:1]


# Real registry ops with their own arguments (shape-preserving on [1, 4, 16, 16]).
REAL = [
    lambda b, x: b.node("max_pool2d", [("self", x), ("kernel_size", [1, 1])]),
    lambda b, x: b.node("avg_pool2d", [("self", x), ("kernel_size", [1, 1])]),
    lambda b, x: b.node("linear", [("input", x), ("weight", b.const((16, 16)))]),
    lambda b, x: b.node("layer_norm", [("input", x), ("normalized_shape", [16])]),
    lambda b, x: b.node("permute_copy", [("self", x), ("dims", [0, 1, 3, 2])]),
    "relu",
    "clone",
]


@st.composite
def random_graphs(draw, ops_unary=UNARY, ops_binary=BINARY, max_nodes=4, dtype="float32", shapes=None):
    b = GraphBuilder()
    shape = draw(st.sampled_from(shapes or [(1, 4, 16, 16), (1, 3, 5, 7), (2, 8, 4)]))
    values = [b.input(shape, dtype) for _ in range(draw(st.integers(1, 2)))]
    for _ in range(draw(st.integers(1, max_nodes))):
        if ops_binary and len(values) > 1 and draw(st.booleans()):
            x, y = draw(st.sampled_from(values)), draw(st.sampled_from(values))
            values.append(b.binary(draw(st.sampled_from(ops_binary)), x, y))
        else:
            op, x = draw(st.sampled_from(ops_unary)), draw(st.sampled_from(values))
            values.append(op(b, x) if callable(op) else b.unary(op, x))
    outs = draw(st.lists(st.sampled_from(values[-3:]), min_size=1, max_size=2, unique_by=id))
    return b.output(*outs)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_graphs())
def test_optimal_is_exact_and_never_worse_than_greedy(graph):
    problem = Problem.build(graph)
    greedy, optimal = plan_greedy(problem), plan_optimal(problem)
    g_count, o_count = len(greedy.transitions(problem)), len(optimal.transitions(problem))
    assert optimal.optimal and optimal.lower_bound == o_count
    assert o_count <= g_count
    assert o_count == brute_force_count(problem)
    verify(problem, greedy, transitions_inserted=False)
    verify(problem, optimal, transitions_inserted=False)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_graphs(ops_unary=REAL, ops_binary=["add", "mul"], shapes=[(1, 4, 16, 16)]))
def test_optimal_is_exact_on_real_registry_ops(graph):
    problem = Problem.build(graph)
    greedy, optimal = plan_greedy(problem), plan_optimal(problem)
    o_count = len(optimal.transitions(problem))
    assert optimal.optimal and o_count <= len(greedy.transitions(problem))
    assert o_count == brute_force_count(problem)
    verify(problem, optimal, transitions_inserted=False)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_graphs(ops_unary=INT8_OPS, ops_binary=[], dtype="int8"))
def test_int8_graphs_mix_compatible_layouts(graph):
    problem = Problem.build(graph)
    optimal = plan_optimal(problem)
    assert len(optimal.transitions(problem)) == brute_force_count(problem)
    verify(problem, optimal, transitions_inserted=False)
    for v, r in optimal.values.items():
        assert r.layout.name.startswith("PACKED_INT8"), (v, r)


@settings(max_examples=25, deadline=None)
@given(random_graphs(max_nodes=8))
def test_full_pipeline_verifies_and_counts_match(graph):
    plan = plan_graph(graph, "optimal")
    assert plan.num_transitions == len([n for n in graph.nodes if n.transition])
    for n in plan.transitions:
        assert n.op.name == "to_layout"


def chain(n_ops: int):
    b = GraphBuilder()
    x = b.input((1, 4, 16, 16))
    for i in range(n_ops):
        x = b.unary("sigmoid" if i % 2 == 0 else "tanh", x)
    return b.output(b.unary(CP_TEX, x))


def test_b64_budget_exhausted_greedy_pays_one_optimal_none():
    for planner, expected in (("greedy", 1), ("optimal", 0)):
        plan = plan_graph(chain(64), planner)
        assert plan.num_transitions == expected, planner
    plan = plan_graph(chain(64), "optimal")
    assert plan.optimal and plan.lower_bound == 0
    assert set(plan.reprs.values()) == {"TEXTURE_3D/CHANNELS_PACKED"}


def test_b63_both_planners_find_zero():
    for planner in ("greedy", "optimal"):
        assert plan_graph(chain(63), planner).num_transitions == 0


def test_shared_transition_for_two_consumers():
    """E2's shape: one pooled value feeding two WP consumers gets exactly one shared copy."""
    b = GraphBuilder()
    x = b.input((1, 4, 16, 16))
    p = b.unary(CP_TEX, x)
    b.output(b.unary(WP_ANY, p), b.unary(WP_ANY, p))
    for planner in ("greedy", "optimal"):
        plan = plan_graph(b.graph if planner == "greedy" else _e2(), planner)
        assert plan.num_transitions == 1
        (t,) = plan.transitions
        assert len(t.outputs[0][1].users) == 2


def _e2():
    b = GraphBuilder()
    x = b.input((1, 4, 16, 16))
    p = b.unary(CP_TEX, x)
    return b.output(b.unary(WP_ANY, p), b.unary(WP_ANY, p))


def test_transitions_are_never_folded_and_identity_is():
    b = GraphBuilder()
    x = b.input((1, 4, 16, 16))
    c = b.unary("clone", b.unary(CP_TEX, x))
    plan = plan_graph(b.output(b.unary(WP_ANY, c)), "optimal")
    assert plan.num_transitions == 1
    assert plan.dispatches["to_layout"] == 1
    assert all(not t.folded for t in plan.transitions)


def test_free_domain_of_int8_input_is_int8_only():
    b = GraphBuilder()
    x = b.input((1, 8, 4, 4), "int8")
    problem = Problem.build(b.output(b.unary("clone", x)))
    dom = problem.free_domain(x)
    assert dom == dom & TensorRepSet.named("PACKED_INT8_BUFFER") and not dom.is_empty()
