"""The cost model (runtime/graph/costs.py) and planning by predicted time: the optimal planner is
still exact and certified for the costs given, never worse than greedy on the same costs, and
costs="none" keeps the transitions-alone plan."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import HealthCheck, given, settings

import texelflow
from texelflow.runtime.graph.costs import ESTIMATE, FORMAT, GENERAL, Coeffs, CostModel, fast_pair, node_flops, \
    node_signature, pair_slots, resolve, slots_of, table_path, value_bytes
from texelflow.runtime.graph.greedy import plan_greedy
from texelflow.runtime.graph.optimal import plan_optimal
from texelflow.runtime.graph.plan import plan_graph
from texelflow.runtime.graph.problem import Assignment, Problem
from texelflow.runtime.graph.repr import TensorRepr
from texelflow.runtime.graph.verify import verify
from tests.graph.synthetic import GraphBuilder, model_like
from tests.graph.test_planners import BINARY, BUF, CP_TEX, REAL, UNARY, brute_force_count, random_graphs

TEX_CP = TensorRepr.parse("TEXTURE_3D/CHANNELS_PACKED")
TEX_WP = TensorRepr.parse("TEXTURE_3D/WIDTH_PACKED")
TEX_HP = TensorRepr.parse("TEXTURE_3D/HEIGHT_PACKED")
BUF_WP = TensorRepr.parse("BUFFER/WIDTH_PACKED")
BUF_CP = TensorRepr.parse("BUFFER/CHANNELS_PACKED")

# A table where textures are slow for unary ops and fast for binary ones, and copies are cheap:
# the plan should mix storages where the transitions pay for themselves.
MIXED = CostModel("table", "test device", {
    ("unary", "TEXTURE_3D/*"): Coeffs(5e-6, 4e-9, 0.0),
    ("unary", "BUFFER/*"): Coeffs(5e-6, 1e-9, 0.0),
    ("binary", "TEXTURE_3D/*"): Coeffs(5e-6, 1e-9, 0.0),
    ("binary", "BUFFER/*"): Coeffs(5e-6, 3e-9, 0.0),
    ("to_layout", "TEXTURE_3D/*"): Coeffs(2e-6, 0.5e-9, 0.0),
    ("to_layout", "BUFFER/*"): Coeffs(2e-6, 0.5e-9, 0.0),
    ("linear", "TEXTURE_3D/WIDTH_PACKED"): Coeffs(8e-6, 1e-9, 1e-10),
    ("*", "TEXTURE_3D/*"): Coeffs(6e-6, 2e-9, 0.0),
    ("*", "BUFFER/*"): Coeffs(6e-6, 2e-9, 0.0),
})


def brute_force_seconds(problem: Problem) -> float:
    """The least predicted time over every legal assignment (small graphs only)."""
    nodes = list(problem.repsets)
    per_node = []
    for n in nodes:
        sets = problem.repsets[n]
        slots = list(sets.sets)
        configs = [dict(zip(slots, combo)) for combo in itertools.product(*(list(sets.sets[s]) for s in slots))]
        per_node.append([c for c in configs if sets.is_sync_compatible(c)])
    free = [v for v in problem.planned if v.producer is None or v.producer not in problem.repsets]
    best = None
    for configs in itertools.product(*per_node):
        a = Assignment()
        for n, chosen in zip(nodes, configs):
            a.slots.update({(n, s): r for s, r in chosen.items()})
            a.values.update({v: chosen[name] for name, v in n.outputs})
        # A host value best takes a representation one of its consumers wants (a copy is priced
        # by its destination only, so any other costs at least as much).
        wanted = [sorted({a.slots[k] for k in problem.consumer_slots(v)}, key=TensorRepr.preference_key) or
                  list(problem.free_domain(v))[:1] for v in free]
        for picks in itertools.product(*wanted):
            a.values.update(zip(free, picks))
            t = a.predicted_seconds(problem)
            best = t if best is None else min(best, t)
    return best


# ---- the model ------------------------------------------------------------------------------------
def test_padding_makes_a_three_channel_texture_dearer_than_a_buffer():
    b = GraphBuilder()
    x = b.input((1, 3, 8, 8))
    b.output(b.unary("relu", x))
    assert value_bytes(x, TEX_CP) == 4 * 8 * 8 * 4 and value_bytes(x, BUF_WP) == 3 * 8 * 8 * 4
    node = b.graph.nodes[0]
    est = CostModel.estimate()
    assert est.node_seconds(node, {"self": TEX_CP, "out": TEX_CP}) > est.node_seconds(node, {"self": BUF_WP, "out": BUF_WP})
    assert est.node_seconds(node, {"self": BUF_WP, "out": BUF_WP}) == pytest.approx(
        ESTIMATE.fixed + ESTIMATE.per_byte * 2 * 3 * 64 * 4 + ESTIMATE.per_flop * 3 * 64)


def test_flops_of_conv_and_linear_and_lookup_order():
    b = GraphBuilder()
    x = b.input((1, 8, 5, 7))
    y = b.conv(x, 16)
    z = b.linear(b.input((3, 10)), 6)
    b.output(y, z)
    conv, linear = b.graph.nodes
    assert node_flops(conv) == 2 * (16 * 5 * 7) * (8 * 3 * 3)
    assert node_flops(linear) == 2 * (3 * 6) * 10
    # op name first, then template, then "*"; exact representation before its storage side
    assert MIXED.coeffs(("linear", "linear", "*"), TEX_WP) == Coeffs(8e-6, 1e-9, 1e-10)
    assert MIXED.coeffs(("linear", "linear", "*"), BUF_WP) == Coeffs(6e-6, 2e-9, 0.0)
    assert CostModel("table").coeffs(("relu", "unary", "*"), BUF_WP) == ESTIMATE


def test_a_view_that_keeps_its_elements_in_place_costs_nothing():
    b = GraphBuilder()
    x = b.input((2, 4, 6))
    b.output(b.view(x, (8, 6)))
    node = b.graph.nodes[0]
    assert MIXED.node_seconds(node, {"self": BUF_WP, "out": BUF_WP}) == 0.0  # a reshape of a contiguous buffer
    assert MIXED.node_seconds(node, {"self": TEX_CP, "out": TEX_CP}) > 0.0  # C changes: a copy


def test_table_json_round_trip_and_bad_files(tmp_path, monkeypatch):
    monkeypatch.setenv("TEXELFLOW_COSTS_DIR", str(tmp_path))
    path = table_path("my gpu/1")
    assert path.parent == tmp_path and "/" not in path.name
    path.write_text(MIXED.to_json({"name": "my gpu"}))
    loaded = resolve("table", "my gpu/1")
    assert loaded.source == "table" and loaded.entries == MIXED.entries and loaded.device == "test device"
    assert resolve(None, "my gpu/1").entries == MIXED.entries  # the default takes an existing table
    assert resolve(None, "other gpu") is None  # ... and transitions alone without one
    assert resolve("table", "other gpu").source == "estimate"
    assert resolve("none", "my gpu/1") is None
    doc = json.loads(path.read_text())
    doc["entries"][0]["fixed_s"] = -1.0
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=f"{path}: not a texelflow cost table"):
        resolve("table", "my gpu/1")
    with pytest.warns(UserWarning, match="planning by transitions alone"):
        assert resolve(None, "my gpu/1") is None
    with pytest.raises(ValueError, match="costs='fast': choose 'table', 'estimate' or 'none'"):
        resolve("fast", None)


def test_a_node_the_tuner_timed_is_predicted_as_measured_names_aside():
    """ViT-S's twelve blocks share one signature; the measured time replaces the fit, split so the
    slots still add up to it (the integer program charges them separately)."""
    b = GraphBuilder()
    x, y = b.input((1, 3, 5, 7)), b.input((1, 3, 5, 7))
    first, second = b.binary("add", x, y), b.binary("add", b.input((1, 3, 5, 7)), b.input((1, 3, 5, 7)))
    other = b.binary("add", b.input((1, 3, 5, 1)), b.input((1, 3, 5, 7)))  # broadcast: another kernel time
    b.output(first, second, other)
    n1, n2, n3 = b.graph.nodes
    assert node_signature(n1) == node_signature(n2) != node_signature(n3)
    measured = {(node_signature(n1), str(BUF_WP)): 40e-6}
    model = CostModel("table", "test device", MIXED.entries, measured=measured)
    uniform = {name: BUF_WP for name, _ in slots_of(n2)}
    assert model.node_seconds(n2, uniform) == pytest.approx(40e-6)
    assert sum(model.slot_seconds(n2, name, v, BUF_WP) for name, v in slots_of(n2)) == pytest.approx(40e-6)
    textures = {name: TEX_CP for name in uniform}  # not measured in textures: the fit
    assert model.node_seconds(n2, textures) == MIXED.node_seconds(n2, textures)
    assert model.node_seconds(n3, {name: BUF_WP for name, _ in slots_of(n3)}) == \
        MIXED.node_seconds(n3, {name: BUF_WP for name, _ in slots_of(n3)})
    # a time below the other slots' fitted shares: the output slot pays its own share, never less
    tiny = CostModel("table", "test device", MIXED.entries, measured={(node_signature(n1), str(BUF_WP)): 1e-12})
    assert tiny.slot_seconds(n1, "out", n1.outputs[0][1], BUF_WP) > 0


def test_measured_times_round_trip_and_old_tables_still_load(tmp_path):
    times = {("relu(self=t1x3:float32)->1x3:float32", str(BUF_WP)): 2e-5}
    model = CostModel("table", "test device", MIXED.entries, measured=times)
    loaded = CostModel.from_json(model.to_json())
    assert loaded.measured == model.measured and loaded.entries == MIXED.entries
    doc = json.loads(model.to_json())
    del doc["measured"]  # written before measured times were kept
    assert CostModel.from_json(json.dumps(doc)).measured == {}
    doc["measured"] = [{"node": "relu()", "repr": str(BUF_WP), "seconds": float("nan")}]
    with pytest.raises(ValueError, match="t.json: not a texelflow cost table .*non-finite time for relu"):
        CostModel.from_json(json.dumps(doc), "t.json")


# ---- planning by predicted time -------------------------------------------------------------------
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_graphs(ops_unary=UNARY + REAL[:3], ops_binary=BINARY, max_nodes=3))
def test_optimal_minimises_predicted_time_exactly_and_beats_greedy(graph):
    problem = Problem.build(graph, costs=MIXED)
    optimal, greedy = plan_optimal(problem), plan_greedy(problem)
    assert optimal.optimal and optimal.lower_bound == len(optimal.transitions(problem))
    best = brute_force_seconds(problem)
    assert optimal.predicted_seconds(problem) == pytest.approx(best, rel=1e-6)
    assert optimal.predicted_seconds(problem) <= greedy.predicted_seconds(problem) * (1 + 1e-9)
    verify(problem, optimal, transitions_inserted=False)


def test_costs_mix_storages_where_the_copies_pay_for_themselves():
    b = GraphBuilder()
    x = b.input((1, 16, 32, 32))
    y = x
    for _ in range(4):  # unary ops are cheap in buffers, binary ones in textures
        y = b.unary("relu", b.unary("sigmoid", y))
    z = b.binary("mul", b.binary("add", y, y), y)
    graph = b.output(z)
    plan = plan_graph(graph, costs=MIXED)
    storages = {r.split("/")[0] for r in plan.reprs.values()}
    assert storages == {"BUFFER", "TEXTURE_3D"}, plan.summary()
    assert plan.optimal and plan.num_transitions >= 1
    assert "predicted us" in plan.summary() and "costs=table" in plan.summary()
    assert plan.predicted_seconds == pytest.approx(sum(plan.predicted().values()))


def test_none_keeps_the_transitions_alone_plan_and_greedy_ignores_costs():
    plans = {}
    for costs in (None, MIXED):
        graph = model_like(60, seed=3)
        plans[costs is None] = plan_graph(graph, costs=costs)
    alone, priced = plans[True], plans[False]
    assert alone.costs is None and alone.predicted_seconds is None and "predicted us" not in alone.summary()
    assert priced.optimal and alone.optimal
    # with the table, the plan's predicted time is the least of the two (both priced alike)
    assert sum(priced.predicted(MIXED).values()) <= sum(alone.predicted(MIXED).values()) * (1 + 1e-9)
    graph = model_like(60, seed=3)
    problem = Problem.build(graph, costs=MIXED)
    g1 = plan_greedy(problem)
    g2 = plan_greedy(Problem.build(model_like(60, seed=3)))
    assert [str(r) for r in g1.values.values()] == [str(r) for r in g2.values.values()]
    assert plan_optimal(problem).predicted_seconds(problem) <= g1.predicted_seconds(problem) * (1 + 1e-9)


def test_large_graph_with_costs_plans_in_reasonable_time():
    import time

    graph = model_like(600, seed=1)
    start = time.perf_counter()
    plan = plan_graph(graph, costs=CostModel.estimate())
    assert plan.optimal
    assert time.perf_counter() - start < 30


def test_api_costs_option_without_a_device():
    import torch

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8 * 4 * 4, 5))
    x = torch.randn(1, 3, 6, 6)
    est = texelflow.plan(model, (x,), costs="estimate")
    assert est.costs.source == "estimate" and est.optimal and est.predicted_seconds > 0
    assert texelflow.plan(model, (x,)).costs is None  # no device: no table, transitions alone
    assert texelflow.plan(model, (x,), costs="table").costs.source == "estimate"  # no device: no table
    with pytest.raises(ValueError, match="costs='nope'"):
        texelflow.plan(model, (x,), costs="nope")


def test_a_plan_predicted_barely_faster_keeps_the_transitions_alone_plan():
    nearly = CostModel("table", "test device", {  # buffers 1% cheaper: under MIN_PREDICTED_GAIN
        ("*", "TEXTURE_3D/*"): Coeffs(5e-6, 1.01e-9, 0.0),
        ("*", "BUFFER/*"): Coeffs(5e-6, 1.0e-9, 0.0),
    })
    b = GraphBuilder()
    x = b.input((1, 16, 32, 32))
    graph = b.output(b.unary("relu", b.unary("sigmoid", x)))
    plan = plan_graph(graph, costs=nearly)
    assert set(plan.reprs.values()) == {"TEXTURE_3D/WIDTH_PACKED"}  # the preferred one, as without costs
    assert "kept the transitions-alone plan" in plan.summary() and plan.optimal
    b = GraphBuilder()
    x = b.input((1, 16, 32, 32))
    graph = b.output(b.unary("relu", b.unary("sigmoid", x)))
    clear = CostModel("table", "test device", {("*", "TEXTURE_3D/*"): Coeffs(5e-6, 2e-9, 0.0),
                                               ("*", "BUFFER/*"): Coeffs(5e-6, 1e-9, 0.0)})
    assert set(plan_graph(graph, costs=clear).reprs.values()) == {"BUFFER/WIDTH_PACKED"}


# ---- a permute's pair of representations ----------------------------------------------------------
# A table where a permute's fast path (units moved whole) costs a fifth of its general path, as
# the tuner measured them on lavapipe, and the other kernels are alike everywhere.
PERMUTES = CostModel("table", "test device", {
    ("permute_copy", "TEXTURE_3D/*"): Coeffs(20e-6, 1e-9, 0.0),
    ("permute_copy", "BUFFER/*"): Coeffs(20e-6, 1e-9, 0.0),
    ("permute_copy" + GENERAL, "TEXTURE_3D/*"): Coeffs(40e-6, 5e-9, 0.0),
    ("permute_copy" + GENERAL, "BUFFER/*"): Coeffs(40e-6, 5e-9, 0.0),
    ("to_layout", "TEXTURE_3D/*"): Coeffs(5e-6, 1e-9, 0.0),
    ("to_layout", "BUFFER/*"): Coeffs(5e-6, 1e-9, 0.0),
    ("*", "TEXTURE_3D/*"): Coeffs(5e-6, 1e-9, 0.0),
    ("*", "BUFFER/*"): Coeffs(5e-6, 1.2e-9, 0.0),
})


def permute_graph(dims=(0, 2, 3, 1), shape=(1, 8, 5, 12)):
    """relu -> permute(dims) -> sigmoid: ConvNeXt's NCHW -> NHWC between two kernels."""
    b = GraphBuilder()
    x = b.unary("relu", b.input(shape))
    y = b.node("permute_copy", [("self", x), ("dims", list(dims))], tuple(shape[d] for d in dims))
    return b.output(b.unary("sigmoid", y))


