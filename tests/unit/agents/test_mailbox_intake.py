"""The mailbox intake between faust's consumer and the worker core: a batch is applied only for a
partition this worker owns, under the current assignment, one batch at a time — and the log is
applied without a hole, whatever happens to a batch on its way (issue 11)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents.batch_intake import BatchChannel, ProjectorApp, RecordBatch
from agents.mailbox import MailboxIntake
from app.replay import ReplayOptions, run_replay
from app.stores.memory_projection import InMemoryProjectionStore
from app.stores.memory_tables import MemoryTables
from app.worker.core import WorkerCore
from app.worker.offsets import Admission, Verdict, admit
from app.worker.ports import RawRecord
from tests.support.builders import StreamBuilder
from tests.support.clock import ManualClock
from tests.support.projection_files import as_replay_files
from tests.support.strategies import Stream, scenarios, streams
from tests.support.worker import RecordingOutbox, make_core, message_store_for

# -- the offset rule, alone --------------------------------------------------------------------


def test_a_batch_is_applied_only_where_it_continues_the_state() -> None:
    assert admit(10, [10, 11, 12], 10, 13) == Admission(Verdict.APPLY, 0, 13)
    # begins below: the head was applied before (a re-read after a seek back)
    assert admit(11, [9, 10, 11, 12], 9, 13) == Admission(Verdict.APPLY, 2, 13)
    assert admit(20, [9, 10, 11], 9, 12).verdict is Verdict.ALREADY_APPLIED
    # begins above: a gap, never applied
    assert admit(10, [14, 15], 14, 16).verdict is Verdict.GAP
    assert admit(10, [14, 15], None, 16).verdict is Verdict.GAP
    # the consumer asked for 10 and the broker answered from 14 (transaction marker, compaction):
    # a hole of the log, not a loss
    assert admit(10, [14, 15], 10, 16) == Admission(Verdict.APPLY, 0, 16)
    # a fetch that only moved the position past offsets without a record
    assert admit(10, [], 10, 12) == Admission(Verdict.APPLY, 0, 12)
    assert admit(10, [], 11, 12).verdict is Verdict.GAP
    # not placed yet (a file, a plain consumer from its start)
    assert admit(None, [3, 4], None, 5) == Admission(Verdict.APPLY, 0, 5)


# -- ownership ------------------------------------------------------------------------------------


class RecordingCore:
    """Records what the intake asks of the core (the core itself has its own tests)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.stats = SimpleNamespace(intake_gaps_refused=0)
        self.partitions: dict[int, Any] = {}

    async def on_batch(
        self, partition: int, records: Sequence[RawRecord], fetch_from: int | None, fetch_to: int
    ) -> Admission:
        self.calls.append(("records", [r.offset for r in records]))
        await asyncio.sleep(0.01)  # a revocation arriving meanwhile must wait for the batch
        return Admission(Verdict.APPLY, 0, fetch_to)

    def expected_offset(self, partition: int) -> int | None:
        return None

    async def restore_assigned(self, partitions: Sequence[int]) -> None:
        self.calls.append(("restore", list(partitions)))
        self.partitions.update(dict.fromkeys(partitions))

    async def release(self, partitions: Sequence[int]) -> None:
        self.calls.append(("release", list(partitions)))

    def forget(self, partitions: Sequence[int]) -> None:
        self.calls.append(("forget", list(partitions)))
        for partition in partitions:
            self.partitions.pop(partition, None)

    def drop(self, partitions: Sequence[int]) -> None:
        self.calls.append(("drop", list(partitions)))
        for partition in partitions:
            self.partitions.pop(partition, None)

    def durable_offsets(self) -> dict[int, int]:
        return {}


def batch(generation: int, partition: int, *offsets: int) -> RecordBatch:
    recs = [RawRecord("t", partition, o, None, b"{}") for o in offsets]
    return RecordBatch(generation, partition, recs, offsets[0], offsets[-1] + 1)


def intake_with(core: Any, generation: int = 3) -> tuple[MailboxIntake, Any]:
    app = SimpleNamespace(consumer_generation_id=generation, consumer=None)
    return MailboxIntake(app, core, "t"), app  # type: ignore[arg-type]


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


