"""Which records of a fetched batch may be applied: the log is applied without a hole, ever.

Every owned partition has an *expected offset*: the next mailbox-tail offset its state has not
applied yet. It is persisted with the partition's state (its checkpoint), so after a restart or
a hand-over it says exactly where the state stands in the log, whatever offset the consumer
group committed or the consumer happens to fetch from.

A batch is one fetch of one partition. The consumer reports where that fetch began in the log
(`fetch_from`: its position before the fetch, when known exactly) and where the next one begins
(`fetch_to`: its position after). Between `fetch_from` and the first record, and between the last
record and `fetch_to`, there may be offsets that hold no record for a consumer (transaction
markers, aborted transactions, compacted or expired records): the broker reports them by moving
the position past them, so they are holes of the log, not losses. Offsets are never assumed +1.

  fetch_to <= expected                  → already applied (a re-read after a seek back): skipped
  fetch_from (or the first record) <= expected
                                        → applied from `expected` on; expected := fetch_to
  otherwise                             → a GAP: records between `expected` and this batch were
                                          fetched and never applied (dropped on the way, or the
                                          consumer was moved past them). Refused, never applied:
                                          the intake seeks back to `expected` and reads again.

A batch that would be applied over a HOLE (the first record it applies is not `expected`, two of
its records are not adjacent, or the position after it is not its last record + 1, or it is empty
and moves the position) is taken only once a read from `expected` itself shows the same hole
(`first_hole`): the positions around a fetch are read in the consumer's thread while faust may be
seeking the same consumer from the event loop's thread, so a hole can also be a seek that landed
between the two reads. A real hole (a transaction marker, a compacted record) is still there when
the log is read again from `expected`; a seek is not. mailbox-tail written by plain producers has
no holes, so this costs nothing there.
"""

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
    """The verdict on one batch (`offsets` ascending; may be empty when a fetch only moved the
    position past a hole). `expected` None: the partition's start is not known yet (never
    happens once the intake has placed the partition; kept total for the pure function)."""
    if expected is None:
        return Admission(Verdict.APPLY, 0, fetch_to)
    if fetch_to <= expected:
        return Admission(Verdict.ALREADY_APPLIED)
    begins = fetch_from if fetch_from is not None else (offsets[0] if offsets else fetch_to)
    if begins > expected:
        return Admission(Verdict.GAP)
    return Admission(Verdict.APPLY, bisect.bisect_left(offsets, expected), fetch_to)


def first_hole(expected: int, offsets: Sequence[int], fetch_to: int) -> int | None:
    """The first offset at or after `expected` that this batch would skip (`offsets`: the records
    it applies, ascending, all >= expected), or None when it covers `expected`..`fetch_to`
    without a hole. O(1) for the usual contiguous batch."""
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
