"""Replay mode (docs/contract.md §7): mailbox entries from a file through the worker's processing object.

A thin driver of `app.domain.processor.PartitionProcessor` (the one decode → gate → apply →
flush loop the worker runs too): the clock is the `ts` of the entry being applied (event time);
the MessageStore is in memory and learns the `message`, `recall` and `delete_message` entries the
processor applies (for any user); the flushes are the projection store and the frames.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from app.domain.flush import UserFlush
from app.domain.processor import PartitionProcessor, ProcessingStats, Snapshot
from app.domain.projector import MAX_DIRTY_ROWS_MIN, WINDOW_MS_MIN, Projector, ProjectorConfig
from app.stores.memory_messages import InMemoryMessageStore

Frame = dict[str, Any]


@dataclass(frozen=True, slots=True)
class ReplayOptions:
    lanes: int = 1
    window_ms: int = 5000
    max_dirty_rows: int = 100_000
    include_muted: bool = False

    def __post_init__(self) -> None:
        if self.lanes < 1:
            raise ValueError("--lanes must be at least 1")
        if self.window_ms < WINDOW_MS_MIN:
            raise ValueError(f"--window-ms must be >= {WINDOW_MS_MIN}")
        if self.max_dirty_rows < MAX_DIRTY_ROWS_MIN:
            raise ValueError(f"--max-dirty-rows must be >= {MAX_DIRTY_ROWS_MIN}")


@dataclass(slots=True)
class ReplayStats:
    entries: int = 0
    applied: int = 0
    duplicates: int = 0
    dead_letters: int = 0
    pending: int = 0
    flushes: int = 0
    projection_writes: int = 0
    max_writes_per_user_conversation: int = 0
    applied_messages: int = 0

    def as_dict(self) -> dict[str, Any]:
        ratio = self.applied_messages / self.projection_writes if self.projection_writes else 0.0
        return {
            "entries": self.entries,
            "applied": self.applied,
            "duplicates": self.duplicates,
            "dead_letters": self.dead_letters,
            "pending": self.pending,
            "flushes": self.flushes,
            "projection_writes": self.projection_writes,
            "max_writes_per_user_conversation": self.max_writes_per_user_conversation,
            "compression_ratio": round(ratio, 6),
        }


@dataclass(slots=True)
class ReplayResult:
    projections: list[dict[str, Any]]
    badges: list[dict[str, Any]]
    frames: list[Frame]
    stats: dict[str, Any]
    dead_letter_reasons: list[str] = field(default_factory=list)


class Replayer:
    """The replay driver: raw lines through one `PartitionProcessor` on event time (each entry's
    `ts` is the clock), its flushes recorded as the projection store and the frames."""

    def __init__(self, options: ReplayOptions, on_frame: Callable[[Frame], None]) -> None:
        self.options = options
        self.store = InMemoryMessageStore()
        self.stats = ReplayStats()
        self.processing = ProcessingStats()
        self.processor = self._processor(lambda config, store, **kw: PartitionProcessor(config, store, **kw))
        self.on_frame = on_frame
        self.dead_letter_reasons: list[str] = []

    def _processor(self, make: Callable[..., PartitionProcessor]) -> PartitionProcessor:
        options = self.options
        config = ProjectorConfig(
            window_ms=options.window_ms,
            max_dirty_rows=options.max_dirty_rows,
            include_muted=options.include_muted,
        )
        return make(config, self.store, lanes=options.lanes, stats=self.processing, learn_messages=True)

    @property
    def projector(self) -> Projector:
        return self.processor.projector

    def feed(self, raw: bytes) -> None:
        self.feed_many((raw,))

    def feed_many(self, lines: Iterable[bytes]) -> int:
        """Feed raw lines; returns how many were read. Blank lines are skipped, not counted."""
        read = lines if isinstance(lines, list) else list(lines)
        batch = [line for line in read if line and not line.isspace()]
        step = self.processor.on_records(batch, None)
        for batches in step.flushes:
            self._flushed(batches)
        if step.dead_letters:
            reasons = self.dead_letter_reasons
            for _, letter in step.dead_letters[: max(0, 1000 - len(reasons))]:
                reasons.append(letter.reason)
        return len(read)

    def _flushed(self, batches: list[UserFlush]) -> None:
        self.stats.flushes += 1
        for batch in batches:
            self._record(batch)

    def _record(self, batch: UserFlush) -> None:
        self.stats.projection_writes += len(batch.rows)
        self.on_frame(batch.session_delta())
        self.on_frame(batch.badge_update())

    # -- crash and restart ---------------------------------------------------------------------

    def checkpoint(self) -> bytes:
        """What survives a crash: the changelog tables' content (rows, users, the gate and its
        waiting entries), serialized. Not the dirty set and not the flush window."""
        snapshot = self.processor.snapshot()
        return msgspec.msgpack.encode(
            {
                "rows": snapshot.rows,
                "users": snapshot.users,
                "gate": snapshot.gate,
                "pending": snapshot.pending,
            }
        )

    @classmethod
    def restart(
        cls,
        options: ReplayOptions,
        on_frame: Callable[[Frame], None],
        checkpoint: bytes,
        crashed: Replayer,
    ) -> Replayer:
        """A replayer restarted from a checkpoint. The MessageStore and the projection store
        outlive the process (Cassandra and Redis in the worker): they are taken from `crashed`."""
        replayer = cls(options, on_frame)
        state = msgspec.msgpack.decode(checkpoint)
        replayer.store = crashed.store
        snapshot = Snapshot(state["rows"], state["users"], state["gate"], state["pending"])
        replayer.processor = replayer._processor(
            lambda config, store, **kw: PartitionProcessor.restore(config, store, snapshot, **kw)
        )
        return replayer

    def finish(self) -> ReplayResult:
        """End of input flushes everything; entries still above the watermark stay pending."""
        processor = self.processor
        batches = processor.on_end()
        if batches:
            self._flushed(batches)
        processing = self.processing
        stats = self.stats
        stats.entries = processing.entries
        stats.applied = processing.applied
        stats.duplicates = processing.duplicates
        stats.dead_letters = processing.dead_letters
        stats.applied_messages = processing.applied_messages
        stats.pending = processor.pending_count
        # Everything is flushed now: each row's state is the row its last flush wrote (no second
        # copy of every row is kept on the way).
        projections = []
        badges = []
        for user_id in sorted(processor.users):
            user = processor.users[user_id]
            for conversation_id in sorted(user.rows):
                row = user.rows[conversation_id]
                if row.writes > stats.max_writes_per_user_conversation:
                    stats.max_writes_per_user_conversation = row.writes
                projections.append(row.as_row())
            badges.append(
                {
                    "user_id": user_id,
                    "total_unread": user.badge.total_unread,
                    "total_mention": user.badge.total_mention,
                    "muted_unread": user.badge.muted_unread,
                    "projection_mailbox_seq": user.projection_mailbox_seq,
                }
            )
        return ReplayResult(
            projections=projections,
            badges=badges,
            frames=[],
            stats=stats.as_dict(),
            dead_letter_reasons=self.dead_letter_reasons,
        )


def run_replay(
    lines: Iterable[bytes | str],
    options: ReplayOptions | None = None,
    on_frame: Callable[[Frame], None] | None = None,
) -> ReplayResult:
    """Replay `lines`; frames go to `on_frame` when given, else into `result.frames`."""
    collected: list[Frame] = []
    replayer = Replayer(options or ReplayOptions(), on_frame or collected.append)
    replayer.feed_many(line.encode() if isinstance(line, str) else line for line in lines)
    result = replayer.finish()
    result.frames = collected
    return result
