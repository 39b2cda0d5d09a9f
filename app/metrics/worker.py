"""The worker's metrics (issue 7). Its counters are not incremented on the hot path:
:meth:`WorkerMetrics.sync` reads the deltas of :class:`app.worker.core.WorkerStats` (and the
gates' pending counts and watermarks) and is called from the flush timer and on every scrape;
only the flush and reconcile latency histograms are observed per event (a histogram cannot be
rebuilt from a total). Served on ``WorkerSettings.worker_metrics_port`` (app/runtime/web.py)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Final, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from app.domain.entries import DEAD_LETTER_KINDS
from app.metrics.declare import MetricSpec, TotalsSeen, each_label
from app.metrics.process import ProcessMetrics

if TYPE_CHECKING:
    from app.worker.core import WorkerCore
    from app.worker.retention import RetentionCounts

# app.domain.reconcile.Outcome's values (the worker's projector_reconciles_total{outcome}).
RECONCILE_OUTCOMES: Final = (
    "clean",
    "corrected",
    "reflushed",
    "not_judged",
    "refused",
    "unknown_user",
    "failed",
    "not_owned",
    "stale",
    "malformed",
)


class DurableCounts(Protocol):
    """What the worker's metrics read from its checkpointed tables (tables/durable/tables.py)."""

    persists: int
    persist_failures: int
    claims: int
    claims_lost: int
    rebuilds: int
    standby_records: int


