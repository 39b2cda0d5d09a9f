"""The worker core's parts, each on its own rule: the publisher's write grouping, the
checkpointer's checkpoint (read back as written), outbound records owed across a failed send."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import pytest

from app.domain.badge import Badge
from app.domain.flush import UserFlush
from app.stores.memory_messages import InMemoryMessageStore
from app.stores.memory_projection import InMemoryProjectionStore
from app.stores.memory_tables import MemoryTables
from app.worker.checkpointer import read_checkpoint
from app.worker.core import WorkerCore
from app.worker.ports import RawRecord
from app.worker.state import PartitionState
from tests.support.clock import ManualClock
from tests.support.worker import RecordingOutbox, make_core


def _core(outbox: RecordingOutbox | None = None) -> WorkerCore:
    return make_core(
        2,
        MemoryTables(),
        InMemoryMessageStore(),
        InMemoryProjectionStore(),
        outbox or RecordingOutbox(),
        ManualClock(),
    )


def _flush(user_id: int, version: int) -> UserFlush:
    return UserFlush(user_id, [], Badge(), version, version - 1, 1, f"e{version}", version)


def _queued(core: WorkerCore, *flushes: Sequence[int]) -> PartitionState:
    state = core.partition(0)
    state.queue([[_flush(user, 10 + i) for user in users] for i, users in enumerate(flushes)])
    return state


@pytest.mark.parametrize("visible_first", [True, False])
def test_a_write_takes_the_queued_flushes_up_to_a_repeated_user(visible_first: bool) -> None:
    core = _core()
    core.visible_before_durable = visible_first
    state = _queued(core, [1], [2, 3], [4], [2], [5])
    state.durable_flushes = state.queued_flushes  # all covered by a persist
    count, batches = core.publisher.next_write(state)
    assert count == 3
    assert [b.user_id for b in batches] == [1, 2, 3, 4]


def test_durable_before_visible_writes_only_flushes_a_persist_covers() -> None:
    core = _core()
    state = _queued(core, [1], [2], [3])
    state.durable_flushes = 2
    count, batches = core.publisher.next_write(state)
    assert count == 2 and [b.user_id for b in batches] == [1, 2]


def test_visible_before_durable_writes_flushes_no_persist_covers() -> None:
    core = _core()
    core.visible_before_durable = True
    state = _queued(core, [1], [2], [3])
    count, _ = core.publisher.next_write(state)
    assert state.durable_flushes == 0 and count == 3


async def test_the_checkpoint_reads_back_what_a_persist_wrote() -> None:
    tables = MemoryTables()
    core = make_core(
        2, tables, InMemoryMessageStore(), InMemoryProjectionStore(), RecordingOutbox(), ManualClock()
    )
    core.start_at(0, 40)
    state = core.partition(0)
    await core.persist(state)
    checkpoint = read_checkpoint(tables.checkpoint_record(0))
    assert checkpoint.next_offset == 40 and checkpoint.persists == 1
    assert checkpoint.unflushed == [] and checkpoint.owing == []
    assert (
        checkpoint.record is not None
        and msgspec.msgpack.decode(tables.checkpoint_record(0) or b"") == checkpoint.record
    )
    assert state.durable_offset == 40


def test_no_checkpoint_reads_as_a_partition_not_placed() -> None:
    checkpoint = read_checkpoint(None)
    assert checkpoint.record is None and checkpoint.next_offset is None and checkpoint.persists == 0


class _FailingOutbox(RecordingOutbox):
    def __init__(self) -> None:
        super().__init__()
        self.failing = True

    async def dead_letters(self, letters: Sequence[tuple[bytes | None, bytes]]) -> None:
        if self.failing:
            raise ConnectionError("broker away")
        await super().dead_letters(letters)


async def test_dead_letters_whose_send_failed_stay_owed_and_go_before_the_next_persist() -> None:
    outbox = _FailingOutbox()
    core = _core(outbox)
    core.start_at(0, 0)
    await core.on_batch(0, [RawRecord("mailbox-tail", 0, 0, b"k", b"not json")], 0, 1)
    state = core.partition(0)
    assert len(state.owed_dead_letters) == 1 and core.stats.outbound_send_failures == 1
    with pytest.raises(ConnectionError):
        await core.persist(state)
    assert state.durable_offset is None  # never durable past the record whose letter is unsent
    outbox.failing = False
    await core.persist(state)
    assert [letter["offset"] for letter in outbox.letters] == [0]
    assert state.owed_dead_letters == [] and state.durable_offset == 1
