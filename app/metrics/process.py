"""What every process (worker, API, rebuild) exports besides its own metrics: the client library's
process and Python collectors, and which build runs."""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, Gauge, GCCollector, PlatformCollector, ProcessCollector

from app.build import build_info
from app.metrics.declare import MetricSet

PROCESS_METRICS: Final = (
    "projector_build_info",
    "process_cpu_seconds_total",
    "process_resident_memory_bytes",
    "process_start_time_seconds",
    "process_open_fds",
    "python_info",
    "python_gc_collections_total",
)


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


class ProcessMetrics(MetricSet):
    """A process's metric set in a registry of the process's own (a new one unless given), with
    the process metrics next to it."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        super().__init__(registry if registry is not None else CollectorRegistry())
        add_process_metrics(self.registry)
