"""Compact sets of conversation seqs: the bitmaps of a row's unread hand.

A row keeps up to four of them (received, counting, mentioning, recalled). Most rows hold a few
seqs and many hold none, while a roaring bitmap costs hundreds of bytes of C heap even for three
values (measured: ~200 bytes for a 32-bit one, ~440 for a 64-bit one). So a set is, by size:

* `None` until its first seq;
* `bytes`: the seqs sorted, 8 native-endian bytes each, while it holds at most SMALL_MAX seqs
  (one allocation: ~64 bytes for three seqs, where an `array` took ~104);
* a 32-bit roaring `BitMap` beyond that (compact for long runs: every message since a join), or a
  `BitMap64` as soon as a seq >= 2^32 arrives (conversation seqs are u64 by contract).

Every operation goes through these functions, which take the set and give back the set (an `add`
may replace it), so the representations never leak into the rules.
"""

from __future__ import annotations

import struct
import sys
from array import array
from bisect import bisect_left, bisect_right
from typing import Final, Literal, TypeAlias

from pyroaring import BitMap, BitMap64

Seqs: TypeAlias = "bytes | BitMap | BitMap64 | None"

# Final: the compiled build (mypyc) folds them into the code instead of reading a module global.
SMALL_MAX: Final = 48  # seqs an array holds before the set becomes a roaring bitmap
WIDE: Final = 1 << 32  # a 32-bit BitMap holds seqs below this
_U64_MAX: Final = (1 << 64) - 1  # the largest value a 64-bit roaring set holds
_ARRAY_TAG: Final = b"\x02"
_SMALL_TAG: Final = b"\x00"
_LARGE_TAG: Final = b"\x01"
_BIG_ENDIAN: Final = sys.byteorder == "big"
# The byte order of the packed seqs ('Q': native), for int.to_bytes: one seq packed without an array.
_ORDER: Final[Literal["little", "big"]] = "big" if _BIG_ENDIAN else "little"
_BITMAP: Final = BitMap  # read as a constant in the compiled build (a global is a dict lookup)
# One packed seq read at a byte offset (cheaper than a memoryview and its cast for one value).
_UNPACK_ONE: Final = struct.Struct("=Q").unpack_from


def _view(packed: bytes) -> memoryview:
    return memoryview(packed).cast("Q")


def _pack(values: list[int] | range) -> bytes:
    return array("Q", values).tobytes()


def _roaring(values: bytes | BitMap) -> BitMap | BitMap64:
    items = list(_view(values)) if isinstance(values, bytes) else list(values)
    if items and items[-1] >= WIDE:
        return BitMap64(items)
    return BitMap(items)


def add(seqs: Seqs, seq: int) -> bytes | BitMap | BitMap64:
    if type(seqs) is _BITMAP and seq < WIDE:  # a long-lived row's set: checked first
        seqs.add(seq)
        return seqs
    if seqs is None:
        return seq.to_bytes(8, _ORDER)
    if isinstance(seqs, bytes):
        size = len(seqs)
        if size and seq > _UNPACK_ONE(seqs, size - 8)[0]:  # the common case: seqs arrive in order
            if size < SMALL_MAX * 8:
                return seqs + seq.to_bytes(8, _ORDER)
            return _grown(seqs, seq)
        view = _view(seqs)
        at = bisect_left(view, seq)
        if at < len(view) and view[at] == seq:
            return seqs
        if len(view) < SMALL_MAX:
            return seqs[: at * 8] + _pack((seq,)) + seqs[at * 8 :]  # type: ignore[arg-type]
        seqs = _roaring(seqs)
    # Also after the array became a 32-bit set just above: a 49th seq past 2^32 must widen it.
    if seq >= WIDE and isinstance(seqs, BitMap):
        seqs = BitMap64(list(seqs))
    seqs.add(seq)
    return seqs


