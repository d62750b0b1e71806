"""Global permute placement (DESIGN §8): one permute per (tensor, order), at minimum total cost.

Before (a region that also feeds a graph output; the local passes give up):

    conv -> permute(0,2,3,1) -> relu -> permute(0,3,1,2) -> conv      3 permutes
                                     -> permute(0,3,1,2) -> conv
                                     -> output
After:

    conv -> relu -> conv, conv                                        1 permute
                 -> permute(0,2,3,1) -> output

Permutes and ops that commute with them (commuting.py) connect values into regions; every value
of a region gets its dim order relative to the region's canonical order, and values linked by
permutes are one tensor class. Commuting ops may run in any order (their dims remapped, constant
operands reshaped); pinned ops, graph inputs, outputs and constants keep the orders they have.
Each region is then a labelling problem (labelling.py): a label per commuting op, a permute per
(class, order read other than the produced one), cost count first, bytes second. The labels worth
trying are the fixed ones (relabelling a free label to a fixed one never adds a permute), so most
regions have two and are solved exactly as a min cut; more go to the integer program.

A region is rewritten only when its solution is strictly cheaper than the permutes it holds, and
the result of the last run is kept in `LAST` (per region: permutes before, the optimum, whether
it is proven), the certificate the tests read.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

from texelflow.generated.layouts import TEXTURE_LIMITS
from texelflow.generated.ops import OPS

from ..ir import Node, PlanGraph, Role, Value
from ..lowering import partition_reason
from .commuting import (commuting_rank, constant_as, is_permute, members, permute_dims, relative,
                        remapped_args)
from .labelling import COUNT, FORBIDDEN, TensorClass, solve

PERMUTE_TARGET = "aten.permute_copy.default"


@dataclass
class RegionResult:
    """What the placement found for one region (cost = permutes * COUNT + bytes)."""

    permutes_before: int
    cost_before: int
    cost: int
    optimal: bool
    labels: int

    @property
    def permutes(self) -> int:
        return self.cost // COUNT

    @property
    def bytes(self) -> int:
        return self.cost % COUNT


@dataclass
class Report:
    regions: list[RegionResult] = field(default_factory=list)

    @property
    def optimal(self) -> bool:
        return all(r.optimal for r in self.regions)


LAST = Report()  # the report of the latest place_permutes call


def place_permutes(graph: PlanGraph, texture_limits: Sequence[int] = TEXTURE_LIMITS) -> PlanGraph:
    """Rewrite `graph` in place with the cheapest permutes each region admits; returns it."""
    global LAST
    LAST = Report()
    regions = _regions(graph)
    names = {v.name for v in graph.values()} | {n.name for n in graph.nodes}
    outputs = {id(v) for v in graph.outputs}
    changed = False
    memo: dict = {}  # partition checks by signature: large graphs repeat a few shapes
    for region in regions:
        plan = _solve(graph, region, outputs, tuple(texture_limits), memo)
        LAST.regions.append(plan.result)
        if plan.result.cost < plan.result.cost_before and plan.result.optimal:
            _rewrite(graph, region, plan, names)
            changed = True
    if changed:
        _relink(graph)
    return graph


# ---- regions ----------------------------------------------------------------------------------------------
@dataclass
class Region:
    rank: int
    order: dict[Value, tuple[int, ...]]  # every value's order relative to the canonical one
    ops: list[Node]  # commuting ops
    permutes: list[Node]
    permutes_set: set = field(default_factory=set)


def _regions(graph: PlanGraph) -> list[Region]:
    """Regions around the permutes; an op whose operands disagree on the order is pinned."""
    pinned: set[int] = set()
    while True:
        regions, conflict = _grow(graph, pinned)
        if conflict is None:
            return regions
        pinned.add(id(conflict))


def _grow(graph: PlanGraph, pinned: set[int]):
    ranks = {}
    for n in graph.nodes:
        if id(n) not in pinned:
            if is_permute(n):
                ranks[n] = "permute"
            else:
                r = commuting_rank(n)
                if r is not None:
                    ranks[n] = r
    seen: dict[Value, tuple[int, ...]] = {}
    regions = []
    for start in graph.nodes:
        if ranks.get(start) != "permute" or start.arg("self") in seen:
            continue
        root = start.arg("self")
        rank = len(root.shape)
        region = Region(rank, {root: tuple(range(rank))}, [], [])
        seen[root] = region.order[root]
        done: set[int] = set()
        queue = deque([root])

        def visit(v: Value, order, via: Node):
            known = region.order.get(v)
            if known is None:
                region.order[v] = seen[v] = order
                queue.append(v)
                return None
            return via if known != order else None

        while queue:
            v = queue.popleft()
            here = region.order[v]
            for n in ([v.producer] if v.producer is not None else []) + list(v.users):
                kind = ranks.get(n)
                if kind is None or id(n) in done:
                    continue
                done.add(id(n))
                if kind == "permute":
                    region.permutes.append(n)
                    x, y, p = n.arg("self"), n.outputs[0][1], permute_dims(n)
                    ox = here if x is v else tuple(_inverse_apply(here, p))
                    bad = visit(x, ox, n) or visit(y, tuple(ox[i] for i in p), n)
                else:
                    region.ops.append(n)
                    bad = None
                    for u in members(n, kind) + [o for _, o in n.outputs]:
                        bad = bad or visit(u, here, n)
                if bad is not None:
                    return [], bad
        regions.append(region)
    return regions, None


def _inverse_apply(order_y, p):
    """The order of x from that of y = x.permute(p): order_x[p[i]] = order_y[i]."""
    ox = [0] * len(p)
    for i, d in enumerate(p):
        ox[d] = order_y[i]
    return ox


# ---- the labelling problem of a region ---------------------------------------------------------------------
@dataclass
class _Plan:
    labels: list[tuple[int, ...]]  # label index -> order
    op_label: dict[Node, tuple[int, ...]]
    classes: dict[Value, list[Value]]  # class source -> its values
    source_of: dict[Value, Value]
    result: RegionResult


def _source(v: Value, region: Region) -> Value:
    while v.producer is not None and v.producer in region.permutes_set:
        v = v.producer.arg("self")
    return v


def _solve(graph: PlanGraph, region: Region, outputs: set[int], limits, memo: dict) -> _Plan:
    region.permutes_set = set(region.permutes)
    ops_index = {n: i for i, n in enumerate(region.ops)}
    classes: dict[Value, list[Value]] = {}
    source_of = {}
    for v in region.order:
        s = _source(v, region)
        source_of[v] = s
        classes.setdefault(s, []).append(v)
    # fixed labels: pinned producers, pinned readers, graph outputs
    fixed: dict[tuple[int, ...], int] = {}
    raw = []
    for s, values in classes.items():
        producer = s.producer if s.producer in ops_index else None
        demands, readers = set(), set()
        for v in values:
            if id(v) in outputs:
                demands.add(region.order[v])
            for n in v.users:
                if n in region.permutes_set:
                    continue
                if n in ops_index:
                    readers.add(ops_index[n])
                else:
                    demands.add(region.order[v])
        if producer is None:
            fixed.setdefault(region.order[s], len(fixed))
        for d in demands:
            fixed.setdefault(d, len(fixed))
        raw.append((s, producer, demands, readers))
    labels = list(fixed)
    current = [region.order[n.outputs[0][1]] for n in region.ops]
    allowed = []
    for n, cur in zip(region.ops, current):
        ok = {i for i, lab in enumerate(labels) if lab == cur or _runs_in(n, region, cur, lab, limits, memo)}
        if cur not in fixed and len(ok) < len(labels):
            fixed[cur] = len(labels)  # keeps the current order open where a fixed one is refused
            labels.append(cur)
            ok.add(len(labels) - 1)
        allowed.append(ok)
    index = {lab: i for i, lab in enumerate(labels)}
    problem = []
    for s, producer, demands, readers in raw:
        weights = [_weight(s, region, lab, limits, memo) for lab in labels]
        problem.append(TensorClass(ops_index[s.producer] if producer is not None else None,
                                   None if producer is not None else index[region.order[s]],
                                   {index[d] for d in demands}, readers, weights))
    if not region.ops:
        labels = labels or [region.order[next(iter(region.order))]]
    cur_index = [index.get(c, 0) for c in current]
    allowed = [a if a else {cur_index[i]} for i, a in enumerate(allowed)]
    solution = solve(len(labels), allowed, problem, cur_index)
    before = sum(COUNT + n.outputs[0][1].nbytes for n in region.permutes)
    result = RegionResult(len(region.permutes), before, solution.cost, solution.optimal, len(labels))
    op_label = {n: labels[solution.labels[i]] for i, n in enumerate(region.ops)}
    return _Plan(labels, op_label, classes, source_of, result)


def _weight(s: Value, region: Region, label, limits, memo: dict) -> int:
    """The cost of one permute of class `s` to `label`: count, then bytes; FORBIDDEN when the
    device cannot run it."""
    shape = _shape_in(s, region, label)
    dims = relative(region.order[s], label)
    key = ("permute", s.dtype, s.shape, dims)
    if key in memo:
        return memo[key]
    node = Node("?", PERMUTE_TARGET, OPS["permute_copy"],
                [("self", s), ("dims", list(dims))], [("out", Value("?", shape, s.dtype, Role.NODE))])
    memo[key] = FORBIDDEN if partition_reason(node, limits, memo.setdefault("fits", {})) else COUNT + s.nbytes
    return memo[key]


def _shape_in(v: Value, region: Region, label) -> tuple[int, ...]:
    canonical = [0] * region.rank
    for i, c in enumerate(region.order[v]):
        canonical[c] = v.shape[i]
    return tuple(canonical[c] for c in label)


def _runs_in(node: Node, region: Region, current, label, limits, memo: dict) -> bool:
    """Whether commuting `node` runs on the device in order `label` (its constants reshaped)."""
    args = []
    for name, v in remapped_args(node, region.rank, current, label):
        args.append((name, _moved(v, region, current, label)))
    if any(a is None or (isinstance(a, list) and None in a) for _, a in args):
        return False
    outs = [(name, Value("?", _shape_in(v, region, label), v.dtype, Role.NODE)) for name, v in node.outputs]
    key = (node.op.name, tuple((n, _signature(v)) for n, v in args + outs))
    if key not in memo:
        new = Node(node.name, node.target, node.op, args, outs)
        memo[key] = partition_reason(new, limits, memo.setdefault("fits", {})) is None
    return memo[key]


def _signature(v):
    """What partition_reason reads of an argument: shapes and dtypes of tensors, scalars as they are."""
    if isinstance(v, Value):
        return (v.shape, v.dtype, v.role is Role.CONST)
    if isinstance(v, (list, tuple)):
        return tuple(_signature(x) for x in v)
    return v if isinstance(v, (int, float, str, bool, type(None))) else repr(v)


def _moved(v, region: Region, current, label):
    """A tensor argument as the op sees it in `label` (a stand-in of the right shape), None when a
    constant cannot follow by a reshape; anything else as it is."""
    if isinstance(v, list):
        return [_moved(x, region, current, label) for x in v]
    if not isinstance(v, Value):
        return v
    if v in region.order:
        return Value(v.name, _shape_in(v, region, label), v.dtype, v.role)
    if v.role is Role.CONST and len(v.shape) > 0:
        shape = constant_as(v, region.rank, current, label)
        return None if shape is None else Value(v.name, shape, v.dtype, Role.CONST)
    return v


# ---- rewriting ------------------------------------------------------------------------------------------------
def _rewrite(graph: PlanGraph, region: Region, plan: _Plan, names: set[str]) -> None:
    order = region.order
    outputs = {id(v) for v in graph.outputs}

    def fresh(base: str) -> str:
        name, k = base, 1
        while name in names:
            name, k = f"{base}.{k}", k + 1
        names.add(name)
        return name

    produced: dict[Value, tuple[int, ...]] = {}  # class source -> the order it is produced in
    for s in plan.classes:
        op = s.producer if s.producer in plan.op_label else None
        produced[s] = plan.op_label[op] if op is not None else order[s]
    held: dict[tuple[Value, tuple[int, ...]], Value] = {}  # (class, order) -> the value holding it
    for s in plan.classes:
        if s.producer not in plan.op_label or plan.op_label[s.producer] == order[s]:
            held[(s, order[s])] = s  # a producer that keeps its order keeps its value

    def value(s: Value, label) -> Value:
        """The value holding class `s` in `label`: a relabelled op's new output (named as the old
        one, which goes), a removed permute's (its name goes with it, a graph output first), else a
        new one."""
        key = (s, label)
        if key not in held and label == produced[s]:  # s.producer runs in another order now
            held[key] = Value(s.name, _shape_in(s, region, label), s.dtype, Role.NODE)
        if key not in held:
            same = [v for v in plan.classes[s] if order[v] == label and v.producer in region.permutes_set]
            same.sort(key=lambda v: id(v) not in outputs)
            held[key] = same[0] if same else Value(fresh(f"{s.name}/{_tag(label)}"), _shape_in(s, region, label),
                                                   s.dtype, Role.NODE)
            host = graph.input_host_dtypes.get(s.name)
            if host is not None:  # a narrowed int64 moved into a new value stays narrowed (returned as int64)
                graph.input_host_dtypes.setdefault(held[key].name, host)
        return held[key]

    # commuting ops in their labels
    new_ops = {}
    for n in region.ops:
        label, current = plan.op_label[n], order[n.outputs[0][1]]
        args = []
        for name, v in remapped_args(n, region.rank, current, label):
            args.append((name, _operand(graph, v, region, plan, current, label, value, fresh)))
        outs = [(name, value(plan.source_of[v], label)) for name, v in n.outputs]
        new = Node(n.name, n.target, n.op, args, outs, fx=n.fx)
        new.fused = list(n.fused)
        new_ops[n] = new
    # one permute per (class, order read)
    needed: dict[Value, set] = {s: set() for s in plan.classes}
    for v in order:
        s = plan.source_of[v]
        if id(v) in outputs:
            needed[s].add(order[v])
        for n in v.users:
            if n in region.permutes_set:
                continue
            needed[s].add(plan.op_label[n] if n in plan.op_label else order[v])
    after: dict[int, list[Node]] = {}
    for s, labels in needed.items():
        src = value(s, produced[s])
        for label in sorted(labels - {produced[s]}):
            out = value(s, label)  # named like its node: a removed permute's value, or a new one
            p = Node(out.producer.name if out.producer is not None else out.name, PERMUTE_TARGET,
                     OPS["permute_copy"], [("self", src), ("dims", list(relative(produced[s], label)))],
                     [("out", out)])
            after.setdefault(id(s.producer) if s.producer is not None else None, []).append(p)
    # substitution for pinned readers and graph outputs
    swap = {v: value(plan.source_of[v], order[v]) for v in order}
    removed = set(region.permutes)
    old_of = {id(new): old for old, new in new_ops.items()}
    nodes = list(after.get(None, []))
    for n in graph.nodes:
        if n in removed:
            continue
        if n in new_ops:
            n = new_ops[n]
        elif any(isinstance(v, Value) and v in swap for _, v in n.tensor_args()):
            n.args = [(name, _swapped(v, swap)) for name, v in n.args]
            if n in graph.fx_inputs:
                graph.fx_inputs[n] = [_swapped(v, swap) for v in graph.fx_inputs[n]]
        nodes.append(n)
        nodes.extend(after.get(id(old_of.get(id(n), n)), []))
    for old, new in new_ops.items():
        if old in graph.fx_inputs:
            graph.fx_inputs[new] = graph.fx_inputs.pop(old)
    for p in region.permutes:
        graph.fx_inputs.pop(p, None)
    graph.nodes[:] = nodes
    graph.outputs[:] = [_swapped(v, swap) for v in graph.outputs]
    specs = getattr(graph, "output_specs", None)
    if specs is not None:
        graph.output_specs = [(k, t, _swapped(v, swap)) for k, t, v in specs]


def _tag(label) -> str:
    return "o" + "".join(str(d) for d in label)


def _swapped(v, swap):
    if isinstance(v, (list, tuple)):
        return type(v)(_swapped(x, swap) for x in v)
    return swap.get(v, v) if isinstance(v, Value) else v


def _operand(graph: PlanGraph, v, region: Region, plan: _Plan, current, label, value, fresh):
    """A commuting op's argument in `label`: a member as its class in that order, a constant
    reshaped (a derived constant), anything else as it is."""
    if isinstance(v, list):
        return [_operand(graph, x, region, plan, current, label, value, fresh) for x in v]
    if not isinstance(v, Value):
        return v
    if v in region.order:
        return value(plan.source_of[v], label)
    if v.role is Role.CONST and len(v.shape) > 0:
        shape = constant_as(v, region.rank, current, label)
        if shape == tuple(v.shape):
            return v
        return graph.add_derived(fresh(f"{v.name}/{_tag(label)}"), shape, v.dtype, "reshaped", (v,), size=shape)
    return v


def _relink(graph: PlanGraph) -> None:
    """Users and producers from the node list (the rewrite moved values between nodes)."""
    for v in graph.values():
        v.users = []
    for n in graph.nodes:
        for _, v in n.tensor_args():
            v.users.append(n)
        for _, v in n.outputs:
            v.producer = n
