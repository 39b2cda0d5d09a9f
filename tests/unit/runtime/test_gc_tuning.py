"""GC tuned for a streaming worker (app/runtime/gc_tuning.py): thresholds and freeze from the
settings, and a monitor that times real collections."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from app.runtime.gc_tuning import GcMonitor, GcPolicy
from app.settings import Settings


@pytest.fixture()
def restore_gc() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.set_threshold(*thresholds)
    gc.unfreeze()


def test_the_defaults_raise_the_first_threshold_and_freeze(restore_gc: None) -> None:
    policy = GcPolicy.from_settings(Settings.from_env({}).worker)
    assert policy == GcPolicy(threshold=50_000, freeze=True)
    policy.apply()
    assert gc.get_threshold() == (50_000, 10, 10)
    assert gc.get_freeze_count() > 0  # what start-up allocated is out of the collector's reach


def test_zero_and_false_leave_python_s_collector_as_it_is(restore_gc: None) -> None:
    before = gc.get_threshold()
    policy = GcPolicy.from_settings(
        Settings.from_env(
            {"PROJECTOR_WORKER_GC_THRESHOLD": "0", "PROJECTOR_WORKER_GC_FREEZE": "false"}
        ).worker
    )
    policy.apply()
    policy.settle("assignment")
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_the_monitor_times_collections_by_generation() -> None:
    monitor = GcMonitor()
    monitor.install()
    try:
        gc.collect(0)
        gc.collect(2)
    finally:
        monitor.uninstall()
    summary = monitor.summary()
    assert summary["collections"][0] >= 1 and summary["collections"][2] >= 1
    assert summary["paused_ms_total"] >= 0 and summary["max_pause_ms"] >= 0
    gc.collect()  # uninstalled: no longer counted
    assert monitor.summary()["collections"] == summary["collections"]
