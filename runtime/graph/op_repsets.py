"""The allowed representations of one op node: one repset per tensor argument and output.

Repsets are never collapsed into one shared set. A sync group (tensors that must share packed-dim
info) is enforced by narrowing each member to the PDIs every other member can take, so int8
tensors of one op may still use different layouts of the same family (4W4C beside 4C1W).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from texelflow.generated.layouts import DTYPES, TEXTURE_LIMITS
from texelflow.generated.ops import OpEntry

from .repr import TensorRepSet, _compatible_mask


@dataclass
class OpRepSets:
    op: OpEntry
    sets: dict[str, TensorRepSet]  # tensor name (argument or output) -> allowed representations
    sync: tuple[tuple[str, ...], ...] = field(default=())

    @classmethod
    def build(
        cls,
        op: OpEntry,
        shapes: Mapping[str, Sequence[int] | list[Sequence[int]]],
        texture_limits: Sequence[int] = TEXTURE_LIMITS,
        dtype: str | None = None,
    ) -> "OpRepSets":
        """Registered repsets, filtered by each tensor's shape (and dtype family), then narrowed
        by the sync groups.

        `shapes` gives the shape of each tensor argument and output present on the node (a list
        of shapes for a tensor-list argument, whose one repset must fit every element); an
        optional tensor argument left out is simply absent.
        """
        declared = {a.name: a.repset for a in op.args if a.repset is not None}
        declared.update({o.name: o.repset for o in op.outputs})
        list_args = {a.name for a in op.args if a.kind == "tensor_list"}
        sets = {}
        for name, repset in declared.items():
            if name not in shapes:
                continue
            allowed = TensorRepSet.named(repset)
            own = op.tensor_dtype(name, dtype) if dtype is not None else None  # dtype_of may fix it
            if own in DTYPES:
                allowed = allowed.filter_for_family(DTYPES[own].family)
            for shape in (shapes[name] if name in list_args else [shapes[name]]):
                allowed = allowed.filter_invalid_reprs(shape, texture_limits)
            sets[name] = allowed
        sync = tuple(tuple(m for m in group if m in sets) for group in op.sync)
        result = cls(op, sets, sync)
        result._narrow_all()
        return result

    def any_empty(self) -> bool:
        return any(s.is_empty() for s in self.sets.values())

    def empty_tensors(self) -> list[str]:
        return [name for name, s in self.sets.items() if s.is_empty()]

    def constrain(self, name: str, allowed: TensorRepSet) -> bool:
        """Narrow one tensor to `allowed` and propagate through its sync groups.

        Returns False (and changes nothing) when that would leave any tensor with no choice.
        """
        narrowed = self.sets[name] & allowed
        if narrowed == self.sets[name]:
            return True
        if not self.sync:  # nothing to propagate: the trial below would only check emptiness
            if narrowed.is_empty() or self.any_empty():
                return False
            self.sets = {**self.sets, name: narrowed}
            return True
        trial = OpRepSets(self.op, dict(self.sets), self.sync)
        trial.sets[name] = narrowed
        trial._narrow_all()
        if trial.any_empty():
            return False
        self.sets = trial.sets
        return True

    def _narrow_all(self) -> None:
        """Filter members of each sync group by each other's PDIs until nothing changes (on
        masks: see TensorRepSet.filter_for_compatible_packed_dim_infos)."""
        if not self.sync:
            return
        masks = {name: s.mask for name, s in self.sets.items()}
        changed = True
        while changed:
            changed = False
            for group in self.sync:
                for a in group:
                    for b in group:
                        if a == b or not masks[b]:  # an empty set constrains nothing
                            continue
                        filtered = masks[a] & _compatible_mask(masks[b])
                        if filtered != masks[a]:
                            masks[a] = filtered
                            changed = True
        for name, mask in masks.items():
            if mask != self.sets[name].mask:
                self.sets[name] = TensorRepSet(mask=mask)

    def is_sync_compatible(self, chosen: Mapping[str, "object"]) -> bool:
        """Whether chosen representations (TensorRepr per tensor) satisfy every sync group."""
        for group in self.sync:
            pdis = {(chosen[m].storage, chosen[m].pdi) for m in group if m in chosen}
            if len(pdis) > 1:
                return False
        return True