def test_a_revocation_that_waited_for_an_assignment_leaves_none_of_its_partitions_assigned() -> None:
    """The assignment of a recovery completing late (it held the intake while a newer
    rebalance's revocation waited) names the revoked partitions again: once the revocation has
    released them, none of them is the intake's, and a later assignment drops without a persist
    any the core still holds that it does not name."""
    core = RecordingCore()
    intake, _ = intake_with(core)

    async def run() -> None:
        await intake.lock.acquire()  # a batch in progress
        late_assignment = asyncio.create_task(intake.assign([0, 1]))
        await asyncio.sleep(0)
        revocation = asyncio.create_task(intake.revoke([0, 1]))
        await asyncio.sleep(0)
        intake.lock.release()
        await late_assignment
        await revocation
        assert intake.assigned == set()
        await intake.process(batch(3, 0, 5))  # not ours: dropped
        core.partitions[2] = None  # held, never handed over (no revocation named it)
        await intake.assign([1])

    asyncio.run(run())
    assert core.calls == [
        ("restore", [0, 1]),
        ("release", [0, 1]),
        ("forget", [0, 1]),
        ("drop", [2]),
        ("restore", [1]),
    ]
    assert intake.stale_batches == 1


class PausingConsumer:
    """faust's pause/resume of partitions, recorded."""

    def __init__(self) -> None:
        self.paused: set[Any] = set()
        self.calls: list[str] = []

    def pause_partitions(self, tps: Any) -> None:
        self.paused |= set(tps)
        self.calls.append("pause")

    def resume_partitions(self, tps: Any) -> None:
        self.paused -= set(tps)
        self.calls.append("resume")


def test_the_intake_holds_its_partitions_while_the_store_fails_and_not_during_a_recovery() -> None:
    """While flushes are held, the owned partitions are paused at every tick (a rebalance's
    recovery resumes every partition: the next tick pauses the new ones again); they resume once,
    when the store writes again, and not while a rebalance is under way (its recovery resumes
    them itself)."""
    intake, app = intake_with(RecordingCore())
    consumer = PausingConsumer()
    app.consumer = consumer
    app.rebalancing = False

    async def run() -> None:
        await intake.assign([0, 1])
        intake.hold(False)
        assert consumer.calls == []  # nothing held: the consumer is not even asked
        intake.hold(True)
        intake.hold(True)
        assert {tp.partition for tp in consumer.paused} == {0, 1} and intake.held
        await intake.assign([1, 2])  # a rebalance during the outage
        consumer.paused.clear()  # faust's recovery resumed everything
        intake.hold(True)
        assert {tp.partition for tp in consumer.paused} == {1, 2}
        app.rebalancing = True
        intake.hold(False)
        assert intake.held and consumer.paused  # the recovery will resume them
        app.rebalancing = False
        intake.hold(False)
        intake.hold(False)
        assert not intake.held and not consumer.paused
        assert consumer.calls == ["pause", "pause", "pause", "resume"]

    asyncio.run(run())


# -- no hole, ever --------------------------------------------------------------------------------


class Log:
    """One mailbox-tail partition as a consumer sees it: records at offsets, and offsets that hold
    no record for a consumer (transaction markers, compacted records)."""

    def __init__(self, lines: Sequence[bytes], rnd: random.Random, holes: float = 0.0) -> None:
        self.at: dict[int, RawRecord] = {}
        offset = 0
        for raw in lines:
            while rnd.random() < holes:
                offset += 1  # an offset without a record
            self.at[offset] = RawRecord("mailbox-tail", 0, offset, b"k", raw)
            offset += 1
        self.end = offset + (1 if rnd.random() < holes else 0)


class Consumer:
    """aiokafka as the intake sees it: a position, fetches that return the records from the
    position on (moving it past offsets without a record), faust's seek to the committed offset
    after a rebalance, commits, and what the intake asks for through `place`."""

    def __init__(self, log: Log, rnd: random.Random) -> None:
        self.log = log
        self.rnd = rnd
        self.position = 0
        self.committed: int | None = None
        self.flow_active = True
        self.places: list[dict[int, int | None]] = []
        self.fetch_size: int | None = None  # records per fetch; None: 1..9 at random

    def fetch(self) -> RecordBatch | None:
        start = self.position
        size = self.fetch_size or self.rnd.randint(1, 9)
        records: list[RawRecord] = []
        offset = start
        while offset < self.log.end and len(records) < size:
            if offset in self.log.at:
                records.append(self.log.at[offset])
            offset += 1
        if offset == start:
            return None
        self.position = offset
        return RecordBatch(1, 0, records, start, offset)

    async def _commit_offsets(self, offsets: Mapping[Any, int]) -> bool:
        for offset in offsets.values():
            self.committed = offset
        return True

    async def place(self, topic: str, offsets: Mapping[int, int | None]) -> dict[int, int]:
        self.places.append(dict(offsets))
        placed = {p: (o if o is not None else (self.committed or 0)) for p, o in offsets.items()}
        self.position = placed[0]
        return placed


