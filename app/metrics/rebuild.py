"""The rebuild tool's metrics (app/cli/rebuild.py): its progress and, once compared, its diff with
the serving namespace, on ``GET /metrics`` while the rebuild runs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from prometheus_client import CollectorRegistry, Gauge

from app.metrics.declare import MetricSpec
from app.metrics.process import ProcessMetrics

# The row counts of a rebuild's diff with the serving namespace (`RebuildMetrics.diffed`).
REBUILD_DIFF_KINDS: Final = ("added", "removed", "changed")


class RebuildMetrics(ProcessMetrics):
    """The rebuild tool's registry: one row per metric (attribute = metric)."""

    # Which namespace the rebuild writes: the operator console shows it next to the serving one (an
    # info gauge, always 1; no sample until the namespace is known).
    info = MetricSpec(
        Gauge, "projector_rebuild_info", "The namespace this rebuild writes (value always 1)", ("namespace",)
    )
    users_total = MetricSpec(
        Gauge,
        "projector_rebuild_work_items",
        "Work items of the running rebuild (users from state, entries by replay)",
    )
    users_done = MetricSpec(Gauge, "projector_rebuild_work_done", "Work items the running rebuild has done")
    progress = MetricSpec(
        Gauge, "projector_rebuild_progress_ratio", "Share of the running rebuild done (0..1)"
    )
    # The diff with the serving namespace, once the rebuild has compared: the rows gauge has no
    # sample before (the console tells "not compared yet" from "identical" by it).
    diff_rows = MetricSpec(
        Gauge,
        "projector_rebuild_diff_rows",
        "Rows of the rebuilt namespace that differ from the serving one, by kind",
        ("kind",),
    )
    diff_badges = MetricSpec(
        Gauge, "projector_rebuild_diff_badges", "Users whose rebuilt badge differs from the serving one"
    )

    def __init__(self, registry: CollectorRegistry | None = None, namespace: str | None = None) -> None:
        super().__init__(registry)
        if namespace is not None:
            self.info.labels(namespace).set(1)

    def update(self, done: int, total: int) -> None:
        self.users_total.set(total)
        self.users_done.set(done)
        self.progress.set(done / total if total else 1.0)

    def diffed(self, diff: Mapping[str, Any]) -> None:
        """The counts of `Diff.as_dict()` (app/rebuild/diff.py)."""
        for kind in REBUILD_DIFF_KINDS:
            self.diff_rows.labels(kind).set(diff[f"rows_{kind}"])
        self.diff_badges.set(diff["badges_differing"])


# Exposition names, in the order declared.
REBUILD_METRICS: Final = RebuildMetrics.exposed_names()
