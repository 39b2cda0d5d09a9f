"""Metrics declared as data (app/metrics/declare.py, app/metrics/gateway.py): the rows of a set
become metrics of its registry under their attribute names, their label sets made at start are
exported at 0, each instance has metrics of its own, and a gateway family a scrape cannot read is
not exported."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from app.gateway.hub import FrameHub
from app.gateway.service import Gateway
from app.metrics import WorkerMetrics, exposition, names, sample
from app.metrics.declare import MetricSet, MetricSpec, each_label
from app.metrics.gateway import register


class Example(MetricSet):
    jobs = MetricSpec(
        Counter, "example_jobs", "Jobs done, by colour", ("colour",), each_label(("red", "blue"))
    )
    depth = MetricSpec(Gauge, "example_depth", "Queue depth")
    took = MetricSpec(Histogram, "example_took_seconds", "One job", buckets=(0.5, 1.0))


def test_rows_become_the_metrics_of_the_registry_under_their_attribute_names() -> None:
    example = Example(CollectorRegistry())
    example.jobs.labels("red").inc(2)
    example.depth.set(7)
    example.took.observe(0.7)
    text = exposition(example.registry).decode()
    exported = {name for name in names(text) if not name.endswith("_created")}  # the library's own
    assert exported == {"example_jobs_total", "example_depth", "example_took_seconds"}
    assert set(Example.exposed_names()) == exported
    assert list(Example.declared()) == ["jobs", "depth", "took"]
    assert sample(text, "example_jobs_total", [("colour", "red")]) == 2
    assert sample(text, "example_depth") == 7
    assert sample(text, "example_took_seconds_bucket", [("le", "0.5")]) == 0
    assert sample(text, "example_took_seconds_bucket", [("le", "1.0")]) == 1


def test_label_sets_made_at_start_are_exported_at_zero() -> None:
    text = exposition(Example(CollectorRegistry()).registry).decode()
    assert 'example_jobs_total{colour="red"} 0.0' in text
    assert 'example_jobs_total{colour="blue"} 0.0' in text


def test_each_instance_has_metrics_of_its_own() -> None:
    first, second = WorkerMetrics(), WorkerMetrics()
    first.entries_in.inc(3)
    assert first.entries_in is not second.entries_in
    assert sample(exposition(second.registry).decode(), "projector_entries_in_total") == 0
    # On the class, the attribute is the row.
    assert WorkerMetrics.entries_in.name == "projector_entries_in"


def test_a_row_read_before_its_set_is_built_says_so() -> None:
    class Unbuilt(MetricSet):
        depth = MetricSpec(Gauge, "unbuilt_depth", "Never built")

        def __init__(self) -> None:  # skips MetricSet.__init__
            pass

    with pytest.raises(AttributeError, match="unbuilt_depth"):
        _ = Unbuilt().depth


def test_the_gateway_exports_no_recent_frames_family_without_recent_frames() -> None:
    hub = FrameHub()  # no RecentFrames
    hub.counters.frames = 5
    registry = CollectorRegistry()
    register(registry, Gateway(hub, heartbeat_s=1.0))
    text = exposition(registry).decode()
    assert sample(text, "projector_gateway_frames_total") == 5
    assert "projector_gateway_connections" in names(text)
    assert not {n for n in names(text) if n.startswith("projector_gateway_recent_frames")}
