"""Replay mode (docs/contract.md §7): mailbox entries from a file through the worker's processing object.

A thin driver of `app.domain.processor.PartitionProcessor` (the one decode → gate → apply →
flush loop the worker runs too): the clock is the `ts` of the entry being applied (event time);
the MessageStore is in memory and learns the `message`, `recall` and `delete_message` entries the
processor applies (for any user); the flushes are the projection store and the frames.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from app.domain.badge import badge_fields
from app.domain.conversation import ROW_BYTES, ConversationState
from app.domain.fast_lane import (
    FAST_LANE_MAX_MEMBERS,
    FAST_LANE_PER_USER_PER_S,
)
from app.domain.flush import UserFlush
from app.domain.processor import PartitionProcessor, ProcessingStats, Snapshot
from app.domain.projector import (
    Projector,
    ProjectorConfig,
    UserState,
)
from app.domain.residency import ROW_STATE_KEY
from app.stores.memory_messages import InMemoryMessageStore
from app.stores.rocks_messages import RocksMessageStore
from app.stores.rocks_tables import RocksTables, scratch_options
from app.worker.state_source import TablesSource

Frame = dict[str, Any]

# Rows kept in memory by a replay with a state folder (600-800 bytes each: README "Sizing a
# worker's state"). A chunk of input touches a few thousand rows: more would only hold memory.
DEFAULT_HOT_ROWS = 100_000


def default_hot_bytes(hot_rows: int) -> int:
    """The hot set's byte bound that goes with `hot_rows`: as many bytes as that many rows hold
    without messages (~500 each, `ROW_BYTES`). Rows holding messages are bigger (~700 with one
    or two), so fewer of them stay: the hot set's memory stays what it was before the log's
    messages began, however long the log (issue 33, item 4)."""
    return hot_rows * ROW_BYTES


@dataclass(frozen=True, slots=True)
class ReplayOptions:
    lanes: int = 1
    window_ms: int = 5000
    max_dirty_rows: int = 100_000
    include_muted: bool = False
    badge_mode: str = "messages"  # docs/contract.md §10: the default of users without preferences
    # docs/contract.md §10, the fast lane on entry ts (the worker's defaults: the same frames)
    fast_lane_max_members: int = FAST_LANE_MAX_MEMBERS
    fast_lane_per_user_per_s: int = FAST_LANE_PER_USER_PER_S

    def __post_init__(self) -> None:
        if self.lanes < 1:
            raise ValueError("--lanes must be at least 1")
        self.projector_config()  # the processing options' bounds are the worker's (ValueError)

    def projector_config(self) -> ProjectorConfig:
        """The processing configuration these options name (the rest: the worker's defaults)."""
        return ProjectorConfig(
            window_ms=self.window_ms,
            max_dirty_rows=self.max_dirty_rows,
            include_muted=self.include_muted,
            badge_mode=self.badge_mode,
            fast_lane_max_members=self.fast_lane_max_members,
            fast_lane_per_user_per_s=self.fast_lane_per_user_per_s,
        )


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
    # The fast lane (docs/contract.md §10): user batches it flushed, the rows they wrote, and the
    # most writes of one row not counting its fast ones (the J-1 bound: <= ceil(span/window) + 1).
    fast_flushes: int = 0
    fast_writes: int = 0
    max_window_writes_per_user_conversation: int = 0

    def row_written(self, writes: int, fast_writes: int) -> None:
        """A row's final write counts (every known row once)."""
        if writes > self.max_writes_per_user_conversation:
            self.max_writes_per_user_conversation = writes
        if writes - fast_writes > self.max_window_writes_per_user_conversation:
            self.max_window_writes_per_user_conversation = writes - fast_writes

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
            "fast_flushes": self.fast_flushes,
            "fast_writes": self.fast_writes,
            "max_window_writes_per_user_conversation": self.max_window_writes_per_user_conversation,
        }


@dataclass(slots=True)
class ReplayResult:
    """`projections` and `badges` are lists in memory; with a state folder they are read from it
    as they are iterated (each iteration a scan), so the outputs never sit in memory whole."""

    projections: Iterable[dict[str, Any]]
    badges: Iterable[dict[str, Any]]
    frames: list[Frame]
    stats: dict[str, Any]
    dead_letter_reasons: list[str] = field(default_factory=list)


