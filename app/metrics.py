"""Prometheus metrics of the worker, the API and the rebuild tool (issue 7), one registry per process.

Every metric is named here, once. The worker's counters are not incremented on the hot path:
:meth:`WorkerMetrics.sync` reads the deltas of :class:`app.worker.core.WorkerStats` (and the
gates' pending counts and watermarks) and is called from the flush timer and on every scrape;
only the flush latency histogram is observed per flush (a histogram cannot be rebuilt from a
total). The API's snapshot counters are read the same way from its ``SessionLists`` and
``SnapshotCache``; its page latency is observed per ``GET /v1/sessions``.

``GET /metrics`` serves the text exposition format: the API on its own port (no token, like
/openapi.json), the worker on ``Settings.worker_metrics_port`` (0 = off) with its own small
aiohttp server, never faust's web server (which several workers per host cannot share).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Protocol

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.exposition import generate_latest

from app.build import build_info
from app.domain.entries import DEAD_LETTER_KINDS

if TYPE_CHECKING:
    from app.worker.core import WorkerCore

PREFIX: Final = "projector_"

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

# Every process (worker, API, rebuild) also exports these (:func:`add_process_metrics`): the
# client library's process and Python collectors, and which build runs.
PROCESS_METRICS: Final = (
    "projector_build_info",
    "process_cpu_seconds_total",
    "process_resident_memory_bytes",
    "process_start_time_seconds",
    "process_open_fds",
    "python_info",
    "python_gc_collections_total",
)

# Exposition names (counters get ``_total`` appended by the client library on exposition).
WORKER_METRICS: Final = (
    "projector_entries_in_total",
    "projector_entries_applied_total",
    "projector_entries_duplicate_total",
    "projector_entries_dead_lettered_total",
    "projector_dead_letters_total",
    "projector_entries_pending",
    "projector_watermark_lag",
    "projector_flushes_total",
    "projector_fast_flushes_total",
    "projector_projection_writes_total",
    "projector_compression_ratio",
    "projector_flush_latency_seconds",
    "projector_frames_emitted_total",
    "projector_member_notices_total",
    "projector_member_notices_ahead_of_roster_total",
    "projector_outbound_send_failures_total",
    "projector_unread_drift_ratio",
    "projector_unread_audited_rows_total",
    "projector_unread_drift_corrected_rows_total",
    "projector_state_writes_total",
    "projector_state_write_failures_total",
    "projector_state_owed_rows_total",
    "projector_state_restaged_rows_total",
    "projector_intake_gaps_refused_total",
    "projector_intake_records_skipped_total",
    "projector_intake_hole_offsets_total",
    # The checkpointed state (tables/durable, issue 31).
    "projector_state_persists_total",
    "projector_state_persist_failures_total",
    "projector_state_claims_total",
    "projector_state_claims_lost_total",
    "projector_state_local_rebuilds_total",
    "projector_standby_records_applied_total",
    "projector_retention_overruns_total",
    "projector_retention_lost_offsets_total",
    # Per-partition figures of the operator console's fleet view (issue 17).
    "projector_watermark_hi",
    "projector_watermark_lane",
    "projector_partition_pending",
    "projector_partition_owed_rows",
    "projector_last_flush_timestamp_seconds",
    # A failing projection store (issue 15): flushes held and retried, never lost.
    "projector_store_write_failures_total",
    "projector_store_failing",
    "projector_flushes_held",
    # Arrival reconciliation (docs/contract.md §9): entries the markers' counts say were sent to
    # a partition and it never received.
    "projector_entries_missing",
    # The projection restore (issue 18, app/worker/restore.py): a store that lost data written
    # again from the workers' state.
    "projector_projection_restores_total",
    "projector_projection_restore_checked_users_total",
    "projector_projection_restored_users_total",
    "projector_projection_restored_rows_total",
    "projector_projection_restore_reflushed_users_total",
    # Reconcile on request (docs/contract.md §10, app/worker/reconcile.py).
    "projector_reconciles_total",
    "projector_reconcile_rows_compared_total",
    "projector_reconcile_rows_corrected_total",
    "projector_reconcile_rows_filled_total",
    "projector_reconcile_duration_seconds",
)
API_METRICS: Final = (
    "projector_snapshot_hits_total",
    "projector_snapshot_loads_total",
    "projector_snapshot_evictions_total",
    "projector_page_latency_seconds",
    "projector_api_requests_total",
    "projector_api_request_duration_seconds",
    "projector_api_reconcile_requests_total",
)
# The operator console (app/api/ops), in the API's registry when the console is served.
OPS_METRICS: Final = (
    "projector_ops_actions_total",
    "projector_ops_corrected_rows_total",
)
REBUILD_METRICS: Final = (
    "projector_rebuild_work_items",
    "projector_rebuild_work_done",
    "projector_rebuild_progress_ratio",
    "projector_rebuild_info",
    "projector_rebuild_diff_rows",
    "projector_rebuild_diff_badges",
)
# The row counts of a rebuild's diff with the serving namespace (`RebuildMetrics.diffed`).
REBUILD_DIFF_KINDS: Final = ("added", "removed", "changed")

_LATENCY_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


def add_process_metrics(registry: CollectorRegistry) -> None:
    """Process (CPU, memory, file descriptors, start time), Python (version, GC) and
    ``projector_build_info{version,python,compiled} 1`` on ``registry`` (each process has its
    own registry, so the library's default one is never used)."""
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    info = build_info()
    build = Gauge(
        "projector_build_info",
        "Always 1: the package version, the Python version and whether the compiled build runs",
        list(info.labels()),
        registry=registry,
    )
    build.labels(**info.labels()).set(1)


def exposition(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)


def metrics_handler(
    registry: CollectorRegistry, before: Callable[[], None] | None = None
) -> Callable[[web.Request], Awaitable[web.Response]]:
    """An aiohttp handler serving ``registry`` (``before`` runs first: a sync of pulled values)."""

    async def handle(request: web.Request) -> web.Response:
        if before is not None:
            before()
        # CONTENT_TYPE_LATEST carries a charset; aiohttp wants it in its own argument.
        return web.Response(body=exposition(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    return handle


# -- worker ---------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Seen:
    """The WorkerStats totals already added to the counters."""

    values: dict[str, int] = field(default_factory=dict)

    def delta(self, name: str, total: int) -> int:
        before = self.values.get(name, 0)
        self.values[name] = total
        # A total below what was seen (a new core after a restart in the same process) restarts.
        return total - before if total >= before else total


class DurableCounts(Protocol):
    """What the worker's metrics read from its checkpointed tables (tables/durable/tables.py)."""

    persists: int
    persist_failures: int
    claims: int
    claims_lost: int
    rebuilds: int
    standby_records: int


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.entries_in = Counter(
            "projector_entries_in",
            "Mailbox entries read (markers excluded), dead letters included",
            registry=r,
        )
        self.entries_applied = Counter(
            "projector_entries_applied", "Entries applied to the projection", registry=r
        )
        self.entries_duplicate = Counter(
            "projector_entries_duplicate",
            "Entries dropped as duplicates (mailbox_seq already applied)",
            registry=r,
        )
        self.entries_dead_lettered = Counter(
            "projector_entries_dead_lettered", "Records sent to the dead-letter topic", registry=r
        )
        self.dead_letters = Counter(
            "projector_dead_letters",
            "Records sent to the dead-letter topic, by reason (app.domain.entries.DEAD_LETTER_KINDS)",
            ["reason"],
            registry=r,
        )
        for kind in DEAD_LETTER_KINDS:  # every reason exported from the start, at 0
            self.dead_letters.labels(kind)
        self.entries_pending = Gauge(
            "projector_entries_pending", "Entries waiting above the watermark (all partitions)", registry=r
        )
        self.watermark_lag = Gauge(
            "projector_watermark_lag",
            "Highest mailbox_seq seen minus the watermark hi, per partition",
            ["partition"],
            registry=r,
        )
        self.flushes = Counter("projector_flushes", "Flushes that wrote at least one user", registry=r)
        self.fast_flushes = Counter(
            "projector_fast_flushes",
            "Users flushed at once by the fast lane (docs/contract.md §10), not at a window's end",
            registry=r,
        )
        self.projection_writes = Counter(
            "projector_projection_writes", "Rows written to the projection store", registry=r
        )
        self.compression_ratio = Gauge(
            "projector_compression_ratio",
            "Entries applied per projection row written (since start; 0 before the first write)",
            registry=r,
        )
        self.flush_latency = Histogram(
            "projector_flush_latency_seconds",
            "One flush: projection store write and frames",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.frames_emitted = Counter(
            "projector_frames_emitted", "SESSION_DELTA and BADGE_UPDATE frames produced", registry=r
        )
        self.member_notices = Counter(
            "projector_member_notices",
            "MEMBER_NOTICE frames produced (member joined / left with history; docs/contract.md §9)",
            registry=r,
        )
        self.member_notices_ahead = Counter(
            "projector_member_notices_ahead_of_roster",
            "MEMBER_NOTICE frames sent while the Cassandra mirror failed to write the roster "
            "changes applied before them (a client re-reading then may see the old roster)",
            registry=r,
        )
        self.outbound_send_failures = Counter(
            "projector_outbound_send_failures",
            "Sends of dead letters / member notices that raised (kept, and sent again before the "
            "partition's next persist, which waits for them)",
            registry=r,
        )
        self.unread_drift_ratio = Gauge(
            "projector_unread_drift_ratio",
            "Share of the rows the last unread audit round compared whose stored row or state "
            "differed from the MessageStore recount (a round that compared none leaves it)",
            registry=r,
        )
        self.unread_audited_rows = Counter(
            "projector_unread_audited_rows",
            "Rows the unread audit compared with a MessageStore recount",
            registry=r,
        )
        self.unread_drift_corrected_rows = Counter(
            "projector_unread_drift_corrected_rows",
            "Drifted rows the unread audit corrected (in place, or through the next flush)",
            registry=r,
        )
        # Reconcile on request (app/worker/reconcile.py): requests by what became of them, and
        # the rows they compared, corrected (the store held other values) and filled (it lacked them).
        self.reconciles = Counter(
            "projector_reconciles",
            "Reconcile requests handled, by outcome (clean, corrected, reflushed, not_judged, "
            "refused, unknown_user, failed, not_owned, stale, malformed)",
            ["outcome"],
            registry=r,
        )
        for outcome in RECONCILE_OUTCOMES:
            self.reconciles.labels(outcome)
        self.reconcile_rows_compared = Counter(
            "projector_reconcile_rows_compared",
            "Rows reconciles compared with the projection store (every row of each reconciled user)",
            registry=r,
        )
        self.reconcile_rows_corrected = Counter(
            "projector_reconcile_rows_corrected",
            "Rows reconciles corrected in place (stored with other values than the state's)",
            registry=r,
        )
        self.reconcile_rows_filled = Counter(
            "projector_reconcile_rows_filled",
            "Rows reconciles wrote because the projection store lacked them",
            registry=r,
        )
        self.reconcile_duration = Histogram(
            "projector_reconcile_duration_seconds",
            "One user's reconcile: its rows read, recounted from the MessageStore, compared, corrected",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.state_writes = Counter(
            "projector_state_writes",
            "Rows written to the Cassandra mirror (user_conversation_state, group_members, member_stats)",
            registry=r,
        )
        self.state_write_failures = Counter(
            "projector_state_write_failures",
            "Cassandra mirror writes that failed (kept and retried; the projection goes on)",
            registry=r,
        )
        self.state_owed_rows = Counter(
            "projector_state_owed_rows",
            "Rows persisted to the changelog with Cassandra mirror writes still owed",
            registry=r,
        )
        self.state_restaged_rows = Counter(
            "projector_state_restaged_rows",
            "Rows whose owed Cassandra mirror writes were staged again after a restart",
            registry=r,
        )
        self.intake_gaps_refused = Counter(
            "projector_intake_gaps_refused",
            "Mailbox batches refused because they did not continue a partition's state in the log "
            "(or a fetch that never reached the core); each is read again from where the state "
            "stands, never skipped",
            registry=r,
        )
        self.intake_records_skipped = Counter(
            "projector_intake_records_skipped",
            "Mailbox records read again that the partition's state already holds (after a seek back)",
            registry=r,
        )
        self.intake_hole_offsets = Counter(
            "projector_intake_hole_offsets",
            "Mailbox offsets the broker reported as holding no record (transaction markers, "
            "compacted or expired records)",
            registry=r,
        )
        # The checkpointed state (tables/durable): persists (one changelog append each),
        # claims of partitions, local stores rebuilt, standby copies, retention overruns.
        self.state_persists = Counter(
            "projector_state_persists",
            "Persists of partition state (one checkpointed append each)",
            registry=r,
        )
        self.state_persist_failures = Counter(
            "projector_state_persist_failures",
            "Persists that failed (the partition is claimed again before its next persist)",
            registry=r,
        )
        self.state_claims = Counter("projector_state_claims", "Partitions claimed (a new epoch)", registry=r)
        self.state_claims_lost = Counter(
            "projector_state_claims_lost",
            "Claims refused because another writer's checkpoint came first",
            registry=r,
        )
        self.state_local_rebuilds = Counter(
            "projector_state_local_rebuilds",
            "Local stores wiped and rebuilt from the changelog (lost, damaged or behind its start)",
            registry=r,
        )
        self.standby_records_applied = Counter(
            "projector_standby_records_applied",
            "Changelog records applied to standby copies",
            registry=r,
        )
        self.retention_overruns = Counter(
            "projector_retention_overruns",
            "Partitions whose mailbox-tail log start was past their checkpoint (entries deleted unread)",
            registry=r,
        )
        self.retention_lost_offsets = Counter(
            "projector_retention_lost_offsets",
            "mailbox-tail offsets deleted before the worker applied them",
            registry=r,
        )
        self._durable: DurableCounts | None = None
        add_process_metrics(r)
        # Per partition, for the operator console's fleet view: the gate (hi and each lane's
        # last marker), what waits above it, and rows still owing Cassandra mirror writes.
        self.watermark_hi = Gauge(
            "projector_watermark_hi",
            "The watermark gate's position hi (min over lanes of the last marker), per partition",
            ["partition"],
            registry=r,
        )
        self.watermark_lane = Gauge(
            "projector_watermark_lane",
            "The last watermark marker of each lane, per partition (absent until the lane reported)",
            ["partition", "lane"],
            registry=r,
        )
        self.partition_pending = Gauge(
            "projector_partition_pending",
            "Entries waiting above the watermark, per partition",
            ["partition"],
            registry=r,
        )
        self.partition_owed_rows = Gauge(
            "projector_partition_owed_rows",
            "Rows whose changelog record still owes Cassandra mirror writes, per partition",
            ["partition"],
            registry=r,
        )
        self.last_flush = Gauge(
            "projector_last_flush_timestamp_seconds",
            "Unix time at which the last flush that wrote anything ended (0 before the first)",
            registry=r,
        )
        self.store_write_failures = Counter(
            "projector_store_write_failures",
            "Flush writes (the projection store, then the frames) that failed; the flush stays "
            "queued and is retried with backoff, nothing is lost",
            registry=r,
        )
        self.store_failing = Gauge(
            "projector_store_failing",
            "1 while flush writes fail and flushes are held (retried with backoff), else 0",
            registry=r,
        )
        self.flushes_held = Gauge(
            "projector_flushes_held",
            "User flushes produced and not yet written to the projection store",
            registry=r,
        )
        self.entries_missing = Gauge(
            "projector_entries_missing",
            "Entries of a lane its last watermark marker's count says were sent to this partition "
            "(mailbox_seq <= W) and the partition never received; 0 when the marker carried no "
            "count (docs/contract.md §9). Nothing is held back or invented because of it",
            ["partition", "lane"],
            registry=r,
        )
        self.projection_restores = Counter(
            "projector_projection_restores",
            "Restores (of a partition, or of users a flush found missing) that wrote the projection "
            "again from the worker's state after the projection store lost data",
            registry=r,
        )
        self.restore_checked_users = Counter(
            "projector_projection_restore_checked_users",
            "Users a projection restore compared with the store (version and row count)",
            registry=r,
        )
        self.restored_users = Counter(
            "projector_projection_restored_users",
            "Users a projection restore wrote again whole at their version (with correction frames)",
            registry=r,
        )
        self.restored_rows = Counter(
            "projector_projection_restored_rows", "Rows those restore writes carried", registry=r
        )
        self.restore_reflushed_users = Counter(
            "projector_projection_restore_reflushed_users",
            "Users with work not flushed yet that a projection restore handed whole to their next flush",
            registry=r,
        )
        self._seen = _Seen()
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


# -- API ------------------------------------------------------------------------------------------


class SnapshotSource(Protocol):
    """What the API's metrics read from its snapshot layer (app/api/snapshots.SessionLists)."""

    hits: int
    loads: int
    adoptions: int

    @property
    def evictions(self) -> int: ...


class ApiMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.snapshot_hits = Counter(
            "projector_snapshot_hits", "Pages served from a held snapshot (no load)", registry=r
        )
        self.snapshot_loads = Counter(
            "projector_snapshot_loads", "Snapshots loaded from the projection store", registry=r
        )
        self.snapshot_adoptions = Counter(
            "projector_snapshot_adoptions",
            "Snapshots another API instance built, taken from the fleet's record (a cursor or a new "
            "walk of the live snapshot this process did not hold)",
            registry=r,
        )
        self.snapshot_evictions = Counter(
            "projector_snapshot_evictions", "Snapshots evicted by the LRU row bound", registry=r
        )
        self.page_latency = Histogram(
            "projector_page_latency_seconds",
            "GET /v1/sessions, handler time",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        # route: the served route's path template (never the raw path: ids would make the label
        # set unbounded), "unmatched" for anything the router does not know; method: the served
        # methods, "other" for the rest; code: the status the API answered.
        self.requests = Counter(
            "projector_api_requests",
            "HTTP requests answered, by route template, method and status code",
            ["route", "method", "code"],
            registry=r,
        )
        self.request_duration = Histogram(
            "projector_api_request_duration_seconds",
            "HTTP request time in the API (every route, errors included), by route template and method",
            ["route", "method"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.rate_limited = Counter(
            "projector_api_rate_limited",
            "Requests refused 429 by the fleet's per-user rate limit",
            registry=r,
        )
        self.rate_limit_store_errors = Counter(
            "projector_api_rate_limit_store_errors",
            "Rate checks the projection store could not answer (let through or 503: "
            "PROJECTOR_API_RATE_LIMIT_ON_STORE_ERROR)",
            registry=r,
        )
        self.reconcile_requests = Counter(
            "projector_api_reconcile_requests",
            "Reconcile requests (docs/contract.md §10) by trigger (login: a first page without "
            "cursor, stream: the live stream's hello, request: POST /v1/reconcile) and outcome "
            "(accepted: sent to the owning worker, limited: within the per-user interval, failed: "
            "the store or Kafka failed, unavailable: no request topic)",
            ["trigger", "outcome"],
            registry=r,
        )
        for trigger in ("login", "stream", "request"):
            for outcome in ("accepted", "limited", "failed", "unavailable"):
                self.reconcile_requests.labels(trigger, outcome)
        add_process_metrics(r)
        self._seen = _Seen()

    def sync_reconcile(self, counts: Mapping[tuple[str, str], int]) -> None:
        for (trigger, outcome), total in list(counts.items()):
            delta = self._seen.delta(f"reconcile:{trigger}:{outcome}", total)
            if delta:
                self.reconcile_requests.labels(trigger, outcome).inc(delta)

    def sync_rate(self, limited: int, store_errors: int) -> None:
        self.rate_limited.inc(self._seen.delta("rate_limited", limited))
        self.rate_limit_store_errors.inc(self._seen.delta("rate_store_errors", store_errors))

    def observe_request(self, route: str, method: str, code: int, seconds: float) -> None:
        self.requests.labels(route, method, str(code)).inc()
        self.request_duration.labels(route, method).observe(seconds)

    def sync(self, source: SnapshotSource) -> None:
        self.snapshot_hits.inc(self._seen.delta("hits", source.hits))
        self.snapshot_loads.inc(self._seen.delta("loads", source.loads))
        self.snapshot_evictions.inc(self._seen.delta("evictions", source.evictions))
        self.snapshot_adoptions.inc(self._seen.delta("adoptions", source.adoptions))


# -- operator console -----------------------------------------------------------------------------


class OpsMetrics:
    """The operator console's actions (app/api/ops), registered in the API's own registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.actions = Counter(
            "projector_ops_actions",
            "Operator console actions (reconcile, rebuild a user) by outcome",
            ["action", "outcome"],
            registry=registry,
        )
        self.corrected_rows = Counter(
            "projector_ops_corrected_rows",
            "Rows the operator console's actions rewrote in the projection store",
            ["action"],
            registry=registry,
        )


# -- rebuild --------------------------------------------------------------------------------------


class RebuildMetrics:
    def __init__(self, registry: CollectorRegistry | None = None, namespace: str | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        # Which namespace the rebuild writes: the operator console shows it next to the serving
        # one (an info gauge, always 1; no sample until the namespace is known).
        self.info = Gauge(
            "projector_rebuild_info",
            "The namespace this rebuild writes (value always 1)",
            ["namespace"],
            registry=r,
        )
        if namespace is not None:
            self.info.labels(namespace).set(1)
        self.users_total = Gauge(
            "projector_rebuild_work_items",
            "Work items of the running rebuild (users from state, entries by replay)",
            registry=r,
        )
        self.users_done = Gauge(
            "projector_rebuild_work_done", "Work items the running rebuild has done", registry=r
        )
        self.progress = Gauge(
            "projector_rebuild_progress_ratio", "Share of the running rebuild done (0..1)", registry=r
        )
        # The diff with the serving namespace, once the rebuild has compared: the rows gauge has
        # no sample before (the console tells "not compared yet" from "identical" by it).
        self.diff_rows = Gauge(
            "projector_rebuild_diff_rows",
            "Rows of the rebuilt namespace that differ from the serving one, by kind",
            ["kind"],
            registry=r,
        )
        self.diff_badges = Gauge(
            "projector_rebuild_diff_badges",
            "Users whose rebuilt badge differs from the serving one",
            registry=r,
        )
        add_process_metrics(r)

    def update(self, done: int, total: int) -> None:
        self.users_total.set(total)
        self.users_done.set(done)
        self.progress.set(done / total if total else 1.0)

    def diffed(self, diff: Mapping[str, Any]) -> None:
        """The counts of `Diff.as_dict()` (app/rebuild/diff.py)."""
        for kind in REBUILD_DIFF_KINDS:
            self.diff_rows.labels(kind).set(diff[f"rows_{kind}"])
        self.diff_badges.set(diff["badges_differing"])


def names(text: str) -> set[str]:
    """Metric family names present in an exposition text (for tests and smoke checks)."""
    out: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            name, kind = line.split()[2:4]
            out.add(name + "_total" if kind == "counter" and not name.endswith("_total") else name)
    return out


def sample(text: str, name: str, labels: Iterable[tuple[str, str]] = ()) -> float:
    """One sample's value in an exposition text (0 when absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = dict(labels)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in wanted.items()):
                return float(s.value)
    return 0.0
