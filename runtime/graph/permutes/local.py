"""The six local permute passes (the reference backend's approach), run to a fixpoint.

Each pass is `(graph) -> bool` (changed or not), in place, and keeps numerics: every graph output
keeps its value, shape and contents. Only device nodes move; a CPU fallback is a barrier (its
inputs may be rewired to an equal tensor, never moved across).

1. `remove_region_permutes`   P -> [elementwise region] -> P^-1   =>   [region, dims renamed]
2. `fuse_inverse_consumers`   y = P(x); every reader of y is P^-1  =>  the readers' readers read x
3. `unit_dim_permutes_to_views`  P moving only size-1 dims         =>  view (free when it folds)
4. `sink_permutes_below_views`   view(P(x)), view only adds / drops size-1 dims or merges /
                                 splits dims whose sources lie side by side, in order, in x
                                                                  =>  P'(view'(x))
5. `fuse_cascaded_permutes`   Q(P(x))                             =>  (P then Q)(x), gone if identity
6. `fuse_cascaded_views`      view(view(x)) => view(x); a view to its input's own shape => gone

They decide locally: a permute or region that also feeds a graph output or another reader, or a
join of tensors in different orders, is left as it is (the global placement, `placement.py`,
handles those).
"""

from __future__ import annotations

from ..ir import PlanGraph
from .dims import compose, inverse, is_identity, is_view, moves_only_unit_dims, non_unit, permute_dims
from .regions import find_region
from .surgery import (as_view, bypass, fresh_name, in_graph, insert_before, is_output, new_value, only_input, out,
                      permute_node, remove_node, replace_node, runs_on_device, substitute, view_node)

MAX_ROUNDS = 1000  # a safety net: every pass removes or sinks a permute or a view, so rounds are few


def optimize_local(graph: PlanGraph) -> PlanGraph:
    """Run the six passes until none changes anything; returns `graph`, rewritten in place."""
    for _ in range(MAX_ROUNDS):
        changed = False
        for run in PASSES:
            changed = run(graph) or changed
        if not changed:
            break
    return graph


def remove_region_permutes(graph: PlanGraph) -> bool:
    """1. A region of ops that commute with permute P, entered only through P and left only through
    P^-1, runs in the original order: its entries and exits vanish (regions.py)."""
    changed = False
    for node in list(graph.nodes):
        if not in_graph(node) or permute_dims(node) is None:
            continue
        region = find_region(graph, node)
        if region is not None and region.rewrite(graph):
            changed = True
    return changed


def fuse_inverse_consumers(graph: PlanGraph) -> bool:
    """2. y = P(x) whose every reader is P^-1 (and y no graph output): both go, the readers' readers
    read x (a reader's result that is a graph output stays as a view of x)."""
    changed = False
    for node in list(graph.nodes):
        dims = permute_dims(node)
        if dims is None or not in_graph(node):
            continue
        y = out(node)
        inv = inverse(dims)
        if is_output(graph, y) or not y.users or any(permute_dims(u) != inv for u in y.users):
            continue
        x = only_input(node)
        for user in list(dict.fromkeys(y.users)):
            bypass(graph, user, x)
        remove_node(graph, node)
        changed = True
    return changed


def unit_dim_permutes_to_views(graph: PlanGraph) -> bool:
    """3. A permute whose dims of size > 1 keep their order moves no element: a view."""
    changed = False
    for node in list(graph.nodes):
        dims = permute_dims(node)
        if dims is not None and moves_only_unit_dims(only_input(node).shape, dims):
            changed = as_view(graph, node) or changed  # (in place: no node removed)
    return changed


def sink_permutes_below_views(graph: PlanGraph) -> bool:
    """4. view(P(x)) that reads the permute alone becomes P'(view'(x)) where the view only adds or
    drops size-1 dims: the permute moves down, towards an inverse it may cancel with. A view that
    merges or splits dims whose sources in x lie side by side and in order moves too, but only
    where P' then cancels with the permute that alone reads the view (up to size-1 dims): a patch
    embedding's NHWC -> NCHW permute, flatten(2) and transpose(1, 2) become one view of the NHWC
    tensor. Elsewhere such a view stays below the permute: view' may cost a copy in a texture where
    the permute already re-lays out and the view after it is free (a mixer's NCHW -> NHWC, then
    reshape to tokens)."""
    changed = False
    for node in list(graph.nodes):
        if not in_graph(node) or not is_view(node):
            continue
        y, z = only_input(node), out(node)
        p = y.producer
        dims = permute_dims(p) if p is not None else None
        if dims is None or is_output(graph, y) or y.users != [node]:
            continue
        x = only_input(p)
        sunk_view = _sunk(x.shape, dims, y.shape, z.shape)
        if sunk_view is None:
            continue
        shape, sunk = sunk_view
        if non_unit(y.shape) != non_unit(z.shape) and not _cancels(graph, z, shape, sunk):
            continue  # a merge or split in x may cost a copy (textures) where the permute's view was free
        src = x
        view = None
        if shape != tuple(x.shape):
            name = fresh_name(graph, f"{p.name}/view")
            view = view_node(name, x, new_value(name, shape, x))
            src = out(view)
        permute = permute_node(node.name, src, sunk, z)
        if (view is not None and not runs_on_device(view)) or not runs_on_device(permute):
            z.producer = node
            continue
        if view is not None:
            insert_before(graph, node, view)
        remove_node(graph, p)
        replace_node(graph, node, permute)
        changed = True
    return changed


