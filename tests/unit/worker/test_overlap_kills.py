"""The worker core as the worker runs it (flushes overlapping the intake, issue 14), on its real
state tables (tables/durable: RocksDB stores, checkpointed persists), killed many times at random
moments, each kill tearing the changelog append in flight (issue 11's promise: no SIGKILL, however
timed, loses an entry; issue 31: a torn persist is discarded by its missing checkpoint).

What a kill leaves here is what a SIGKILL leaves a worker: the append in flight has any prefix of
its records in the changelog, every task stops at whatever await it was in, and the data dir is
kept or lost. The restarted core claims the partition and reads from where its checkpoint says
(else the log start), as the intake places it; at the end the projection is replay's.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from app.worker.core import WorkerCore
from tables.durable.changelog import Appended, InMemoryChangelog
from tables.durable.records import WireRecord
from tables.durable.tables import CheckpointedTables
from tests.support.durable import IDENTITY
from tests.support.projection_files import as_replay_files
from tests.support.strategies import Stream, scenarios, streams
from tests.support.worker import WHOLE_STREAMS, StreamRig, flush_scheduler


class TearingChangelog(InMemoryChangelog):
    """Acknowledges an append after a few event-loop turns; an append cancelled meanwhile (the
    worker killed) leaves a random prefix of its records in the log."""

    def __init__(self, rnd: random.Random) -> None:
        super().__init__()
        self.rnd = rnd

    async def append(self, partition: int, records: Sequence[WireRecord]) -> Appended:
        try:
            for _ in range(self.rnd.randint(0, 3)):
                await asyncio.sleep(0)
        except asyncio.CancelledError:
            landed = self.rnd.randint(0, len(records))
            if landed:
                await super().append(partition, records[:landed])
            raise
        return await super().append(partition, records)


async def _identity() -> object:
    return IDENTITY


async def _log_start(partition: int) -> int:
    return 0


def durable_tables(folder: Path, changelog: TearingChangelog) -> CheckpointedTables:
    return CheckpointedTables(folder, changelog, _identity, _log_start)  # type: ignore[arg-type]


def overlapping(core: WorkerCore, visible_before_durable: bool) -> WorkerCore:
    """As the worker runs with PROJECTOR_WORKER_OVERLAP_FLUSHES=true (the default), flushes
    visible before durable (PROJECTOR_WORKER_VISIBLE_BEFORE_DURABLE, the default) or not."""
    core.background_publish = True
    core.commit_outside_state_lock = True
    core.visible_before_durable = visible_before_durable
    return core


@WHOLE_STREAMS
@given(
    stream=st.one_of(streams(), streams(scenarios(min_steps=30, max_steps=120))),
    seed=st.integers(0, 2**32 - 1),
    kills=st.integers(1, 6),
    hot_rows=st.sampled_from([500_000, 3]),
    visible_before_durable=st.booleans(),
)
def test_kills_at_random_moments_with_flushes_overlapping_lose_nothing(
    stream: Stream, seed: int, kills: int, hot_rows: int, visible_before_durable: bool
) -> None:
    rig = StreamRig(stream, seed, hot_rows)
    rnd, clock = rig.rnd, rig.clock
    changelog = TearingChangelog(rnd)
    recs = rig.records
    scratch = tempfile.TemporaryDirectory()
    data_dirs = [Path(scratch.name) / "data-0"]

    async def life(core: WorkerCore, kill_after: int | None) -> bool:
        """One worker process: restore, read from where the state stands, flush in the
        background; killed after `kill_after` batches (plus some loop turns). True: it read to
        the end of the stream and stopped cleanly."""
        await core.restore_assigned([0])
        if core.expected_offset(0) is None:
            core.start_at(0, 0)  # no checkpoint: the log start
        stop = asyncio.Event()

        def commit_offsets() -> None:  # the intake's commit timer (lag monitoring only)
            durable = core.durable_offsets()
            if durable and rnd.random() < 0.5:
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

    tables: list[CheckpointedTables] = []

    def restarted() -> WorkerCore:
        """A new process: the data dir as the last one left it, or lost."""
        if rnd.random() < 0.3:
            data_dirs.append(Path(scratch.name) / f"data-{len(data_dirs)}")
        tables.append(durable_tables(data_dirs[-1], changelog))
        rig.tables = tables[-1]  # type: ignore[assignment]  # the StateTables port, not MemoryTables
        return overlapping(rig.new_core(), visible_before_durable)

    async def run() -> None:
        for _ in range(kills):
            core = restarted()
            await life(core, rnd.randint(0, 15))
            tables[-1].close()  # the killed process's files are closed
        assert await life(restarted(), None)
        tables[-1].close()

    with scratch:
        asyncio.run(run())
    rows, badges = asyncio.run(as_replay_files(rig.projections, [b["user_id"] for b in rig.expected.badges]))
    assert rows == rig.expected.projections
    assert badges == rig.expected.badges
    assert_frames_fold_to(rig.outbox.frames_out, rig.expected.projections)


def assert_frames_fold_to(frames: list[dict[str, Any]], expected: list[dict[str, Any]]) -> None:
    """A client that applies every SESSION_DELTA newer than what it holds (rows are absolute,
    docs/contract.md §4) ends with replay's rows — for every user whose frames form one chain
    (each frame's prev is the version of the one before it). A kill between a store write and
    its frames breaks the chain: that client sees the gap and re-pulls, so it is not judged
    here. A frame written before its persist (visible before durable) must not be contradicted
    by what the restarted worker writes after it."""
    held: dict[int, dict[str, dict[str, Any]]] = {}
    version: dict[int, int] = {}
    broken: set[int] = set()
    for frame in frames:
        if frame["type"] != "SESSION_DELTA":
            continue
        user = frame["user_id"]
        current = version.get(user, 0)
        if frame["prev_projection_mailbox_seq"] != current:
            broken.add(user)
        if frame["projection_mailbox_seq"] <= current:
            continue
        version[user] = frame["projection_mailbox_seq"]
        rows = held.setdefault(user, {})
        for row in frame["conversations"]:
            rows[row["conversation_id"]] = row
    judged = [user for user in held if user not in broken]
    for user in judged:
        want = {row["conversation_id"]: row for row in expected if row["user_id"] == user}
        assert held[user] == want, f"user {user}: folded frames differ from replay"