def _grown(packed: bytes, seq: int) -> BitMap | BitMap64:
    """A full array and a seq above all of it: the roaring set of both."""
    grown = _roaring(packed)
    if seq >= WIDE and isinstance(grown, BitMap):
        grown = BitMap64(list(grown))
    grown.add(seq)
    return grown


def added(seqs: Seqs, seq: int) -> tuple[bytes | BitMap | BitMap64, bool]:
    """`add`, and whether `seq` was not there before (one call where `has` + `add` took two)."""
    if type(seqs) is _BITMAP and seq < WIDE:  # see `add`
        if seq in seqs:
            return seqs, False
        seqs.add(seq)
        return seqs, True
    if seqs is None:
        return seq.to_bytes(8, _ORDER), True
    if isinstance(seqs, bytes):
        size = len(seqs)
        if size and seq > _UNPACK_ONE(seqs, size - 8)[0]:  # in order (see `add`)
            if size < SMALL_MAX * 8:
                return seqs + seq.to_bytes(8, _ORDER), True
            return _grown(seqs, seq), True
        view = _view(seqs)
        at = bisect_left(view, seq)
        if at < len(view) and view[at] == seq:
            return seqs, False
        if len(view) < SMALL_MAX:
            return seqs[: at * 8] + _pack((seq,)) + seqs[at * 8 :], True  # type: ignore[arg-type]
        seqs = _roaring(seqs)  # (seq is not in it: looked up above)
    if seq >= WIDE and isinstance(seqs, BitMap):
        seqs = BitMap64(list(seqs))  # a 32-bit set holds no seq this high (see `add`)
    elif seq in seqs:
        return seqs, False
    seqs.add(seq)
    return seqs, True


def add_range(seqs: Seqs, low: int, high: int) -> Seqs:
    """Add [low, high)."""
    if low >= high:
        return seqs
    if seqs is None or isinstance(seqs, bytes):
        count = len(seqs) // 8 if seqs is not None else 0
        if high - low + count <= SMALL_MAX:
            return _pack(sorted(set(_view(seqs) if seqs is not None else ()).union(range(low, high))))
        seqs = _roaring(seqs) if seqs is not None else (BitMap() if high <= WIDE else BitMap64())
    if high > WIDE and type(seqs) is BitMap:
        seqs = BitMap64(list(seqs))
    seqs.add_range(low, high)
    return seqs


def discard(seqs: Seqs, seq: int) -> Seqs:
    if seqs is None:
        return seqs
    if isinstance(seqs, bytes):
        view = _view(seqs)
        at = bisect_left(view, seq)
        if at < len(view) and view[at] == seq:
            return (seqs[: at * 8] + seqs[at * 8 + 8 :]) or None
        return seqs
    if seq < WIDE or type(seqs) is BitMap64:
        seqs.discard(seq)
    return seqs


def has(seqs: Seqs, seq: int) -> bool:
    if seqs is None:
        return False
    if isinstance(seqs, bytes):
        view = _view(seqs)
        at = bisect_left(view, seq)
        return at < len(view) and view[at] == seq
    return (seq < WIDE or type(seqs) is BitMap64) and seq in seqs


def remove_range(seqs: Seqs, low: int, high: int) -> Seqs:
    """Remove [low, high)."""
    if seqs is None or low >= high:
        return seqs
    if isinstance(seqs, bytes):
        view = _view(seqs)
        start, end = bisect_left(view, low), bisect_left(view, high)
        if start == end:
            return seqs
        return (seqs[: start * 8] + seqs[end * 8 :]) or None
    if type(seqs) is BitMap:
        high = min(high, WIDE)
    elif high > _U64_MAX:  # roaring's bounds are uint64: the top value is removed on its own
        seqs.discard(_U64_MAX)
        high = _U64_MAX
    if low < high:
        seqs.remove_range(low, high)
    return seqs


