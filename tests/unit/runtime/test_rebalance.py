"""A rebalance's completion in the worker (app/runtime/worker.RebalanceCompletion): the mailbox
partitions assigned as active are restored by the intake (claimed: tables/durable), a partition
whose checkpoint mailbox-tail's log start has passed is a retention overrun, the standby copies
follow every other partition, what the restore read is frozen; a checkpoint of another input
ends the worker with one line and exit code 3."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from faust.types import TP

from app.runtime.app import new_faust_app
from app.runtime.gc_tuning import GcMonitor, GcPolicy
from app.runtime.worker import INPUT_MISMATCH_EXIT, RebalanceCompletion
from app.settings import Settings
from tables.durable.identity import InputMismatch


class RecordingIntake:
    def __init__(self, fail: Exception | None = None) -> None:
        self.assigned: list[list[int]] = []
        self.fail = fail

    async def assign(self, partitions: Sequence[int]) -> None:
        if self.fail is not None:
            raise self.fail
        self.assigned.append(list(partitions))


class PlacedPartitions:
    def __init__(self, offsets: dict[int, int | None]) -> None:
        self.offsets = offsets
        self.overruns: list[tuple[int, int]] = []
        self.handled: list[tuple[int, int]] = []  # (partition, the checkpoint's next offset)

    def expected_offset(self, partition: int) -> int | None:
        return self.offsets.get(partition)

    def retention_overrun(self, partition: int, log_start: int) -> None:
        self.overruns.append((partition, log_start))


class Standbys:
    def __init__(self) -> None:
        self.kept: list[list[int]] = []

    def keep_standbys(self, partitions: Collection[int]) -> None:
        self.kept.append(sorted(partitions))


@pytest.fixture()
def restore_gc() -> Iterator[None]:
    yield
    gc.unfreeze()


def completion(
    tmp_path: Path, intake: RecordingIntake, replicas: int = 1
) -> tuple[PlacedPartitions, Standbys, GcMonitor, RebalanceCompletion, list[int]]:
    settings = Settings.from_env(
        {
            "PROJECTOR_DATA_DIR": str(tmp_path),
            "PROJECTOR_TOPIC_PARTITIONS": "4",
            "PROJECTOR_TABLE_STANDBY_REPLICAS": str(replicas),
        }
    )
    app: Any = new_faust_app(settings.kafka, settings.topics, settings.worker)
    topic = settings.topics.topic_mailbox_tail
    actives = {TP(topic, 2), TP(topic, 0), TP("other", 3)}
    app.assignor.assigned_actives = lambda: actives  # the assignment
    core = PlacedPartitions({0: 40, 2: None})
    standbys, monitor = Standbys(), GcMonitor()
    exits: list[int] = []

    async def log_start(partition: int) -> int:
        return {0: 55, 2: 0}[partition]

    async def on_overrun(partition: int, checkpoint_next: int) -> None:
        # After the core's own handling (the projection epoch, the reconciles: app/worker/retention.py).
        assert core.overruns[-1][0] == partition
        core.handled.append((partition, checkpoint_next))

    handler = RebalanceCompletion(
        app,
        intake,
        core,
        standbys,
        log_start,
        settings.topics,
        GcPolicy(threshold=0, freeze=True),
        monitor,
        on_overrun,
        exit_process=exits.append,
    )
    return core, standbys, monitor, handler, exits


def test_the_mailbox_partitions_assigned_are_restored_and_the_others_kept_as_standbys(
    tmp_path: Path, restore_gc: None
) -> None:
    intake = RecordingIntake()
    core, standbys, monitor, handler, exits = completion(tmp_path, intake)
    gc.unfreeze()

    restored = asyncio.run(handler())

    assert restored == [0, 2]  # not another topic's partitions
    assert intake.assigned == [[0, 2]]
    # Partition 0's checkpoint needs offset 40, mailbox-tail starts at 55: entries deleted unread.
    assert core.overruns == [(0, 55)]
    assert core.handled == [(0, 40)]  # with the offset the checkpoint needed
    assert standbys.kept == [[1, 3]]
    assert exits == []
    assert gc.get_freeze_count() > 0 and monitor.installed
    monitor.uninstall()


def test_no_standby_copies_with_zero_replicas(tmp_path: Path, restore_gc: None) -> None:
    _, standbys, monitor, handler, _ = completion(tmp_path, RecordingIntake(), replicas=0)
    asyncio.run(handler())
    assert standbys.kept == [[]]
    monitor.uninstall()


def test_a_checkpoint_of_another_input_ends_the_worker(tmp_path: Path, restore_gc: None) -> None:
    mismatch = InputMismatch("partition 0: checkpoint 3.1 is of another input: cluster id 'a' != 'b'")
    core, standbys, _, handler, exits = completion(tmp_path, RecordingIntake(fail=mismatch))
    assert asyncio.run(handler()) == []
    assert exits == [INPUT_MISMATCH_EXIT]
    assert core.overruns == [] and standbys.kept == []
