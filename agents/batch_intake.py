"""Mailbox-tail records from faust's consumer to the mailbox agent one fetch at a time.

faust-streaming 0.15's fetch loop hands every record to the conductor inside `wait_first`
(four tasks and an `asyncio.wait` per record), then through a channel queue, a stream and
`take_events`. Measured here: ~100 µs of CPU per record, 5-10k records/s, about a fifth of what
the same consumer fetches; removing only the per-record `wait_first` still left ~35 µs.

What stays faust's: the consumer (its aiokafka driver, fetcher thread, group membership,
rebalances), the agent (supervised, iterating a faust channel). faust has no tables here: the
state, its changelog and the input position are the worker's own (tables/durable). For the
topics registered in `ProjectorApp.batch_sinks` (the only ones the worker consumes): each fetch's
records of one partition become ONE `RecordBatch` sent to the agent's in-memory channel, so
faust's per-event machinery runs once per fetch instead of once per record.

The private faust/aiokafka members the worker relies on are all used in this module, and each
is pinned by tests/unit/agents/test_private_members.py (signature and the behaviour relied on).

Batch topics are never acked to faust, so faust never commits their offsets: the worker commits
them itself, for lag monitoring only, once a batch's effects are in a checkpoint; where a
partition is read from comes from its checkpoint (`BatchSink.placements`), never from the group.

No batch may vanish on its way (issue 11: a range of entries was lost after a restart). Each batch
carries where its fetch began and ended in the log (the consumer's positions before and after,
read in the consumer's thread around the fetch), so the worker can tell a batch that continues
its state from one that does not (app/worker/offsets.py); the channel to the agent is never
emptied behind the intake's back (faust's own channels are: see `BatchChannel`); and every place
that puts the consumer somewhere (faust's seek to the committed offsets after a rebalance) is
followed by putting the batch partitions where their checkpoint says (`BatchSink.placements`).
"""

from __future__ import annotations

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
        self.last_fetch: FetchPositions = {}

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
        positions: FetchPositions = {}
        for tp, end in after.items():
            if end is None:
                continue
            start = before.get(tp)
            if tp in records or (start is not None and end != start and not moved_by_others):
                positions[tp] = (None if moved_by_others else start, end)
        self.last_fetch = positions
        return records

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
                # No checkpoint: the partition's state is empty, so it starts at the log start
                # (a committed group offset says nothing about state that is not there).
                offset = (await consumer.beginning_offsets([tp]))[tp]
            self.seeks += 1
            consumer.seek(tp, offset)
            placed[tp] = offset
        return placed

    # Counted before AND after: faust runs some seeks from the event loop's thread (a direct
    # `seek`) or hands them to this thread to run later (`seek_to_committed`), so a fetch may
    # read the count between the first increment and the seek itself. The second increment
    # catches most of those; the worker core's hole confirmation (app/worker/offsets.py) the rest.
    def seek(self, partition: TP, offset: int) -> None:
        self.seeks += 1
        super().seek(partition, offset)
        self.seeks += 1

    async def seek_to_committed(self) -> Mapping[TP, int]:
        self.seeks += 1
        try:
            committed = await super().seek_to_committed()
        finally:
            self.seeks += 1
        return committed

    async def seek_to_beginning(self, *partitions: Any) -> None:
        self.seeks += 1
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
                    if sink is None:  # the worker consumes its batch topics only
                        self.log.warning(
                            "%d records of %s fetched with no batch sink: ignored", len(fetched), tp
                        )
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
        # Run on a clean stop while the consumer still works (faust closes it before its own
        # shutdown signal): the place to persist hot state and commit.
        self.before_consumer_stop: list[Callable[[], Awaitable[None]]] = []
        super().__init__(*args, **kwargs)

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


def raw_producer(app: faust.App) -> Any:
    """The aiokafka producer under faust's (its driver starts it on first use): the worker's
    frames go out through it in whole batches (app/kafka/batches.py), without faust's per-record
    send path."""
    producer: Any = app.producer
    return producer._ensure_producer()