def count_range(seqs: Seqs, low: int, high: int) -> int:
    """How many seqs lie in [low, high)."""
    if not seqs or low >= high:
        return 0
    if isinstance(seqs, bytes):
        view = _view(seqs)
        return bisect_left(view, high) - bisect_left(view, low)
    if type(seqs) is BitMap:
        high = min(high, WIDE)
        if low >= high:
            return 0
    top = 0
    if high > _U64_MAX:  # roaring's bounds are uint64: the top value is counted on its own
        top = int(low <= _U64_MAX and _U64_MAX in seqs)
        high = _U64_MAX
    return top + (int(seqs.range_cardinality(low, high)) if low < high else 0)


def rank(seqs: Seqs, upto: int) -> int:
    """How many seqs are <= upto."""
    if not seqs:
        return 0
    if isinstance(seqs, bytes):
        return bisect_right(_view(seqs), upto)
    if type(seqs) is BitMap and upto >= WIDE:
        return len(seqs)
    return int(seqs.rank(upto))


def first_in(seqs: Seqs, after: int, upto: int) -> int | None:
    """The lowest seq in (after, upto], or None."""
    if not seqs:
        return None
    below = rank(seqs, after)
    if below >= size(seqs):
        return None
    candidate = at(seqs, below)
    return candidate if candidate <= upto else None


def at(seqs: bytes | BitMap | BitMap64, index: int) -> int:
    if isinstance(seqs, bytes):
        return int(_view(seqs)[index])
    return int(seqs[index])


def highest(seqs: Seqs) -> int | None:
    if not seqs:
        return None
    if isinstance(seqs, bytes):
        return int(_view(seqs)[-1])
    return int(seqs.max())


def size(seqs: Seqs) -> int:
    if seqs is None:
        return 0
    return len(seqs) // 8 if isinstance(seqs, bytes) else len(seqs)


def copy(seqs: Seqs) -> Seqs:
    if seqs is None or isinstance(seqs, bytes):
        return seqs  # immutable
    return seqs.copy()


# C heap a roaring set holds besides its containers' data (pyroaring 1.2, measured by RSS over
# 200,000 sets of one seq: ~190 bytes for a 32-bit BitMap, ~430 for a BitMap64).
BITMAP_BYTES: Final = 190
BITMAP64_BYTES: Final = 430


def footprint(seqs: Seqs) -> int:
    """About how many bytes the set holds in memory (the hot set's byte bound adds them up,
    app/domain/residency.py): the bytes object's size, or a roaring set's own heap plus its
    containers' data (pyroaring's sys.getsizeof: the serialized size)."""
    if seqs is None:
        return 0
    if isinstance(seqs, bytes):
        return sys.getsizeof(seqs)
    return (BITMAP_BYTES if type(seqs) is _BITMAP else BITMAP64_BYTES) + sys.getsizeof(seqs)


def dump(seqs: Seqs) -> bytes | None:
    """Tagged bytes (None for an empty set): an array's raw seqs, or roaring's portable format."""
    if not seqs:
        return None
    if isinstance(seqs, bytes):
        if _BIG_ENDIAN:  # records are little-endian wherever they were written
            raw = array("Q", _view(seqs))
            raw.byteswap()
            return _ARRAY_TAG + raw.tobytes()
        return _ARRAY_TAG + seqs
    seqs.run_optimize()  # long runs (every message since a join) → one run
    return (_SMALL_TAG if type(seqs) is BitMap else _LARGE_TAG) + seqs.serialize()


def load(data: bytes | None) -> Seqs:
    if not data:
        return None
    tag = data[:1]
    if tag == _ARRAY_TAG:
        if _BIG_ENDIAN:
            values: array[int] = array("Q")
            values.frombytes(data[1:])
            values.byteswap()
            return values.tobytes()
        return bytes(data[1:])
    if tag == _SMALL_TAG:
        return BitMap.deserialize(data[1:])
    return BitMap64.deserialize(data[1:])
