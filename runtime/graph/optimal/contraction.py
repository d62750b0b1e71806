"""Chain contraction: merge classes where an optimal plan never needs a transition (exact).

Elementwise chains, views and single-consumer inputs collapse before any program is built, which
is most of a real graph.
"""

from __future__ import annotations

from .tables import Tables


def contract_chains(t: Tables, root: list[int]) -> int:
    """Merge classes along chains where an optimal plan never needs a transition (exact).

    Forward: a class B whose only input value v is read by B alone, and whose outputs reach at
    most one value w that anyone reads, can take v's producer's representation: the copy it could
    save on v is worth at least what it could cost on w (by count; by bytes when bytes(w) <= bytes(v)),
    provided B accepts everything the producer may hold. Backward is the mirror image: B with at
    most one input value and one read output w, read by class C alone, can take C's representation.
    Returns the number of merges.
    Backward merges are tried first, so a chain takes its constrained consumer's representation
    and the copy sits at the constrained producer, as in the reference. Among plans equal in count
    and bytes, where a transition sits along such a chain is decided here, not by the preference
    order. `root` is every class's root before contraction; classes and values are indices.
    """
    parent, domain, vbytes = t.classes.parent, t.classes.domain, t.vbytes
    pinned = {root[k] for keys in t.int8_groups for k in keys}
    prod: dict[int, int] = {}
    cons: dict[int, set] = {}
    ins: dict[int, set] = {}
    outs: dict[int, set] = {}
    value_class = t.value_class
    for s, v in zip(t.use_slot, t.use_value):
        p, c = root[value_class[v]], root[s]
        prod[v] = p
        if c != p:
            cons.setdefault(v, set()).add(c)
            ins.setdefault(c, set()).add(v)
            outs.setdefault(p, set()).add(v)

    def subset(a, b) -> bool:
        return domain[a] & ~domain[b] == 0

    def merge(keep, gone) -> None:
        parent[gone] = keep
        domain[keep] &= domain[gone]
        for v in outs.pop(gone, set()):
            prod[v] = keep
            cons[v].discard(keep)
            ins.get(keep, set()).discard(v)
            if cons[v]:
                outs.setdefault(keep, set()).add(v)
        for v in ins.pop(gone, set()):
            cons[v].discard(gone)
            if prod[v] != keep:
                cons[v].add(keep)
                ins.setdefault(keep, set()).add(v)
            if not cons[v]:
                outs.get(prod[v], set()).discard(v)
        if keep in outs:
            outs[keep] = {v for v in outs[keep] if cons.get(v)}

    empty: set = set()
    merges = 0
    work = sorted(set(ins) | set(outs))
    while work:
        b = work.pop()
        if parent[b] != b or b in pinned:
            continue
        b_in, b_out = ins.get(b, empty), outs.get(b, empty)
        if len(b_in) <= 1 and len(b_out) == 1:
            (w,) = b_out
            if len(cons[w]) == 1:
                (c,) = cons[w]
                if c not in pinned and subset(c, b) and all(vbytes[v] <= vbytes[w] for v in b_in):
                    merge(c, b)
                    merges += 1
                    work.append(c)
                    work.extend(prod[x] for x in ins.get(c, ()))
                    work.extend(k for x in outs.get(c, ()) for k in cons[x])
                    continue
        if len(b_in) == 1 and len(b_out) <= 1:
            (v,) = b_in
            a = prod[v]
            if cons[v] == {b} and a not in pinned and subset(a, b) and all(vbytes[w] <= vbytes[v] for w in b_out):
                merge(a, b)
                merges += 1
                work.append(a)
                work.extend(prod[x] for x in ins.get(a, ()))
                work.extend(c for x in outs.get(a, ()) for c in cons[x])
    return merges
