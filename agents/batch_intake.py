"""Batch topics from faust's consumer to their sinks one fetch at a time: each fetch of one
partition becomes one `RecordBatch` saying where the fetch began and ended in the log. Why, and how
none is lost: docs/decisions/0006-fetch-batches-not-records.md, 0007-no-batch-vanishes.md and
0003-input-position-from-the-checkpoint.md."""

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
    """One fetch's records of one partition in offset order (maybe none), the generation they were
    fetched under, and the consumer's position before (None: unknown) and after the fetch."""

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
        """A fetch of the partition ended at `fetch_to` and its batch is NOT delivered."""
        ...

    def placements(self, partitions: Iterable[int]) -> dict[int, int | None]:
        """Where each of these partitions the sink owns is read from (None: the log start)."""
        ...

    def placed(self, offsets: Mapping[int, int]) -> None:
        """The consumer now reads these partitions from these offsets."""
        ...


# How long the broker may hold a fetch that found no new data (faust's 1.5 s:
# docs/decisions/0006-fetch-batches-not-records.md).
FETCH_MAX_WAIT_MS = 100


# One fetch's positions per partition: (before, or None when unknown; after).
FetchPositions = dict[TP, tuple[int | None, int]]


class BatchIntakeConsumerThread(aiokafka_driver.AIOKafkaConsumerThread):
    """faust's consumer thread: where a fetch began and ended (docs/decisions/0007-no-batch-vanishes.md)."""

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
        # A copy in one C call: faust's event-loop thread changes this set meanwhile.
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
        """Seek each partition to its offset (None: the log start); returns where each was put."""
        result: dict[TP, int] = await self.call_thread(self._place, self._ensure_consumer(), offsets)
        return result

    async def _place(self, consumer: Any, offsets: Mapping[TP, int | None]) -> dict[TP, int]:
        placed: dict[TP, int] = {}
        for tp, wanted in offsets.items():
            offset = wanted
            if offset is None:
                # No checkpoint: the log start (docs/decisions/0003-input-position-from-the-checkpoint.md).
                offset = (await consumer.beginning_offsets([tp]))[tp]
            self.seeks += 1
            consumer.seek(tp, offset)
            placed[tp] = offset
        return placed

    # Counted before AND after: faust seeks from either thread; hole confirmation catches the rest.
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
                    # Fetched while the flow was stopped: dropped, back to the committed offsets.
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
        # Abandoned when the flow stops (as faust does): refused as a gap next, or noticed missing.
        await self.wait_first(
            sink.deliver(RecordBatch(generation, tp.partition, records, fetch_from, fetch_to)),
            self.suspend_flow.wait(),
        )

    async def perform_seek(self) -> None:
        """faust's seek to the committed offsets, then batch partitions where their checkpoint says."""
        try:
            await super().perform_seek()
            for topic, sink in cast(ProjectorApp, self.app).batch_sinks.items():
                wanted = sink.placements(tp.partition for tp in self.assignment() if tp.topic == topic)
                if wanted:
                    sink.placed(await self.place(topic, wanted))
        except IllegalStateError as exc:
            # A rebalance took a partition away mid-seek: the next assignment seeks again.
            self.log.info("seek interrupted by a rebalance (%s): the next assignment seeks again", exc)

    async def place(self, topic: str, offsets: Mapping[int, int | None]) -> dict[int, int]:
        """Put batch partitions at these offsets; returns where each was put."""
        thread = cast(BatchIntakeConsumerThread, self._thread)
        placed = await thread.place({TP(topic, p): offset for p, offset in offsets.items()})
        return {tp.partition: offset for tp, offset in placed.items()}


class BatchIntakeTransport(aiokafka_driver.Transport):
    Consumer = BatchIntakeConsumer


class BatchChannel(faust.Channel[RecordBatch]):
    """A channel `flow_control.resume()` never clears (docs/decisions/0007-no-batch-vanishes.md)."""

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
        # Run on a clean stop while the consumer still works: persist hot state and commit.
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
    """Commit batch-topic offsets through faust's consumer (it flushes the producer first)."""
    if not offsets:
        return False
    consumer: Any = app.consumer
    return bool(await consumer._commit_offsets({TP(topic, p): o for p, o in offsets.items()}))


def raw_producer(app: faust.App) -> Any:
    """The aiokafka producer under faust's: frames go out through it in whole batches."""
    producer: Any = app.producer
    return producer._ensure_producer()
