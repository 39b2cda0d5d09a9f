"""The mailbox-tail agent: one fetch batch at a time into the worker core (no business branching);
a refused batch or a lost fetch is read again (docs/decisions/0007-no-batch-vanishes.md)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import faust
from faust.types import TP

from agents.batch_intake import BatchChannel, ProjectorApp, RecordBatch, commit_offsets
from app.worker.core import WorkerCore
from app.worker.offsets import Verdict

log = logging.getLogger("projector.worker")

# A state not moving this long with a fetch ahead of it and batches on their way: taken for lost.
STALLED_S = 15.0

# Batches waiting for the agent: fetching overlaps processing, a rebalance leaves little queued.
CHANNEL_BATCHES = 4


class MailboxIntake:
    """One batch at a time, stale ones dropped, offsets committed once in a checkpoint."""

    def __init__(
        self,
        app: faust.App,
        core: WorkerCore,
        topic: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.app = app
        self.clock = clock
        self.core = core
        self.topic = topic
        self.channel: Any = None  # set by register_agent
        # Held per batch; a revocation waits (docs/decisions/0018-hand-over-on-revocation.md).
        self.lock = asyncio.Lock()
        # Commits run on their own timer, never inside a batch (a commit waits for a fetch).
        self.commit_lock = asyncio.Lock()
        # Owned partitions: set when a rebalance completes, cleared as soon as a revocation starts.
        self.assigned: set[int] = set()
        self.stale_batches = 0
        # Per partition: last fetch end, batches on their way, (state offset, since) when behind.
        self.fetched_to: dict[int, int] = {}
        self.in_flight: dict[int, int] = {}
        self.behind: dict[int, tuple[int, float]] = {}
        self.seeks = 0
        # Rebalances completed (0: not in the group yet, for readiness); `held`: fetching paused.
        self.assignments = 0
        self.held = False

    # -- BatchSink: the consumer's side ----------------------------------------------------------

    def fetched(self, partition: int, fetch_to: int) -> None:
        self.fetched_to[partition] = fetch_to

    async def deliver(self, batch: RecordBatch) -> None:
        partition = batch.partition
        # Before any await: the check never sees the fetch without the batch on its way.
        self.fetched_to[partition] = batch.fetch_to
        self.in_flight[partition] = self.in_flight.get(partition, 0) + 1
        try:
            await self.channel.send(value=batch)
        except BaseException:  # abandoned (a rebalance stopped the flow): never queued
            self.in_flight[partition] -= 1
            raise

    def placements(self, partitions: Iterable[int]) -> dict[int, int | None]:
        """Where each owned partition is read from (None: no checkpoint, the log start)."""
        return {p: self.core.expected_offset(p) for p in sorted(self.assigned.intersection(partitions))}

    def placed(self, offsets: Mapping[int, int]) -> None:
        for partition, offset in offsets.items():
            if partition in self.assigned:
                self.core.start_at(partition, offset)
                self.fetched_to[partition] = offset

    # -- the agent's side -------------------------------------------------------------------------

    async def process(self, batch: RecordBatch) -> None:
        try:
            async with self.lock:
                stale = batch.generation != self.app.consumer_generation_id
                if stale or batch.partition not in self.assigned:
                    # An older assignment's batch, or one queued before a revocation: not ours.
                    self.stale_batches += 1
                    return
                admission = await self.core.on_batch(
                    batch.partition, batch.records, batch.fetch_from, batch.fetch_to
                )
                if admission.verdict is Verdict.GAP:
                    await self._read_again(batch.partition)
        finally:
            self.in_flight[batch.partition] = self.in_flight.get(batch.partition, 1) - 1

    async def _read_again(self, partition: int) -> None:
        """Put the consumer back where the partition's state stands in the log."""
        offset = self.core.expected_offset(partition)
        if offset is None:
            return
        self.seeks += 1
        consumer: Any = self.app.consumer  # agents.batch_intake.BatchIntakeConsumer
        self.placed(await consumer.place(self.topic, {partition: offset}))

    async def check_fetched(self) -> None:
        """A fetch ahead of the state with nothing on its way (or stalled STALLED_S) is read again."""
        if not getattr(self.app.consumer, "flow_active", False):
            return  # a rebalance is under way: its seek places every partition again
        async with self.lock:
            now = self.clock()
            for partition in sorted(self.assigned):
                fetched_to = self.fetched_to.get(partition)
                expected = self.core.expected_offset(partition)
                if fetched_to is None or expected is None or fetched_to <= expected:
                    self.behind.pop(partition, None)
                    continue
                since = self.behind.get(partition)
                if since is None or since[0] != expected:
                    self.behind[partition] = since = (expected, now)
                in_flight = self.in_flight.get(partition, 0)
                if in_flight > 0 and now - since[1] < STALLED_S:
                    continue
                self.in_flight[partition] = 0  # what it counted never arrives now
                self.behind.pop(partition, None)
                self.core.stats.intake_gaps_refused += 1
                log.warning(
                    "partition %d: fetched up to offset %d but the state stands at %d and nothing "
                    "is on its way: reading again from there",
                    partition,
                    fetched_to,
                    expected,
                )
                await self._read_again(partition)

    async def assign(self, partitions: Sequence[int]) -> None:
        """A rebalance completed: these partitions are ours, restored now."""
        async with self.lock:
            self.assigned = set(partitions)
            for partition in partitions:
                self.fetched_to.pop(partition, None)
            # Held but not named: another worker writes it now, so dropped without a persist.
            stale = sorted(set(self.core.partitions) - self.assigned)
            if stale:
                log.warning("partitions %s held but not assigned: dropped without a persist", stale)
                self.core.drop(stale)
            await self.core.restore_assigned(sorted(partitions))
            self.assignments += 1

    def hold(self, held: bool) -> None:
        """Pause fetching while `held` (docs/decisions/0012-store-outage-holds-flushes.md)."""
        if not held and not self.held:
            return
        consumer: Any = self.app.consumer
        owned = {TP(self.topic, partition) for partition in self.assigned}
        if held:
            if owned:
                consumer.pause_partitions(owned)
            if not self.held:
                log.info(
                    "intake paused (flushes held while the projection store fails): partitions %s",
                    sorted(self.assigned),
                )
            self.held = True
        elif self.held and not self.app.rebalancing:  # a recovery resumes them itself
            consumer.resume_partitions(owned)
            self.held = False
            log.info("intake resumed: partitions %s", sorted(self.assigned))

    async def revoke(self, partitions: Sequence[int]) -> None:
        """Persisted once, committed, released (docs/decisions/0018-hand-over-on-revocation.md)."""
        self.assigned.difference_update(partitions)  # batches still queued for them are dropped
        async with self.lock:
            # Again: an assignment that held the lock meanwhile may have named them.
            self.assigned.difference_update(partitions)
            await self.core.release(partitions)
            await self.commit()
            self.core.forget(partitions)
        if partitions:
            # The other end of "restored partition N" (crash runs check no two owners overlap).
            log.info("released partitions %s: persisted, offsets committed", sorted(partitions))

    async def stop(self) -> None:
        """A clean stop: the batch in progress finished, everything flushed and committed."""
        async with self.lock:
            await self.core.flush_all()
            await self.commit()

    async def commit(self) -> None:
        """Commit the offsets the core reports durable; serialized, so they only move forward."""
        async with self.commit_lock:
            offsets = self.core.durable_offsets()
            if not offsets:
                return
            try:
                if await commit_offsets(self.app, offsets, self.topic):
                    self.core.offsets_committed(offsets)
            except Exception as exc:  # a failed commit only means re-reading (duplicates dropped)
                log.warning("offset commit failed (entries will be read again): %s", exc)


def register_agent(app: ProjectorApp, topic: Any, intake: MailboxIntake) -> Any:
    batches = BatchChannel(app, maxsize=CHANNEL_BATCHES)
    intake.channel = batches
    app.route_batches(topic, intake)
    app.before_consumer_stop.append(intake.stop)

    @app.agent(batches, name="project-mailbox")
    async def project(stream: Any) -> None:
        async for batch in stream:
            await intake.process(batch)

    return project
