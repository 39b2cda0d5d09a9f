"""Replay mode (docs/contract.md §7): mailbox entries from a file through exactly the worker's core.

The clock is the `ts` of the entry being applied; the MessageStore is in memory, fed by the
`message`, `recall` and `delete_message` entries replay applies (for any user).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from app.domain.entries import (
    DeadLetter,
    DeleteMessageEntry,
    Entry,
    MessageEntry,
    RecallEntry,
    WatermarkMarker,
    decode_record,
)
from app.domain.flush import UserFlush
from app.domain.memory_store import InMemoryMessageStore
from app.domain.projector import Applied, Projector, ProjectorConfig
from app.domain.watermark import Offer, WatermarkGate

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
        if self.window_ms < 0:
            raise ValueError("--window-ms must be >= 0")
        if self.max_dirty_rows < 0:
            raise ValueError("--max-dirty-rows must be >= 0")


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
    """Drives the gate and the projector over a stream of raw lines."""

    def __init__(self, options: ReplayOptions, on_frame: Callable[[Frame], None]) -> None:
        self.options = options
        self.store = InMemoryMessageStore()
        self.projector = Projector(
            ProjectorConfig(
                window_ms=options.window_ms,
                max_dirty_rows=options.max_dirty_rows,
                include_muted=options.include_muted,
            ),
            self.store,
        )
        self.gate = WatermarkGate(options.lanes)
        self.stats = ReplayStats()
        self.on_frame = on_frame
        self.final_rows: dict[tuple[int, str], dict[str, Any]] = {}
        self.writes: dict[tuple[int, str], int] = {}
        self.dead_letter_reasons: list[str] = []

    def feed(self, raw: bytes) -> None:
        self.feed_many((raw,))

    def feed_many(self, lines: Iterable[bytes]) -> int:
        """Feed raw lines; returns how many were read. The hot loop: locals, no per-line calls
        beyond decode, gate and apply."""
        lanes = self.options.lanes
        stats = self.stats
        gate = self.gate
        apply = self._apply
        count = 0
        for raw in lines:
            count += 1
            if not raw or raw.isspace():
                continue
            record = decode_record(raw, lanes)
            kind = type(record)
            if kind is WatermarkMarker:
                for entry in gate.mark(record):  # type: ignore[arg-type]
                    apply(entry)
                continue
            stats.entries += 1
            if kind is DeadLetter:
                stats.dead_letters += 1
                if len(self.dead_letter_reasons) < 1000:
                    self.dead_letter_reasons.append(record.reason)  # type: ignore[union-attr]
                continue
            offer = gate.offer(record)  # type: ignore[arg-type]  # neither marker nor dead letter
            if offer is Offer.READY:
                apply(record)  # type: ignore[arg-type]
            elif offer is Offer.DUPLICATE:
                stats.duplicates += 1
        return count

    def _apply(self, entry: Entry) -> None:
        stats = self.stats
        projector = self.projector
        policy = projector.policy
        if policy.window_elapsed(entry.ts) and not projector.is_duplicate(entry):
            self._flush()  # the window is over: it closes before this entry opens the next
        if projector.apply(entry, entry.ts) is Applied.DUPLICATE:
            stats.duplicates += 1
            return
        stats.applied += 1
        kind = type(entry)
        if kind is MessageEntry:
            stats.applied_messages += 1
            message: MessageEntry = entry  # type: ignore[assignment]
            # The in-memory MessageStore learns what replay applies, for any user.
            self.store.record_message(
                message.conversation_id,
                message.conversation_seq,
                message_id=message.message_id,
                activity_id=message.activity_id,
                sender_id=message.sender_id,
                counts_unread=message.counts_unread,
                mentioned_user=message.user_id if message.mention else None,
            )
        elif kind is RecallEntry or kind is DeleteMessageEntry:
            target: RecallEntry = entry  # type: ignore[assignment]
            self.store.record_recall(target.conversation_id, target.target_conversation_seq)
        if policy.over_memory_bound(projector.dirty.row_count):
            self._flush()

    def _flush(self) -> None:
        batches = self.projector.flush()
        if not batches:
            return
        self.stats.flushes += 1
        for batch in batches:
            self._record(batch)

    def _record(self, batch: UserFlush) -> None:
        writes = self.writes
        for row in batch.rows:
            key = (batch.user_id, row["conversation_id"])
            self.final_rows[key] = row
            count = writes[key] = writes.get(key, 0) + 1
            if count > self.stats.max_writes_per_user_conversation:
                self.stats.max_writes_per_user_conversation = count
        self.stats.projection_writes += len(batch.rows)
        self.on_frame(batch.session_delta())
        self.on_frame(batch.badge_update())

    # -- crash and restart ---------------------------------------------------------------------

    def checkpoint(self) -> bytes:
        """What survives a crash: the changelog tables' content (rows, users, the gate and its
        waiting entries), serialized. Not the dirty set and not the flush window."""
        state = {
            "projector": self.projector.dump(),
            "gate": self.gate.dump(),
            "waiting": [msgspec.json.encode(entry) for entry in self.gate.waiting()],
        }
        return msgspec.msgpack.encode(state)

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
        store = replayer.store = crashed.store
        replayer.final_rows = crashed.final_rows
        replayer.projector = Projector.restore(replayer.projector.config, store, state["projector"])
        waiting = [decode_record(raw, options.lanes) for raw in state["waiting"]]
        replayer.gate = WatermarkGate.load(
            options.lanes,
            state["gate"],
            [entry for entry in waiting if not isinstance(entry, DeadLetter | WatermarkMarker)],
        )
        return replayer

    def finish(self) -> ReplayResult:
        """End of input flushes everything; entries still above the watermark stay pending."""
        self._flush()
        self.stats.pending = self.gate.pending_count
        projections = [self.final_rows[key] for key in sorted(self.final_rows)]
        badges = []
        for user_id in sorted(self.projector.users):
            user = self.projector.users[user_id]
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
            stats=self.stats.as_dict(),
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
