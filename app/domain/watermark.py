"""The per-partition watermark gate (docs/contract.md §3.1): never apply past min over lanes."""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from enum import Enum
from operator import attrgetter
from typing import Any, Final

from app.domain.entries import Entry, WatermarkMarker
from app.domain.record_fields import int_field, list_field, optional_int_field

_SEQ: Final = attrgetter("mailbox_seq")


class Offer(Enum):
    READY = "ready"  # at or below the watermark: apply now
    PENDING = "pending"  # above the watermark: waits
    DUPLICATE = "duplicate"  # this user's mailbox_seq is already waiting


class WatermarkGate:
    """hi = min over lanes of the highest in-band marker seen (0 until every lane reported).

    Entries above hi wait; when hi rises they are released in mailbox_seq order (arrival order
    among equal seqs), which is the apply order the core requires per user.

    Waiting entries are kept two ways. Lanes write in mailbox_seq order, so most entries arrive
    at or above the last one waiting: those are appended to `_run`, a list in apply order, and a
    marker releases a slice of it (no heap, no key per entry). An entry that arrives below the
    run's end goes to `_heap`, keyed (seq, arrival). Ties between the two always favour the run:
    an entry goes to the heap only while the run ends above its seq (every run entry of that seq
    arrived before it), or while the run is empty and the heap is not (the run restarts only once
    the heap is empty).
    """

    def __init__(self, lanes: int) -> None:
        if lanes < 1:
            raise ValueError("lanes must be >= 1")
        self.lanes = lanes
        self._marks: list[int | None] = [None] * lanes
        self.hi = 0
        self._arrivals = 0
        self._run: list[Entry] = []  # non-decreasing mailbox_seq, arrival order among equals
        self._run_last = 0  # mailbox_seq of the run's last entry (0 when empty)
        # Users of the run's entries at `_run_last`, built on the first entry that repeats that
        # seq (None until then): the duplicate check of an in-order arrival.
        self._run_users: set[int] | None = None
        self._heap: list[tuple[int, int, Entry]] = []
        self._waiting: set[tuple[int, int]] = set()  # (user, seq) of the heap's entries

    @property
    def pending_count(self) -> int:
        return len(self._run) + len(self._heap)

    def offer(self, entry: Entry) -> Offer:
        seq = entry.mailbox_seq
        if seq <= self.hi:
            return Offer.READY
        run = self._run
        last = self._run_last
        if seq > last and (run or not self._heap):
            # Above everything waiting in the run (and the heap's seqs are below its end): no
            # duplicate possible.
            run.append(entry)
            self._run_last = seq
            self._run_users = None
            return Offer.PENDING
        user_id = entry.user_id
        if seq == last and run:
            users = self._run_users
            if users is None:
                users = self._run_users = {
                    waiting.user_id for waiting in run[bisect_left(run, seq, key=_SEQ) :]
                }
            if user_id in users:
                return Offer.DUPLICATE
            users.add(user_id)
            run.append(entry)
            return Offer.PENDING
        # Below the run's end (or the run is empty while the heap is not): the heap.
        key = (user_id, seq)
        if key in self._waiting:
            return Offer.DUPLICATE
        if run:
            start = bisect_left(run, seq, key=_SEQ)
            end = bisect_right(run, seq, lo=start, key=_SEQ)
            for index in range(start, end):
                if run[index].user_id == user_id:
                    return Offer.DUPLICATE
        self._waiting.add(key)
        self._arrivals += 1
        heapq.heappush(self._heap, (seq, self._arrivals, entry))
        return Offer.PENDING

    def offer_run(self, entries: list[Entry], first: int, last: int) -> bool:
        """`offer` of each of `entries` when every one of them would wait at the run's end: their
        seqs strictly increase from `first` to `last` (the caller checked that) and `first` is
        above the watermark and the run's end. Then they are appended in one step and True is
        returned; otherwise nothing is taken (False) and they must be offered one by one.
        Lanes write in mailbox_seq order: between two markers this is the common case."""
        if first <= self.hi or first <= self._run_last or not (self._run or not self._heap):
            return False
        self._run.extend(entries)
        self._run_last = last
        self._run_users = None
        return True

    def mark(self, marker: WatermarkMarker) -> list[Entry]:
        """Record a lane's marker; return the entries it releases, in apply order."""
        marks = self._marks
        current = marks[marker.lane]
        if current is None or marker.watermark > current:
            marks[marker.lane] = marker.watermark
        if None in marks:
            return []
        hi = min(mark for mark in marks if mark is not None)
        if hi <= self.hi:
            return []
        self.hi = hi
        run = self._run
        if self._run_last <= hi:  # the whole run (the common case: a marker after its entries)
            released = run
            self._run = []
            self._run_last = 0
            self._run_users = None
        elif run:
            count = bisect_right(run, hi, key=_SEQ)
            released = run[:count]
            del run[:count]
        else:
            released = []
        heap = self._heap
        if heap and heap[0][0] <= hi:
            waiting = self._waiting
            popped: list[Entry] = []
            while heap and heap[0][0] <= hi:
                entry = heapq.heappop(heap)[2]
                waiting.discard((entry.user_id, entry.mailbox_seq))
                popped.append(entry)
            # Stable: the run's entries first among equal seqs (see the class docstring).
            released = sorted(released + popped, key=_SEQ) if released else popped
        return released

    def waiting(self) -> list[Entry]:
        """Entries still above the watermark, in apply order."""
        from_heap = [item[2] for item in sorted(self._heap)]
        return sorted(self._run + from_heap, key=_SEQ) if from_heap else list(self._run)

    # -- persistence --------------------------------------------------------------------------

    def dump(self) -> dict[str, Any]:
        return {"marks": list(self._marks), "hi": self.hi}

    @classmethod
    def load(cls, lanes: int, state: dict[str, Any], waiting: list[Entry]) -> WatermarkGate:
        gate = cls(lanes)
        marks = [optional_int_field(mark, "marks") for mark in list_field(state["marks"], "marks")][:lanes]
        gate._marks = marks + [None] * (lanes - len(marks))
        gate.hi = int_field(state["hi"], "hi")
        for entry in waiting:
            gate.offer(entry)
        return gate
