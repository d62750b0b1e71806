"""Tensor representations and sets of them: the vocabulary of the layout planner.

A representation is a (storage, layout) pair. A TensorRepSet keeps the allowed layouts per storage
side, because packed-dim info (PDI) is per storage: the same float layout has block 1 in a buffer
and block 4 in a texture, so only the same storage and layout are compatible for floats, while the
int8 buffer layouts form two interchangeable families, {4W4C, 4C1W} and {4H4W, 4W}.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Iterator, Mapping, Sequence

from texelflow.generated.layouts import (
    LAYOUT_INFO,
    LAYOUT_PREFERENCE,
    PACKED_DIM_INFO,
    REPSETS,
    STORAGE_PREFERENCE,
    TEXTURE_LIMITS,
    Layout,
    PackedDimInfo,
    Storage,
)

_STORAGE_RANK = {s: i for i, s in enumerate(STORAGE_PREFERENCE)}
_LAYOUT_RANK = {l: i for i, l in enumerate(LAYOUT_PREFERENCE)}


@dataclass(frozen=True)
class TensorRepr:
    storage: Storage
    layout: Layout

    @property
    def pdi(self) -> PackedDimInfo:
        return PACKED_DIM_INFO[(self.storage, self.layout)]

    def preference_key(self) -> tuple[int, int]:
        return (_STORAGE_RANK[self.storage], _LAYOUT_RANK[self.layout])

    def __str__(self) -> str:
        return f"{self.storage.name}/{self.layout.name}"

    @classmethod
    def parse(cls, text: str) -> "TensorRepr":
        storage, layout = text.split("/")
        return cls(Storage[storage], Layout[layout])


def whcn_sizes(shape: Sequence[int]) -> tuple[int, int, int, int]:
    """(W, H, C, N) of an NCHW shape; missing dims are 1 and extra leading dims fold into N."""
    dims = [int(d) for d in shape]
    w = dims[-1] if len(dims) >= 1 else 1
    h = dims[-2] if len(dims) >= 2 else 1
    c = dims[-3] if len(dims) >= 3 else 1
    n = math.prod(dims[:-3]) if len(dims) >= 4 else 1
    return (w, h, c, n)


def texture_extents(shape: Sequence[int], layout: Layout) -> tuple[int, int, int]:
    """Image extents (x, y, z) of a tensor in a 3-D texture of `layout` (docs/memory-layouts.md)."""
    sizes = list(whcn_sizes(shape))
    info = LAYOUT_INFO[layout]
    block = info.texture_block or 4
    sizes[info.packed_dim] = -(-sizes[info.packed_dim] // block)
    return (sizes[0], sizes[1], sizes[2] * sizes[3])


class TensorRepSet:
    """An immutable set of allowed representations, held as layouts per storage side."""

    __slots__ = ("_sides", "_hash")

    def __init__(self, sides: Mapping[Storage, Iterable[Layout]] | None = None):
        built = {s: frozenset(sides.get(s, ())) if sides else frozenset() for s in Storage}
        for storage, layouts in built.items():
            for layout in layouts:
                if storage not in LAYOUT_INFO[layout].storages:
                    raise ValueError(f"layout {layout.name} cannot live in storage {storage.name}")
        self._sides: dict[Storage, frozenset[Layout]] = built
        self._hash = hash(tuple(sorted((s, tuple(sorted(ls))) for s, ls in built.items())))

    # ---- construction ------------------------------------------------------------------------
    @classmethod
    def named(cls, name: str) -> "TensorRepSet":
        try:
            return cls(REPSETS[name])
        except KeyError:
            raise KeyError(f"unknown repset '{name}'; layouts.yaml declares {', '.join(sorted(REPSETS))}") from None

    @classmethod
    def of(cls, *reprs: TensorRepr) -> "TensorRepSet":
        sides: dict[Storage, set[Layout]] = {}
        for r in reprs:
            sides.setdefault(r.storage, set()).add(r.layout)
        return cls(sides)

    @classmethod
    def empty(cls) -> "TensorRepSet":
        return cls()

    # ---- set protocol ------------------------------------------------------------------------
    def side(self, storage: Storage) -> frozenset[Layout]:
        return self._sides[storage]

    def reprs(self) -> frozenset[TensorRepr]:
        return frozenset(TensorRepr(s, l) for s, ls in self._sides.items() for l in ls)

    def __iter__(self) -> Iterator[TensorRepr]:
        """Representations in preference order (storage first, then layout)."""
        return iter(sorted(self.reprs(), key=TensorRepr.preference_key))

    def __len__(self) -> int:
        return sum(len(ls) for ls in self._sides.values())

    def __contains__(self, r: object) -> bool:
        return isinstance(r, TensorRepr) and r.layout in self._sides[r.storage]

    def __and__(self, other: "TensorRepSet") -> "TensorRepSet":
        return TensorRepSet({s: self._sides[s] & other._sides[s] for s in Storage})

    def __or__(self, other: "TensorRepSet") -> "TensorRepSet":
        return TensorRepSet({s: self._sides[s] | other._sides[s] for s in Storage})

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TensorRepSet) and self._sides == other._sides

    def __hash__(self) -> int:
        return self._hash

    def is_empty(self) -> bool:
        return len(self) == 0

    def is_constrained(self) -> bool:
        """Exactly one representation is left."""
        return len(self) == 1

    def is_ambiguous(self) -> bool:
        return len(self) > 1

    def pick(self) -> TensorRepr:
        """The most preferred representation; the declared preference order breaks ties."""
        if self.is_empty():
            raise ValueError("cannot pick a representation from an empty repset")
        return next(iter(self))

    # ---- packed-dim info ---------------------------------------------------------------------
    def possible_pdis(self) -> dict[Storage, frozenset[PackedDimInfo]]:
        return {s: frozenset(PACKED_DIM_INFO[(s, l)] for l in ls) for s, ls in self._sides.items()}

    def has_same_packed_dim_info_set(self, other: "TensorRepSet") -> bool:
        """Equal PDI sets; an empty set matches anything."""
        if self.is_empty() or other.is_empty():
            return True
        return self.possible_pdis() == other.possible_pdis()

    def has_compatible_packed_dim_info_set(self, other: "TensorRepSet") -> bool:
        """Every PDI `other` can take, this set can take too, on each storage side."""
        mine, theirs = self.possible_pdis(), other.possible_pdis()
        return all(theirs[s] <= mine[s] for s in Storage)

    def filter_for_compatible_packed_dim_infos(self, other: "TensorRepSet") -> "TensorRepSet":
        """Keep the layouts whose PDI `other` can also take on the same storage side.

        A side that `other` lacks disappears; an empty `other` constrains nothing.
        """
        if other.is_empty():
            return self
        theirs = other.possible_pdis()
        return TensorRepSet(
            {s: {l for l in ls if PACKED_DIM_INFO[(s, l)] in theirs[s]} for s, ls in self._sides.items()}
        )

    def filter_for_family(self, family: str) -> "TensorRepSet":
        """Keep the layouts that can hold elements of a dtype family ("float" or "int8x4")."""
        return TensorRepSet({s: {l for l in ls if LAYOUT_INFO[l].family == family} for s, ls in self._sides.items()})

    def filter_invalid_reprs(
        self, shape: Sequence[int], texture_limits: Sequence[int] = TEXTURE_LIMITS
    ) -> "TensorRepSet":
        """Drop texture representations the shape cannot have: rank > 4 or extents over the limits."""
        sides = dict(self._sides)
        textures = sides.get(Storage.TEXTURE_3D, frozenset())
        if len(shape) > 4:
            sides[Storage.TEXTURE_3D] = frozenset()
        else:
            sides[Storage.TEXTURE_3D] = frozenset(
                l for l in textures if all(e <= m for e, m in zip(texture_extents(shape, l), texture_limits))
            )
        return TensorRepSet(sides)

    def __repr__(self) -> str:
        parts = [
            f"{s.name}: {', '.join(LAYOUT_INFO[l].short for l in sorted(ls, key=_LAYOUT_RANK.__getitem__))}"
            for s, ls in sorted(self._sides.items(), key=lambda kv: _STORAGE_RANK[kv[0]])
            if ls
        ]
        return "TensorRepSet{" + "; ".join(parts) + "}"
