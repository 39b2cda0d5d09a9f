"""The gateway's Prometheus metrics, read from the hub's counters at scrape time (nothing on the
frame path touches a metric object)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

if TYPE_CHECKING:
    from app.gateway.service import Gateway


class GatewayCollector(Collector):
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        hub = self.gateway.hub
        c = hub.counters
        yield GaugeMetricFamily(
            "projector_gateway_connections", "Open /v1/stream connections", hub.connections
        )
        yield GaugeMetricFamily(
            "projector_gateway_users_connected", "Users with an open stream here", len(hub.connected_users())
        )
        yield GaugeMetricFamily(
            "projector_gateway_resume_logs", "Users whose recent frames are held for resume", hub.logs_held
        )
        yield CounterMetricFamily(
            "projector_gateway_frames",
            "Frames of connected or resumable users taken from the topics",
            c.frames,
        )
        yield CounterMetricFamily(
            "projector_gateway_frames_malformed", "Frames dropped as malformed", c.malformed
        )
        yield CounterMetricFamily(
            "projector_gateway_events_delivered", "Frame events queued on connections", c.delivered
        )
        yield CounterMetricFamily(
            "projector_gateway_slow_closes", "Connections closed with repull: buffer overflow", c.overflows
        )
        yield CounterMetricFamily("projector_gateway_heartbeats", "Heartbeat events sent", c.heartbeats)
        starts = CounterMetricFamily(
            "projector_gateway_stream_starts", "Streams started, by hello status", labels=["status"]
        )
        for status, count in sorted(c.starts.items()):
            starts.add_metric([status], count)
        yield starts
        yield CounterMetricFamily(
            "projector_gateway_frames_replayed", "Frames replayed on resume", c.replayed
        )
        yield CounterMetricFamily(
            "projector_gateway_resume_logs_seeded",
            "User logs started from the frames held for users streaming elsewhere",
            c.seeded,
        )
        if hub.recent is not None:
            yield GaugeMetricFamily(
                "projector_gateway_recent_frames_bytes",
                "Bytes of frames held for users without a stream here",
                hub.recent.size,
            )
            yield GaugeMetricFamily(
                "projector_gateway_recent_frames_users",
                "Users whose frames are held though they have no stream here",
                hub.recent.users,
            )
        yield CounterMetricFamily(
            "projector_gateway_presence_failures",
            "Presence writes that failed (Redis)",
            self.gateway.presence_failures,
        )

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