class WorkerMetrics(ProcessMetrics):
    """The worker's registry: one row per metric (attribute = metric), pulled by :meth:`sync`."""

    entries_in = MetricSpec(
        Counter, "projector_entries_in", "Mailbox entries read (markers excluded), dead letters included"
    )
    entries_applied = MetricSpec(Counter, "projector_entries_applied", "Entries applied to the projection")
    entries_duplicate = MetricSpec(
        Counter, "projector_entries_duplicate", "Entries dropped as duplicates (mailbox_seq already applied)"
    )
    entries_dead_lettered = MetricSpec(
        Counter, "projector_entries_dead_lettered", "Records sent to the dead-letter topic"
    )
    dead_letters = MetricSpec(
        Counter,
        "projector_dead_letters",
        "Records sent to the dead-letter topic, by reason (app.domain.entries.DEAD_LETTER_KINDS)",
        ("reason",),
        made_at_start=each_label(DEAD_LETTER_KINDS),
    )
    entries_pending = MetricSpec(
        Gauge, "projector_entries_pending", "Entries waiting above the watermark (all partitions)"
    )
    watermark_lag = MetricSpec(
        Gauge,
        "projector_watermark_lag",
        "Highest mailbox_seq seen minus the watermark hi, per partition",
        ("partition",),
    )
    flushes = MetricSpec(Counter, "projector_flushes", "Flushes that wrote at least one user")
    fast_flushes = MetricSpec(
        Counter,
        "projector_fast_flushes",
        "Users flushed at once by the fast lane (docs/contract.md §10), not at a window's end",
    )
    projection_writes = MetricSpec(
        Counter, "projector_projection_writes", "Rows written to the projection store"
    )
    compression_ratio = MetricSpec(
        Gauge,
        "projector_compression_ratio",
        "Entries applied per projection row written (since start; 0 before the first write)",
    )
    flush_latency = MetricSpec(
        Histogram, "projector_flush_latency_seconds", "One flush: projection store write and frames"
    )
    frames_emitted = MetricSpec(
        Counter, "projector_frames_emitted", "SESSION_DELTA and BADGE_UPDATE frames produced"
    )
    member_notices = MetricSpec(
        Counter,
        "projector_member_notices",
        "MEMBER_NOTICE frames produced (member joined / left with history; docs/contract.md §9)",
    )
    member_notices_ahead = MetricSpec(
        Counter,
        "projector_member_notices_ahead_of_roster",
        "MEMBER_NOTICE frames sent while the Cassandra mirror failed to write the roster changes applied "
        "before them (a client re-reading then may see the old roster)",
    )
    outbound_send_failures = MetricSpec(
        Counter,
        "projector_outbound_send_failures",
        "Sends of dead letters / member notices that raised (kept, and sent again before the partition's "
        "next persist, which waits for them)",
    )
    unread_drift_ratio = MetricSpec(
        Gauge,
        "projector_unread_drift_ratio",
        "Share of the rows the last unread audit round compared whose stored row or state differed from the "
        "MessageStore recount (a round that compared none leaves it)",
    )
    unread_audited_rows = MetricSpec(
        Counter, "projector_unread_audited_rows", "Rows the unread audit compared with a MessageStore recount"
    )
    unread_drift_corrected_rows = MetricSpec(
        Counter,
        "projector_unread_drift_corrected_rows",
        "Drifted rows the unread audit corrected (in place, or through the next flush)",
    )
    # Reconcile on request (app/worker/reconcile.py): requests by what became of them, and the rows
    # they compared, corrected (the store held other values) and filled (it lacked them).
    reconciles = MetricSpec(
        Counter,
        "projector_reconciles",
        "Reconcile requests handled, by outcome (clean, corrected, reflushed, not_judged, refused, "
        "unknown_user, failed, not_owned, stale, malformed)",
        ("outcome",),
        made_at_start=each_label(RECONCILE_OUTCOMES),
    )
    reconcile_rows_compared = MetricSpec(
        Counter,
        "projector_reconcile_rows_compared",
        "Rows reconciles compared with the projection store (every row of each reconciled user)",
    )
    reconcile_rows_corrected = MetricSpec(
        Counter,
        "projector_reconcile_rows_corrected",
        "Rows reconciles corrected in place (stored with other values than the state's)",
    )
    reconcile_rows_filled = MetricSpec(
        Counter,
        "projector_reconcile_rows_filled",
        "Rows reconciles wrote because the projection store lacked them",
    )
    reconcile_duration = MetricSpec(
        Histogram,
        "projector_reconcile_duration_seconds",
        "One user's reconcile: its rows read, recounted from the MessageStore, compared, corrected",
    )
    # The Cassandra mirror (user_conversation_state, group_members, member_stats).
    state_writes = MetricSpec(
        Counter,
        "projector_state_writes",
        "Rows written to the Cassandra mirror (user_conversation_state, group_members, member_stats)",
    )
    state_write_failures = MetricSpec(
        Counter,
        "projector_state_write_failures",
        "Cassandra mirror writes that failed (kept and retried; the projection goes on)",
    )
    state_owed_rows = MetricSpec(
        Counter,
        "projector_state_owed_rows",
        "Rows persisted to the changelog with Cassandra mirror writes still owed",
    )
    state_restaged_rows = MetricSpec(
        Counter,
        "projector_state_restaged_rows",
        "Rows whose owed Cassandra mirror writes were staged again after a restart",
    )
    # The mailbox intake: batches refused, records read again, offsets with no record.
    intake_gaps_refused = MetricSpec(
        Counter,
        "projector_intake_gaps_refused",
        "Mailbox batches refused because they did not continue a partition's state in the log (or a fetch "
        "that never reached the core); each is read again from where the state stands, never skipped",
    )
    intake_records_skipped = MetricSpec(
        Counter,
        "projector_intake_records_skipped",
        "Mailbox records read again that the partition's state already holds (after a seek back)",
    )
    intake_hole_offsets = MetricSpec(
        Counter,
        "projector_intake_hole_offsets",
        "Mailbox offsets the broker reported as holding no record (transaction markers, compacted or "
        "expired records)",
    )
    # The checkpointed state (tables/durable): persists (one changelog append each), claims of
    # partitions, local stores rebuilt, standby copies, retention overruns.
    state_persists = MetricSpec(
        Counter, "projector_state_persists", "Persists of partition state (one checkpointed append each)"
    )
    state_persist_failures = MetricSpec(
        Counter,
        "projector_state_persist_failures",
        "Persists that failed (the partition is claimed again before its next persist)",
    )
    state_claims = MetricSpec(Counter, "projector_state_claims", "Partitions claimed (a new epoch)")
    state_claims_lost = MetricSpec(
        Counter,
        "projector_state_claims_lost",
        "Claims refused because another writer's checkpoint came first",
    )
    state_local_rebuilds = MetricSpec(
        Counter,
        "projector_state_local_rebuilds",
        "Local stores wiped and rebuilt from the changelog (lost, damaged or behind its start)",
    )
    standby_records_applied = MetricSpec(
        Counter, "projector_standby_records_applied", "Changelog records applied to standby copies"
    )
    retention_overruns = MetricSpec(
        Counter,
        "projector_retention_overruns",
        "Partitions whose mailbox-tail log start was past their checkpoint (entries deleted unread)",
    )
    retention_lost_offsets = MetricSpec(
        Counter,
        "projector_retention_lost_offsets",
        "mailbox-tail offsets deleted before the worker applied them",
    )
    # After a retention overrun (app/worker/retention.py): the projection epoch, the reconciles asked.
    projection_epoch_bumps = MetricSpec(
        Counter,
        "projector_projection_epoch_bumps",
        "Retention overruns that bumped the projection epoch (once per overrun; a failed bump is "
        "counted in projector_projection_epoch_bump_failures)",
    )
    projection_epoch_bump_failures = MetricSpec(
        Counter,
        "projector_projection_epoch_bump_failures",
        "Projection epoch bumps the projection store did not take (logins within the interval are "
        "then not reconciled again; the partition's users are asked anyway)",
    )
    retention_reconciles = MetricSpec(
        Counter,
        "projector_retention_reconciles",
        "Reconcile requests the worker asked for the users of a partition after its retention overrun, "
        "by outcome (sent, unsent: the send failed or the partition moved first)",
        ("outcome",),
        made_at_start=(("sent",), ("unsent",)),
    )
    # Per partition, for the operator console's fleet view: the gate (hi and each lane's last
    # marker), what waits above it, and rows still owing Cassandra mirror writes.
    watermark_hi = MetricSpec(
        Gauge,
        "projector_watermark_hi",
        "The watermark gate's position hi (min over lanes of the last marker), per partition",
        ("partition",),
    )
    watermark_lane = MetricSpec(
        Gauge,
        "projector_watermark_lane",
        "The last watermark marker of each lane, per partition (absent until the lane reported)",
        ("partition", "lane"),
    )
    partition_pending = MetricSpec(
        Gauge,
        "projector_partition_pending",
        "Entries waiting above the watermark, per partition",
        ("partition",),
    )
    partition_owed_rows = MetricSpec(
        Gauge,
        "projector_partition_owed_rows",
        "Rows whose changelog record still owes Cassandra mirror writes, per partition",
        ("partition",),
    )
    last_flush = MetricSpec(
        Gauge,
        "projector_last_flush_timestamp_seconds",
        "Unix time at which the last flush that wrote anything ended (0 before the first)",
    )
    # A failing projection store (issue 15): flushes held and retried, never lost.
    store_write_failures = MetricSpec(
        Counter,
        "projector_store_write_failures",
        "Flush writes (the projection store, then the frames) that failed; the flush stays queued and is "
        "retried with backoff, nothing is lost",
    )
    store_failing = MetricSpec(
        Gauge,
        "projector_store_failing",
        "1 while flush writes fail and flushes are held (retried with backoff), else 0",
    )
    flushes_held = MetricSpec(
        Gauge, "projector_flushes_held", "User flushes produced and not yet written to the projection store"
    )
    # Arrival reconciliation (docs/contract.md §9).
    entries_missing = MetricSpec(
        Gauge,
        "projector_entries_missing",
        "Entries of a lane its last watermark marker's count says were sent to this partition (mailbox_seq "
        "<= W) and the partition never received; 0 when the marker carried no count (docs/contract.md §9). "
        "Nothing is held back or invented because of it",
        ("partition", "lane"),
    )
    # The projection repair (issue 18, app/worker/repair.py): a store that lost data written
    # again from the workers' state.
    projection_restores = MetricSpec(
        Counter,
        "projector_projection_restores",
        "Restores (of a partition, or of users a flush found missing) that wrote the projection again from "
        "the worker's state after the projection store lost data",
    )
    restore_checked_users = MetricSpec(
        Counter,
        "projector_projection_restore_checked_users",
        "Users a projection restore compared with the store (version and row count)",
    )
    restored_users = MetricSpec(
        Counter,
        "projector_projection_restored_users",
        "Users a projection restore wrote again whole at their version (with correction frames)",
    )
    restored_rows = MetricSpec(
        Counter, "projector_projection_restored_rows", "Rows those restore writes carried"
    )
    restore_reflushed_users = MetricSpec(
        Counter,
        "projector_projection_restore_reflushed_users",
        "Users with work not flushed yet that a projection restore handed whole to their next flush",
    )

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        super().__init__(registry)
        self._durable: DurableCounts | None = None
        self._retention: RetentionCounts | None = None
        self._seen = TotalsSeen()
        self._lag_partitions: set[int] = set()
        self._lanes: set[tuple[str, str]] = set()
        self._missing_lanes: set[tuple[str, str]] = set()

    def observe_reconcile(self, seconds: float) -> None:
        self.reconcile_duration.observe(seconds)

    def observe_flush(self, seconds: float) -> None:
        self.flush_latency.observe(seconds)
        self.last_flush.set(time.time())

    def watch_durable(self, counts: DurableCounts) -> None:
        """Count the checkpointed tables' persists, claims and rebuilds (`sync` reads them)."""
        self._durable = counts

    def watch_retention(self, counts: RetentionCounts) -> None:
        """Count the epoch bumps and reconciles after retention overruns (`sync` reads them)."""
        self._retention = counts

    def sync(self, core: WorkerCore) -> None:
        """Pull the core's totals and gauges into the metrics (cheap: a few dict reads)."""
        stats = core.stats
        seen = self._seen
        durable = self._durable
        if durable is not None:
            self.state_persists.inc(seen.delta("state_persists", durable.persists))
            self.state_persist_failures.inc(seen.delta("state_persist_failures", durable.persist_failures))
            self.state_claims.inc(seen.delta("state_claims", durable.claims))
            self.state_claims_lost.inc(seen.delta("state_claims_lost", durable.claims_lost))
            self.state_local_rebuilds.inc(seen.delta("state_rebuilds", durable.rebuilds))
            self.standby_records_applied.inc(seen.delta("standby_records", durable.standby_records))
        self.retention_overruns.inc(seen.delta("retention_overruns", stats.retention_overruns))
        self.retention_lost_offsets.inc(seen.delta("retention_lost", stats.retention_lost_offsets))
        retention = self._retention
        if retention is not None:
            self.projection_epoch_bumps.inc(seen.delta("epoch_bumps", retention.epoch_bumps))
            self.projection_epoch_bump_failures.inc(
                seen.delta("epoch_bump_failures", retention.epoch_bump_failures)
            )
            self.retention_reconciles.labels("sent").inc(
                seen.delta("retention_sent", retention.reconciles_asked)
            )
            self.retention_reconciles.labels("unsent").inc(
                seen.delta("retention_unsent", retention.reconciles_unsent)
            )
        self.entries_in.inc(seen.delta("entries", stats.entries))
        self.entries_applied.inc(seen.delta("applied", stats.applied))
        self.entries_duplicate.inc(seen.delta("duplicates", stats.duplicates))
        self.entries_dead_lettered.inc(seen.delta("dead_letters", stats.dead_letters))
        for kind, total in list(stats.dead_letter_kinds.items()):
            label = kind if kind in DEAD_LETTER_KINDS else "schema"  # the label set stays closed
            self.dead_letters.labels(label).inc(seen.delta("dead_letters:" + kind, total))
        self.flushes.inc(seen.delta("flushes", stats.flushes))
        self.fast_flushes.inc(seen.delta("fast_flushes", stats.fast_flushes))
        self.projection_writes.inc(seen.delta("projection_writes", stats.projection_writes))
        self.frames_emitted.inc(seen.delta("frames", stats.frames))
        self.member_notices.inc(seen.delta("notices", stats.notices))
        self.member_notices_ahead.inc(seen.delta("notices_ahead", stats.notices_ahead_of_roster))
        self.outbound_send_failures.inc(seen.delta("outbound_send_failures", stats.outbound_send_failures))
        self.unread_audited_rows.inc(seen.delta("audited_rows", stats.audited_rows))
        self.unread_drift_corrected_rows.inc(seen.delta("audit_corrected_rows", stats.audit_corrected_rows))
        self.unread_drift_ratio.set(stats.audit_drift_ratio)
        for outcome, total in list(stats.reconcile_outcomes.items()):
            delta = seen.delta(f"reconciles:{outcome}", total)
            if delta:
                self.reconciles.labels(outcome).inc(delta)
        self.reconcile_rows_compared.inc(seen.delta("reconcile_rows_compared", stats.reconcile_rows_compared))
        self.reconcile_rows_corrected.inc(
            seen.delta("reconcile_rows_corrected", stats.reconcile_rows_corrected)
        )
        self.reconcile_rows_filled.inc(seen.delta("reconcile_rows_filled", stats.reconcile_rows_filled))
        self.state_writes.inc(seen.delta("state_writes", stats.state_writes))
        self.state_write_failures.inc(seen.delta("state_write_failures", stats.state_write_failures))
        self.state_owed_rows.inc(seen.delta("state_owed_rows", stats.state_owed_rows))
        self.state_restaged_rows.inc(seen.delta("state_restaged_rows", stats.state_restaged_rows))
        self.intake_gaps_refused.inc(seen.delta("intake_gaps_refused", stats.intake_gaps_refused))
        self.store_write_failures.inc(seen.delta("store_write_failures", stats.store_write_failures))
        self.store_failing.set(1 if core.store_failing else 0)
        self.flushes_held.set(core.held_flushes())
        self.intake_records_skipped.inc(seen.delta("intake_records_skipped", stats.intake_records_skipped))
        self.intake_hole_offsets.inc(seen.delta("intake_hole_offsets", stats.intake_hole_offsets))
        self.projection_restores.inc(seen.delta("projection_restores", stats.projection_restores))
        self.restore_checked_users.inc(seen.delta("restore_checked_users", stats.restore_checked_users))
        self.restored_users.inc(seen.delta("restored_users", stats.restored_users))
        self.restored_rows.inc(seen.delta("restored_rows", stats.restored_rows))
        self.restore_reflushed_users.inc(seen.delta("restore_reflushed_users", stats.restore_reflushed_users))
        if stats.projection_writes:
            self.compression_ratio.set(stats.applied / stats.projection_writes)
        pending = 0
        current: set[int] = set()
        lanes: set[tuple[str, str]] = set()
        missing_lanes: set[tuple[str, str]] = set()
        for partition, state in list(core.partitions.items()):
            label = str(partition)
            processor = state.processor
            gate = processor.gate
            pending += gate.pending_count
            self.watermark_lag.labels(label).set(max(0, processor.max_seen_seq - gate.hi))
            self.watermark_hi.labels(label).set(gate.hi)
            self.partition_pending.labels(label).set(gate.pending_count)
            self.partition_owed_rows.labels(label).set(len(state.owing))
            for lane, mark in enumerate(gate.dump()["marks"]):
                if mark is not None:
                    self.watermark_lane.labels(label, str(lane)).set(mark)
                    lanes.add((label, str(lane)))
            for lane, missing in enumerate(processor.arrivals.missing_by_lane()):
                self.entries_missing.labels(label, str(lane)).set(missing)
                missing_lanes.add((label, str(lane)))
            current.add(partition)
        for gone in self._lag_partitions - current:  # revoked: another worker reports it now
            for gauge in (
                self.watermark_lag,
                self.watermark_hi,
                self.partition_pending,
                self.partition_owed_rows,
            ):
                gauge.remove(str(gone))
        for pair in self._lanes - lanes:
            self.watermark_lane.remove(*pair)
        for pair in self._missing_lanes - missing_lanes:
            self.entries_missing.remove(*pair)
        self._lag_partitions = current
        self._lanes = lanes
        self._missing_lanes = missing_lanes
        self.entries_pending.set(pending)


# Exposition names, in the order declared.
WORKER_METRICS: Final = WorkerMetrics.exposed_names()