def fuse_cascaded_permutes(graph: PlanGraph) -> bool:
    """5. Q(P(x)) reads x through one permute, P then Q; an identity one goes (a graph output stays
    as a view). P goes too when nothing else reads it."""
    changed = False
    for node in list(graph.nodes):
        second = permute_dims(node)
        if second is None or not in_graph(node):
            continue
        y = only_input(node)
        p = y.producer
        first = permute_dims(p) if p is not None else None
        if first is None:
            continue
        x = only_input(p)
        dims = compose(first, second)
        if is_identity(dims):
            bypass(graph, node, x)
        else:
            replace_node(graph, node, permute_node(node.name, x, dims, out(node)))
        if not y.users and not is_output(graph, y):
            remove_node(graph, p)
        changed = True
    return changed


def fuse_cascaded_views(graph: PlanGraph) -> bool:
    """6. view(view(x)) is one view of x; a view to its input's own shape goes (a graph output
    stays)."""
    changed = False
    for node in list(graph.nodes):
        if not in_graph(node) or not is_view(node):
            continue
        y, z = only_input(node), out(node)
        if tuple(y.shape) == tuple(z.shape) and not is_output(graph, z):
            substitute(graph, z, y)
            remove_node(graph, node)
            changed = True
            continue
        p = y.producer
        if p is None or not is_view(p):
            continue
        merged = view_node(node.name, only_input(p), z)
        if not runs_on_device(merged):
            z.producer = node
            continue
        replace_node(graph, node, merged)
        if not y.users and not is_output(graph, y):
            remove_node(graph, p)
        changed = True
    return changed


PASSES = (remove_region_permutes, fuse_inverse_consumers, unit_dim_permutes_to_views, sink_permutes_below_views,
          fuse_cascaded_permutes, fuse_cascaded_views)


def _sunk(x_shape, dims, y_shape, z_shape) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(shape of view'(x), dims of P') with P'(view'(x)) == view(P(x), z_shape), or None when the
    view cannot move above the permute. Size-1 dims aside, y's and z's dims fall into consecutive
    groups of equal product (the view merges or splits within a group); each group of y must come
    from dims of x that lie side by side and in increasing order (x's dims of size > 1 counted),
    so view' can merge or split them in x. view' holds the groups in x's order, each with z's sizes,
    and z's size-1 dims after them; P' sends each of z's dims to where its elements come from."""
    big_x = [d for d in range(len(x_shape)) if x_shape[d] != 1]  # x's dims of size > 1, in order
    rank_x = {d: i for i, d in enumerate(big_x)}
    big_y = [i for i in range(len(y_shape)) if y_shape[i] != 1]
    big_z = [i for i in range(len(z_shape)) if z_shape[i] != 1]
    groups = _groups([y_shape[i] for i in big_y], [z_shape[i] for i in big_z])
    if groups is None:
        return None
    placed = []  # (position in big_x of the group's first source, z dims of the group)
    for ys, zs in groups:
        src = [rank_x[dims[big_y[i]]] for i in ys]
        if src != list(range(src[0], src[0] + len(src))):
            return None  # the group's sources are not side by side, in order, in x
        placed.append((src[0], [big_z[j] for j in zs]))
    position = {}
    shape = []
    for _, zs in sorted(placed):
        for d in zs:
            position[d] = len(shape)
            shape.append(z_shape[d])
    ones = iter(range(len(shape), len(z_shape)))
    sunk = tuple(position[d] if d in position else next(ones) for d in range(len(z_shape)))
    return tuple(shape) + (1,) * (len(z_shape) - len(shape)), sunk


def _cancels(graph: PlanGraph, z, shape, sunk) -> bool:
    """Whether `z` (a view's output, to be produced by permute `sunk` of a tensor of `shape`) is
    read by one permute alone, not a graph output, whose composition with `sunk` moves only size-1
    dims: the two then fold into a view."""
    readers = list(dict.fromkeys(z.users))
    second = permute_dims(readers[0]) if len(readers) == 1 and len(z.users) == 1 else None
    return second is not None and not is_output(graph, z) and moves_only_unit_dims(shape, compose(sunk, second))


def _groups(a: list[int], b: list[int]) -> list[tuple[list[int], list[int]]] | None:
    """Consecutive groups of the sizes `a` and `b` (all > 1) with equal products, smallest first:
    ([indices of a], [indices of b]) each; None when the products never meet."""
    groups = []
    i = j = 0
    while i < len(a) and j < len(b):
        ga, gb, pa, pb = [i], [j], a[i], b[j]
        i, j = i + 1, j + 1
        while pa != pb:
            if pa < pb and i < len(a):
                pa, ga = pa * a[i], ga + [i]
                i += 1
            elif pb < pa and j < len(b):
                pb, gb = pb * b[j], gb + [j]
                j += 1
            else:
                return None
        groups.append((ga, gb))
    return groups if i == len(a) and j == len(b) else None
