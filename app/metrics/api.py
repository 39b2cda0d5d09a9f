"""The API's metrics (issue 7), and the operator console's in the same registry when it is served.
The snapshot counters are read from its ``SessionLists`` and ``SnapshotCache`` (:meth:`ApiMetrics.sync`);
the request counters and latencies are observed per request. Served on the API's ``GET /metrics``
(no token, like /openapi.json)."""

from __future__ import annotations

from collections.abc import Mapping
from itertools import product
from typing import Final, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram

from app.metrics.declare import MetricSet, MetricSpec, TotalsSeen
from app.metrics.process import ProcessMetrics

# The labels of projector_api_reconcile_requests_total (docs/contract.md §10).
RECONCILE_TRIGGERS: Final = ("login", "stream", "request", "epoch")
RECONCILE_REQUEST_OUTCOMES: Final = ("accepted", "limited", "failed", "unavailable")


class SnapshotSource(Protocol):
    """What the API's metrics read from its snapshot layer (app/api/snapshots.SessionLists)."""

    hits: int
    loads: int
    adoptions: int

    @property
    def evictions(self) -> int: ...


class ApiMetrics(ProcessMetrics):
    """The API's registry: one row per metric (attribute = metric)."""

    snapshot_hits = MetricSpec(
        Counter, "projector_snapshot_hits", "Pages served from a held snapshot (no load)"
    )
    snapshot_loads = MetricSpec(
        Counter, "projector_snapshot_loads", "Snapshots loaded from the projection store"
    )
    snapshot_adoptions = MetricSpec(
        Counter,
        "projector_snapshot_adoptions",
        "Snapshots another API instance built, taken from the fleet's record (a cursor or a new walk of the "
        "live snapshot this process did not hold)",
    )
    snapshot_evictions = MetricSpec(
        Counter, "projector_snapshot_evictions", "Snapshots evicted by the LRU row bound"
    )
    page_latency = MetricSpec(Histogram, "projector_page_latency_seconds", "GET /v1/sessions, handler time")
    # route: the served route's path template (never the raw path: ids would make the label set
    # unbounded), "unmatched" for anything the router does not know; method: the served methods,
    # "other" for the rest; code: the status the API answered.
    requests = MetricSpec(
        Counter,
        "projector_api_requests",
        "HTTP requests answered, by route template, method and status code",
        ("route", "method", "code"),
    )
    request_duration = MetricSpec(
        Histogram,
        "projector_api_request_duration_seconds",
        "HTTP request time in the API (every route, errors included), by route template and method",
        ("route", "method"),
    )
    rate_limited = MetricSpec(
        Counter, "projector_api_rate_limited", "Requests refused 429 by the fleet's per-user rate limit"
    )
    rate_limit_store_errors = MetricSpec(
        Counter,
        "projector_api_rate_limit_store_errors",
        "Rate checks the projection store could not answer (let through or 503: "
        "PROJECTOR_API_RATE_LIMIT_ON_STORE_ERROR)",
    )
    reconcile_requests = MetricSpec(
        Counter,
        "projector_api_reconcile_requests",
        "Reconcile requests (docs/contract.md §10) by trigger (login: a first page without cursor, stream: "
        "the live stream's hello, request: POST /v1/reconcile) and outcome (accepted: sent to the owning "
        "worker, limited: within the per-user interval, failed: the store or Kafka failed, unavailable: no "
        "request topic)",
        ("trigger", "outcome"),
        made_at_start=tuple(product(RECONCILE_TRIGGERS, RECONCILE_REQUEST_OUTCOMES)),
    )

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        super().__init__(registry)
        self._seen = TotalsSeen()

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


class OpsMetrics(MetricSet):
    """The operator console's actions (app/api/ops), registered in the API's own registry."""

    actions = MetricSpec(
        Counter,
        "projector_ops_actions",
        "Operator console actions (reconcile, rebuild a user) by outcome",
        ("action", "outcome"),
    )
    corrected_rows = MetricSpec(
        Counter,
        "projector_ops_corrected_rows",
        "Rows the operator console's actions rewrote in the projection store",
        ("action",),
    )


# Exposition names, in the order declared.
API_METRICS: Final = ApiMetrics.exposed_names()
OPS_METRICS: Final = OpsMetrics.exposed_names()
