"""After a retention overrun (docs/contract.md §3.9; rules in app/domain/retention.py): the
projection epoch bumped once per overrun, then, once the partition read on to the end it had at the
overrun, a reconcile asked of every user of the partition the worker knows, in acknowledged chunks
(docs/decisions/0014-retention-overrun-epoch.md, which also names the known gap)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from app.domain.reconcile import ReconcileRequest
from app.domain.retention import REQUEST_CHUNK, overrun_mark, partition_users, request_chunks

if TYPE_CHECKING:
    from app.worker.core import WorkerCore

log = logging.getLogger("projector.retention")

# Row keys read per page from the state tables (one hop to a worker thread each).
ROW_PAGE = 5_000
# How often the sender looks at the runner's backlog, or the partition's offset, while it waits (s).
BACKLOG_POLL_S = 0.2
# How long the reconciles wait for the partition to read on to the end it had at the overrun.
CATCH_UP_MAX_S = 600.0

# (mark, the checkpoint's next offset) -> (bumped, the epoch now)
EpochBump = Callable[[str, int], Awaitable[tuple[bool, int]]]


class ReconcileSender(Protocol):
    async def send(self, request: ReconcileRequest) -> None:
        """Hand the request to the reconcile-request topic; returns once acknowledged."""
        ...


@dataclass
class RetentionCounts:
    epoch_bumps: int = 0  # overruns that bumped the projection epoch
    epoch_bump_failures: int = 0  # bumps the store did not take (the users are asked anyway)
    reconciles_asked: int = 0  # reconcile requests sent for the users of overrun partitions
    reconciles_unsent: int = 0  # requests that failed to send, or were left when the partition went


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


class RetentionReconciles:
    def __init__(
        self,
        core: WorkerCore,
        bump: EpochBump,
        sender: ReconcileSender | None,
        topic: str,
        owned: Callable[[int], bool],
        backlog: Callable[[], int],
        *,
        input_end: Callable[[int], Awaitable[int]] | None = None,
        chunk: int = REQUEST_CHUNK,
        clock_ms: Callable[[], int] = _wall_ms,
    ) -> None:
        self.core = core
        self.bump = bump
        self.sender = sender
        self.topic = topic
        self.owned = owned
        self.backlog = backlog
        self.input_end = input_end
        self.chunk = chunk
        self.clock_ms = clock_ms
        self.counts = RetentionCounts()
        self.epoch: int | None = None  # the epoch after the last bump seen (tests, logs)
        self.tasks: set[asyncio.Task[int]] = set()

    async def overrun(self, partition: int, checkpoint_next: int) -> None:
        """Partition `partition` lost the entries from `checkpoint_next` to the log start."""
        try:
            bumped, self.epoch = await self.bump(overrun_mark(self.topic, partition), checkpoint_next)
        except Exception as exc:  # the store's own error types differ per adapter
            self.counts.epoch_bump_failures += 1
            log.error("partition %d: bumping the projection epoch failed: %s", partition, exc)
        else:
            if bumped:
                self.counts.epoch_bumps += 1
            log.warning(
                "partition %d: projection epoch %s %d (retention overrun at checkpoint offset %d)",
                partition,
                "now" if bumped else "already",
                self.epoch,
                checkpoint_next,
            )
        if self.sender is None:
            return
        task = asyncio.get_running_loop().create_task(self.caught_up_then_ask(partition))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def caught_up_then_ask(self, partition: int) -> int:
        await self.catch_up(partition)
        return await self.ask_users(partition)

    async def catch_up(self, partition: int) -> None:
        """Until the partition applied mailbox-tail up to its end of now, moved, or the wait ran out."""
        if self.input_end is None:
            return
        try:
            end = await self.input_end(partition)
        except Exception as exc:  # the reconciles go without waiting
            log.warning("partition %d: mailbox-tail's end unknown (%s): reconciling now", partition, exc)
            return
        deadline = time.monotonic() + CATCH_UP_MAX_S
        while self.owned(partition) and time.monotonic() < deadline:
            state = self.core.partitions.get(partition)
            if state is None or (state.next_offset or 0) >= end:
                return
            await asyncio.sleep(BACKLOG_POLL_S)

    async def users(self, partition: int) -> list[int]:
        """The users of `partition` the worker knows (row keys paged in a worker thread)."""
        tables = self.core.tables
        row_users: set[int] = set()
        after: tuple[int, str] | None = None
        while True:
            page = await asyncio.to_thread(tables.rows_after, partition, after, ROW_PAGE)
            row_users.update(user_id for (user_id, _), _ in page)
            if len(page) < ROW_PAGE:
                break
            after = page[-1][0]
        state = self.core.partitions.get(partition)
        resident = list(state.processor.projector.users) if state is not None else []
        return partition_users(row_users, resident)

    async def ask_users(self, partition: int) -> int:
        """Ask a reconcile of each user of `partition`; returns how many were sent."""
        sender = self.sender
        assert sender is not None  # overrun() starts this only with one
        users = await self.users(partition)
        sent = 0
        for number, chunk in enumerate(request_chunks(users, self.chunk)):
            if not self.owned(partition):
                left = len(users) - number * self.chunk
                self.counts.reconciles_unsent += left
                log.warning("partition %d moved: %d reconciles after the overrun not asked", partition, left)
                return sent
            while number > 0 and self.backlog() >= self.chunk:
                await asyncio.sleep(BACKLOG_POLL_S)
            now = self.clock_ms()
            results = await asyncio.gather(
                *(sender.send(ReconcileRequest(user_id, now, "retention")) for user_id in chunk),
                return_exceptions=True,
            )
            failed = sum(1 for result in results if isinstance(result, BaseException))
            self.counts.reconciles_asked += len(chunk) - failed
            self.counts.reconciles_unsent += failed
            sent += len(chunk) - failed
        log.warning(
            "partition %d: reconcile asked of %d of its %d users after the overrun",
            partition,
            sent,
            len(users),
        )
        return sent

    async def drain(self) -> None:
        """Wait for the senders in flight (tests; a clean stop)."""
        while self.tasks:
            await asyncio.gather(*list(self.tasks), return_exceptions=True)
