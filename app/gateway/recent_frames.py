"""RecentFrames: the last frames of the users this instance holds no log for, as they came off
the frame topics (raw, never decoded here), bounded in bytes.

Why: behind a load balancer without sticky routing a client's reconnect lands on any instance.
Every instance reads every frame (docs/gateway.md, "Several instances"), so the frames it
missed are on hand even where it never had a stream: kept here, oldest dropped first, they seed
the user log of the instance the reconnect reaches, and `Last-Event-ID` resumes there instead of
re-pulling. Holding a frame costs one append and a dict lookup per record; decoding happens only
for the user who attaches.

What a seed claims (the new log's ``covers_after``): every frame of the user with a version
above the ``prev_projection_mailbox_seq`` of its first held SESSION_DELTA is held — a user's
flushes each send one SESSION_DELTA chained to the one before, so no frame has a version between
a delta's prev and its own, and every frame after the end of each partition is read. But a
flush's frames go to two topics and reach this consumer in no fixed order, so a delta read just
after the start may have a badge sibling that was written before it. Only a SESSION_DELTA that
arrived ``settle_s`` after the start sets the floor; older frames are still handed over (a
resume's chain check decides what they are worth), and ``evicted`` (the highest version dropped
for the user) raises the floor after evictions.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

# How long after the start a frame must arrive to be trusted as a seed's floor: far more than two
# topics' arrivals of one flush ever drift apart on one consumer.
RECENT_SETTLE_S: Final = 2.0

_VERSION_KEY: Final = b'"projection_mailbox_seq":'

# Per held frame, beside its bytes: the tuple, the deque slot and the bytes object's header.
FRAME_OVERHEAD: Final = 120


@dataclass(slots=True)
class _Held:
    user_id: int
    raw: bytes
    settled: bool  # arrived settle_s after the start: may set a seed's floor


@dataclass(slots=True)
class _UserFrames:
    frames: deque[_Held] = field(default_factory=deque)
    evicted: int = 0  # the highest version dropped (0: none; versions start at 1)


class RecentFrames:
    def __init__(
        self,
        *,
        capacity_bytes: int,
        settle_s: float = RECENT_SETTLE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.capacity_bytes = capacity_bytes
        self.settle_s = settle_s
        self.clock = clock
        self._order: deque[_Held] = deque()
        self._users: dict[int, _UserFrames] = {}
        self.size = 0
        self.started_at: float | None = None
        self.held = 0  # frames ever held
        self.evicted = 0  # frames dropped for room

    def start(self) -> None:
        """The frame source reached the end of every partition: from now on nothing is missed."""
        self.started_at = self.clock()

    @property
    def users(self) -> int:
        return len(self._users)

    def hold(self, user_id: int, raw: bytes) -> None:
        if self.capacity_bytes <= 0 or self.started_at is None:
            return
        cost = len(raw) + FRAME_OVERHEAD
        if cost > self.capacity_bytes:
            return
        settled = self.clock() - self.started_at >= self.settle_s
        held = _Held(user_id, raw, settled)
        self._order.append(held)
        self._users.setdefault(user_id, _UserFrames()).frames.append(held)
        self.size += cost
        self.held += 1
        while self.size > self.capacity_bytes:
            self._evict_oldest()

    def _evict_oldest(self) -> None:
        old = self._order.popleft()
        self.size -= len(old.raw) + FRAME_OVERHEAD
        self.evicted += 1
        mine = self._users.get(old.user_id)
        if mine is None or not mine.frames or mine.frames[0] is not old:
            return  # the user's frames were handed to a log meanwhile
        mine.frames.popleft()
        if not mine.frames:
            del self._users[old.user_id]  # nothing held: nothing claimed either
            return
        version = version_in(old.raw)
        if version is not None:
            mine.evicted = max(mine.evicted, version)

    def take(self, user_id: int) -> tuple[list[tuple[bytes, bool]], int]:
        """The user's held frames (oldest first, with their settled flag) and the highest version
        dropped for the user; the user is no longer held here (its log takes its frames now).
        The bytes stay counted until their turn to leave the ring comes."""
        mine = self._users.pop(user_id, None)
        if mine is None:
            return [], 0
        return [(h.raw, h.settled) for h in mine.frames], mine.evicted


def version_in(raw: bytes) -> int | None:
    """The frame's projection_mailbox_seq, found without decoding the frame (it is compact JSON
    as the worker writes it); None when it is not there as an integer."""
    at = raw.find(_VERSION_KEY)
    if at < 0:
        return None
    start = at + len(_VERSION_KEY)
    end = start
    while end < len(raw) and 48 <= raw[end] <= 57:
        end += 1
    return int(raw[start:end]) if end > start else None
