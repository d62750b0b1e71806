"""Tensor representations and sets of them: the vocabulary of the layout planner.

A representation is a (storage, layout) pair. A TensorRepSet keeps the allowed layouts per storage
side, because packed-dim info (PDI) is per storage: the same float layout has block 1 in a buffer
and block 4 in a texture, so only the same storage and layout are compatible for floats, while the
int8 buffer layouts form two interchangeable families, {4W4C, 4C1W} and {4H4W, 4W}.
"""

from __future__ import annotations

import functools
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
from texelflow.shaders.geometry import buffer_words, fits_texture

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


# Every representation layouts.yaml allows, in preference order; bit i of a repset mask is REPRS[i].
REPRS: tuple[TensorRepr, ...] = tuple(
    sorted(
        (TensorRepr(s, l) for l, info in LAYOUT_INFO.items() for s in info.storages),
        key=TensorRepr.preference_key,
    )
)
_BIT = {r: 1 << i for i, r in enumerate(REPRS)}
_ALL = (1 << len(REPRS)) - 1
_PDI_KEY = [(r.storage, r.pdi) for r in REPRS]
# Bits sharing a representation's (storage, packed-dim info): the ones compatible with it.
_COMPAT = [sum(1 << j for j, k in enumerate(_PDI_KEY) if k == key) for key in _PDI_KEY]
_STORAGE_MASK = {s: sum(1 << i for i, r in enumerate(REPRS) if r.storage == s) for s in Storage}
_FAMILY_MASK: dict[str, int] = {}
for _i, _r in enumerate(REPRS):
    _f = LAYOUT_INFO[_r.layout].family
    _FAMILY_MASK[_f] = _FAMILY_MASK.get(_f, 0) | (1 << _i)


def _bits(mask: int) -> Iterator[int]:
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


@functools.lru_cache(maxsize=None)
def _compatible_mask(mask: int) -> int:
    out = 0
    for i in _bits(mask):
        out |= _COMPAT[i]
    return out


