"""The mailbox-tail agent: one fetch batch of raw records at a time into the worker core.

The consumer (`app.worker.batch_intake`) sends each fetch's records of a partition as one
`RecordBatch` to an in-memory faust channel; this agent iterates it. No business branching
here: decode, gating, state and flushing live in `app.worker.core` and the pure core under it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
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

    def __init__(
        self,
        app: faust.App,
        core_ref: dict[str, WorkerCore],
        topic: str,
        commit_interval_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.app = app
        self.core_ref = core_ref
        self.topic = topic
        self.commit_interval_s = commit_interval_s
        self.clock = clock
        # Held while a batch is processed: a revocation waits for it, so no changelog record of a
        # partition is written after another worker may own it.
        self.lock = asyncio.Lock()
        self.last_commit = clock()
        self.stale_batches = 0

    async def process(self, batch: RecordBatch) -> None:
        async with self.lock:
            if batch.generation != self.app.consumer_generation_id:
                # Fetched under an older assignment: the partition was revoked (its new owner reads
                # it from the committed offset) or re-assigned (the seek reads it again).
                self.stale_batches += 1
                return
            await self.core_ref["core"].on_records(batch.records)
            if self.clock() - self.last_commit >= self.commit_interval_s:
                await self._commit()

    async def commit_due(self) -> None:
        """From the timer: commit what became durable when no batch came to do it."""
        if self.clock() - self.last_commit >= self.commit_interval_s:
            async with self.lock:
                await self._commit()

    async def revoke(self, partitions: Sequence[int]) -> None:
        """Before the partitions go: their hot state persisted and its offsets committed, so
        the new owner restores it instead of reading it again."""
        async with self.lock:
            core = self.core_ref["core"]
            await core.release(partitions)
            await self._commit()
            core.forget(partitions)

    async def _commit(self) -> None:
        """Commit the offsets the core reports durable (its changelog records are handed to the
        producer; faust's commit flushes the producer before committing)."""
        self.last_commit = self.clock()
        core = self.core_ref["core"]
        offsets = core.durable_offsets()
        if not offsets:
            return
        try:
            if await commit_offsets(self.app, offsets, self.topic):
                core.offsets_committed(offsets)
        except Exception as exc:  # a failed commit only means re-reading (duplicates are dropped)
            log.warning("offset commit failed (entries will be read again): %s", exc)


def register_agent(app: ProjectorApp, topic: Any, intake: MailboxIntake) -> Any:
    batches = app.channel(maxsize=CHANNEL_BATCHES)

    async def route(batch: RecordBatch) -> None:
        await batches.send(value=batch)

    app.route_batches(topic, route)

    @app.agent(batches, name="project-mailbox")
    async def project(stream: Any) -> None:
        async for batch in stream:
            await intake.process(batch)

    return project
