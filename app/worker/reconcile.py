"""Reconcile on request in the worker (docs/contract.md §10): requests on topic reconcile-request,
co-partitioned with mailbox-tail so the owner of the user's state gets them, handled one at a time
by `ReconcileRunner.run`: every row copied, recounted in worker threads, then judged and repaired
like the unread audit (app/worker/audit.judge_user). Handled offsets are committed by the commit
timer; a reconcile is idempotent (docs/decisions/0016-reconcile-on-request-in-the-owner.md)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from app.domain.audit import Repair, recount
from app.domain.conversation import ConversationState
from app.domain.ports import MessageStore
from app.domain.reconcile import (
    Outcome,
    ReconcileRequest,
    ReconcileResult,
    decode_request,
    is_stale,
    recovers_lost_entries,
    split_rows,
    wants_recount,
)
from app.worker.audit import judge_user

if TYPE_CHECKING:
    from app.settings import ProcessingSettings, ReconcileSettings
    from app.worker.core import WorkerCore
    from app.worker.ports import RawRecord

log = logging.getLogger("projector.reconcile")

# A request is dropped as stale after the interval, and not before this (seconds).
MIN_MAX_AGE_S = 60
# Requests queued for the runner at most (beyond: dropped and counted as failed).
QUEUE_MAX = 10_000
# Rows recounted per hop to a worker thread, and such hops in flight at once.
_RECOUNT_SLICE = 64
_RECOUNT_PARALLEL = 4


@dataclass(frozen=True, slots=True)
class ReconcileConfig:
    max_age_ms: int  # a request older than this is dropped (the API's interval, at least a minute)
    limit: int  # the bounded read's width (unread_precise_limit)

    @classmethod
    def from_settings(cls, reconcile: ReconcileSettings, processing: ProcessingSettings) -> ReconcileConfig:
        # The interval, never under a minute (queued requests, API hosts' clocks a little ahead).
        max_age_ms = max(reconcile.reconcile_min_interval_s, MIN_MAX_AGE_S) * 1000
        return cls(max_age_ms=max_age_ms, limit=processing.unread_precise_limit)


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


class ReconcileRunner:
    """Handles the requests of the partitions this worker owns, one at a time."""

    def __init__(
        self,
        core: WorkerCore,
        config: ReconcileConfig,
        owned: Callable[[int], bool],
        *,
        clock_ms: Callable[[], int] = _wall_ms,
        observe: Callable[[float], None] | None = None,
    ) -> None:
        self.core = core
        self.config = config
        self.owned = owned
        self.clock_ms = clock_ms
        self.observe = observe
        self.queue: asyncio.Queue[tuple[int, int, bytes | None]] = asyncio.Queue(QUEUE_MAX)
        # Per partition: the offset after the last record handled (what the commit timer commits).
        self.handled: dict[int, int] = {}
        self.results: list[ReconcileResult] = []  # the last few (tests, logs)

    # -- the intake's side -------------------------------------------------------------------------

    def offer(self, records: Sequence[RawRecord]) -> None:
        for record in records:
            try:
                self.queue.put_nowait((record.partition, record.offset, record.value))
            except asyncio.QueueFull:
                self._count(ReconcileResult(0, Outcome.FAILED))
                self.handled[record.partition] = record.offset + 1
                log.warning(
                    "reconcile: queue full, request at %d/%d dropped", record.partition, record.offset
                )

    # -- the task ----------------------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            partition, offset, raw = await self.queue.get()
            try:
                await self.handle_record(partition, raw)
            except Exception:  # a bug in one reconcile must not stop the next
                log.exception("reconcile: request at %d/%d failed", partition, offset)
                self._count(ReconcileResult(0, Outcome.FAILED))
            self.handled[partition] = offset + 1

    async def handle_record(self, partition: int, raw: bytes | None) -> ReconcileResult:
        request = decode_request(raw)
        if request is None:
            return self._count(ReconcileResult(0, Outcome.MALFORMED))
        return await self.handle(partition, request)

    async def handle(self, partition: int, request: ReconcileRequest) -> ReconcileResult:
        started = time.perf_counter()
        result = await self._handle(partition, request)
        elapsed = time.perf_counter() - started
        if result.outcome not in (Outcome.STALE, Outcome.NOT_OWNED, Outcome.MALFORMED):
            if self.observe is not None:
                self.observe(elapsed)
            log.info(
                "reconcile of user %d (%s): %s, %d rows compared (%d recounted), %d corrected, "
                "%d filled, badge %s, %.1f ms",
                request.user_id,
                request.trigger,
                result.outcome.value,
                result.rows,
                result.recounted,
                result.corrected,
                result.filled,
                "corrected" if result.badge_corrected else "unchanged",
                elapsed * 1000,
            )
        return self._count(result)

    async def _handle(self, partition: int, request: ReconcileRequest) -> ReconcileResult:
        user_id = request.user_id
        if is_stale(request, self.clock_ms(), self.config.max_age_ms):
            return ReconcileResult(user_id, Outcome.STALE)
        state = self.core.partitions.get(partition)
        if not self.owned(partition) or state is None or state.released:
            return ReconcileResult(user_id, Outcome.NOT_OWNED)
        projector = state.processor.projector
        # Every row of the user (evicted ones read back), copied with no await in between.
        user = projector.user(user_id)
        if user is None:
            return ReconcileResult(user_id, Outcome.UNKNOWN_USER)
        projector.complete(user)
        copies = {cid: row.copy() for cid, row in user.rows.items()}
        if not copies:
            return ReconcileResult(user_id, Outcome.UNKNOWN_USER)
        counted = [row for row in copies.values() if wants_recount(row, self.config.limit)]
        try:
            await self._recount(counted, lost_entries=recovers_lost_entries(request.trigger))
        except Exception as exc:  # the store's own error types differ per adapter
            log.warning("reconcile: recounting user %d failed: %s", user_id, exc)
            return ReconcileResult(user_id, Outcome.FAILED, rows=len(copies))
        judged = await judge_user(self.core, state, user_id, copies, "reconcile", complete=True)
        base = ReconcileResult(
            user_id,
            Outcome.CLEAN,
            rows=judged.audited,
            recounted=len(counted),
            state_corrected=judged.state_corrected,
        )
        if judged.repair is None:
            return replace(base, outcome=Outcome.FAILED if judged.failed else Outcome.NOT_OWNED)
        if judged.failed:
            return replace(base, outcome=Outcome.FAILED)
        if judged.repair is Repair.NOT_JUDGED:
            return ReconcileResult(user_id, Outcome.NOT_JUDGED)
        if judged.refused:
            return replace(base, outcome=Outcome.REFUSED)
        if judged.repair is Repair.CORRECT:
            corrected, filled = split_rows(judged.written, judged.stored)
            return replace(
                base,
                outcome=Outcome.CORRECTED,
                corrected=corrected,
                filled=filled,
                badge_corrected=judged.badge_corrected,
            )
        if judged.repair in (Repair.REFLUSH_ROWS, Repair.REFLUSH_USER):
            return replace(base, outcome=Outcome.REFLUSHED)
        return base

    async def _recount(self, rows: list[ConversationState], *, lost_entries: bool = False) -> None:
        """The copies recounted in worker threads, `_RECOUNT_PARALLEL` slices at once."""
        gate = asyncio.Semaphore(_RECOUNT_PARALLEL)
        store, limit = self.core.message_store, self.config.limit

        async def one(chunk: list[ConversationState]) -> None:
            async with gate:
                await asyncio.to_thread(_recount_all, chunk, store, limit, lost_entries)

        slices = [rows[i : i + _RECOUNT_SLICE] for i in range(0, len(rows), _RECOUNT_SLICE)]
        await asyncio.gather(*(one(chunk) for chunk in slices))

    def _count(self, result: ReconcileResult) -> ReconcileResult:
        stats = self.core.stats
        key = result.outcome.value
        stats.reconcile_outcomes[key] = stats.reconcile_outcomes.get(key, 0) + 1
        stats.reconcile_rows_compared += result.rows
        stats.reconcile_rows_recounted += result.recounted
        stats.reconcile_rows_corrected += result.corrected
        stats.reconcile_rows_filled += result.filled
        stats.reconcile_badges_corrected += int(result.badge_corrected)
        self.results = [*self.results[-31:], result]
        return result

    # -- offsets ---------------------------------------------------------------------------------

    def commit_due(self, committed: dict[int, int]) -> dict[int, int]:
        """The handled offsets not committed yet (of partitions still owned)."""
        return {p: o for p, o in self.handled.items() if committed.get(p) != o and self.owned(p)}


def _recount_all(
    rows: Sequence[ConversationState], store: MessageStore, limit: int, lost_entries: bool
) -> None:
    """In the worker thread: recount each copy (raises on the first failing read)."""
    for row in rows:
        recount(row, store, limit, lost_entries=lost_entries)