def test_a_permute_is_priced_by_its_pair_of_representations():
    graph = permute_graph()
    node = next(n for n in graph.nodes if n.op.name == "permute_copy")
    assert pair_slots(node) == ("self", "out")
    assert pair_slots(graph.nodes[0]) is None  # relu: separable
    # NCHW -> NHWC takes the output's W to the input's C: channels- to width-packed is the fast path
    assert fast_pair(node, TEX_CP, TEX_WP) and fast_pair(node, BUF_CP, BUF_WP)
    assert not fast_pair(node, TEX_CP, TEX_CP) and not fast_pair(node, TEX_WP, TEX_WP)
    assert not fast_pair(node, TEX_CP, BUF_WP)  # storages differ: one element at a time
    fast = PERMUTES.node_seconds(node, {"self": TEX_CP, "out": TEX_WP})
    slow = PERMUTES.node_seconds(node, {"self": TEX_CP, "out": BUF_WP})
    n = 8 * 5 * 12 * 4
    assert slow == pytest.approx(40e-6 + 5e-9 * 2 * n, rel=0.05) and fast < slow / 2
    assert PERMUTES.pair_seconds(node, TEX_CP, TEX_WP) == 0.0
    assert PERMUTES.pair_seconds(node, TEX_CP, BUF_WP) == PERMUTES.general_seconds(node, BUF_WP) > 0
    # a table that never timed the general path prices every pair alike (as tables did before)
    plain = CostModel("table", "t", {k: c for k, c in PERMUTES.entries.items() if GENERAL not in k[0]})
    assert plain.pair_seconds(node, TEX_CP, BUF_WP) == 0.0
    # the built-in estimate takes the general path as several times the fast one
    est = CostModel.estimate()
    general, fast = ({"self": TEX_CP, "out": r} for r in (TEX_CP, TEX_WP))
    assert est.node_seconds(node, general) > 2 * est.node_seconds(node, fast)
    # a general-path time the tuner measured for this very node is used before the fit
    measured = {(node_signature(node) + GENERAL, str(BUF_WP)): 1e-3}
    timed = CostModel("table", "t", PERMUTES.entries, measured=measured)
    assert timed.node_seconds(node, {"self": TEX_CP, "out": BUF_WP}) == pytest.approx(1e-3)


