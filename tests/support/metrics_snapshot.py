"""What each process's metrics look like to a scraper and to their callers, values left out: the
families of each registry's exposition (name, type, help, the label sets of the samples present)
and the metric objects callers reach by attribute (name, type, help, label names, buckets).

tests/unit/fixtures/metrics_snapshot.json holds it as the code produced it before the metrics
were declared as tables (issue 36); `python -m tests.support.metrics_snapshot` prints it anew.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families

from app.gateway.hub import FrameHub
from app.gateway.kafka_frames import SourceStats
from app.gateway.push import PushStats
from app.gateway.recent_frames import RecentFrames
from app.gateway.service import Gateway
from app.metrics import ApiMetrics, OpsMetrics, RebuildMetrics, WorkerMetrics, exposition
from app.metrics.gateway import register as register_gateway

# Label values that depend on the machine or the build, not on the declarations.
_MACHINE_LABELS = frozenset(
    {"version", "python", "compiled", "implementation", "major", "minor", "patchlevel"}
)


def families(registry: CollectorRegistry) -> list[dict[str, Any]]:
    """The exposition's families: name, type, help, and each sample's name and labels (the
    machine-dependent label values and every sample value left out)."""
    out: list[dict[str, Any]] = []
    for family in text_string_to_metric_families(exposition(registry).decode()):
        samples = sorted(
            {
                (
                    s.name,
                    tuple(sorted((k, "*" if k in _MACHINE_LABELS else v) for k, v in s.labels.items())),
                )
                for s in family.samples
            }
        )
        out.append(
            {
                "name": family.name,
                "type": family.type,
                "help": family.documentation,
                "samples": [[name, [list(pair) for pair in labels]] for name, labels in samples],
            }
        )
    return sorted(out, key=lambda f: str(f["name"]))


def attributes(metrics: object) -> dict[str, dict[str, Any]]:
    """The metric objects reachable as attributes of ``metrics``, by attribute name."""
    out: dict[str, dict[str, Any]] = {}
    for attr in dir(metrics):
        if attr.startswith("__"):
            continue
        value = getattr(metrics, attr)
        if not isinstance(value, MetricWrapperBase):
            continue
        # prometheus_client keeps what a metric was declared with in these (no public reader).
        described: dict[str, Any] = {
            "name": getattr(value, "_name"),  # noqa: B009
            "type": getattr(value, "_type"),  # noqa: B009
            "help": getattr(value, "_documentation"),  # noqa: B009
            "labels": list(getattr(value, "_labelnames")),  # noqa: B009
        }
        if isinstance(value, Histogram):
            described["buckets"] = [str(b) for b in getattr(value, "_upper_bounds")]  # noqa: B009
        out[attr] = described
    return out


def _gateway_registry() -> CollectorRegistry:
    """A gateway with every optional family present: recent frames held, both adapters' counters
    and a stream start of each status."""
    hub = FrameHub(recent=RecentFrames(capacity_bytes=1024))
    for status in ("fresh", "resumed", "repull"):
        hub.counters.starts[status] = 1
    gateway = Gateway(hub, heartbeat_s=1.0)
    gateway.source_stats = SourceStats()
    gateway.push_stats = PushStats()
    registry = CollectorRegistry()
    register_gateway(registry, gateway)
    return registry


def snapshot() -> dict[str, Any]:
    worker = WorkerMetrics()
    api = ApiMetrics()
    ops = OpsMetrics(api.registry)
    rebuild = RebuildMetrics()
    named = RebuildMetrics(namespace="ns-snapshot")
    return {
        "worker": {"families": families(worker.registry), "attributes": attributes(worker)},
        "api": {"families": families(api.registry), "attributes": attributes(api)},
        "ops": {"attributes": attributes(ops)},
        "rebuild": {"families": families(rebuild.registry), "attributes": attributes(rebuild)},
        "rebuild_named": {"families": families(named.registry)},
        "gateway": {"families": families(_gateway_registry())},
    }


if __name__ == "__main__":
    json.dump(snapshot(), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
