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

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Protocol

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest

if TYPE_CHECKING:
    from app.worker.core import WorkerCore

PREFIX: Final = "projector_"

# Exposition names (counters get ``_total`` appended by the client library on exposition).
WORKER_METRICS: Final = (
    "projector_entries_in_total",
    "projector_entries_applied_total",
    "projector_entries_duplicate_total",
    "projector_entries_dead_lettered_total",
    "projector_entries_pending",
    "projector_watermark_lag",
    "projector_flushes_total",
    "projector_projection_writes_total",
    "projector_compression_ratio",
    "projector_flush_latency_seconds",
    "projector_frames_emitted_total",
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
)
API_METRICS: Final = (
    "projector_snapshot_hits_total",
    "projector_snapshot_loads_total",
    "projector_snapshot_evictions_total",
    "projector_page_latency_seconds",
)
REBUILD_METRICS: Final = (
    "projector_rebuild_work_items",
    "projector_rebuild_work_done",
    "projector_rebuild_progress_ratio",
)

_LATENCY_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


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
        self._seen = _Seen()
        self._lag_partitions: set[int] = set()

    def observe_flush(self, seconds: float) -> None:
        self.flush_latency.observe(seconds)

    def sync(self, core: WorkerCore) -> None:
        """Pull the core's totals and gauges into the metrics (cheap: a few dict reads)."""
        stats = core.stats
        seen = self._seen
        self.entries_in.inc(seen.delta("entries", stats.entries))
        self.entries_applied.inc(seen.delta("applied", stats.applied))
        self.entries_duplicate.inc(seen.delta("duplicates", stats.duplicates))
        self.entries_dead_lettered.inc(seen.delta("dead_letters", stats.dead_letters))
        self.flushes.inc(seen.delta("flushes", stats.flushes))
        self.projection_writes.inc(seen.delta("projection_writes", stats.projection_writes))
        self.frames_emitted.inc(seen.delta("frames", stats.frames))
        self.unread_audited_rows.inc(seen.delta("audited_rows", stats.audited_rows))
        self.unread_drift_corrected_rows.inc(seen.delta("audit_corrected_rows", stats.audit_corrected_rows))
        self.unread_drift_ratio.set(stats.audit_drift_ratio)
        self.state_writes.inc(seen.delta("state_writes", stats.state_writes))
        self.state_write_failures.inc(seen.delta("state_write_failures", stats.state_write_failures))
        self.state_owed_rows.inc(seen.delta("state_owed_rows", stats.state_owed_rows))
        self.state_restaged_rows.inc(seen.delta("state_restaged_rows", stats.state_restaged_rows))
        self.intake_gaps_refused.inc(seen.delta("intake_gaps_refused", stats.intake_gaps_refused))
        self.intake_records_skipped.inc(seen.delta("intake_records_skipped", stats.intake_records_skipped))
        self.intake_hole_offsets.inc(seen.delta("intake_hole_offsets", stats.intake_hole_offsets))
        if stats.projection_writes:
            self.compression_ratio.set(stats.applied / stats.projection_writes)
        pending = 0
        current: set[int] = set()
        for partition, state in list(core.partitions.items()):
            pending += state.gate.pending_count
            self.watermark_lag.labels(str(partition)).set(max(0, state.max_seen_seq - state.gate.hi))
            current.add(partition)
        for gone in self._lag_partitions - current:  # revoked: another worker reports it now
            self.watermark_lag.remove(str(gone))
        self._lag_partitions = current
        self.entries_pending.set(pending)


# -- API ------------------------------------------------------------------------------------------


class SnapshotSource(Protocol):
    """What the API's metrics read from its snapshot layer (app/api/snapshots.SessionLists)."""

    hits: int
    loads: int

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
        self.snapshot_evictions = Counter(
            "projector_snapshot_evictions", "Snapshots evicted by the LRU row bound", registry=r
        )
        self.page_latency = Histogram(
            "projector_page_latency_seconds",
            "GET /v1/sessions, handler time",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self._seen = _Seen()

    def sync(self, source: SnapshotSource) -> None:
        self.snapshot_hits.inc(self._seen.delta("hits", source.hits))
        self.snapshot_loads.inc(self._seen.delta("loads", source.loads))
        self.snapshot_evictions.inc(self._seen.delta("evictions", source.evictions))


# -- rebuild --------------------------------------------------------------------------------------


class RebuildMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
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

    def update(self, done: int, total: int) -> None:
        self.users_total.set(total)
        self.users_done.set(done)
        self.progress.set(done / total if total else 1.0)


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
