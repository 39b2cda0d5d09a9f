"""A rebalance's completion in the worker (app/runtime/worker.RebalanceCompletion): the current
recovery restores the mailbox partitions assigned as active, the tables hear they were recovered
(their noted holes are read through now), and what the restore read is frozen; a superseded
recovery does none of it."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from faust.types import TP

from app.kafka.batches import BatchSender
from app.runtime.app import new_faust_app
from app.runtime.gc_tuning import GcMonitor, GcPolicy
from app.runtime.worker import RebalanceCompletion
from app.settings import Settings
from tables.state import FaustStateTables, LocalStoreGuard, declare_tables


class RecordingIntake:
    def __init__(self) -> None:
        self.assigned: list[list[int]] = []

    async def assign(self, partitions: Sequence[int]) -> None:
        self.assigned.append(list(partitions))


@pytest.fixture()
def restore_gc() -> Iterator[None]:
    yield
    gc.unfreeze()


def completion(
    tmp_path: Path,
) -> tuple[Any, RecordingIntake, LocalStoreGuard, GcMonitor, RebalanceCompletion]:
    settings = Settings.from_env({"PROJECTOR_DATA_DIR": str(tmp_path), "PROJECTOR_TOPIC_PARTITIONS": "4"})
    app = new_faust_app(settings)
    (tmp_path / settings.app_id).mkdir(parents=True, exist_ok=True)
    guard = LocalStoreGuard()
    tables = FaustStateTables(
        declare_tables(app, settings.topic_partitions, guard), BatchSender(lambda: None)
    )
    app.track_recoveries()
    intake, monitor = RecordingIntake(), GcMonitor()
    topic = settings.topic_mailbox_tail
    actives = {TP(topic, 2), TP(topic, 0), TP(f"{settings.app_id}-rows-changelog", 1), TP("other", 3)}
    app.assignor.assigned_actives = lambda: actives  # type: ignore[method-assign]  # the assignment
    handler = RebalanceCompletion(app, intake, tables, topic, GcPolicy(threshold=0, freeze=True), monitor)
    return app, intake, guard, monitor, handler


def test_the_current_recovery_restores_the_mailbox_partitions_assigned_and_reads_through_holes(
    tmp_path: Path, restore_gc: None
) -> None:
    app, intake, guard, monitor, handler = completion(tmp_path)
    guard.holes[("rows", 0)] = 17  # faust cleared records of partition 0 unapplied
    guard.holes[("rows", 1)] = 5  # a partition not assigned here keeps its hole
    app.consumer_generation_id = 1
    gc.unfreeze()

    restored = asyncio.run(handler())

    assert restored is not None and sorted(restored) == [0, 2]  # neither changelogs nor others
    assert [sorted(p) for p in intake.assigned] == [[0, 2]]
    assert guard.holes == {("rows", 1): 5}
    assert gc.get_freeze_count() > 0 and monitor.installed
    monitor.uninstall()


def test_a_superseded_recovery_restores_nothing(tmp_path: Path, restore_gc: None) -> None:
    app, intake, guard, monitor, handler = completion(tmp_path)
    guard.holes[("rows", 0)] = 17
    app.consumer_generation_id = 1
    app.on_rebalance_start()  # generation 1 revoked: a newer rebalance began
    gc.unfreeze()

    assert asyncio.run(handler()) is None
    assert intake.assigned == []
    assert guard.holes == {("rows", 0): 17}  # its next recovery reads through it
    assert gc.get_freeze_count() == 0 and not monitor.installed
