"""The publisher: queued flushes to the projection store (each user's batch atomically), then a
SESSION_DELTA and a BADGE_UPDATE per user whose version the store took, in order, one publication at
a time (docs/decisions/0004-visible-before-durable.md, 0012-store-outage-holds-flushes.md)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import orjson

from app.domain.flush import UserFlush, badge_update_frame, session_delta_frame
from app.domain.projection_store import ProjectionStore
from app.worker.mirror import MirrorPump
from app.worker.ports import FlushObserver, Outbox
from app.worker.ratelog import RateLimitedLog
from app.worker.retry import Backoff
from app.worker.state import PartitionState, WorkerStats

log = logging.getLogger("projector.worker")

Persist = Callable[[PartitionState], Awaitable[None]]


class Publisher:
    def __init__(
        self,
        *,
        window_ms: int,
        partitions: dict[int, PartitionState],
        projection_store: ProjectionStore,
        outbox: Outbox,
        stats: WorkerStats,
        clock: Callable[[], int],
        state_lock: asyncio.Lock,
        persist: Persist,
        mirror: Callable[[], MirrorPump | None],
        dead_letter_log: RateLimitedLog,
    ) -> None:
        self.window_ms = window_ms
        self.partitions = partitions  # the core's, shared
        self.projection_store = projection_store
        self.outbox = outbox
        self.stats = stats
        self.clock = clock
        self._state_lock = state_lock
        self._persist = persist
        self._mirror = mirror
        self._dead_letter_log = dead_letter_log
        self.lock = asyncio.Lock()
        self.visible_before_durable = False
        self.store_backoff: Backoff | None = None
        self.after_store_write: Callable[[], None] | None = None  # fault-injection hook (tests)
        # Only the flush latency histogram is observed here, once per write.
        self.metrics: FlushObserver | None = None
        # Users a write found stored older than their previous flush (drained by the repair).
        self.store_behind: set[int] = set()
        self.track_store_behind = False

    # -- when to flush ------------------------------------------------------------------------

    async def flush_due(self, now: int) -> int:
        """Flush every partition whose window elapsed (or that holds too many dirty rows); persist
        the others at least once per window (changes that flush nothing still move the offset)."""
        self._dead_letter_log.tick()
        flushed = 0
        for state in list(self.partitions.values()):
            if state.released:
                continue
            async with self._state_lock:
                batches = state.processor.on_deadline(now)
                if batches:
                    state.queue([batches])
            mirror = self._mirror()
            if state.unpublished:
                flushed += await self.publish(state)
                if self.visible_before_durable and not state.released and self._persist_due(state, now):
                    # The window's persist still comes, however busy the fast lane keeps it.
                    await self._persist(state)
            elif self._persist_due(state, now):
                await self._persist(state)
            elif state.owing and mirror is not None and mirror.caught_up:
                # The mirror caught up: persisted so the records (and the gauge) stop saying owed.
                await self._persist(state)
        return flushed

    def _persist_due(self, state: PartitionState, now: int) -> bool:
        """Changes older than a window are not persisted yet."""
        since = state.unpersisted_since
        return since is not None and now - since >= self.window_ms

    async def flush_all(self) -> int:
        """Everything flushes now (a clean stop), after the mirror wrote what it owes."""
        mirror = self._mirror()
        if mirror is not None:
            await mirror.drain()
        flushed = 0
        for state in list(self.partitions.values()):
            flushed += await self.flush_partition(state)
        return flushed

    async def flush_partition(self, state: PartitionState) -> int:
        """One flush of everything the partition holds, published at once."""
        async with self._state_lock:
            batches = state.processor.on_end()
            if batches:
                state.queue([batches])
        return await self.publish(state, now=True)

    # -- publishing ---------------------------------------------------------------------------

    async def publish(self, state: PartitionState, *, now: bool = False) -> int:
        """Publish the partition's queued flushes in order; returns how many user batches went out.
        `now`: try the store even within a backoff, and persist what was written at once."""
        async with self.lock:
            if state.released:
                return 0
            if not now and not state.unpublished:
                # Published by the publisher it waited for: its offsets go durable with the next persist.
                return 0
            if not now and self._held(state):
                await self._persist_held(state)
                return 0
            failing = self.store_backoff is not None and self.store_backoff.failing
            uncovered = state.durable_flushes < state.queued_flushes
            visible_first = self.visible_before_durable
            if not visible_first and not (failing and state.unpersisted_since is None and not uncovered):
                # A persist makes the offsets durable (not needed by a retry with nothing changed).
                await self._persist(state)
            published = 0
            while self._publishable(state):
                count, batches = self.next_write(state)
                try:
                    published += await self._write(batches, flushes=count)
                except Exception as exc:
                    if not self._store_failed(exc, state):
                        raise
                    break  # queued, and recorded unflushed by every persist until written
                self._store_succeeded()
                del state.unpublished[:count]
                state.published_flushes += count
                # Their records now say these versions are flushed (with the next persist).
                state.processor.touch((), [batch.user_id for batch in batches], self.clock())
            if visible_first and now:
                # A clean stop's or a test's flush: what it wrote is persisted at once.
                await self._persist(state)
            return published

    def _publishable(self, state: PartitionState) -> bool:
        """The oldest queued flush may be written now."""
        return self._writable(state) > 0

    def _writable(self, state: PartitionState) -> int:
        """How many of the oldest queued flushes may be written now
        (docs/decisions/0004-visible-before-durable.md)."""
        if state.released:
            return 0
        queued = len(state.unpublished)
        if self.visible_before_durable:
            return queued
        return min(queued, state.durable_flushes - state.published_flushes)

    def next_write(self, state: PartitionState) -> tuple[int, list[UserFlush]]:
        """The oldest queued flushes that share one store write: the oldest, then each next
        writable one until a user repeats (docs/decisions/0017-flushes-grouped-per-store-write.md)."""
        queued = state.unpublished
        batches = list(queued[0])
        writable = self._writable(state)
        users = {batch.user_id for batch in batches}
        count = 1
        while count < writable:
            following = queued[count]
            if any(batch.user_id in users for batch in following):
                break
            users.update(batch.user_id for batch in following)
            batches += following
            count += 1
        return count, batches

    async def _write(self, batches: list[UserFlush], flushes: int = 1) -> int:
        """One store write of `batches` (the users of `flushes` queued flushes), then their frames."""
        started = time.perf_counter()
        previous = await self.projection_store.write(batches)
        if self.after_store_write is not None:
            self.after_store_write()
        deltas: list[tuple[bytes, bytes]] = []
        badges: list[tuple[bytes, bytes]] = []
        for batch, stored_before in zip(batches, previous, strict=True):
            if stored_before is None:
                # The store holds this version already (a re-read after a crash): no frames again.
                self.stats.refused_writes += 1
                continue
            if self.track_store_behind and stored_before < batch.prev_projection_mailbox_seq:
                self.store_behind.add(batch.user_id)  # it held more than this: its data went
            self.stats.projection_writes += len(batch.rows)
            # prev = what the store held, i.e. the last version any client can have seen.
            version = batch.projection_mailbox_seq
            key = str(batch.user_id).encode()
            delta = session_delta_frame(
                batch.user_id,
                batch.rows,
                version=version,
                prev_version=stored_before,
                driving_event_id=batch.driving_event_id,
                driving_mailbox_seq=batch.driving_mailbox_seq,
            )
            deltas.append((key, orjson.dumps(delta)))
            badge = badge_update_frame(
                batch.user_id, batch.badge, version=version, prev_version=stored_before
            )
            badges.append((key, orjson.dumps(badge)))
        if deltas:
            await self.outbox.frames(deltas, badges)
        self.stats.flushes += flushes
        self.stats.frames += len(deltas) + len(badges)
        elapsed = time.perf_counter() - started
        self.stats.last_flush_ms = elapsed * 1000
        if self.metrics is not None:
            self.metrics.observe_flush(elapsed)
        log.debug("flush: %d users in %.1f ms", len(batches), self.stats.last_flush_ms)
        return len(batches)

    # -- a failing store ----------------------------------------------------------------------

    @property
    def store_failing(self) -> bool:
        """Flushes are held: a write failed and none has succeeded since (and some are still ours)."""
        return self.store_backoff is not None and self.store_backoff.failing and self.held_flushes() > 0

    def held_flushes(self) -> int:
        """User batches produced and not yet published, all partitions."""
        return sum(len(batches) for s in self.partitions.values() for batches in s.unpublished)

    def held_rows(self) -> int:
        """Rows in those batches (what holding them costs in memory)."""
        return sum(
            len(b.rows) for s in self.partitions.values() for batches in s.unpublished for b in batches
        )

    def _held(self, state: PartitionState) -> bool:
        backoff = self.store_backoff
        return backoff is not None and bool(state.unpublished) and not backoff.ready(self.clock())

    async def _persist_held(self, state: PartitionState) -> None:
        """While flushes are held: persist at most once per window, like a partition that flushes nothing."""
        if self._persist_due(state, self.clock()):
            await self._persist(state)

    def _store_failed(self, exc: Exception, state: PartitionState) -> bool:
        """A write raised: with a backoff, count it and log the streak's first failure (True: the
        caller keeps the flush queued); without one, False (the caller raises)."""
        backoff = self.store_backoff
        if backoff is None:
            return False
        self.stats.store_write_failures += 1
        reason = f"{type(exc).__name__}: {exc}"
        if backoff.failed(self.clock(), reason):
            log.error(
                "writing a flush failed (%s); %d flushes held, retried with backoff "
                "(up to %.0f s apart): nothing is lost, the changelog keeps them unflushed",
                reason,
                self.held_flushes(),
                backoff.max_delay_ms / 1000,
            )
        else:
            log.debug("writing a flush failed again (partition %d): %s", state.partition, reason)
        return True

    def _store_succeeded(self) -> None:
        streak = self.store_backoff.succeeded(self.clock()) if self.store_backoff is not None else None
        if streak is not None:
            log.warning(
                "flushes are written again after %d failed attempts in %.1f s; publishing %d held flushes",
                streak.failures,
                streak.duration_ms / 1000,
                self.held_flushes(),
            )