def test_the_planner_keeps_a_permute_on_its_fast_path():
    """Without the pair price the planner sees no difference between a permute's pairs; with it,
    the plan puts the permute's input and output where its units move whole, and is certified."""
    plain = CostModel("table", "t", {k: c for k, c in PERMUTES.entries.items() if GENERAL not in k[0]})
    for dims, shape in (((0, 2, 3, 1), (1, 8, 5, 12)), ((0, 3, 1, 2), (1, 7, 6, 8)), ((0, 2, 1, 3), (1, 5, 6, 8))):
        fast = {}
        for name, costs in (("pairs", PERMUTES), ("output alone", plain)):
            graph = permute_graph(dims, shape)
            plan = plan_graph(graph, costs=costs)
            node = next(n for n in graph.nodes if n.op.name == "permute_copy")
            pair = plan.assignment.slots[(node, "self")], plan.assignment.slots[(node, "out")]
            assert plan.optimal
            fast[name] = fast_pair(node, *pair)
        assert fast["pairs"], dims
        # Priced alike in every pair, the plans tie and the transitions-alone plan is kept: its
        # ties go to the fast path too (optimal/pair_ties.py)
        assert fast["output alone"], dims


def test_transitions_alone_breaks_ties_toward_a_permutes_fast_path():
    """Planned by transitions alone, every plan of relu -> permute -> sigmoid needs none; among
    them the planner takes one where the permute moves whole units, certified all the same."""
    for dims, shape in (((0, 2, 3, 1), (1, 8, 5, 12)), ((0, 3, 1, 2), (1, 7, 6, 8)), ((0, 2, 1, 3), (1, 5, 6, 8))):
        graph = permute_graph(dims, shape)
        problem = Problem.build(graph)
        plan = plan_optimal(problem)
        node = next(n for n in graph.nodes if n.op.name == "permute_copy")
        assert plan.optimal and plan.cost(problem) == (0, 0)
        assert fast_pair(node, plan.slots[(node, "self")], plan.slots[(node, "out")]), dims
        # the preference order alone (texture width-packed everywhere) puts NCHW <-> NHWC on the
        # general path: the planner's note counts the permute it moved
        moved = [note for note in plan.notes if "fast path" in note]
        assert moved == ([] if dims == (0, 2, 1, 3) else ["1 permute(s), slice(s), pad(s) or select(s) moved to "
                                                           "their fast path among plans of equal transitions"]), dims
        verify(problem, plan, transitions_inserted=False)


