"""Mailbox-tail records from faust's consumer to the mailbox agent one fetch at a time.

faust-streaming 0.15's fetch loop hands every record to the conductor inside `wait_first`
(four tasks and an `asyncio.wait` per record), then through a channel queue, a stream and
`take_events`. Measured here: ~100 µs of CPU per record, 5-10k records/s, about a fifth of what
the same consumer fetches; removing only the per-record `wait_first` still left ~35 µs.

What stays faust's: the consumer (its aiokafka driver, fetcher thread, group membership,
rebalances, seeks to committed offsets), the agent (supervised, iterating a faust channel), the
tables. What changes, for the topics registered in `ProjectorApp.batch_sinks` only: each fetch's
records of one partition become ONE `RecordBatch` sent to the agent's in-memory channel, so
faust's per-event machinery runs once per fetch instead of once per record. Every other topic
(changelogs during recovery, any other agent) keeps faust's per-message path, unchanged.

Batch topics are never acked to faust, so faust never commits their offsets: the worker commits
them itself once a batch's effects are durable in the changelog tables (`agents/mailbox.py`),
which also keeps faust-streaming's commit-past-processing bugs (#312/#606) out of the way.

No batch may vanish on its way (issue 11: a range of entries was lost after a restart). Each batch
carries where its fetch began and ended in the log (the consumer's positions before and after,
read in the consumer's thread around the fetch), so the worker can tell a batch that continues
its state from one that does not (app/worker/offsets.py); the channel to the agent is never
emptied behind the intake's back (faust's own channels are: see `BatchChannel`); and every place
that puts the consumer somewhere (faust's seek to the committed offsets after a rebalance) is
followed by putting the batch partitions where their state stands (`BatchSink.placements`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, NamedTuple, Protocol, cast
from urllib.parse import urlparse

import faust
from aiokafka.errors import IllegalStateError
from faust.transport.consumer import CONSUMER_FETCHING
from faust.transport.drivers import aiokafka as aiokafka_driver
from faust.types import TP

from app.worker.ports import RawRecord, raw_record

log = logging.getLogger("projector.worker")


class RecordBatch(NamedTuple):
    """One fetch's records of one partition, in offset order, and the consumer generation
    (group assignment) they were fetched under: a batch of an older generation is stale.
    `fetch_from`/`fetch_to`: the consumer's position before and after the fetch (`fetch_from`
    None when a seek or a reassignment during the fetch makes it unknown). `records` may be
    empty: the fetch only moved the position past offsets that hold no record."""

    generation: int
    partition: int
    records: list[RawRecord]
    fetch_from: int | None
    fetch_to: int


class BatchSink(Protocol):
    """Where a batch topic's fetches go (the mailbox intake)."""

    async def deliver(self, batch: RecordBatch) -> None:
        """Hand the batch on (may wait while the agent is busy)."""
        ...

    def fetched(self, partition: int, fetch_to: int) -> None:
        """A fetch of the partition ended at `fetch_to` and its batch is NOT delivered (the
        intake's check that nothing fetched went missing; `deliver` says it for the others)."""
        ...

    def placements(self, partitions: Iterable[int]) -> dict[int, int | None]:
        """After the consumer was put at the group's committed offsets: where each of these
        partitions that the sink owns must be read from (None: the committed offset, else the
        log start)."""
        ...

    def placed(self, offsets: Mapping[int, int]) -> None:
        """The consumer now reads these partitions from these offsets."""
        ...


# How long the broker may hold a fetch that found no new data. faust hard-codes 1.5 s; measured
# here, with records arriving every few ms, fetches still sat out the whole wait now and then
# (getmany returned nothing for 1 s, then 1.5 s of records at once: p50 latency 1.2 s at a
# 100 ms window). Kafka's own consumer default is 500 ms; an idle worker makes 10 requests/s.
FETCH_MAX_WAIT_MS = 100


# One fetch's positions per partition: (before, or None when unknown; after).
FetchPositions = dict[TP, tuple[int | None, int]]
# How often a partition was moved by a seek: see BatchIntakeConsumerThread.seek_mark.
SeekMark = int


