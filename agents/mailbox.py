"""The mailbox-tail agent: one fetch batch of raw records at a time into the worker core.

The consumer (`app.worker.batch_intake`) sends each fetch's records of a partition as one
`RecordBatch` to an in-memory faust channel; this agent iterates it. No business branching
here: decode, gating, state and flushing live in `app.worker.core` and the pure core under it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import faust

from app.worker.batch_intake import ProjectorApp, RecordBatch, commit_offsets
from app.worker.core import WorkerCore

log = logging.getLogger("projector.worker")

# Batches waiting for the agent: enough to overlap fetching with processing, few enough that a
# rebalance drops little (a flow stop clears the channel; the seek reads it again).
CHANNEL_BATCHES = 4


class MailboxIntake:
    """Between the consumer and the core: one batch at a time, stale batches dropped, offsets
    committed only once a batch's effects are durable in the changelog tables."""

    def __init__(self, app: faust.App, core_ref: dict[str, WorkerCore], topic: str) -> None:
        self.app = app
        self.core_ref = core_ref
        self.topic = topic
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

    async def process(self, batch: RecordBatch) -> None:
        async with self.lock:
            if batch.generation != self.app.consumer_generation_id or batch.partition not in self.assigned:
                # Fetched under an older assignment, or queued before a revocation: the partition
                # is another worker's now (it reads from the committed offset) or was re-assigned
                # (the seek reads it again). Applying it would write a partition we do not own.
                self.stale_batches += 1
                return
            await self.core_ref["core"].on_records(batch.records)

    async def assign(self, partitions: Sequence[int]) -> None:
        """A rebalance completed: these partitions are ours; their state is restored now, so
        work applied but never flushed is flushed even if no new record arrives."""
        async with self.lock:
            self.assigned = set(partitions)
            await self.core_ref["core"].restore_assigned(sorted(partitions))

    async def revoke(self, partitions: Sequence[int]) -> None:
        """Before the partitions go: their hot state persisted and its offsets committed, so
        the new owner restores it instead of reading it again."""
        self.assigned.difference_update(partitions)  # batches still queued for them are dropped
        async with self.lock:
            core = self.core_ref["core"]
            await core.release(partitions)
            await self.commit()
            core.forget(partitions)

    async def stop(self) -> None:
        """A clean stop: the batch in progress finished, everything flushed (hot state persisted
        first) and its offsets committed, so a restart reads nothing again."""
        async with self.lock:
            core = self.core_ref.get("core")
            if core is None:
                return
            await core.flush_all()
            await self.commit()

    async def commit(self) -> None:
        """Commit the offsets the core reports durable (its changelog records are handed to the
        producer; faust's commit flushes the producer before committing). From the commit
        timer and on revocation; serialized, so a committed offset only moves forward."""
        async with self.commit_lock:
            core = self.core_ref["core"]
            offsets = core.durable_offsets()
            if not offsets:
                return
            try:
                if await commit_offsets(self.app, offsets, self.topic):
                    core.offsets_committed(offsets)
            except Exception as exc:  # a failed commit only means re-reading (duplicates dropped)
                log.warning("offset commit failed (entries will be read again): %s", exc)


def register_agent(app: ProjectorApp, topic: Any, intake: MailboxIntake) -> Any:
    batches = app.channel(maxsize=CHANNEL_BATCHES)

    async def route(batch: RecordBatch) -> None:
        await batches.send(value=batch)

    app.route_batches(topic, route)
    app.before_consumer_stop.append(intake.stop)

    @app.agent(batches, name="project-mailbox")
    async def project(stream: Any) -> None:
        async for batch in stream:
            await intake.process(batch)

    return project
