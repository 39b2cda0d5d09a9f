"""The gateway's metrics (the API's ``/v1/stream``, in the API's registry): read from the hub's and
the adapters' counters at scrape time, so nothing on the frame path touches a metric object."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

if TYPE_CHECKING:
    from app.gateway.service import Gateway


@dataclass(frozen=True, slots=True)
class PulledSpec:
    """One gateway metric without labels: its kind, name (a counter's without ``_total``), help
    text and how a scrape reads it; ``read`` answers None where the family is not exported."""

    kind: type[CounterMetricFamily] | type[GaugeMetricFamily]
    name: str
    help: str
    read: Callable[[Gateway], float | None]


GATEWAY_METRICS: Final[tuple[PulledSpec, ...]] = (
    PulledSpec(
        GaugeMetricFamily,
        "projector_gateway_connections",
        "Open /v1/stream connections",
        lambda g: g.hub.connections,
    ),
    PulledSpec(
        GaugeMetricFamily,
        "projector_gateway_users_connected",
        "Users with an open stream here",
        lambda g: len(g.hub.connected_users()),
    ),
    PulledSpec(
        GaugeMetricFamily,
        "projector_gateway_resume_logs",
        "Users whose recent frames are held for resume",
        lambda g: g.hub.logs_held,
    ),
    PulledSpec(
        CounterMetricFamily,
        "projector_gateway_frames",
        "Frames of connected or resumable users taken from the topics",
        lambda g: g.hub.counters.frames,
    ),
    PulledSpec(
        CounterMetricFamily,
        "projector_gateway_frames_malformed",
        "Frames dropped as malformed",
        lambda g: g.hub.counters.malformed,
    ),
    PulledSpec(
        CounterMetricFamily,
        "projector_gateway_events_delivered",
        "Frame events queued on connections",
        lambda g: g.hub.counters.delivered,
    ),
    PulledSpec(
        CounterMetricFamily,
        "projector_gateway_slow_closes",
        "Connections closed with repull: buffer overflow",
        lambda g: g.hub.counters.overflows,
    ),
    PulledSpec(
        CounterMetricFamily,
        "projector_gateway_heartbeats",
        "Heartbeat events sent",
        lambda g: g.hub.counters.heartbeats,
    ),
    PulledSpec(
        CounterMetricFamily,
        "projector_gateway_frames_replayed",
        "Frames replayed on resume",
        lambda g: g.hub.counters.replayed,
    ),
    PulledSpec(
        CounterMetricFamily,
        "projector_gateway_resume_logs_seeded",
        "User logs started from the frames held for users streaming elsewhere",
        lambda g: g.hub.counters.seeded,
    ),
    PulledSpec(
        GaugeMetricFamily,
        "projector_gateway_recent_frames_bytes",
        "Bytes of frames held for users without a stream here",
        lambda g: None if g.hub.recent is None else g.hub.recent.size,
    ),
    PulledSpec(
        GaugeMetricFamily,
        "projector_gateway_recent_frames_users",
        "Users whose frames are held though they have no stream here",
        lambda g: None if g.hub.recent is None else g.hub.recent.users,
    ),
    PulledSpec(
        CounterMetricFamily,
        "projector_gateway_presence_failures",
        "Presence writes that failed (Redis)",
        lambda g: g.presence_failures,
    ),
)


class GatewayCollector(Collector):
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        for spec in GATEWAY_METRICS:
            value = spec.read(self.gateway)
            if value is not None:
                yield spec.kind(spec.name, spec.help, value)
        starts = CounterMetricFamily(
            "projector_gateway_stream_starts", "Streams started, by hello status", labels=["status"]
        )
        for status, count in sorted(self.gateway.hub.counters.starts.items()):
            starts.add_metric([status], count)
        yield starts
        # The adapters started next to the gateway: one counter per int field of their stats.
        for prefix, stats, what in (
            ("projector_gateway_topic_", self.gateway.source_stats, "frame topics"),
            ("projector_push_", self.gateway.push_stats, "offline badge pushes"),
        ):
            if stats is None or not dataclasses.is_dataclass(stats) or isinstance(stats, type):
                continue
            for name, value in dataclasses.asdict(stats).items():
                if isinstance(value, int):
                    yield CounterMetricFamily(prefix + name, f"{what}: {name.replace('_', ' ')}", value)


def register(registry: CollectorRegistry, gateway: Gateway) -> None:
    registry.register(GatewayCollector(gateway))
