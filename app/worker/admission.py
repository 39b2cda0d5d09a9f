"""Admission: whether one fetch of one partition is applied, and from which record: the offset
rule (offsets.py) plus a hole seen once (`hole_seen`), applied over only when read again
(docs/decisions/0008-hole-confirmation.md). Pure: the caller applies, counts and logs the verdict."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.worker.offsets import Admission, Verdict, admit, first_hole


@dataclass(frozen=True, slots=True)
class FetchVerdict:
    admission: Admission
    # (expected offset, first hole offset) of a hole seen once and not confirmed yet.
    hole_seen: tuple[int, int] | None
    # A hole seen for the first time: the fetch is refused (GAP) and read again from `expected`.
    unconfirmed_hole: int | None = None
    # A hole seen again from `expected`: applied over; `hole_offsets` offsets held no record.
    confirmed_hole: int | None = None
    hole_offsets: int = 0

    @property
    def verdict(self) -> Verdict:
        return self.admission.verdict


def admit_fetch(
    expected: int | None,
    hole_seen: tuple[int, int] | None,
    offsets: Sequence[int],
    fetch_from: int | None,
    fetch_to: int,
) -> FetchVerdict:
    """The verdict on one fetch (`offsets` ascending), given `expected` and `hole_seen`."""
    admission = admit(expected, offsets, fetch_from, fetch_to)
    if admission.verdict is not Verdict.APPLY or expected is None:
        keep = hole_seen if admission.verdict is not Verdict.APPLY else None
        return FetchVerdict(admission, hole_seen=keep)
    fresh = offsets[admission.start :]
    hole = first_hole(expected, fresh, fetch_to)
    if hole is not None and hole_seen != (expected, hole):
        return FetchVerdict(Admission(Verdict.GAP), hole_seen=(expected, hole), unconfirmed_hole=hole)
    hole_offsets = max(0, fetch_to - expected - len(fresh))
    return FetchVerdict(admission, hole_seen=None, confirmed_hole=hole, hole_offsets=hole_offsets)