def swap_last_two(b, x):
    """A permute that keeps the shape (H and W of a square image swapped), so it mixes with adds."""
    dims = list(range(len(x.shape)))
    dims[-2:] = dims[-1], dims[-2]
    return b.node("permute_copy", [("self", x), ("dims", dims)])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_graphs(ops_unary=[swap_last_two, "relu", CP_TEX, BUF], ops_binary=["add"], max_nodes=2,
                     shapes=[(1, 4, 8, 8), (2, 6, 6)]))
def test_optimal_with_permutes_matches_brute_force(graph):
    """The pair terms are exact: the optimum over every assignment, permutes' pairs priced."""
    problem = Problem.build(graph, costs=PERMUTES)
    optimal = plan_optimal(problem)
    assert optimal.optimal
    assert optimal.predicted_seconds(problem) == pytest.approx(brute_force_seconds(problem), rel=1e-6)
    verify(problem, optimal, transitions_inserted=False)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_graphs(ops_unary=[swap_last_two, "relu", CP_TEX, BUF], ops_binary=["add"], max_nodes=3,
                     shapes=[(1, 4, 8, 8), (2, 6, 6)]))
def test_pair_ties_keep_the_minimum_transitions(graph):
    """Moving permutes to their fast paths never costs a transition: the count is still the
    brute-force minimum, and the plan is legal."""
    problem = Problem.build(graph)
    plan = plan_optimal(problem)
    assert plan.optimal
    assert plan.cost(problem)[0] == brute_force_count(problem)
    verify(problem, plan, transitions_inserted=False)


def test_a_table_of_another_format_is_not_used(tmp_path):
    doc = json.loads(PERMUTES.to_json())
    assert doc["format"] == FORMAT
    doc["format"] = FORMAT - 1  # permutes were priced by their output alone then
    with pytest.raises(ValueError, match="not a texelflow cost table .*format 1, expected 2"):
        CostModel.from_json(json.dumps(doc))
