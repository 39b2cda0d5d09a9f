"""The Cassandra mirror pump (app/worker/mirror.py) on its own, with the writer's test double
(tests/support/mirror_writer.py): what it owes is always retried until written, whoever ran the
round that failed, and a failed round is retried after its backoff, not at once."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import cast

import msgspec

from app.domain.processor import StateChange
from app.domain.projector import ProjectorConfig
from app.stores.memory_tables import MemoryTables
from app.worker.core import WorkerConfig
from app.worker.mirror import MirrorPump
from tests.support.builders import CONV_A, CONV_B
from tests.support.clock import ManualClock
from tests.support.mirror_writer import MirrorCassandra, MirrorWriter
from tests.support.worker import core_with_writer, pin_batch


@dataclass
class Stats:
    state_writes: int = 0
    state_write_failures: int = 0
    state_unmirrorable: int = 0
    state_restaged_rows: int = 0


def change(user_id: int, conversation_id: str, seq: int, read: int) -> StateChange:
    return StateChange(user_id, conversation_id, {"read_seq": read}, seq, seq, False)


async def until(condition: object, budget_s: float = 20.0) -> None:
    """Wait for `condition()` (a callable) on the loop, with a generous budget."""
    assert callable(condition)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + budget_s
    while not condition():
        assert loop.time() < deadline, "condition not met within the budget"
        await asyncio.sleep(0.005)


def test_a_failed_drain_round_is_retried_by_the_pump_without_a_new_stage() -> None:
    """A drain (a member notice, the backlog bound) runs a round outside the pump's task; when it
    fails, what it held is staged again and must be written once Cassandra is back, even if
    nothing else is ever staged (the end of a stream). The pump's task, started by the stage just
    before, found nothing staged (the drain had taken it) and ended: the retry was never run."""
    cassandra = MirrorCassandra()
    writer = MirrorWriter(cassandra)
    stats = Stats()
    pump = MirrorPump(writer, stats, spacing_s=0.0, retry_max_s=0.05)

    async def run() -> None:
        writer.down = True
        pump.stage([change(7, CONV_A, 1, 3)])  # starts the pump's task (it has not run yet)
        assert not await pump.drain()  # the notice's drain: its round fails
        writer.down = False
        # Nothing else is staged: the pump alone must write what the failed round held.
        await until(lambda: (7, CONV_A) in cassandra.state)
        assert cassandra.state[(7, CONV_A)]["read_conversation_seq"] == 3
        assert pump.owed() == {}
        await pump.close()

    asyncio.run(run())
    assert stats.state_write_failures >= 1


def test_a_failed_round_is_retried_after_its_backoff_and_the_newest_values_win() -> None:
    cassandra = MirrorCassandra()
    writer = MirrorWriter(cassandra)
    stats = Stats()
    pump = MirrorPump(writer, stats, spacing_s=0.0, retry_max_s=0.05)

    async def run() -> None:
        writer.down = True
        pump.stage([change(7, CONV_A, 1, 1), change(8, CONV_B, 2, 1)])
        await until(lambda: stats.state_write_failures >= 2)  # retried while down
        pump.stage([change(7, CONV_A, 3, 2)])  # newer, staged over the failed share
        writer.down = False
        await until(lambda: pump.owed() == {})
        assert cassandra.state[(7, CONV_A)]["read_conversation_seq"] == 2
        assert cassandra.state[(8, CONV_B)]["read_conversation_seq"] == 1
        await pump.close()

    asyncio.run(run())


def test_once_the_mirror_caught_up_the_changelog_and_the_gauge_stop_saying_owed() -> None:
    """A persist while Cassandra fails records the rows' owed writes (and the partition counts
    them: `projector_partition_owed_rows`). Once the mirror wrote them, a partition that gets no
    more entries (the stream ended) must not keep saying so: the gauge stayed at its last value
    for good, and a restart restaged writes already made."""
    cassandra = MirrorCassandra()
    writer = MirrorWriter(cassandra)
    tables, clock = MemoryTables(), ManualClock()
    config = WorkerConfig(
        lanes=1,
        projector=ProjectorConfig(window_ms=100, max_dirty_rows=100_000, unread_precise_limit=200),
        mirror_spacing_ms=0,
    )
    core = core_with_writer(config, tables, writer, clock=clock)
    assert core.mirror is not None
    core.mirror.retry_max_s = 0.05

    async def run() -> None:
        writer.down = True
        await core.on_records(pin_batch(0))
        await core.flush_partition(core.partition(0))
        state = core.partition(0)
        while state.unpersisted_since is not None:  # every change persisted: the state is at rest
            clock.now += 1_000
            await core.flush_due(clock.now)
        assert state.owing == {(7, CONV_A)}  # persisted while Cassandra was down
        writer.down = False
        await until(lambda: (7, CONV_A) in cassandra.state)
        clock.now += 1_000  # windows pass; no entry arrives any more
        await core.flush_due(clock.now)
        assert core.partition(0).owing == set()
        assert core.mirror is not None
        await core.mirror.close()

    asyncio.run(run())
    checkpoint_record = msgspec.msgpack.decode(cast(bytes, tables.checkpoint_record(0)))
    assert checkpoint_record["owing"] == []
    # A restart finds nothing to restage.
    rewriter = MirrorWriter(cassandra)
    restarted = core_with_writer(config, tables, rewriter)
    asyncio.run(restarted.restore_assigned([0]))
    assert restarted.stats.state_restaged_rows == 0 and rewriter.owed() == {}
