"""Prometheus metrics, one registry per process (issue 7), each process's declared as data in a
module of its own: the worker (:mod:`app.metrics.worker`), the API and its operator console
(:mod:`app.metrics.api`), the gateway in the API (:mod:`app.metrics.gateway`), the rebuild tool
(:mod:`app.metrics.rebuild`); the process and build-info metrics all of them export
(:mod:`app.metrics.process`). Every metric is named once, in its process's module.

``GET /metrics`` serves the text exposition format (:mod:`app.metrics.exposition`): the API on
its own port (no token, like /openapi.json), the worker on ``WorkerSettings.worker_metrics_port``
(0 = off) with its own small aiohttp server, never faust's web server (which several workers per
host cannot share).
"""

from app.metrics.api import API_METRICS, OPS_METRICS, ApiMetrics, OpsMetrics, SnapshotSource
from app.metrics.exposition import exposition, metrics_handler, names, sample
from app.metrics.process import PROCESS_METRICS, add_process_metrics
from app.metrics.rebuild import REBUILD_DIFF_KINDS, REBUILD_METRICS, RebuildMetrics
from app.metrics.worker import RECONCILE_OUTCOMES, WORKER_METRICS, DurableCounts, WorkerMetrics

__all__ = [
    "API_METRICS",
    "OPS_METRICS",
    "PROCESS_METRICS",
    "REBUILD_DIFF_KINDS",
    "REBUILD_METRICS",
    "RECONCILE_OUTCOMES",
    "WORKER_METRICS",
    "ApiMetrics",
    "DurableCounts",
    "OpsMetrics",
    "RebuildMetrics",
    "SnapshotSource",
    "WorkerMetrics",
    "add_process_metrics",
    "exposition",
    "metrics_handler",
    "names",
    "sample",
]