class TensorRepSet:
    """An immutable set of allowed representations (a bitmask over REPRS, in preference order)."""

    __slots__ = ("mask",)

    def __init__(self, sides: Mapping[Storage, Iterable[Layout]] | None = None, *, mask: int | None = None):
        if mask is not None:
            self.mask = mask
            return
        m = 0
        for storage, layouts in (sides or {}).items():
            for layout in layouts:
                bit = _BIT.get(TensorRepr(storage, layout))
                if bit is None:
                    raise ValueError(f"layout {layout.name} cannot live in storage {storage.name}")
                m |= bit
        self.mask = m

    # ---- construction ------------------------------------------------------------------------
    @classmethod
    def named(cls, name: str) -> "TensorRepSet":
        try:
            return _named(name)
        except KeyError:
            raise KeyError(f"unknown repset '{name}'; layouts.yaml declares {', '.join(sorted(REPSETS))}") from None

    @classmethod
    def of(cls, *reprs: TensorRepr) -> "TensorRepSet":
        m = 0
        for r in reprs:
            m |= _BIT[r]
        return cls(mask=m)

    @classmethod
    def empty(cls) -> "TensorRepSet":
        return cls(mask=0)

    # ---- set protocol ------------------------------------------------------------------------
    def side(self, storage: Storage) -> frozenset[Layout]:
        return frozenset(REPRS[i].layout for i in _bits(self.mask & _STORAGE_MASK[storage]))

    def __iter__(self) -> Iterator[TensorRepr]:
        """Representations in preference order (storage first, then layout)."""
        return (REPRS[i] for i in _bits(self.mask))

    def __len__(self) -> int:
        return self.mask.bit_count()

    def __contains__(self, r: object) -> bool:
        return isinstance(r, TensorRepr) and bool(self.mask & _BIT.get(r, 0))

    def __and__(self, other: "TensorRepSet") -> "TensorRepSet":
        return TensorRepSet(mask=self.mask & other.mask)

    def __or__(self, other: "TensorRepSet") -> "TensorRepSet":
        return TensorRepSet(mask=self.mask | other.mask)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TensorRepSet) and self.mask == other.mask

    def __hash__(self) -> int:
        return hash(self.mask)

    def is_empty(self) -> bool:
        return self.mask == 0

    def is_constrained(self) -> bool:
        """Exactly one representation is left."""
        return self.mask != 0 and self.mask & (self.mask - 1) == 0

    def is_ambiguous(self) -> bool:
        return self.mask & (self.mask - 1) != 0

    def pick(self) -> TensorRepr:
        """The most preferred representation; the declared preference order breaks ties."""
        if not self.mask:
            raise ValueError("cannot pick a representation from an empty repset")
        return REPRS[(self.mask & -self.mask).bit_length() - 1]

    # ---- packed-dim info ---------------------------------------------------------------------
    def possible_pdis(self) -> dict[Storage, frozenset[PackedDimInfo]]:
        out: dict[Storage, set] = {s: set() for s in Storage}
        for i in _bits(self.mask):
            out[REPRS[i].storage].add(REPRS[i].pdi)
        return {s: frozenset(v) for s, v in out.items()}

    def has_same_packed_dim_info_set(self, other: "TensorRepSet") -> bool:
        """Equal PDI sets; an empty set matches anything."""
        if not self.mask or not other.mask:
            return True
        return _compatible_mask(self.mask) == _compatible_mask(other.mask)

    def has_compatible_packed_dim_info_set(self, other: "TensorRepSet") -> bool:
        """Every PDI `other` can take, this set can take too, on each storage side."""
        return _compatible_mask(other.mask) & ~_compatible_mask(self.mask) == 0

    def filter_for_compatible_packed_dim_infos(self, other: "TensorRepSet") -> "TensorRepSet":
        """Keep the layouts whose PDI `other` can also take on the same storage side.

        A side that `other` lacks disappears; an empty `other` constrains nothing.
        """
        if not other.mask:
            return self
        return TensorRepSet(mask=self.mask & _compatible_mask(other.mask))

    def filter_for_family(self, family: str) -> "TensorRepSet":
        """Keep the layouts that can hold elements of a dtype family ("float" or "int8x4")."""
        return TensorRepSet(mask=self.mask & _FAMILY_MASK.get(family, 0))

    def filter_invalid_reprs(
        self, shape: Sequence[int], texture_limits: Sequence[int] = TEXTURE_LIMITS
    ) -> "TensorRepSet":
        """Drop texture representations the shape cannot have: rank > 4 or extents over the limits."""
        return TensorRepSet(mask=self.mask & _valid_mask(tuple(shape), tuple(texture_limits)))

    def __repr__(self) -> str:
        parts = []
        for s in STORAGE_PREFERENCE:
            names = [LAYOUT_INFO[r.layout].short for r in self if r.storage == s]
            if names:
                parts.append(f"{s.name}: {', '.join(names)}")
        return "TensorRepSet{" + "; ".join(parts) + "}"


@functools.lru_cache(maxsize=None)
def _named(name: str) -> TensorRepSet:
    return TensorRepSet(REPSETS[name])


@functools.lru_cache(maxsize=4096)
def _valid_mask(shape: tuple[int, ...], limits: tuple[int, ...]) -> int:
    """Bits of the representations a tensor of `shape` can have under the texture limits (x, y,
    z extents) and, where `limits` has a fourth entry, the device's largest storage buffer in
    bytes (maxStorageBufferRange: 4-byte words counted, an upper bound for every dtype)."""
    mask = _ALL & ~_STORAGE_MASK[Storage.TEXTURE_3D]
    for i, r in enumerate(REPRS):
        if r.storage == Storage.TEXTURE_3D and fits_texture(shape, r.layout, limits, r.storage):
            mask |= 1 << i
        elif r.storage == Storage.BUFFER and len(limits) > 3 and 4 * buffer_words(shape, r.layout) > limits[3]:
            mask &= ~(1 << i)
    return mask
