"""The per-partition watermark gate (docs/contract.md §3.1): never apply past min over lanes."""

from __future__ import annotations

import heapq
from enum import Enum
from typing import Any

from app.domain.entries import Entry, WatermarkMarker


class Offer(Enum):
    READY = "ready"  # at or below the watermark: apply now
    PENDING = "pending"  # above the watermark: waits
    DUPLICATE = "duplicate"  # this user's mailbox_seq is already waiting


class WatermarkGate:
    """hi = min over lanes of the highest in-band marker seen (0 until every lane reported).

    Entries above hi wait; when hi rises they are released in mailbox_seq order (arrival order
    among equal seqs), which is the apply order the core requires per user.
    """

    def __init__(self, lanes: int) -> None:
        if lanes < 1:
            raise ValueError("lanes must be >= 1")
        self.lanes = lanes
        self._marks: list[int | None] = [None] * lanes
        self.hi = 0
        self._arrivals = 0
        self._pending: list[tuple[int, int, Entry]] = []
        self._waiting: set[tuple[int, int]] = set()

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    def offer(self, entry: Entry) -> Offer:
        if entry.mailbox_seq <= self.hi:
            return Offer.READY
        key = (entry.user_id, entry.mailbox_seq)
        if key in self._waiting:
            return Offer.DUPLICATE
        self._waiting.add(key)
        self._arrivals += 1
        heapq.heappush(self._pending, (entry.mailbox_seq, self._arrivals, entry))
        return Offer.PENDING

    def mark(self, marker: WatermarkMarker) -> list[Entry]:
        """Record a lane's marker; return the entries it releases, in apply order."""
        current = self._marks[marker.lane]
        if current is None or marker.watermark > current:
            self._marks[marker.lane] = marker.watermark
        marks = self._marks
        if any(mark is None for mark in marks):
            return []
        hi = min(mark for mark in marks if mark is not None)
        if hi <= self.hi:
            return []
        self.hi = hi
        released: list[Entry] = []
        pending = self._pending
        while pending and pending[0][0] <= hi:
            entry = heapq.heappop(pending)[2]
            self._waiting.discard((entry.user_id, entry.mailbox_seq))
            released.append(entry)
        return released

    def waiting(self) -> list[Entry]:
        """Entries still above the watermark, in apply order."""
        return [item[2] for item in sorted(self._pending)]

    # -- persistence --------------------------------------------------------------------------

    def dump(self) -> dict[str, Any]:
        return {"marks": list(self._marks), "hi": self.hi}

    @classmethod
    def load(cls, lanes: int, state: dict[str, Any], waiting: list[Entry]) -> WatermarkGate:
        gate = cls(lanes)
        marks = list(state["marks"])[:lanes]
        gate._marks = marks + [None] * (lanes - len(marks))
        gate.hi = int(state["hi"])
        for entry in waiting:
            gate.offer(entry)
        return gate
