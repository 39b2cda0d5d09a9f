"""Compact sets of conversation seqs: the bitmaps of a row's unread hand.

A row keeps up to four of them (received, counting, mentioning, recalled). Most rows hold few
seqs, all below 2^32, and many hold none: a 64-bit roaring bitmap costs ~260 bytes even empty, a
32-bit one ~40. So a set is `None` until its first seq, a 32-bit `BitMap` while every seq fits,
and becomes a `BitMap64` the first time a seq >= 2^32 arrives (conversation seqs are u64 by
contract). Every operation goes through these functions, which take and give back the set
(an `add` may replace it), so the two representations never leak into the rules.
"""

from __future__ import annotations

from typing import TypeAlias

from pyroaring import BitMap, BitMap64

Seqs: TypeAlias = BitMap | BitMap64 | None

SMALL = 1 << 32  # a 32-bit BitMap holds seqs below this
_SMALL_TAG = b"\x00"
_LARGE_TAG = b"\x01"


def _widen(seqs: BitMap) -> BitMap64:
    return BitMap64(list(seqs))


def add(seqs: Seqs, seq: int) -> BitMap | BitMap64:
    if seqs is None:
        seqs = BitMap() if seq < SMALL else BitMap64()
    elif seq >= SMALL and type(seqs) is BitMap:
        seqs = _widen(seqs)
    seqs.add(seq)
    return seqs


def add_range(seqs: Seqs, low: int, high: int) -> Seqs:
    """Add [low, high)."""
    if low >= high:
        return seqs
    if seqs is None:
        seqs = BitMap() if high <= SMALL else BitMap64()
    elif high > SMALL and type(seqs) is BitMap:
        seqs = _widen(seqs)
    seqs.add_range(low, high)
    return seqs


def discard(seqs: Seqs, seq: int) -> None:
    if seqs is not None and (seq < SMALL or type(seqs) is BitMap64):
        seqs.discard(seq)


def has(seqs: Seqs, seq: int) -> bool:
    return seqs is not None and (seq < SMALL or type(seqs) is BitMap64) and seq in seqs


def remove_range(seqs: Seqs, low: int, high: int) -> None:
    """Remove [low, high)."""
    if seqs is None:
        return
    if type(seqs) is BitMap:
        high = min(high, SMALL)
    if low < high:
        seqs.remove_range(low, high)


def count_range(seqs: Seqs, low: int, high: int) -> int:
    """How many seqs lie in [low, high)."""
    if not seqs:
        return 0
    if type(seqs) is BitMap:
        high = min(high, SMALL)
        if low >= high:
            return 0
    return int(seqs.range_cardinality(low, high))


def rank(seqs: Seqs, upto: int) -> int:
    """How many seqs are <= upto."""
    if not seqs:
        return 0
    if type(seqs) is BitMap and upto >= SMALL:
        return len(seqs)
    return int(seqs.rank(upto))


def first_in(seqs: Seqs, after: int, upto: int) -> int | None:
    """The lowest seq in (after, upto], or None."""
    if not seqs:
        return None
    below = rank(seqs, after)
    if below >= len(seqs):
        return None
    candidate: int = seqs[below]
    return candidate if candidate <= upto else None


def at(seqs: BitMap | BitMap64, index: int) -> int:
    value: int = seqs[index]
    return value


def highest(seqs: Seqs) -> int | None:
    return int(seqs.max()) if seqs else None


def size(seqs: Seqs) -> int:
    return len(seqs) if seqs is not None else 0


def copy(seqs: Seqs) -> Seqs:
    return seqs.copy() if seqs is not None else None


def dump(seqs: Seqs) -> bytes | None:
    """The portable roaring serialization, tagged with the width (None for an empty set)."""
    if not seqs:
        return None
    seqs.run_optimize()  # long runs of received seqs (every message since a join) become one run
    return (_SMALL_TAG if type(seqs) is BitMap else _LARGE_TAG) + seqs.serialize()


def load(data: bytes | None) -> Seqs:
    if not data:
        return None
    if data[:1] == _SMALL_TAG:
        return BitMap.deserialize(data[1:])
    return BitMap64.deserialize(data[1:])
