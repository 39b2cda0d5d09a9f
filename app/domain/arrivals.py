"""Arrival reconciliation (docs/contract.md §9; the answer to seed 000 §10's open item, the
MAILBOXED → APPLIED reconciliation): did every entry the producer sent reach this partition?

A lane's watermark marker may carry `count`: how many distinct entries of that lane with
mailbox_seq <= W the producer has sent to this partition, cumulative. The ledger counts what the
partition's processor received of each lane, the same way, and the difference is what went
missing on the way (a producer that believed a send succeeded, a record lost between the lane
and the log). The watermark alone cannot show such a loss: the marker says "everything <= W is
written", the gate opens, and an entry that never arrived is simply never applied.

What "received" means here: an entry counts once, when the processor first takes it — applied
at once (at or below the watermark) or put in the pending buffer (above it). A duplicate (the
user's version is already past it, or the same (user, mailbox_seq) already waits), a dead letter
and a marker count nothing. So a retried entry, a record read again after a crash (the count is
state, persisted with the gate record and its offset: a re-read after a restart counts exactly
what the restored state had not counted) and bad records never make a false report. An entry
that arrives after its lane's marker (late) counts when it arrives, and the report goes down.

Which entries are <= W: entries of lane L above L's last marker are all still pending (the gate's
hi is at most that marker), so the ledger keeps their seqs per lane in a sorted list (a lane
writes in mailbox_seq order: almost always an append) and moves the ones a new marker covers
into the lane's count (one slice); every other entry it counts at once.

Baseline: the producer's count is cumulative from its start, this count from the state's start.
A state that begins mid-stream (it started at an offset past 0 of its partition, or was written
before this ledger existed) cannot know what came before: each lane's first count-carrying
marker then sets the baseline (the difference at that point is taken as "before our time"), and
only what goes missing after it is reported. A count that goes DOWN (a producer that restarted its
cumulative count) also sets a new baseline.

It never changes what is applied: the report is a metric and a log line, nothing else (the
contract: the worker never invents or drops state because of it). Pure: no I/O, no clock.
"""

from __future__ import annotations

from bisect import bisect_right, insort
from collections.abc import Iterable
from typing import Any, Final

from app.domain.entries import Entry
from app.domain.record_fields import bool_field, int_field, list_field, optional_int_field

# No marker of the lane seen yet (a watermark is >= 0).
NO_MARK: Final = -1


