"""The worker core as the worker runs it (flushes overlapping the intake, issue 14), killed many
times at random moments, each kill tearing the changelog commits in flight (issue 11's promise:
no SIGKILL, however timed, loses an entry).

What a kill leaves here is what a SIGKILL leaves a worker: the persist's steps acknowledged
before it stay delivered, the step in flight is delivered record by record or not (its records go
to several changelog partitions), nothing after; every task stops at whatever await it was in.
The restarted core reads from where its restored state says (the gate's offset, else the
group's committed offset), as the intake places it; at the end the projection is replay's.
"""

from __future__ import annotations

import asyncio
import contextlib
import random

from hypothesis import given
from hypothesis import strategies as st

from app.stores.memory_tables import MemoryTables
from app.worker.core import WorkerCore
from tests.support.projection_files import as_replay_files
from tests.support.strategies import Stream, scenarios, streams
from tests.support.worker import WHOLE_STREAMS, StreamRig, flush_scheduler


class TearingTables(MemoryTables):
    """A changelog that acknowledges each step of a commit after a few event-loop turns; a
    commit cancelled (the worker killed) during a step delivers a random part of that step."""

    def __init__(self, rnd: random.Random) -> None:
        super().__init__()
        self.rnd = rnd

    async def commit(self) -> None:
        for step in self.take_steps():
            if not step:
                continue
            try:
                for _ in range(self.rnd.randint(0, 3)):
                    await asyncio.sleep(0)
            except asyncio.CancelledError:
                self._write([item for item in step if self.rnd.random() < 0.5])
                raise
            self._write(step)


def overlapping(core: WorkerCore) -> WorkerCore:
    """As the worker runs with PROJECTOR_WORKER_OVERLAP_FLUSHES=true (the default)."""
    core.background_publish = True
    core.commit_outside_state_lock = True
    return core


@WHOLE_STREAMS
@given(
    stream=st.one_of(streams(), streams(scenarios(min_steps=30, max_steps=120))),
    seed=st.integers(0, 2**32 - 1),
    kills=st.integers(1, 6),
    hot_rows=st.sampled_from([500_000, 3]),
)
def test_kills_at_random_moments_with_flushes_overlapping_lose_nothing(
    stream: Stream, seed: int, kills: int, hot_rows: int
) -> None:
    rig = StreamRig(stream, seed, hot_rows)
    rnd, clock = rig.rnd, rig.clock
    rig.tables = TearingTables(rnd)
    recs = rig.records
    committed: list[int] = []  # the group's committed offset (the intake commits durable ones)

    async def life(core: WorkerCore, kill_after: int | None) -> bool:
        """One worker process: restore, read from where the state stands, flush in the
        background; killed after `kill_after` batches (plus some loop turns). True: it read to
        the end of the stream and stopped cleanly."""
        await core.restore_assigned([0])
        if core.expected_offset(0) is None:
            core.start_at(0, committed[-1] if committed else 0)
        stop = asyncio.Event()

        def commit_offsets() -> None:  # the intake's commit timer, now and then
            durable = core.durable_offsets()
            if durable and rnd.random() < 0.5:
                committed.append(durable[0])
                core.offsets_committed(durable)

        async def intake() -> None:
            done = 0
            while kill_after is None or done < kill_after:
                start = core.expected_offset(0)
                assert start is not None
                if start >= len(recs):
                    break
                batch = recs[start : start + rnd.randint(1, 12)]
                await core.on_batch(0, batch, start, batch[-1].offset + 1)
                done += 1
                clock.now += rnd.choice((0, 10, 60, 150))
                for _ in range(rnd.randint(0, 3)):
                    await asyncio.sleep(0)

        tasks = [
            asyncio.create_task(flush_scheduler(core, clock, rnd, stop, commit_offsets)),
            asyncio.create_task(intake()),
        ]
        if kill_after is None:
            await tasks[1]
            stop.set()
            await tasks[0]
            await core.flush_all()
            return True
        await tasks[1]
        for _ in range(rnd.randint(0, 8)):  # the kill lands anywhere in what is in flight
            await asyncio.sleep(0)
        for task in tasks:  # SIGKILL: every task stops where it is
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        return False

    async def run() -> None:
        for _ in range(kills):
            await life(overlapping(rig.new_core()), rnd.randint(0, 15))
        assert await life(overlapping(rig.new_core()), None)

    asyncio.run(run())
    rows, badges = asyncio.run(as_replay_files(rig.projections, [b["user_id"] for b in rig.expected.badges]))
    assert rows == rig.expected.projections
    assert badges == rig.expected.badges
