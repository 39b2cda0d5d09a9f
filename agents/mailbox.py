"""The mailbox-tail agent: one fetch batch of raw records at a time into the worker core.

The consumer (`agents.batch_intake`) sends each fetch's records of a partition as one
`RecordBatch` to an in-memory channel; this agent iterates it. No business branching here:
decode, gating, state and flushing live in `app.worker.core` and the pure core under it.

What the intake does own is the promise that the log is applied without a hole: a batch the core
refuses (it does not continue the partition's state in the log: app/worker/offsets.py) makes the
consumer read again from where the state stands, and so does a fetch that never reached the core
(`check_fetched`, on the commit timer), whatever lost it.
"""

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

# A partition whose state has not moved for this long while a fetch ended ahead of it and batches
# were counted on their way: they are taken for lost (a batch normally reaches the core in ms).
STALLED_S = 15.0

# Batches waiting for the agent: enough to overlap fetching with processing, few enough that a
# rebalance leaves little stale work queued (it is dropped by the ownership checks or the offset rule).
CHANNEL_BATCHES = 4


class MailboxIntake:
    """Between the consumer and the core: one batch at a time, stale batches dropped, the log
    applied without holes, offsets committed only once a batch's effects are durable in the
    changelog tables."""

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
        # Held while a batch is processed: a revocation waits for it, so no changelog record of a
        # partition is written after another worker may own it.
        self.lock = asyncio.Lock()
        # Commits run on their own timer, never inside a batch: faust's consumer thread serves a
        # commit after its fetch in progress, which waits up to a second for records.
        self.commit_lock = asyncio.Lock()
        # The mailbox-tail partitions this worker owns: set when a rebalance completes (before
        # faust resumes fetching), cleared for the revoked ones as soon as a revocation starts.
        self.assigned: set[int] = set()
        self.stale_batches = 0
        # Per partition: where the consumer's last fetch ended, and batches handed to the channel
        # and not processed yet. A fetch that ended past the state's offset while nothing is on
        # its way to the core went missing (`check_fetched`).
        self.fetched_to: dict[int, int] = {}
        self.in_flight: dict[int, int] = {}
        # Per partition with a fetch ahead of its state: (the state's offset, since when).
        self.behind: dict[int, tuple[int, float]] = {}
        self.seeks = 0
        # Rebalances completed (`assign`): none yet = the worker has not joined its group (the
        # readiness check "assignment"). `held`: fetching paused while the store fails (`hold`).
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
        """After faust put the consumer at the committed offsets: every partition this intake
        owns goes where its state stands (a new one: where the group left it, else the log
        start, which the consumer looks up)."""
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
                    # Fetched under an older assignment, or queued before a revocation: the
                    # partition is another worker's now (it reads from the committed offset) or
                    # was re-assigned (the seek reads it again). Applying it would write a
                    # partition we do not own.
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
        """A fetch that ended past where the state stands while no batch of that partition is on
        its way to the core never arrived (dropped somewhere between the consumer and the agent):
        read it again. Without this, a lost LAST batch would leave its entries unapplied until
        more records came — forever, at the end of a stream. "On its way" is a count kept by
        `deliver` and `process`; should a batch vanish after `deliver` counted it (a queue emptied
        behind our back), the partition's state not moving for STALLED_S with a fetch ahead of
        it counts as lost too."""
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
        """A rebalance completed: these partitions are ours; their state is restored now, so
        work applied but never flushed is flushed even if no new record arrives."""
        async with self.lock:
            self.assigned = set(partitions)
            for partition in partitions:
                self.fetched_to.pop(partition, None)
            # A partition the core still holds but this assignment does not name was never
            # handed over here: its state must not be persisted (another worker writes its
            # changelog now, and reads again what this one did not persist).
            stale = sorted(set(self.core.partitions) - self.assigned)
            if stale:
                log.warning("partitions %s held but not assigned: dropped without a persist", stale)
                self.core.drop(stale)
            await self.core.restore_assigned(sorted(partitions))
            self.assignments += 1

    def hold(self, held: bool) -> None:
        """While the projection store fails and the held flushes reached their bound
        (app/worker/retry.py, PROJECTOR_WORKER_HELD_ROWS_MAX): no fetching of the owned
        partitions, more records would only grow them; the records wait in Kafka instead, the
        consumer stays in its group (it still polls). Called at every tick of the flush
        scheduler: a rebalance's recovery resumes every partition, and the next tick pauses them
        again."""
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
        """Before the partitions go: their hot state persisted and its offsets committed, so
        the new owner restores it instead of reading it again."""
        self.assigned.difference_update(partitions)  # batches still queued for them are dropped
        async with self.lock:
            # Again under the lock: an assignment that held it meanwhile may have named them.
            self.assigned.difference_update(partitions)
            await self.core.release(partitions)
            await self.commit()
            self.core.forget(partitions)
        if partitions:
            # The other end of "restored partition N": between the two lines no other worker may
            # write the partition's changelog (the crash runs' logs are read for overlaps).
            log.info("released partitions %s: persisted, offsets committed", sorted(partitions))

    async def stop(self) -> None:
        """A clean stop: the batch in progress finished, everything flushed (hot state persisted
        first) and its offsets committed, so a restart reads nothing again."""
        async with self.lock:
            await self.core.flush_all()
            await self.commit()

    async def commit(self) -> None:
        """Commit the offsets the core reports durable (its changelog records are handed to the
        producer; faust's commit flushes the producer before committing). From the commit
        timer and on revocation; serialized, so a committed offset only moves forward."""
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
