"""The worker's shared parts: its configuration, its counts, and one owned partition's state."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from app.domain.flush import UserFlush
from app.domain.processor import PartitionProcessor, ProcessingStats
from app.domain.projector import ProjectorConfig


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(slots=True)
class WorkerStats(ProcessingStats):
    """The processing counts (shared by every partition's processor: partitions come and go, the
    totals must not) and the worker's own I/O counts."""

    flushes: int = 0
    projection_writes: int = 0
    refused_writes: int = 0
    frames: int = 0
    notices: int = 0  # MEMBER_NOTICE frames produced (app/domain/notices.py)
    notices_ahead_of_roster: int = 0  # of them, sent while the mirror's roster write failed
    # Sends of a batch's dead letters / member notices that raised (kept and sent again before
    # the partition's next persist, which waits for them).
    outbound_send_failures: int = 0
    state_writes: int = 0
    state_write_failures: int = 0
    state_unmirrorable: int = 0
    # Rows persisted while their mirror write was still owed (Cassandra failing), and owed
    # writes staged again from the changelog after a restart.
    state_owed_rows: int = 0
    state_restaged_rows: int = 0
    # The intake's offset rule (app/worker/offsets.py): batches refused because they did not start
    # where the partition's state stands in the log (never applied: read again after a seek back),
    # records skipped because the state already holds them (re-reads), and offsets the broker
    # reported as holding no record (transaction markers, compaction, retention).
    intake_gaps_refused: int = 0
    intake_records_skipped: int = 0
    intake_hole_offsets: int = 0
    # mailbox-tail's log start found past a partition's checkpoint (entries deleted unread: the
    # retention overran the worker), and the offsets lost so.
    retention_overruns: int = 0
    retention_lost_offsets: int = 0
    # Projection-store writes that raised while a store backoff was set (the flush stayed queued).
    store_write_failures: int = 0
    last_flush_ms: float = 0.0
    # The unread audit (app/worker/audit.py): totals, and the last round's drifted/audited share.
    audit_rounds: int = 0
    audited_rows: int = 0
    audit_drifted_rows: int = 0
    audit_corrected_rows: int = 0
    audit_drift_ratio: float = 0.0
    # Reconcile on request (app/worker/reconcile.py): requests by outcome, rows compared /
    # recounted from the MessageStore / corrected in place / filled, badges corrected.
    reconcile_outcomes: dict[str, int] = field(default_factory=dict)
    reconcile_rows_compared: int = 0
    reconcile_rows_recounted: int = 0
    reconcile_rows_corrected: int = 0
    reconcile_rows_filled: int = 0
    reconcile_badges_corrected: int = 0
    # Dead letters by kind (app.domain.entries.DEAD_LETTER_KINDS): the metrics' reason label.
    dead_letter_kinds: dict[str, int] = field(default_factory=dict)
    # The projection repair (app/worker/repair.py): partitions repaired, users checked against
    # the store, users written again (and their rows), users handed to their next flush whole.
    projection_restores: int = 0
    restore_checked_users: int = 0
    restored_users: int = 0
    restored_rows: int = 0
    restore_reflushed_users: int = 0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class PartitionState:
    """One owned partition: its processor, and the I/O bookkeeping around it."""

    def __init__(self, partition: int, processor: PartitionProcessor) -> None:
        self.partition = partition
        self.processor = processor
        # Rows whose changelog record carries Cassandra writes still owed (app/worker/checkpointer.py),
        # and the same as the partition's checkpoint last listed them.
        self.owing: set[tuple[int, str]] = set()
        self.owing_persisted: set[tuple[int, str]] = set()
        # The users the checkpoint lists as having work no flush carried (Checkpointer._write_tables).
        self.unflushed: list[int] = []
        # Persists of this partition so far (kept in the checkpoint).
        self.persists = 0
        # Flushes the processor produced and nobody published yet, in the order produced: a
        # user's versions must reach the store and the frames in order.
        self.unpublished: list[list[UserFlush]] = []
        # Flushes queued in this partition's life, and how many of them were published; a flush
        # may be published once a persist that snapshotted the state after it was produced has
        # completed (`durable_flushes`): a persist's changelog commit runs without the state
        # lock, so batches applied meanwhile may queue flushes that no completed persist covers.
        self.queued_flushes = 0
        self.published_flushes = 0
        self.durable_flushes = 0
        # Handed to another worker (`WorkerCore.release`): nothing of it is persisted or
        # published any more (a flush or persist queued behind the hand-over must not write the
        # changelog another worker owns; the hand-over's persist recorded its users' unflushed
        # work, the new owner flushes it).
        self.released = False
        # The next mailbox-tail offset this state has not applied (app/worker/offsets.py): every
        # record below it is in the state, none at or above it. Persisted in the checkpoint, so
        # it is restored with the state it describes; None until the intake places a partition
        # that has no state yet.
        self.next_offset: int | None = None
        self.durable_offset: int | None = None  # next_offset as of the last persist
        self.committed_offset: int | None = None
        # (expected offset, first skipped offset) of a hole seen once and not confirmed yet.
        self.hole_seen: tuple[int, int] | None = None
        # Dead letters and member notices of applied batches whose send raised: events, not
        # state, so no later flush restates them; the next persist sends them first and fails
        # while it cannot (a crash then re-reads their records and produces them again).
        self.owed_dead_letters: list[tuple[bytes | None, bytes]] = []
        self.owed_notices: list[tuple[bytes, bytes]] = []

    @property
    def unpersisted_since(self) -> int | None:
        return self.processor.changes.since

    def queue(self, flushes: Sequence[list[UserFlush]]) -> None:
        """Flushes the processor produced, in order (under the core's state lock)."""
        self.unpublished.extend(flushes)
        self.queued_flushes += len(flushes)


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    lanes: int
    projector: ProjectorConfig
    # Rows kept in memory per partition at most (the rest is read from the tables on demand).
    hot_rows: int = 500_000
    # And their estimated bytes at most (app/domain/residency.py; None: no byte bound, as the
    # live worker runs; `rebuild --by-replay --state-dir` sets it as replay does).
    hot_bytes: int | None = None
    # Time between the starts of two Cassandra mirror rounds (writes to one key within it merge).
    mirror_spacing_ms: int = 100
    # Dead-letter log lines per second at most (app/worker/ratelog.py); every one is counted.
    dead_letter_log_per_s: int = 5

    @classmethod
    def from_settings(cls, settings: Any) -> WorkerConfig:
        """The processing configuration of `settings` (app.settings.Settings), built once."""
        return cls(
            lanes=settings.lanes,
            hot_rows=settings.hot_rows,
            mirror_spacing_ms=settings.mirror_spacing_ms,
            dead_letter_log_per_s=settings.dead_letter_log_per_s,
            projector=ProjectorConfig(
                window_ms=settings.projection_compaction_window_ms,
                max_dirty_rows=settings.max_dirty_rows,
                include_muted=settings.include_muted,
                unread_precise_limit=settings.unread_precise_limit,
                badge_mode=settings.badge_mode,
                fast_lane_max_members=settings.fast_lane_max_members,
                fast_lane_per_user_per_s=settings.fast_lane_per_user_per_s,
            ),
        )

    @property
    def window_ms(self) -> int:
        return self.projector.window_ms

    @property
    def include_muted(self) -> bool:
        return self.projector.include_muted

    @property
    def unread_precise_limit(self) -> int:
        return self.projector.unread_precise_limit