class BatchIntakeConsumerThread(aiokafka_driver.AIOKafkaConsumerThread):
    """faust's consumer thread, telling where each fetch began and ended in the log.

    aiokafka returns a partition's records only from its current position (a buffered fetch for
    another position is dropped) and moves the position past what it returns, including offsets
    that hold no record for a consumer (transaction markers, aborted or compacted records). So
    the position read just before the fetch and just after it bound exactly the stretch of log
    the fetch covered, provided nothing moved the consumer meanwhile: every seek passes through
    this class and is counted, and a reassignment replaces the partitions' state objects."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seeks = 0  # every seek of the consumer, whoever asks for it
        # Per partition, the seeks that moved it: its seek mark. A fetched record is stale once
        # its partition's mark moved (`seek_mark`).
        self.partition_seeks: dict[TP, int] = {}
        self.last_fetch: FetchPositions = {}
        self.last_fetch_marks: dict[TP, SeekMark] = {}

    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        consumer._fetch_max_wait_ms = FETCH_MAX_WAIT_MS  # read by its fetcher at start()
        return consumer

    async def _fetch_records(
        self,
        consumer: Any,
        active_partitions: Any,
        timeout: float | None = None,
        max_records: int | None = None,
    ) -> Any:
        seeks = self.seeks
        assignment = consumer._subscription.subscription
        assignment = assignment.assignment if assignment is not None else None
        # A copy, taken in one C call: faust's event-loop thread pauses and resumes partitions
        # in this very set while this thread iterates it ("Set changed size during iteration"
        # stopped a worker's fetcher in a crash run).
        partitions = tuple(active_partitions or ())
        before = _positions(assignment, partitions)
        records = await super()._fetch_records(
            consumer, active_partitions, timeout=timeout, max_records=max_records
        )
        # No await since the fetch returned: these are the positions right after it.
        now = consumer._subscription.subscription
        now = now.assignment if now is not None else None
        after = _positions(now, partitions)
        moved_by_others = self.seeks != seeks or now is not assignment
        # Taken right after the fetch returned (records are from the position as it was then):
        # a seek of a partition after this makes the rest of its records stale (`seek_mark`).
        self.last_fetch_marks = {tp: self.seek_mark(tp) for tp in records}
        positions: FetchPositions = {}
        for tp, end in after.items():
            if end is None:
                continue
            start = before.get(tp)
            if tp in records or (start is not None and end != start and not moved_by_others):
                positions[tp] = (None if moved_by_others else start, end)
        self.last_fetch = positions
        return records

    def seek_mark(self, tp: TP) -> SeekMark:
        """A count that moves once, just BEFORE something moves `tp`'s position (no fetch in
        between). Records fetched under an older mark are read again from where the seek put
        the partition; records fetched under the new one may be delivered. Two rules learnt the
        hard way, each a hole in a standby's table: only a partition really moved counts (a seek
        to the committed offsets leaves a changelog partition, which has none, where it is), and
        the mark never moves AFTER the seek (a fetch from the new position taken in between
        would be abandoned with nothing to read it again)."""
        return self.partition_seeks.get(tp, 0)

    def _seeking(self, partitions: Iterable[TP]) -> None:
        for tp in partitions:
            self.partition_seeks[tp] = self.partition_seeks.get(tp, 0) + 1

    async def place(self, offsets: Mapping[TP, int | None]) -> dict[TP, int]:
        """Seek each partition to its offset (None: the group's committed offset, else the log
        start); returns where each was put."""
        result: dict[TP, int] = await self.call_thread(self._place, self._ensure_consumer(), offsets)
        return result

    async def _place(self, consumer: Any, offsets: Mapping[TP, int | None]) -> dict[TP, int]:
        placed: dict[TP, int] = {}
        for tp, wanted in offsets.items():
            offset = wanted
            if offset is None:
                committed = await consumer.committed(tp)
                if committed is not None and committed >= 0:
                    offset = committed
                else:
                    offset = (await consumer.beginning_offsets([tp]))[tp]
            self.seeks += 1
            self._seeking((tp,))  # then the seek, with no await between (see `seek_mark`)
            consumer.seek(tp, offset)
            placed[tp] = offset
        return placed

    # Counted before AND after: faust runs some seeks from the event loop's thread (a direct
    # `seek`) or hands them to this thread to run later (`seek_to_committed`), so a fetch may
    # read the count between the first increment and the seek itself. The second increment
    # catches most of those; the worker core's hole confirmation (app/worker/offsets.py) the rest.
    def seek(self, partition: TP, offset: int) -> None:
        self.seeks += 1
        self._seeking((partition,))
        super().seek(partition, offset)
        self.seeks += 1

    async def _seek_wait(self, consumer: Any, partitions: Mapping[TP, int]) -> None:
        self.seeks += 1
        # faust's _seek_wait seeks every partition before its first await: no fetch of this
        # thread runs between the marks and the seeks.
        self._seeking(partitions)
        await super()._seek_wait(consumer, seekable_offsets(partitions))
        self.seeks += 1

    async def seek_to_committed(self) -> Mapping[TP, int]:
        self.seeks += 1
        try:
            committed = await super().seek_to_committed()
        finally:
            self.seeks += 1
        # No seek marks: aiokafka awaits each partition's committed offset before it seeks it, so
        # a mark taken before or after could abandon records fetched from the new position. It
        # moves only partitions with a committed offset (the mailbox, delivered in batches under
        # the offset rule; never a changelog), and faust's perform_seek then sets their read
        # offsets over anything delivered meanwhile.
        return committed

    async def seek_to_beginning(self, *partitions: Any) -> None:
        moved = partitions or tuple(self._ensure_consumer().assignment())  # none named: every one
        self.seeks += 1
        self._seeking(moved)
        await super().seek_to_beginning(*partitions)
        self.seeks += 1


def _positions(assignment: Any, partitions: Iterable[TP]) -> dict[TP, int | None]:
    """The consumer's position per partition (None: not assigned, or waiting for a reset)."""
    if assignment is None:
        return {}
    positions: dict[TP, int | None] = {}
    for tp in partitions:
        try:
            state = assignment.state_value(tp)
        except (KeyError, AssertionError):
            continue
        if state is None:
            continue
        positions[tp] = state.position if state.has_valid_position else None
    return positions


