"""The mailbox intake's rules between faust's consumer and the worker core: a batch is applied
only for a partition this worker owns, under the current assignment, one batch at a time."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from agents.mailbox import MailboxIntake
from app.worker.batch_intake import RecordBatch
from app.worker.ports import RawRecord


class RecordingCore:
    """Records what the intake asks of the core (the core itself has its own tests)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    async def on_records(self, records: Sequence[RawRecord]) -> None:
        self.calls.append(("records", [r.offset for r in records]))
        await asyncio.sleep(0.01)  # a revocation arriving meanwhile must wait for the batch

    async def restore_assigned(self, partitions: Sequence[int]) -> None:
        self.calls.append(("restore", list(partitions)))

    async def release(self, partitions: Sequence[int]) -> None:
        self.calls.append(("release", list(partitions)))

    def forget(self, partitions: Sequence[int]) -> None:
        self.calls.append(("forget", list(partitions)))

    def durable_offsets(self) -> dict[int, int]:
        return {}


def batch(generation: int, partition: int, *offsets: int) -> RecordBatch:
    return RecordBatch(generation, partition, [RawRecord("t", partition, o, None, b"{}") for o in offsets])


def intake_with(core: RecordingCore, generation: int = 3) -> tuple[MailboxIntake, Any]:
    app = SimpleNamespace(consumer_generation_id=generation)
    return MailboxIntake(app, {"core": core}, "t"), app  # type: ignore[arg-type, dict-item]


def test_batches_of_unassigned_partitions_or_older_generations_are_dropped() -> None:
    core = RecordingCore()
    intake, app = intake_with(core)

    async def run() -> None:
        await intake.process(batch(3, 0, 1))  # before any assignment: not ours
        await intake.assign([0, 1])
        await intake.process(batch(3, 0, 2))
        await intake.process(batch(2, 1, 3))  # fetched under the previous generation
        await intake.process(batch(3, 2, 4))  # partition 2 is another worker's
        app.consumer_generation_id = 4
        await intake.process(batch(3, 1, 5))  # queued before the rebalance to 4

    asyncio.run(run())
    assert core.calls == [("restore", [0, 1]), ("records", [2])]
    assert intake.stale_batches == 4


def test_a_revocation_waits_for_the_batch_in_progress_and_drops_the_queued_ones() -> None:
    core = RecordingCore()
    intake, _ = intake_with(core)

    async def run() -> None:
        await intake.assign([0, 1])
        in_progress = asyncio.create_task(intake.process(batch(3, 0, 7)))
        await asyncio.sleep(0)  # the batch holds the intake now
        await intake.revoke([0])
        await in_progress
        await intake.process(batch(3, 0, 8))  # still queued for partition 0: dropped
        await intake.process(batch(3, 1, 9))  # partition 1 stays ours

    asyncio.run(run())
    assert core.calls == [
        ("restore", [0, 1]),
        ("records", [7]),
        ("release", [0]),
        ("forget", [0]),
        ("records", [9]),
    ]