class Replayer:
    """The replay driver: raw lines through one `PartitionProcessor` on event time (each entry's
    `ts` is the clock), its flushes recorded as the projection store and the frames."""

    def __init__(
        self,
        options: ReplayOptions,
        on_frame: Callable[[Frame], None],
        *,
        state_dir: Path | None = None,
        hot_rows: int = DEFAULT_HOT_ROWS,
        hot_bytes: int | None = None,
    ) -> None:
        self.options = options
        self.stats = ReplayStats()
        self.processing = ProcessingStats()
        # With a state folder the rows and users live in RocksDB there and memory holds a bounded
        # hot set (the worker's own mechanism: app/domain/residency.py) of at most `hot_rows`
        # rows and about `hot_bytes` bytes (None: `default_hot_bytes(hot_rows)`), persisted
        # after every chunk of input; the messages learned live there too (only the chunk's in
        # memory).
        self.tables = RocksTables(state_dir) if state_dir is not None else None
        self.rocks_store = (
            RocksMessageStore(
                state_dir / "messages", scratch_options(self.tables.cache, self.tables.memtables)
            )
            if state_dir is not None and self.tables is not None
            else None
        )
        self.store: InMemoryMessageStore | RocksMessageStore = (
            self.rocks_store if self.rocks_store is not None else InMemoryMessageStore()
        )
        self.hot_rows = hot_rows
        self.hot_bytes = default_hot_bytes(hot_rows) if hot_bytes is None else hot_bytes
        self.processor = self._processor(lambda config, store, **kw: PartitionProcessor(config, store, **kw))
        self.on_frame = on_frame
        self.dead_letter_reasons: list[str] = []
        self._flushed_rows: set[tuple[int, str]] = set()
        # Users a flush wrote (their flushed version moved), rows or none: a batch with no row (a
        # badge_preferences entry's, §10) must persist its user too, or a user read back after
        # eviction would chain its next frame to an older version.
        self._flushed_users: set[int] = set()

    def _processor(self, make: Callable[..., PartitionProcessor]) -> PartitionProcessor:
        options = self.options
        config = options.projector_config()
        extra: dict[str, Any] = {}
        if self.tables is not None:
            extra = {
                "source": TablesSource(self.tables, 0),
                "hot_rows": self.hot_rows,
                "hot_bytes": self.hot_bytes,
                "track_changes": True,
            }
        return make(
            config, self.store, lanes=options.lanes, stats=self.processing, learn_messages=True, **extra
        )

    @property
    def projector(self) -> Projector:
        return self.processor.projector

    def feed(self, raw: bytes) -> None:
        self.feed_many((raw,))

    def feed_many(self, lines: Iterable[bytes]) -> int:
        """Feed raw lines; returns how many were read. Blank lines are skipped, not counted."""
        read = lines if isinstance(lines, list) else list(lines)
        batch = read
        if b"" in read or any(map(bytes.isspace, read)):  # rare: one pass in C before the copy
            batch = [line for line in read if line and not line.isspace()]
        step = self.processor.on_records(batch, None)
        for batches in step.flushes:
            self._flushed(batches)
        if step.dead_letters:
            reasons = self.dead_letter_reasons
            for _, letter in step.dead_letters[: max(0, 1000 - len(reasons))]:
                reasons.append(letter.reason)
        if self.tables is not None:
            self._persist()
        return len(read)

    def _persist(self) -> None:
        """State folder: what changed (and what flushes wrote: the rows' write counts, the users'
        flushed versions) goes to RocksDB; then clean rows beyond the hot set leave memory."""
        tables = self.tables
        assert tables is not None
        processor = self.processor
        changes = processor.changes_since_persist()
        for user_id, conversation_id in changes.rows | self._flushed_rows:
            record = processor.row_record(user_id, conversation_id)
            tables.put_row(0, user_id, conversation_id, msgspec.msgpack.encode(record))
        for user_id in changes.users | self._flushed_users:
            tables.put_user(0, user_id, msgspec.msgpack.encode(processor.user_record(user_id)))
        tables.commit_now()
        if self.rocks_store is not None:
            self.rocks_store.commit()
        self._flushed_rows.clear()
        self._flushed_users.clear()
        processor.evict()

    def _flushed(self, batches: list[UserFlush]) -> None:
        self.stats.flushes += 1
        for batch in batches:
            self._record(batch)
            if self.tables is not None:
                self._flushed_rows.update((batch.user_id, row["conversation_id"]) for row in batch.rows)
                self._flushed_users.add(batch.user_id)

    def _record(self, batch: UserFlush) -> None:
        self.stats.projection_writes += len(batch.rows)
        if batch.fast:
            self.stats.fast_flushes += 1
            self.stats.fast_writes += len(batch.rows)
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
        # msgpack gives the row triples back as lists: tuples again, as Snapshot declares (the
        # compiled build checks the element type).
        rows = [(int(u), str(c), dict(record)) for u, c, record in state["rows"]]
        snapshot = Snapshot(rows, state["users"], state["gate"], state["pending"])
        replayer.processor = replayer._processor(
            lambda config, store, **kw: PartitionProcessor.restore(config, store, snapshot, **kw)
        )
        return replayer

    def finish(self, *, lazy: bool = False) -> ReplayResult:
        """End of input flushes everything; entries still above the watermark stay pending.

        `lazy`: the in-memory outputs are read from the state as they are iterated (each
        iteration a pass) rather than built as lists, so they never sit in memory whole next to
        the state (`projector replay` writes them so: a million rows' dicts cost ~470 MiB). With
        a state folder they are always read from it."""
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
        if self.tables is not None:
            return self._finish_from_folder(self.tables)
        # Everything is flushed now: each row's state is the row its last flush wrote (no second
        # copy of every row is kept on the way).
        users = processor.users
        for user in users.values():
            for row in user.rows.values():
                stats.row_written(row.writes, row.fast_writes)

        def projections() -> Iterator[dict[str, Any]]:
            for user_id in sorted(users):
                rows = users[user_id].rows
                for conversation_id in sorted(rows):
                    yield rows[conversation_id].as_row()

        def badges() -> Iterator[dict[str, Any]]:
            for user_id in sorted(users):
                yield _badge_output(users[user_id])

        return ReplayResult(
            projections=_Rescan(projections) if lazy else list(projections()),
            badges=_Rescan(badges) if lazy else list(badges()),
            frames=[],
            stats=stats.as_dict(),
            dead_letter_reasons=self.dead_letter_reasons,
        )

    def _finish_from_folder(self, tables: RocksTables) -> ReplayResult:
        """The outputs read from the state folder in key order (users by id, their rows by
        conversation id): the same order and the same rows as in memory. The hot set leaves
        memory first (everything is persisted): the scans need none of it."""
        self._persist()
        residency = self.processor.residency
        if residency is not None:
            residency.hot_rows = 0
            self.processor.evict()
        stats = self.stats
        for _, blob in tables.users(0):
            user_id = msgspec.msgpack.decode(blob)["user_id"]
            for conversation_id, row_blob in tables.user_rows(0, user_id):
                record = msgspec.msgpack.decode(row_blob)
                row = ConversationState.load(record[ROW_STATE_KEY], user_id, conversation_id)
                stats.row_written(row.writes, row.fast_writes)

        def projections() -> Iterator[dict[str, Any]]:
            for _, blob in tables.users(0):
                user_id = msgspec.msgpack.decode(blob)["user_id"]
                for conversation_id, row_blob in tables.user_rows(0, user_id):
                    record = msgspec.msgpack.decode(row_blob)
                    yield ConversationState.load(record[ROW_STATE_KEY], user_id, conversation_id).as_row()

        def badges() -> Iterator[dict[str, Any]]:
            for _, blob in tables.users(0):
                user = UserState.load(msgspec.msgpack.decode(blob), [])
                self.processor.projector.defaults(user)  # preferences not chosen: the deployment's
                yield _badge_output(user)

        return ReplayResult(
            projections=_Rescan(projections),
            badges=_Rescan(badges),
            frames=[],
            stats=stats.as_dict(),
            dead_letter_reasons=self.dead_letter_reasons,
        )


def _badge_output(user: UserState) -> dict[str, Any]:
    """A user's line of badges.jsonl."""
    return {"user_id": user.user_id, **badge_fields(user.badge, user.projection_mailbox_seq)}


class _Rescan:
    """An iterable that runs its generator function again at every iteration."""

    def __init__(self, make: Callable[[], Iterator[dict[str, Any]]]) -> None:
        self.make = make

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self.make()


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