def seekable_offsets(partitions: Mapping[TP, Any]) -> dict[TP, int]:
    """The offsets faust's table recovery asks to seek its changelog partitions to, each one a
    position aiokafka accepts.

    Why: faust maps an unknown offset (-1) to 0, the changelog's start, but a rebalance that
    lands while a recovery is running re-registers a standby partition without a persisted
    offset as None after the offsets were built (faust's `Recovery._add`), and the running
    recovery then seeks to it: "Offset must be a positive integer" raised in the recovery
    service, which stopped the worker (issue 18's 20-kill run). Reading a changelog from its
    start is always safe (its records are upserts of whole values, applied again in order), so
    any such value gets faust's own rule for -1, with a warning naming it."""
    seekable: dict[TP, int] = {}
    for tp, offset in partitions.items():
        if isinstance(offset, int) and not isinstance(offset, bool) and offset >= 0:
            seekable[tp] = offset
        else:
            log.warning("changelog %s: asked to seek to %r, read from its start instead", tp, offset)
            seekable[tp] = 0
    return seekable


class BatchIntakeConsumer(aiokafka_driver.Consumer):
    """faust's aiokafka consumer; batch topics bypass the per-record conductor path."""

    def _new_consumer_thread(self) -> aiokafka_driver.AIOKafkaConsumerThread:
        return BatchIntakeConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def _drain_messages(self, fetcher: Any) -> None:  # the fetcher service's loop
        sinks = cast(ProjectorApp, self.app).batch_sinks
        consumer_should_stop = self._stopped.is_set
        fetcher_should_stop = fetcher._stopped.is_set
        thread = cast(BatchIntakeConsumerThread, self._thread)
        try:
            while not (consumer_should_stop() or fetcher_should_stop()):
                self.diag.set_flag(CONSUMER_FETCHING)
                records, active = await self._wait_next_records(1.0)
                positions = thread.last_fetch  # this fetch's, written before it returned
                marks = thread.last_fetch_marks
                generation = self.app.consumer_generation_id
                # faust sleeps here too: a getmany answered at once must not starve the loop.
                await self.sleep(0)
                if self.should_stop:
                    break
                if not self.flow_active:
                    # Fetched while the flow was stopped (a rebalance): faust's rule is to drop
                    # them and go back to the committed offsets.
                    if records:
                        await self.perform_seek()
                    continue
                # Batch partitions whose fetch moved past offsets without a record for us.
                for tp, (fetch_from, fetch_to) in positions.items():
                    sink = sinks.get(tp.topic)
                    if sink is not None and tp not in (records or {}):
                        await self._deliver_batch(sink, tp, [], fetch_from, fetch_to, generation)
                if not records:
                    continue
                for tp, fetched in records.items():
                    if not self.flow_active or self.app.consumer_generation_id != generation:
                        break  # a rebalance began: the rest is re-read after its seek
                    if active is not None and tp not in active and tp not in self._buffered_partitions:
                        if tp in positions and tp.topic in sinks:  # fetched, never delivered
                            sinks[tp.topic].fetched(tp.partition, positions[tp][1])
                        continue
                    self.app.monitor.track_tp_end_offset(tp, self.highwater(tp))
                    sink = sinks.get(tp.topic)
                    if sink is None:
                        await self._deliver_each(tp, fetched, generation, marks.get(tp))
                        continue
                    fetch_from, fetch_to = positions.get(tp, (None, fetched[-1].offset + 1))
                    batch = [raw_record(r.topic, r.partition, r.offset, r.key, r.value) for r in fetched]
                    await self._deliver_batch(sink, tp, batch, fetch_from, fetch_to, generation)
                self.diag.unset_flag(CONSUMER_FETCHING)
        except self.consumer_stopped_errors:
            if self.transport.app.should_stop:
                return  # stopping: faust ignores it too
            raise

    async def _deliver_batch(
        self,
        sink: BatchSink,
        tp: TP,
        records: list[RawRecord],
        fetch_from: int | None,
        fetch_to: int,
        generation: int,
    ) -> None:
        # Like faust per message: a flow stopped while the agent's channel is full abandons the
        # batch. Nothing is lost by it: the partition's next batch does not continue its state
        # (refused and read again), and the intake notices a fetch that never arrived.
        await self.wait_first(
            sink.deliver(RecordBatch(generation, tp.partition, records, fetch_from, fetch_to)),
            self.suspend_flow.wait(),
        )

    async def perform_seek(self) -> None:
        """faust's seek to the committed offsets (after every rebalance, and when a fetch came
        in while the flow was stopped), then each owned batch partition put where its state
        stands in the log: the committed offset may be behind it (or, for a new partition,
        absent)."""
        try:
            await super().perform_seek()
            for topic, sink in cast(ProjectorApp, self.app).batch_sinks.items():
                wanted = sink.placements(tp.partition for tp in self.assignment() if tp.topic == topic)
                if wanted:
                    sink.placed(await self.place(topic, wanted))
        except IllegalStateError as exc:
            # A rebalance took a partition away while the seek awaited its committed offset
            # (aiokafka's seek_to_committed reads the assignment, awaits, then seeks): it stopped
            # the worker in issue 18's 20-kill run. The new assignment gets its own recovery and
            # seek; until then nothing is applied from a position the state did not choose (the
            # intake takes a batch only where the partition's state continues).
            self.log.info("seek interrupted by a rebalance (%s): the next assignment seeks again", exc)

    async def place(self, topic: str, offsets: Mapping[int, int | None]) -> dict[int, int]:
        """Put batch partitions at these offsets (None: the committed offset, else the log
        start); returns where each was put."""
        thread = cast(BatchIntakeConsumerThread, self._thread)
        placed = await thread.place({TP(topic, p): offset for p, offset in offsets.items()})
        return {tp.partition: offset for tp, offset in placed.items()}

    async def _deliver_each(
        self, tp: TP, fetched: Iterable[Any], generation: int, mark: SeekMark | None
    ) -> None:
        """faust's own per-message path (gaps, commit_every, flow suspension) for other topics:
        the changelogs while a recovery reads them.

        A record is delivered only while its fetch is current, and counted read only once it
        was delivered. faust's `getmany` stops at every record once a rebalance begins; a copy
        of this loop that checked only per partition went on through the rest of a fetch
        after one: each record's delivery was abandoned (the flow stopped) but its offset
        counted read, possibly after the recovery had already sought back to where it stood.
        The recovery then dropped the records it re-read as read, took the later ones, and
        declared itself complete with a hole: a worker's local table lacked a row record its
        changelog held, the row was restored from an older record, and the entries between were
        never applied again (issue 11's crash run: 5 rows of 4 users, one missing 56 entries,
        after a recovery from an empty data dir was interrupted by a rebalance)."""
        thread = cast(BatchIntakeConsumerThread, self._thread)
        read_offsets = self._read_offset
        for count, record in enumerate(fetched, 1):
            if count % 100 == 0:
                await asyncio.sleep(0)
            if not self._fetch_current(generation, thread, tp, mark):
                return  # what is left is read again from where the seek put the partition
            message = self._to_message(tp, record)
            offset = message.offset
            read_from = read_offsets.get(tp)
            if read_from is not None and offset < read_from:
                continue
            if read_from and offset - read_from > 1 and self.app.topics.acks_enabled_for(message.topic):
                await self._add_gap(tp, read_from + 1, offset)
            if self._commit_every is not None and self._n_acked >= self._commit_every:
                self._n_acked = 0
                await self.commit()
            delivery = self.callback(message)
            outcome = await self.wait_first(delivery, self.suspend_flow.wait())
            if delivery not in outcome.done:
                return  # abandoned (the flow stopped): not delivered, not read
            if mark is not None and thread.seek_mark(tp) != mark:
                return  # a seek overtook it: the read offset is the seek's now
            read_offsets[tp] = offset

    def _fetch_current(
        self, generation: int, thread: BatchIntakeConsumerThread, tp: TP, mark: SeekMark | None
    ) -> bool:
        """The records of the fetch that `generation` and `mark` describe may still be
        delivered: no rebalance began and nothing sought their partition since."""
        return (
            self.flow_active
            and self.app.consumer_generation_id == generation
            and (mark is None or thread.seek_mark(tp) == mark)
        )