def expected_for(lines: list[bytes], lanes: int) -> tuple[list[Any], list[Any]]:
    result = run_replay(lines, ReplayOptions(lanes=lanes))
    # lists: run_replay without a state folder keeps its outputs in memory
    return cast(list[Any], result.projections), cast(list[Any], result.badges)


async def final(projections: InMemoryProjectionStore, lines: list[bytes], lanes: int) -> Any:
    users = [b["user_id"] for b in expected_for(lines, lanes)[1]]
    return await as_replay_files(projections, users)


class World:
    """One worker (core + intake + the agent's channel) over one partition, its tables and stores
    surviving a SIGKILL as on a real host."""

    def __init__(self, lines: list[bytes], lanes: int, log: Log, rnd: random.Random) -> None:
        self.lines, self.lanes, self.rnd = lines, lanes, rnd
        self.store = message_store_for(lines, lanes)
        self.tables, self.projections, self.outbox, self.clock = (
            MemoryTables(),
            InMemoryProjectionStore(),
            RecordingOutbox(),
            ManualClock(),
        )
        self.consumer = Consumer(log, rnd)
        self.faust_app = ProjectorApp("intake-test", broker="kafka://127.0.0.1:1", store="memory://")
        self.start()

    def start(self) -> None:
        """A worker process starts: a new core over the surviving tables and stores."""
        self.core: WorkerCore = make_core(
            self.lanes, self.tables, self.store, self.projections, self.outbox, self.clock, window_ms=50
        )
        app = SimpleNamespace(consumer_generation_id=1, consumer=self.consumer)
        self.intake = MailboxIntake(
            app,  # type: ignore[arg-type]
            self.core,
            "mailbox-tail",
            clock=lambda: self.clock.now / 1000,
        )
        self.intake.channel = BatchChannel(self.faust_app, maxsize=4)
        self.agent = self.intake.channel.__aiter__()
        self.faust_app.flow_control.resume()

    async def assigned(self) -> None:
        """faust's order after a rebalance: on_rebalance_complete (the intake restores), then
        its seek to the committed offsets, which the consumer follows with the placements."""
        await self.intake.assign([0])
        self.consumer.position = self.consumer.committed or 0
        wanted = self.intake.placements([0])
        self.intake.placed(await self.consumer.place("mailbox-tail", wanted))

    async def deliver(self, got: RecordBatch) -> None:
        """The consumer's hand-off; like the real channel's, it waits while the agent is busy."""
        while self.agent.queue.full():
            await self.agent_step()
        await self.intake.deliver(got)

    async def agent_step(self) -> bool:
        queue = self.agent.queue
        if queue.empty():
            return False
        event = await queue.get()
        await self.intake.process(event.value)
        return True

    async def tick(self) -> None:
        self.clock.now += self.rnd.choice((0, 20, 60))
        await self.core.flush_due(self.clock.now)
        await self.intake.check_fetched()
        await self.intake.commit()


def simple_lines() -> list[bytes]:
    s = StreamBuilder()
    for seq in range(1, 41):
        s.message(7 + seq % 3, seq)
    return s.close()


def test_a_batch_queued_for_the_agent_survives_fausts_flow_control_resume() -> None:
    """The cause of issue 11's loss: faust empties its channels on every flow_control.resume(),
    which it calls after the seek that ends a rebalance's recovery. A batch fetched between that
    seek and the resume vanished while the consumer's position was past it; the next batch was
    applied and committed. The intake's channel keeps it."""

    async def run() -> None:
        app = ProjectorApp("resume-test", broker="kafka://127.0.0.1:1", store="memory://")
        channel = BatchChannel(app, maxsize=4)
        agent = channel.__aiter__()
        app.flow_control.resume()  # recovery resumes the flow (changelog reading)...
        await channel.send(value=batch(1, 0, 0, 1, 2))  # ...a fetch is routed to the agent...
        app.flow_control.resume()  # ...and on_recovery_completed resumes it again after its seek
        assert agent.queue.qsize() == 1
        assert (await agent.queue.get()).value.records[0].offset == 0

    asyncio.run(run())


def test_the_recovery_resume_between_two_batches_loses_nothing() -> None:
    """The scenario of issue 11 end to end through the intake: the first batch after the
    restore is in the channel when faust resumes the flow after its seek; the next batch follows.
    Everything is applied in order, without a refusal."""
    lines = simple_lines()
    rnd = random.Random(1)
    world = World(lines, 1, Log(lines, rnd), rnd)

    async def run() -> None:
        await world.assigned()
        first = world.consumer.fetch()
        assert first is not None
        await world.deliver(first)
        world.faust_app.flow_control.resume()  # faust: after its seek to the committed offsets
        while (rest := world.consumer.fetch()) is not None:
            await world.deliver(rest)
            while await world.agent_step():
                pass
        await world.core.flush_all()

    asyncio.run(run())
    assert asyncio.run(final(world.projections, lines, 1)) == expected_for(lines, 1)
    assert world.core.stats.intake_gaps_refused == 0


