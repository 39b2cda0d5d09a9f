"""The Prometheus text of a registry, for tests that read metrics as a scraper does."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from app.metrics import WorkerMetrics


def scrape(metrics: WorkerMetrics, core: object) -> str:
    metrics.sync(core)  # type: ignore[arg-type]
    return metrics_text(metrics.registry)


def metrics_text(registry: CollectorRegistry) -> str:
    from app.metrics import exposition

    return exposition(registry).decode()