class BatchIntakeTransport(aiokafka_driver.Transport):
    Consumer = BatchIntakeConsumer


class BatchChannel(faust.Channel[RecordBatch]):
    """An in-memory channel whose queue is never emptied by faust.

    faust's channels are cleared on EVERY `app.flow_control.resume()`, and faust calls it after
    the seek that ends a rebalance's recovery: a batch fetched between that seek and the clear
    was silently dropped while the consumer's position was already past it. The next batch was
    applied and its offsets committed: the dropped range was lost for good (issue 11), or, when
    no later batch came, the worker waited forever with entries unapplied. A stale batch in this
    channel is harmless: the intake drops it (older generation, partition not owned) or the offset
    rule does (already applied, or a gap read again)."""

    @property
    def queue(self) -> Any:
        if self._queue is None:
            maxsize = self.maxsize if self.maxsize is not None else self.app.conf.stream_buffer_maxsize
            self._queue = self.app.FlowControlQueue(maxsize=maxsize, clear_on_resume=False)
        return self._queue


class ProjectorApp(faust.App):
    """A faust App whose Kafka consumer delivers the `batch_sinks` topics in fetch batches."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.batch_sinks: dict[str, BatchSink] = {}
        # Run on a clean stop while the consumer and the tables still work (faust closes both
        # before its own shutdown signal): the place to persist hot state and commit.
        self.before_consumer_stop: list[Callable[[], Awaitable[None]]] = []
        # The consumer generation whose partitions were last revoked (a rebalance began), and the
        # one whose table recovery is completing now (see `recovery_is_current`).
        self.revoked_generation: int | None = None
        self.recovering_generation: int | None = None
        super().__init__(*args, **kwargs)

    def on_rebalance_start(self) -> None:
        # Called by the consumer at the very start of every revocation, before any await.
        self.revoked_generation = self.consumer_generation_id
        super().on_rebalance_start()

    def track_recoveries(self) -> None:
        """Note which generation each table recovery is completing for (call once the tables
        are declared): faust's `on_recovery_completed(generation)` sends `on_rebalance_complete`
        before it checks that its generation is still the consumer's."""
        recovery: Any = self.tables.recovery  # type: ignore[attr-defined]  # TableManager's
        completed = recovery.on_recovery_completed

        async def on_recovery_completed(generation_id: int = 0) -> None:
            self.recovering_generation = generation_id
            try:
                await completed(generation_id)
            finally:
                self.recovering_generation = None

        recovery.on_recovery_completed = on_recovery_completed
        self._watch_changelog_queue()

    def _watch_changelog_queue(self) -> None:
        """faust empties its changelog queue on every `flow_control.resume()` and `clear()`:
        records fetched (the consumer's position is past them) and never applied. Each table is
        told which of its records went that way (`tables/state.WorkerTable`), so its next
        recovery reads through the hole instead of past it."""
        manager: Any = self.tables
        queue = manager.changelog_queue
        changelogs = manager._changelogs  # changelog topic -> table
        clear = queue.clear

        def clear_and_note() -> None:
            noted = 0
            for event in list(queue._queue):
                message = getattr(event, "message", None)
                if message is None:
                    continue
                table = changelogs.get(message.topic)
                note = getattr(table, "changelog_records_dropped", None)
                if note is not None:
                    note(message.partition, message.offset)
                    noted += 1
            clear()
            if noted:
                log.info(
                    "faust cleared %d changelog records before applying them: their partitions "
                    "are read again from there at their next recovery",
                    noted,
                )

        queue.clear = clear_and_note

    @property
    def recovery_is_current(self) -> bool:
        """The `on_rebalance_complete` being sent ends the recovery of the current assignment.

        faust sends it when a recovery completes even when a newer rebalance began meanwhile,
        and by then the assignor may already hold the newer assignment, whose partitions no
        recovery has read yet. A worker that restored them then (issue 11 again: a CI crash run
        two rows one message short) read a data dir that had just been lost: no gate, no
        waiting entries; the partition started at its committed offset and the entries that
        were waiting there were never applied. The newer generation's own recovery completes
        later and restores them; until then nothing is restored."""
        generation = self.recovering_generation
        if generation is None:  # sent by faust without a table recovery
            generation = self.consumer_generation_id
        return generation == self.consumer_generation_id and self.revoked_generation != generation

    async def _stop_consumer(self) -> None:
        for hook in self.before_consumer_stop:
            try:
                await hook()
            except Exception:  # a stop goes on: what was not committed is read again
                self.log.exception("before_consumer_stop hook %r failed", hook)
        await super()._stop_consumer()

    def _new_transport(self) -> Any:
        url = self.conf.broker_consumer[0]
        if urlparse(str(url)).scheme not in ("kafka", "aiokafka"):
            raise ValueError(f"the projector worker needs a kafka:// broker, not {url}")
        return BatchIntakeTransport(self.conf.broker_consumer, self)

    def route_batches(self, topic: Any, sink: BatchSink) -> None:
        """Deliver `topic` in fetch batches to `sink`; the consumer still subscribes to it."""
        self.batch_sinks[topic.get_topic_name()] = sink
        self.topics.add(topic)


async def commit_offsets(app: faust.App, offsets: dict[int, int], topic: str) -> bool:
    """Commit batch-topic offsets through faust's consumer (it flushes the producer first, so
    every changelog record sent before is delivered, and it skips partitions no longer ours)."""
    if not offsets:
        return False
    consumer: Any = app.consumer
    return bool(await consumer._commit_offsets({TP(topic, p): o for p, o in offsets.items()}))
