"""Offsets for intermediate tensors that share one allocation, by lifetime.

Two tensors may overlap in memory only when their lifetimes (first to last dispatch that touches
them, inclusive) are disjoint. Greedy first-fit in decreasing size order: simple, and close to the
peak of live bytes on the chains and forks programs are made of. Pure Python, no device.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Interval:
    """One tensor to place: bytes, alignment, and the inclusive range of steps it is live."""

    size: int
    alignment: int
    first: int
    last: int


def _align(x: int, a: int) -> int:
    return -(-x // a) * a


def plan_offsets(items: Sequence[Interval]) -> tuple[list[int], int]:
    """Return (offset per item, total bytes) with no two live-at-once items overlapping."""
    order = sorted(range(len(items)), key=lambda i: (-items[i].size, items[i].first, i))
    placed: list[tuple[int, int, Interval]] = []  # (offset, end, item)
    offsets = [0] * len(items)
    for i in order:
        it = items[i]
        busy = sorted((o, e) for o, e, other in placed if other.first <= it.last and it.first <= other.last)
        offset = 0
        for o, e in busy:
            if _align(offset, it.alignment) + it.size <= o:
                break
            offset = max(offset, e)
        offset = _align(offset, it.alignment)
        offsets[i] = offset
        placed.append((offset, offset + it.size, it))
    total = max((e for _, e, _ in placed), default=0)
    return offsets, total
