"""The worker's shared parts: its configuration, its counts, and one owned partition's state."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from app.domain.flush import UserFlush
from app.domain.processor import PartitionProcessor, ProcessingStats
from app.domain.projector import ProjectorConfig

if TYPE_CHECKING:
    from app.settings import ProcessingSettings, WorkerSettings


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(slots=True)
class WorkerStats(ProcessingStats):
    """The processing counts (shared by every partition's processor) and the worker's I/O counts."""

    flushes: int = 0
    projection_writes: int = 0
    refused_writes: int = 0
    frames: int = 0
    notices: int = 0  # MEMBER_NOTICE frames produced (app/domain/notices.py)
    notices_ahead_of_roster: int = 0  # of them, sent while the mirror's roster write failed
    # Sends of dead letters / member notices that raised (kept owed:
    # docs/decisions/0010-outbound-events-owed.md).
    outbound_send_failures: int = 0
    state_writes: int = 0
    state_write_failures: int = 0
    state_unmirrorable: int = 0
    # Rows persisted with mirror writes owed, and owed writes restaged after a restart.
    state_owed_rows: int = 0
    state_restaged_rows: int = 0
    # The offset rule (app/worker/offsets.py): gaps refused, re-read records skipped, hole offsets.
    intake_gaps_refused: int = 0
    intake_records_skipped: int = 0
    intake_hole_offsets: int = 0
    # Log starts found past a partition's checkpoint (retention overran it), and the offsets lost.
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
    # Reconcile on request (app/worker/reconcile.py): requests by outcome, rows and badges.
    reconcile_outcomes: dict[str, int] = field(default_factory=dict)
    reconcile_rows_compared: int = 0
    reconcile_rows_recounted: int = 0
    reconcile_rows_corrected: int = 0
    reconcile_rows_filled: int = 0
    reconcile_badges_corrected: int = 0
    # Dead letters by kind (app.domain.entries.DEAD_LETTER_KINDS): the metrics' reason label.
    dead_letter_kinds: dict[str, int] = field(default_factory=dict)
    # The projection repair (app/worker/repair.py): repairs, users checked / restated / reflushed.
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
        # Rows whose changelog record carries owed Cassandra writes, now and as last persisted.
        self.owing: set[tuple[int, str]] = set()
        self.owing_persisted: set[tuple[int, str]] = set()
        # The users the checkpoint lists as having work no flush carried (Checkpointer._write_tables).
        self.unflushed: list[int] = []
        # Persists of this partition so far (kept in the checkpoint).
        self.persists = 0
        # Flushes produced and not published yet, in the order produced (a user's versions in order).
        self.unpublished: list[list[UserFlush]] = []
        # Flushes queued in this partition's life, published, and covered by a completed persist
        # (durable before visible publishes only those: docs/decisions/0004-visible-before-durable.md).
        self.queued_flushes = 0
        self.published_flushes = 0
        self.durable_flushes = 0
        # Handed to another worker: nothing of it is persisted or published any more
        # (docs/decisions/0018-hand-over-on-revocation.md).
        self.released = False
        # The next mailbox-tail offset this state has not applied (in the checkpoint; None: not placed).
        self.next_offset: int | None = None
        self.durable_offset: int | None = None  # next_offset as of the last persist
        self.committed_offset: int | None = None
        # (expected offset, first skipped offset) of a hole seen once and not confirmed yet.
        self.hole_seen: tuple[int, int] | None = None
        # Dead letters and member notices whose send raised: the next persist sends them first.
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
    def from_settings(cls, processing: ProcessingSettings, worker: WorkerSettings) -> WorkerConfig:
        """The processing configuration of the sections (app.settings), built once."""
        return cls(
            lanes=processing.lanes,
            hot_rows=processing.hot_rows,
            mirror_spacing_ms=worker.mirror_spacing_ms,
            dead_letter_log_per_s=worker.dead_letter_log_per_s,
            projector=ProjectorConfig(
                window_ms=processing.projection_compaction_window_ms,
                max_dirty_rows=processing.max_dirty_rows,
                include_muted=processing.include_muted,
                unread_precise_limit=processing.unread_precise_limit,
                badge_mode=processing.badge_mode,
                fast_lane_max_members=processing.fast_lane_max_members,
                fast_lane_per_user_per_s=processing.fast_lane_per_user_per_s,
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
