"""Compaction: when to flush, which rows are dirty, and what one flush produces (DESIGN §3.9, §4)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyroaring import BitMap64

from app.domain.badge import Badge


class FlushPolicy:
    """Flush when the window has elapsed since the first entry applied after the last flush,
    or early when more than `max_dirty_rows` rows are held dirty (a memory bound, not a trigger
    per read batch: the seed's `batch.len() >= 512`, read literally, would make J-1 impossible).

    Time is an argument: entry `ts` in replay, the wall clock in the worker.
    """

    def __init__(self, window_ms: int, max_dirty_rows: int) -> None:
        if window_ms < 0 or max_dirty_rows < 0:
            raise ValueError("window_ms and max_dirty_rows must be >= 0")
        self.window_ms = window_ms
        self.max_dirty_rows = max_dirty_rows
        self.window_start: int | None = None

    def on_applied(self, now_ms: int) -> None:
        if self.window_start is None:
            self.window_start = now_ms

    def due(self, now_ms: int, dirty_rows: int) -> bool:
        if dirty_rows == 0:
            return False
        if dirty_rows > self.max_dirty_rows:
            return True
        return self.window_start is not None and now_ms - self.window_start >= self.window_ms

    def flushed(self) -> None:
        self.window_start = None


class DirtySet:
    """Dirty users in a RoaringBitmap plus their dirty conversations.

    Not checkpointed: after a restart `lost` is set, and the next flush writes every row of every
    user — more writes, never wrong data.
    """

    def __init__(self, lost: bool = False) -> None:
        self.users = BitMap64()
        self.rows: dict[int, set[str]] = {}
        self.row_count = 0
        self.lost = lost

    def mark(self, user_id: int, conversation_id: str) -> None:
        conversations = self.rows.get(user_id)
        if conversations is None:
            self.users.add(user_id)
            conversations = self.rows[user_id] = set()
        if conversation_id not in conversations:
            conversations.add(conversation_id)
            self.row_count += 1

    def clear(self) -> None:
        self.users = BitMap64()
        self.rows = {}
        self.row_count = 0
        self.lost = False


@dataclass(frozen=True, slots=True)
class UserFlush:
    """One user's atomic batch: changed rows, badge and version go to the store together."""

    user_id: int
    rows: list[dict[str, Any]]
    badge: Badge
    projection_mailbox_seq: int
    prev_projection_mailbox_seq: int
    structure_version: int
    driving_event_id: str
    driving_mailbox_seq: int

    def session_delta(self) -> dict[str, Any]:
        return {
            "type": "SESSION_DELTA",
            "user_id": self.user_id,
            "projection_mailbox_seq": self.projection_mailbox_seq,
            "prev_projection_mailbox_seq": self.prev_projection_mailbox_seq,
            "driving_event_id": self.driving_event_id,
            "driving_mailbox_seq": self.driving_mailbox_seq,
            "conversations": self.rows,
        }

    def badge_update(self) -> dict[str, Any]:
        return {
            "type": "BADGE_UPDATE",
            "user_id": self.user_id,
            "total_unread": self.badge.total_unread,
            "total_mention": self.badge.total_mention,
            "muted_unread": self.badge.muted_unread,
            "projection_mailbox_seq": self.projection_mailbox_seq,
            "prev_projection_mailbox_seq": self.prev_projection_mailbox_seq,
        }