@pytest.mark.parametrize("lost", ["first", "middle", "last", "vanished"])
def test_a_batch_lost_on_its_way_is_never_skipped(lost: str) -> None:
    """Whatever loses a batch between the consumer and the core (a cleared queue, an abandoned
    hand-off, a bug not found yet): the next batch does not continue the state and is refused,
    the consumer is put back, and the lost records are applied. A lost LAST batch (no next one
    to refuse) is noticed by the intake's check on what was fetched."""
    lines = simple_lines()
    rnd = random.Random(2)
    world = World(lines, 1, Log(lines, rnd), rnd)
    world.consumer.fetch_size = 4
    lose_at = {"first": 1, "middle": 5, "last": -1, "vanished": -1}[lost]

    async def run() -> None:
        await world.assigned()
        fetches = 0
        dropped = False
        for _ in range(100):
            for _ in range(2):  # two fetches before the agent runs: the next one is queued
                got = world.consumer.fetch()
                if got is None:
                    continue
                fetches += 1
                at_end = world.consumer.position >= world.consumer.log.end
                if not dropped and (fetches == lose_at or (lose_at < 0 and at_end)):
                    dropped = True  # fetched, never delivered (the consumer may or may not know)
                    if lost == "last":
                        world.intake.fetched(0, got.fetch_to)  # the drain dropped it, knowingly
                    elif lost == "vanished":
                        await world.deliver(got)  # counted on its way, then the queue is emptied
                        world.agent.queue.clear()
                else:
                    await world.deliver(got)
            while await world.agent_step():
                pass
            await world.tick()
            world.clock.now += 1000  # a second between the worker's checks
        await world.core.flush_all()
        assert dropped

    asyncio.run(run())
    assert asyncio.run(final(world.projections, lines, 1)) == expected_for(lines, 1)
    assert world.core.stats.intake_gaps_refused >= 1
    # the consumer was put back where the state stood (beyond the assignment's placement)
    assert len(world.consumer.places) >= 2


@given(
    stream=st.one_of(streams(), streams(scenarios(min_steps=30, max_steps=100))),
    seed=st.integers(0, 2**32 - 1),
    holes=st.sampled_from([0.0, 0.0, 0.15]),
)
def test_no_entry_is_lost_whatever_happens_between_the_consumer_and_the_core(
    stream: Stream, seed: int, holes: float
) -> None:
    """A lossy, duplicating, re-seeking road from the log to the core, and SIGKILLs: fetches are
    dropped, delivered twice, or cleared from the channel; faust seeks back to the committed
    offset; the worker is killed (memory gone, tables kept) and restarted; the log has offsets
    without records. At the end, the projection is replay's of the whole stream."""
    lines = [line for line in stream.lines() if line.strip()]
    rnd = random.Random(seed)
    log = Log(lines, rnd, holes)
    world = World(lines, stream.lanes, log, rnd)

    async def run() -> None:
        await world.assigned()
        for _ in range(60 + 8 * len(lines)):
            roll = rnd.random()
            if roll < 0.02:  # SIGKILL and restart: a new core over the surviving tables
                world.start()
                await world.assigned()
                continue
            if roll < 0.05:  # a rebalance: revoked (persisted, committed), assigned again
                await world.intake.revoke([0])
                await world.assigned()
                continue
            if roll < 0.08:  # faust's resume clears a channel it manages (ours is not one)
                world.faust_app.flow_control.resume()
            got = world.consumer.fetch()
            if got is not None:
                fate = rnd.random()
                if fate < 0.05:
                    world.intake.fetched(0, got.fetch_to)  # dropped where the consumer sees it
                elif fate < 0.1:
                    pass  # lost where nobody sees it
                elif fate < 0.15:
                    await world.deliver(got)
                    await world.deliver(got)  # delivered twice
                else:
                    await world.deliver(got)
            for _ in range(rnd.randint(0, 3)):
                await world.agent_step()
            await world.tick()
        # Traffic ends: the worker runs on until it has caught up.
        for _ in range(500):
            while await world.agent_step():
                pass
            await world.tick()
            got = world.consumer.fetch()
            if got is not None:
                await world.deliver(got)
            elif world.core.expected_offset(0) == log.end and world.agent.queue.empty():
                break
        await world.core.flush_all()

    asyncio.run(run())
    assert asyncio.run(final(world.projections, lines, stream.lanes)) == expected_for(lines, stream.lanes)
