"""Which records of a fetched batch may be applied: the log is applied without a hole, ever.
`expected`: the next offset the partition's state has not applied (in its checkpoint); offsets are
never assumed +1 (the rules and why: docs/decisions/0008-hole-confirmation.md)."""

from __future__ import annotations

import bisect
import enum
from collections.abc import Sequence
from dataclasses import dataclass


class Verdict(enum.Enum):
    APPLY = "apply"
    ALREADY_APPLIED = "already applied"
    GAP = "gap"


@dataclass(frozen=True, slots=True)
class Admission:
    verdict: Verdict
    # With APPLY: the index of the first record to apply (records before it were applied before).
    start: int = 0
    # With APPLY: the offset the state expects after this batch.
    next_offset: int = 0


def admit(expected: int | None, offsets: Sequence[int], fetch_from: int | None, fetch_to: int) -> Admission:
    """The verdict on one batch (`offsets` ascending, maybe empty; `expected` None: not placed)."""
    if expected is None:
        return Admission(Verdict.APPLY, 0, fetch_to)
    if fetch_to <= expected:
        return Admission(Verdict.ALREADY_APPLIED)
    begins = fetch_from if fetch_from is not None else (offsets[0] if offsets else fetch_to)
    if begins > expected:
        return Admission(Verdict.GAP)
    return Admission(Verdict.APPLY, bisect.bisect_left(offsets, expected), fetch_to)


def first_hole(expected: int, offsets: Sequence[int], fetch_to: int) -> int | None:
    """The first offset at or after `expected` the batch would skip (`offsets`: the records it
    applies, ascending, all >= expected), or None; O(1) for a contiguous batch."""
    if not offsets:
        return expected if fetch_to > expected else None
    if offsets[0] == expected and offsets[-1] - expected + 1 == len(offsets) and fetch_to == offsets[-1] + 1:
        return None
    at = expected
    for offset in offsets:
        if offset != at:
            return at
        at = offset + 1
    return at if fetch_to != at else None
