"""The fast lane in the worker (docs/contract.md §10): the settings reach the core through
WorkerConfig.from_settings, and on the wall clock a direct message is written and its frames
sent with the batch that applied it, while a group message waits for the window's end."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from app.domain.flush import UserFlush
from app.settings import ProcessingSettings, Settings, WorkerSettings
from app.stores.memory_messages import InMemoryMessageStore
from app.stores.memory_projection import InMemoryProjectionStore
from app.stores.memory_tables import MemoryTables
from app.worker.core import WorkerConfig, WorkerCore
from tests.support.builders import CONV_A, CONV_B, StreamBuilder
from tests.support.clock import ManualClock
from tests.support.worker import RecordingOutbox, message_store_for, records

DM, GROUP = CONV_A, CONV_B
WINDOW_MS = 5000


def deltas(outbox: RecordingOutbox) -> list[tuple[int, int]]:
    return [
        (f["user_id"], f["projection_mailbox_seq"]) for f in outbox.frames_out if f["type"] == "SESSION_DELTA"
    ]


def run(per_user_per_s: int) -> list[list[tuple[int, int]]]:
    """What the outbox holds after each step: the batch, just before the window's end, after it."""
    settings = Settings.build(
        projection_compaction_window_ms=WINDOW_MS, fast_lane_per_user_per_s=per_user_per_s
    )
    s = StreamBuilder()
    s.message(2, 1, conv=GROUP, member_count=40)  # user 2: a group, waits for the window
    s.message(1, 1, conv=DM, member_count=2)  # user 1: a direct message, at once
    lines = s.close()
    clock = ManualClock()
    outbox = RecordingOutbox()
    store: InMemoryMessageStore = message_store_for(lines, 1)
    core = WorkerCore(
        WorkerConfig.from_settings(settings.processing, settings.worker),
        message_store=store,
        projection_store=InMemoryProjectionStore(),
        tables=MemoryTables(),
        outbox=outbox,
        clock=clock,
    )
    seen = []

    async def go() -> None:
        await core.on_records(records(lines))
        seen.append(deltas(outbox))
        clock.now += WINDOW_MS - 1
        await core.flush_due(clock.now)
        seen.append(deltas(outbox))
        clock.now += 1
        await core.flush_due(clock.now)
        seen.append(deltas(outbox))

    asyncio.run(go())
    return seen


def test_a_direct_message_is_sent_with_its_batch_and_a_group_message_at_the_window_end() -> None:
    at_batch, before_end, at_end = run(per_user_per_s=5)
    assert at_batch == [(1, 2)]
    assert before_end == [(1, 2)]
    assert at_end == [(1, 2), (2, 1)]


def test_with_the_fast_lane_off_both_wait_for_the_window() -> None:
    at_batch, before_end, at_end = run(per_user_per_s=0)
    assert at_batch == before_end == []
    assert at_end == [(1, 2), (2, 1)]


class CountingStore(InMemoryProjectionStore):
    """The projection store, recording the users of each write call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[list[int]] = []

    async def write(self, batches: Sequence[UserFlush]) -> list[int | None]:
        self.calls.append([batch.user_id for batch in batches])
        return await super().write(batches)


def test_the_fast_flushes_of_a_batch_go_to_the_store_in_one_write_until_a_user_repeats() -> None:
    """Four direct messages in one batch are four fast flushes (users 1, 2, 3, then 1 again):
    users 1-3 go in one store write, the second flush of user 1 starts the next one, and every
    user's frames still come in version order."""
    s = StreamBuilder()
    firsts = [s.message(user, 1, conv=DM, member_count=2) for user in (1, 2, 3)]
    again = s.message(1, 2, conv=DM, member_count=2)
    lines = s.close()
    store = CountingStore()
    outbox = RecordingOutbox()
    settings = Settings.build(projection_compaction_window_ms=WINDOW_MS)
    core = WorkerCore(
        WorkerConfig.from_settings(settings.processing, settings.worker),
        message_store=message_store_for(lines, 1),
        projection_store=store,
        tables=MemoryTables(),
        outbox=outbox,
        clock=ManualClock(),
    )
    asyncio.run(core.on_records(records(lines)))
    assert store.calls == [[1, 2, 3], [1]]
    assert deltas(outbox) == [(1, firsts[0]), (2, firsts[1]), (3, firsts[2]), (1, again)]
    assert core.stats.flushes == 4  # queued flushes published, however many writes carried them


@pytest.mark.parametrize(("visible_first", "persists_at_batch"), [(True, 0), (False, 1)])
def test_visible_before_durable_a_direct_message_is_written_before_its_persist(
    visible_first: bool, persists_at_batch: int
) -> None:
    """PROJECTOR_WORKER_VISIBLE_BEFORE_DURABLE (the worker's default): the direct message's flush
    reaches the store and the frames with its batch and no persist precedes it; the partition is
    persisted at the window's end. Durable before visible (false): the flush waits for a persist."""
    s = StreamBuilder()
    s.message(1, 1, conv=DM, member_count=2)
    lines = s.close()
    clock = ManualClock()
    outbox = RecordingOutbox()
    core = WorkerCore(
        WorkerConfig.from_settings(
            ProcessingSettings(projection_compaction_window_ms=WINDOW_MS), WorkerSettings()
        ),
        message_store=message_store_for(lines, 1),
        projection_store=InMemoryProjectionStore(),
        tables=MemoryTables(),
        outbox=outbox,
        clock=clock,
    )
    core.visible_before_durable = visible_first

    async def go() -> tuple[int, int, int]:
        await core.on_records(records(lines))
        at_batch = core.partition(0).persists
        clock.now += WINDOW_MS
        await core.flush_due(clock.now)
        return at_batch, core.partition(0).persists, len(deltas(outbox))

    at_batch, at_window, frames = asyncio.run(go())
    assert (at_batch, frames) == (persists_at_batch, 1)
    assert at_window >= 1  # durable within the window either way
