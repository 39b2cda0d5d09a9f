"""WorkerCore: the worker's I/O around the processing object, one per owned partition.

The rules are `app.domain.processor.PartitionProcessor` (replay runs the same object). Around it:
(partition, [record]) → admission.py → processor → outbound.py (dead letters, notices) | mirror.py
(Cassandra, owed in each persist) | queued flushes → publisher.py; checkpointer.py persists the hot
state. Only `durable_offsets()` are committed, so a crash re-reads exactly what the changelog does
not hold (docs/decisions/0001-one-atomic-checkpoint.md, 0009-mirror-owed-writes.md)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar, overload

import msgspec

from app.domain.ports import MessageStore
from app.domain.processor import PartitionProcessor
from app.domain.projection_store import ProjectionStore
from app.worker.admission import admit_fetch
from app.worker.checkpointer import OWED_KEY, Checkpointer, read_checkpoint
from app.worker.mirror import MirrorPump
from app.worker.offsets import Admission, Verdict
from app.worker.outbound import OutboundRecords, dead_letter_envelope
from app.worker.ports import FlushObserver, Outbox, RawRecord, StateTables, StateWriter
from app.worker.publisher import Publisher
from app.worker.ratelog import RateLimitedLog
from app.worker.retry import Backoff
from app.worker.state import PartitionState, WorkerConfig, WorkerStats, wall_clock_ms
from app.worker.state_source import TablesSource

__all__ = [
    "PartitionState",
    "WorkerConfig",
    "WorkerCore",
    "WorkerStats",
    "dead_letter_envelope",
    "wall_clock_ms",
]

log = logging.getLogger("projector.worker")

T = TypeVar("T")


class _Forwarded(Generic[T]):
    """An attribute of the core that lives on one of its parts (callers set it on the core)."""

    def __init__(self, part: str) -> None:
        self.part = part
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, core: None, owner: type) -> _Forwarded[T]: ...
    @overload
    def __get__(self, core: object, owner: type) -> T: ...
    def __get__(self, core: object | None, owner: type) -> T | _Forwarded[T]:
        if core is None:
            return self
        value: T = getattr(getattr(core, self.part), self.name)
        return value

    def __set__(self, core: object, value: T) -> None:
        setattr(getattr(core, self.part), self.name, value)


class WorkerCore:
    # True: a persist commits outside the state lock (docs/decisions/0005-overlap-flushes-and-batches.md).
    commit_outside_state_lock = _Forwarded[bool]("checkpointer")
    # True: flushes are published before their persist (docs/decisions/0004-visible-before-durable.md).
    visible_before_durable = _Forwarded[bool]("publisher")
    # None: a failing store write raises. Set: the flush stays queued until the backoff allows.
    store_backoff = _Forwarded["Backoff | None"]("publisher")
    after_store_write = _Forwarded["Callable[[], None] | None"]("publisher")  # fault injection
    # Prometheus: counters are pulled from `stats`; only the flush latency is observed, per write.
    metrics = _Forwarded["FlushObserver | None"]("publisher")
    # Users a write found the store behind on (the projection repair drains it while tracking).
    store_behind = _Forwarded["set[int]"]("publisher")
    track_store_behind = _Forwarded[bool]("publisher")

    def __init__(
        self,
        config: WorkerConfig,
        *,
        message_store: MessageStore,
        projection_store: ProjectionStore,
        tables: StateTables,
        outbox: Outbox,
        state_writer: StateWriter | None = None,
        clock: Callable[[], int] = wall_clock_ms,
        after_store_write: Callable[[], None] | None = None,
        metrics: FlushObserver | None = None,
        store_backoff: Backoff | None = None,
    ) -> None:
        self.config = config
        self.message_store = message_store
        self.projection_store = projection_store
        self.tables = tables
        self.outbox = outbox
        self.clock = clock
        self.partitions: dict[int, PartitionState] = {}
        self.stats = WorkerStats()
        self.mirror: MirrorPump | None = None
        self.state_writer = state_writer  # also makes the mirror (the property below)
        # Held while a batch is applied and while a persist snapshots (one point between batches).
        self._state_lock = asyncio.Lock()
        self.dead_letter_log = RateLimitedLog(log, config.dead_letter_log_per_s, "dead letters")
        self.outbound = OutboundRecords(outbox, self.stats, self._current_mirror, self.dead_letter_log)
        self.checkpointer = Checkpointer(
            tables, self.stats, self._state_lock, self.outbound, self._current_mirror
        )
        self.publisher = Publisher(
            window_ms=config.window_ms,
            partitions=self.partitions,
            projection_store=projection_store,
            outbox=outbox,
            stats=self.stats,
            clock=clock,
            state_lock=self._state_lock,
            persist=self.checkpointer.persist,
            mirror=self._current_mirror,
            dead_letter_log=self.dead_letter_log,
        )
        self.store_backoff = store_backoff
        self.after_store_write = after_store_write
        self.metrics = metrics
        # `background_publish`: a batch's flushes wake the flush scheduler (`publish_wanted`); the
        # batch publishes itself only past `max_queued_flushes` queued in its partition.
        self.background_publish = False
        self.max_queued_flushes = 4
        self.publish_wanted = asyncio.Event()

    def _current_mirror(self) -> MirrorPump | None:
        return self.mirror

    @property
    def state_writer(self) -> StateWriter | None:
        return self.mirror.writer if self.mirror is not None else None

    @state_writer.setter
    def state_writer(self, writer: StateWriter | None) -> None:
        # The Cassandra mirror runs beside the batches and off the flush path (app/worker/mirror.py).
        self.mirror = (
            MirrorPump(writer, self.stats, spacing_s=self.config.mirror_spacing_ms / 1000)
            if writer is not None
            else None
        )

    # -- partitions ---------------------------------------------------------------------------

    def partition(self, partition: int) -> PartitionState:
        """The partition's core, restored from the changelog tables on first use."""
        state = self.partitions.get(partition)
        if state is None:
            state = self.partitions[partition] = self._restore(partition)
        return state

    def _processor_options(self) -> dict[str, Any]:
        return {
            "lanes": self.config.lanes,
            "stats": self.stats,
            "mirror": self.state_writer is not None,
            "member_stats": True,
            "track_changes": True,
            "hot_rows": self.config.hot_rows,
            "hot_bytes": self.config.hot_bytes,
        }

    def _restore(self, partition: int) -> PartitionState:
        """A partition's processor over its changelog tables: the checkpoint, the waiting entries
        and the users and rows the checkpoint lists read now; everything else on first touch."""
        tables = self.tables
        checkpoint = read_checkpoint(tables.checkpoint_record(partition))
        processor = PartitionProcessor.restore_lazily(
            self.config.projector,
            self.message_store,
            TablesSource(tables, partition),
            checkpoint.record,
            tables.pending(partition),
            checkpoint.unflushed,
            **self._processor_options(),
        )
        # Unflushed work survived in the changelog: flush it within one window from now.
        processor.open_window_at(self.clock())
        state = PartitionState(partition, processor)
        state.next_offset = state.durable_offset = checkpoint.next_offset
        # A user stays listed until a persist writes its record as flushed (crashes in a row).
        state.unflushed = checkpoint.unflushed
        state.persists = checkpoint.persists
        state.owing_persisted = set(checkpoint.owing)
        mirror = self.mirror
        for key, blob in tables.get_rows(partition, checkpoint.owing).items():
            record = msgspec.msgpack.decode(blob)
            if OWED_KEY in record and mirror is not None:
                state.owing.add(key)
                mirror.restage(key, record[OWED_KEY])
        if state.owing and mirror is not None:
            mirror.kick()
        if checkpoint.record is not None:
            log.info(
                "restored partition %d: %d users with unflushed work, %d waiting, hi=%d, next offset %s",
                partition,
                len(processor.users),
                processor.pending_count,
                processor.gate.hi,
                state.next_offset,
            )
        return state

    async def restore_assigned(self, partitions: Sequence[int]) -> None:
        """After a rebalance: restore every assigned partition now (its unflushed work flushes)."""
        async with self.checkpointer.lock:  # a commit of its own: never one that a persist staged
            # Each store caught up and claimed (raises when its checkpoint names another input).
            await self.tables.acquire(partitions)
            for partition in partitions:
                self.partition(partition)
            await self.tables.commit()

    async def release(self, partitions: Sequence[int]) -> None:
        """Partitions handed to another worker: persisted, then released; commit offsets after."""
        for partition in partitions:
            state = self.partitions.get(partition)
            if state is not None:
                await self.persist(state, handing_over=True)

    def forget(self, partitions: Sequence[int]) -> None:
        for partition in partitions:
            self.partitions.pop(partition, None)

    def drop(self, partitions: Sequence[int]) -> None:
        """Partitions held without being owned: forgotten without a persist."""
        for partition in partitions:
            state = self.partitions.pop(partition, None)
            if state is not None:
                state.released = True
                self.tables.hand_over(partition)

    # -- records ------------------------------------------------------------------------------

    async def on_records(self, records: Sequence[RawRecord]) -> dict[int, Admission]:
        """Records of any partitions in offset order without holes (rebuild by replay, tests)."""
        by_partition: dict[int, list[RawRecord]] = {}
        for record in records:
            by_partition.setdefault(record.partition, []).append(record)
        return {
            partition: await self.on_batch(partition, batch, None, batch[-1].offset + 1)
            for partition, batch in by_partition.items()
        }

    async def on_batch(
        self, partition: int, records: Sequence[RawRecord], fetch_from: int | None, fetch_to: int
    ) -> Admission:
        """Process one fetch of one partition if admission takes it (`fetch_from`/`fetch_to`: the
        consumer's position around it). A GAP changes nothing: the caller seeks back to
        `expected_offset(partition)`. Its offsets are durable with the partition's next persist."""
        async with self._state_lock:
            now = self.clock()
            state = self.partition(partition)
            processor = state.processor
            expected = state.next_offset
            verdict = admit_fetch(
                expected, state.hole_seen, [r.offset for r in records], fetch_from, fetch_to
            )
            state.hole_seen = verdict.hole_seen
            admission = verdict.admission
            if admission.verdict is Verdict.ALREADY_APPLIED:
                self.stats.intake_records_skipped += len(records)
                return admission
            if admission.verdict is Verdict.GAP:
                self.stats.intake_gaps_refused += 1
                self._log_refused(
                    partition, records, fetch_from, fetch_to, expected, verdict.unconfirmed_hole
                )
                return admission
            if verdict.confirmed_hole is not None:
                # Offsets with no record for us (a confirmed hole): counted and logged.
                log.warning(
                    "partition %d: offsets from %d on hold no record (read twice from %d): "
                    "%d skipped up to %d",
                    partition,
                    verdict.confirmed_hole,
                    expected,
                    verdict.hole_offsets,
                    fetch_to,
                )
            self.stats.intake_records_skipped += admission.start
            self.stats.intake_hole_offsets += verdict.hole_offsets
            fresh = records[admission.start :] if admission.start else records
            step = processor.on_records([r.value for r in fresh], now)
            # The checkpoint carries the offset: it is persisted with the state it describes.
            state.next_offset = admission.next_offset
            processor.changes.gate = True
            processor.touch((), (), now)
            if step.flushes:
                state.queue(step.flushes)
            mirror = self.mirror
            if step.mirror and mirror is not None:
                mirror.stage(step.mirror)
                if mirror.behind:
                    await mirror.drain()  # backpressure: Cassandra is behind
            if step.dead_letters or step.notices:
                await self.outbound.send(state, fresh, step.dead_letters, step.notices)
        if state.unpublished:
            if self.background_publish and len(state.unpublished) <= self.max_queued_flushes:
                self.publish_wanted.set()  # the flush scheduler publishes it
            else:
                await self.publish(state)
        return admission

    @staticmethod
    def _log_refused(
        partition: int,
        records: Sequence[RawRecord],
        fetch_from: int | None,
        fetch_to: int,
        expected: int | None,
        unconfirmed_hole: int | None,
    ) -> None:
        if unconfirmed_hole is not None:
            log.warning(
                "partition %d: a fetch (from %s to %s) would skip offsets from %d on: reading "
                "again from %s to confirm",
                partition,
                fetch_from,
                fetch_to,
                unconfirmed_hole,
                expected,
            )
            return
        log.warning(
            "partition %d: refused a batch at offsets %s..%s (fetched from %s): the state "
            "expects offset %s next; reading again from there",
            partition,
            records[0].offset if records else fetch_to,
            records[-1].offset if records else fetch_to,
            fetch_from,
            expected,
        )

    def expected_offset(self, partition: int) -> int | None:
        """Where the partition's state stands in the log (None: not placed yet)."""
        return self.partition(partition).next_offset

    def start_at(self, partition: int, offset: int) -> None:
        """Place a partition that has no offset yet at `offset` (where the intake put the consumer:
        the log start, docs/decisions/0003-input-position-from-the-checkpoint.md)."""
        state = self.partition(partition)
        if state.next_offset is None:
            state.next_offset = offset
            state.processor.changes.gate = True
            if offset > 0:  # begins mid-log: the lanes' counts are baselined (app/domain/arrivals.py)
                state.processor.arrivals.start_mid_stream()
            log.info("partition %d: starting at offset %d", partition, offset)

    def retention_overrun(self, partition: int, log_start: int) -> None:
        """The log starts past the partition's state (entries deleted unread): counted, read on."""
        state = self.partition(partition)
        expected = state.next_offset
        if expected is None or log_start <= expected:
            return
        self.stats.retention_overruns += 1
        self.stats.retention_lost_offsets += log_start - expected
        log.error(
            "partition %d: mailbox-tail starts at offset %d, the checkpoint needs %d: %d entries "
            "were deleted unread (retention overrun); reading on from %d",
            partition,
            log_start,
            expected,
            log_start - expected,
            log_start,
        )
        state.next_offset = log_start
        state.processor.changes.gate = True
        state.processor.arrivals.start_mid_stream()

    def durable_offsets(self) -> dict[int, int]:
        """Per partition, the persisted offset not committed yet (see `offsets_committed`)."""
        return {
            partition: state.durable_offset
            for partition, state in self.partitions.items()
            if state.durable_offset is not None and state.durable_offset != state.committed_offset
        }

    def offsets_committed(self, offsets: dict[int, int]) -> None:
        for partition, offset in offsets.items():
            state = self.partitions.get(partition)
            if state is not None:
                state.committed_offset = offset

    # -- persisting (app/worker/checkpointer.py) -------------------------------------------------

    async def persist(self, state: PartitionState, *, handing_over: bool = False) -> None:
        """See `Checkpointer.persist`."""
        await self.checkpointer.persist(state, handing_over=handing_over)

    # -- flushing (app/worker/publisher.py) ------------------------------------------------------

    @property
    def flush_lock(self) -> asyncio.Lock:
        """Held by every publication of flushes, and by the audit and the repair while they write."""
        return self.publisher.lock

    def next_deadline(self) -> int | None:
        """The earliest time a partition's open window ends (the driver's flush timer)."""
        deadlines = [d for s in self.partitions.values() if (d := s.processor.next_deadline()) is not None]
        return min(deadlines) if deadlines else None

    async def flush_due(self, now: int) -> int:
        """See `Publisher.flush_due`."""
        return await self.publisher.flush_due(now)

    async def flush_all(self) -> int:
        """See `Publisher.flush_all`."""
        return await self.publisher.flush_all()

    async def flush_partition(self, state: PartitionState) -> int:
        """One flush of everything the partition holds (tests, the audit's repair path)."""
        return await self.publisher.flush_partition(state)

    async def publish(self, state: PartitionState, *, now: bool = False) -> int:
        """See `Publisher.publish`."""
        return await self.publisher.publish(state, now=now)

    @property
    def store_failing(self) -> bool:
        """See `Publisher.store_failing`."""
        return self.publisher.store_failing

    def held_flushes(self) -> int:
        return self.publisher.held_flushes()

    def held_rows(self) -> int:
        return self.publisher.held_rows()

    # -- the unread audit's access (app/worker/audit.py) ----------------------------------------

    def holder(self, user_id: int) -> PartitionState | None:
        """The owned partition holding this user's state, if any."""
        for state in self.partitions.values():
            if user_id in state.processor.users:
                return state
        return None