class ArrivalLedger:
    """Per lane of one partition: distinct entries received at or below the lane's last marker
    (`counted`), the pending ones above it (`above`), and the last marker's count (`expected`)."""

    __slots__ = ("above", "base", "conflicting", "counted", "covered", "expected", "lanes", "unbased")

    def __init__(self, lanes: int, *, exact: bool = True) -> None:
        self.lanes = lanes
        # Distinct entries received of the lane with mailbox_seq <= covered[lane].
        self.counted = [0] * lanes
        # The lane's highest marker seen (NO_MARK: none yet); the gate's marks, kept here too.
        self.covered = [NO_MARK] * lanes
        # Seqs of the lane's received entries above its last marker (all pending), ascending.
        self.above: list[list[int]] = [[] for _ in range(lanes)]
        # The count of the lane's last marker, if it carried one (None: nothing to compare).
        self.expected: list[int | None] = [None] * lanes
        # What the producer had counted before this state began (see the module docstring).
        self.base = [0] * lanes
        self.unbased = [not exact] * lanes
        # Two markers of one lane with the same W carried different counts. One partition's
        # producer counts the entries <= W once, so this is not one partition's log: a file that
        # merges several (simulate --out keeps one copy per partition, each with that
        # partition's count). Nothing here can be checked then; `report_missing` says so.
        self.conflicting = False

    # -- events ---------------------------------------------------------------------------------

    def received(self, lane: int, mailbox_seq: int) -> None:
        """A distinct entry of `lane` was taken (applied or put in the pending buffer)."""
        if mailbox_seq <= self.covered[lane]:
            self.counted[lane] += 1
            return
        above = self.above[lane]
        if not above or mailbox_seq >= above[-1]:
            above.append(mailbox_seq)
        else:
            insort(above, mailbox_seq)

    def received_all(self, entries: Iterable[Entry]) -> None:
        """`received` of each entry, in order (a batch's entries that went to the pending buffer)."""
        covered = self.covered
        counted = self.counted
        all_above = self.above
        for entry in entries:
            lane = entry.lane
            mailbox_seq = entry.mailbox_seq
            if mailbox_seq <= covered[lane]:
                counted[lane] += 1
                continue
            above = all_above[lane]
            if not above or mailbox_seq >= above[-1]:
                above.append(mailbox_seq)
            else:
                insort(above, mailbox_seq)

    def marked(self, lane: int, watermark: int, count: int | None) -> None:
        """Lane `lane`'s marker: entries it covers move into the lane's count; its count (if
        any) becomes what the lane should have."""
        covered = self.covered[lane]
        if watermark < covered:
            return  # an older marker than one already seen: says nothing about the newer W
        if watermark > covered:
            self.covered[lane] = watermark
            above = self.above[lane]
            if above and above[0] <= watermark:
                moved = bisect_right(above, watermark)
                del above[:moved]
                self.counted[lane] += moved
        previous = self.expected[lane]
        if watermark == covered and count is not None and previous is not None and count != previous:
            self.conflicting = True
        if count is None:
            if watermark > covered:
                self.expected[lane] = None  # the count we had was for an older W: unknown now
            return
        if self.unbased[lane] or (previous is not None and count < previous):
            self.base[lane] = count - self.counted[lane]
            self.unbased[lane] = False
        self.expected[lane] = count

    def start_mid_stream(self) -> None:
        """The state begins after the start of its partition's log: baseline every lane at its
        first count-carrying marker."""
        for lane in range(self.lanes):
            if self.expected[lane] is None:
                self.unbased[lane] = True

    # -- reading --------------------------------------------------------------------------------

    def balance(self, lane: int) -> int | None:
        """Sent per the lane's last count minus received (None: nothing to compare). Negative:
        more arrived than the producer counted (a producer counting short; never reported)."""
        expected = self.expected[lane]
        if expected is None or self.unbased[lane]:
            return None
        return expected - self.base[lane] - self.counted[lane]

    def missing(self, lane: int) -> int:
        """Entries the lane's last count says were sent here at or below its marker and this
        partition never received (0 when the last marker carried no count)."""
        balance = self.balance(lane)
        return balance if balance is not None and balance > 0 else 0

    def missing_by_lane(self) -> list[int]:
        return [self.missing(lane) for lane in range(self.lanes)]

    @property
    def checked(self) -> bool:
        """Some marker carried a count (there is something to report on)."""
        return any(expected is not None for expected in self.expected)

    # -- persistence (inside the partition's gate record) ---------------------------------------

    def dump(self) -> dict[str, Any]:
        """The counts; the seqs above each lane's marker are not in it: they are the pending
        entries', which the pending buffer persists (see `load`)."""
        return {
            "counted": list(self.counted),
            "covered": list(self.covered),
            "expected": list(self.expected),
            "base": list(self.base),
            "unbased": list(self.unbased),
        }

    @classmethod
    def load(
        cls,
        lanes: int,
        state: dict[str, Any] | None,
        marks: Iterable[int | None],
        waiting: Iterable[Entry],
    ) -> ArrivalLedger:
        """The ledger of a restored partition. `state`: what `dump` wrote (None: a state written
        before the ledger existed, whose counts are unknown: baselined, its covered marks taken
        from the gate's `marks`). `waiting`: the pending entries (in the pending buffer with the
        state): those above their lane's marker go back to `above`; the others are counted in
        `counted` already."""
        if state is None:
            ledger = cls(lanes, exact=False)
            ledger.covered = _fit([NO_MARK if mark is None else int(mark) for mark in marks], lanes, NO_MARK)
        else:
            ledger = cls(lanes)
            ledger.counted = _fit(_ints(state, "counted"), lanes, 0)
            ledger.covered = _fit(_ints(state, "covered"), lanes, NO_MARK)
            expected = list_field(state["expected"], "expected")
            ledger.expected = _fit([optional_int_field(v, "expected") for v in expected], lanes, None)
            ledger.base = _fit(_ints(state, "base"), lanes, 0)
            ledger.unbased = _fit(
                [bool_field(v, "unbased") for v in list_field(state["unbased"], "unbased")], lanes, False
            )
        for entry in waiting:
            lane = entry.lane
            if lane < lanes and entry.mailbox_seq > ledger.covered[lane]:
                insort(ledger.above[lane], entry.mailbox_seq)
        return ledger


def _ints(state: dict[str, Any], name: str) -> list[int]:
    return [int_field(v, name) for v in list_field(state[name], name)]


def _fit(values: list[Any], lanes: int, fill: Any) -> list[Any]:
    """A per-lane list sized for `lanes` (the lane count is a setting: it may have changed)."""
    return values[:lanes] + [fill] * (lanes - len(values))
