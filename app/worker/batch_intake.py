"""Mailbox-tail records from faust's consumer to the mailbox agent one fetch at a time.

faust-streaming 0.15's fetch loop hands every record to the conductor inside `wait_first`
(four tasks and an `asyncio.wait` per record), then through a channel queue, a stream and
`take_events`. Measured here: ~100 µs of CPU per record, 5-10k records/s, about a fifth of what
the same consumer fetches; removing only the per-record `wait_first` still left ~35 µs.

What stays faust's: the consumer (its aiokafka driver, fetcher thread, group membership,
rebalances, seeks to committed offsets), the agent (supervised, iterating a faust channel), the
tables. What changes, for the topics registered in `ProjectorApp.batch_routes` only: each fetch's
records of one partition become ONE `RecordBatch` sent to the agent's in-memory channel, so
faust's per-event machinery runs once per fetch instead of once per record. Every other topic
(changelogs during recovery, any other agent) keeps faust's per-message path, unchanged.

Batch topics are never acked to faust, so faust never commits their offsets: the worker commits
them itself once a batch's effects are durable in the changelog tables (`agents/mailbox.py`),
which also keeps faust-streaming's commit-past-processing bugs (#312/#606) out of the way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, NamedTuple, cast
from urllib.parse import urlparse

import faust
from faust.transport.consumer import CONSUMER_FETCHING
from faust.transport.drivers import aiokafka as aiokafka_driver
from faust.types import TP

from app.worker.ports import RawRecord, raw_record


class RecordBatch(NamedTuple):
    """One fetch's records of one partition, in offset order, and the consumer generation
    (group assignment) they were fetched under: a batch of an older generation is stale."""

    generation: int
    partition: int
    records: list[RawRecord]


BatchRoute = Callable[[RecordBatch], Awaitable[None]]


# How long the broker may hold a fetch that found no new data. faust hard-codes 1.5 s; measured
# here, with records arriving every few ms, fetches still sat out the whole wait now and then
# (getmany returned nothing for 1 s, then 1.5 s of records at once: p50 latency 1.2 s at a
# 100 ms window). Kafka's own consumer default is 500 ms; an idle worker makes 10 requests/s.
FETCH_MAX_WAIT_MS = 100


class BatchIntakeConsumerThread(aiokafka_driver.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        consumer._fetch_max_wait_ms = FETCH_MAX_WAIT_MS  # read by its fetcher at start()
        return consumer


class BatchIntakeConsumer(aiokafka_driver.Consumer):
    """faust's aiokafka consumer; batch topics bypass the per-record conductor path."""

    def _new_consumer_thread(self) -> aiokafka_driver.AIOKafkaConsumerThread:
        return BatchIntakeConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def _drain_messages(self, fetcher: Any) -> None:  # the fetcher service's loop
        routes = cast(ProjectorApp, self.app).batch_routes
        consumer_should_stop = self._stopped.is_set
        fetcher_should_stop = fetcher._stopped.is_set
        read_offsets = self._read_offset
        try:
            while not (consumer_should_stop() or fetcher_should_stop()):
                self.diag.set_flag(CONSUMER_FETCHING)
                records, active = await self._wait_next_records(1.0)
                generation = self.app.consumer_generation_id
                # faust sleeps here too: a getmany answered at once must not starve the loop.
                await self.sleep(0)
                if self.should_stop:
                    break
                if not records:
                    continue
                if not self.flow_active:
                    # Fetched while the flow was stopped (a rebalance): faust's rule is to drop
                    # them and go back to the committed offsets.
                    await self.perform_seek()
                    continue
                for tp, fetched in records.items():
                    if not self.flow_active or self.app.consumer_generation_id != generation:
                        break  # a rebalance began: the rest is re-read after its seek
                    if active is not None and tp not in active and tp not in self._buffered_partitions:
                        continue
                    self.app.monitor.track_tp_end_offset(tp, self.highwater(tp))
                    route = routes.get(tp.topic)
                    if route is None:
                        await self._deliver_each(tp, fetched)
                        continue
                    read_from = read_offsets.get(tp)
                    batch = [
                        raw_record(r.topic, r.partition, r.offset, r.key, r.value)
                        for r in fetched
                        if read_from is None or r.offset >= read_from
                    ]
                    if not batch:
                        continue
                    # Like faust per message: a flow stopped while the agent's channel is full
                    # abandons the batch (the seek after the rebalance reads it again).
                    await self.wait_first(
                        route(RecordBatch(generation, tp.partition, batch)), self.suspend_flow.wait()
                    )
                    read_offsets[tp] = batch[-1].offset
                self.diag.unset_flag(CONSUMER_FETCHING)
        except self.consumer_stopped_errors:
            if self.transport.app.should_stop:
                return  # stopping: faust ignores it too
            raise

    async def _deliver_each(self, tp: TP, fetched: Iterable[Any]) -> None:
        """faust's own per-message path (gaps, commit_every, flow suspension) for other topics."""
        read_offsets = self._read_offset
        for count, record in enumerate(fetched, 1):
            if count % 100 == 0:
                await asyncio.sleep(0)
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
            await self.wait_first(self.callback(message), self.suspend_flow.wait())
            read_offsets[tp] = offset


class BatchIntakeTransport(aiokafka_driver.Transport):
    Consumer = BatchIntakeConsumer


class ProjectorApp(faust.App):
    """A faust App whose Kafka consumer delivers the `batch_routes` topics in fetch batches."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.batch_routes: dict[str, BatchRoute] = {}
        # Run on a clean stop while the consumer and the tables still work (faust closes both
        # before its own shutdown signal): the place to persist hot state and commit.
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

    def route_batches(self, topic: Any, route: BatchRoute) -> None:
        """Deliver `topic` in fetch batches to `route`; the consumer still subscribes to it."""
        self.batch_routes[topic.get_topic_name()] = route
        self.topics.add(topic)


async def commit_offsets(app: faust.App, offsets: dict[int, int], topic: str) -> bool:
    """Commit batch-topic offsets through faust's consumer (it flushes the producer first, so
    every changelog record sent before is delivered, and it skips partitions no longer ours)."""
    if not offsets:
        return False
    consumer: Any = app.consumer
    return bool(await consumer._commit_offsets({TP(topic, p): o for p, o in offsets.items()}))
