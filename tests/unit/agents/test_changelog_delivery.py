"""The intake consumer's per-message path (changelog records while a table recovery reads them):
a record counts as read only once it was delivered, and no record of a fetch is delivered or
counted after a rebalance began or a seek moved its partition.

Issue 11's crash run found the loop that did otherwise: after a rebalance began it went on
through the rest of the fetch, counting every abandoned record read, also after the recovery had
sought the partition back to where it stood. The recovery's re-read then dropped those records
as already read and finished with a hole in a worker's local table (a row restored from an older
record; the entries between were lost)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.structs import ConsumerRecord
from faust.transport.drivers import aiokafka as aiokafka_driver
from faust.types import TP
from mode.utils.locks import Event

from agents.batch_intake import BatchIntakeConsumer, BatchIntakeConsumerThread

CHANGELOG = TP("app-rows-changelog", 3)
OTHER = TP("app-users-changelog", 3)


def seek_bookkeeping() -> BatchIntakeConsumerThread:
    """The consumer thread's seek counts, without a Kafka consumer behind them."""
    thread = BatchIntakeConsumerThread.__new__(BatchIntakeConsumerThread)
    thread.partition_seeks = {}
    return thread


class Consumer(BatchIntakeConsumer):
    """`_deliver_each` over a recovery that receives every delivered record (its queue)."""

    def __init__(self) -> None:  # no transport: only what the per-message path reads
        self.thread = seek_bookkeeping()
        self._thread = self.thread
        self._read_offset = {}
        self._commit_every = None
        self._n_acked = 0
        self.flow_active = True
        self.suspend_flow = asyncio.Event()
        self._stopped = Event()
        self._crashed = Event()
        self._loop = asyncio.get_running_loop()
        self.app = SimpleNamespace(
            consumer_generation_id=1, topics=SimpleNamespace(acks_enabled_for=lambda t: False)
        )  # type: ignore[assignment]
        self.received: list[int] = []
        self.on_delivered: Any = None  # a hook run after each delivery (a rebalance arriving)

    def _to_message(self, tp: TP, record: Any) -> Any:
        return SimpleNamespace(tp=tp, topic=tp.topic, offset=record.offset)

    async def callback(self, message: Any) -> None:
        self.received.append(message.offset)
        if self.on_delivered is not None:
            await self.on_delivered(message.offset)

    # What faust does at a rebalance and in the recovery that follows it.
    def stop_flow(self) -> None:
        self.flow_active = False
        self.suspend_flow.set()

    def resume(self, generation: int) -> None:
        self.app.consumer_generation_id = generation
        self.flow_active = True
        self.suspend_flow.clear()

    def seek(self, tp: TP, offset: int) -> None:  # type: ignore[override]
        self.thread._seeking((tp,))
        self._read_offset[tp] = offset  # faust's _seek_wait: re-read from here

    async def fetch(self, tp: TP, offsets: range, generation: int = 1) -> None:
        """One fetch of `tp` delivered (the mark taken as the fetch returned)."""
        records = [
            ConsumerRecord(tp.topic, tp.partition, o, 0, 0, None, b"v", None, 0, 1, ()) for o in offsets
        ]
        await self._deliver_each(tp, records, generation, self.thread.seek_mark(tp))


async def test_every_record_of_a_fetch_is_delivered_in_order_and_counted_read() -> None:
    consumer = Consumer()
    await consumer.fetch(CHANGELOG, range(0, 250))
    assert consumer.received == list(range(250))
    assert consumer._read_offset[CHANGELOG] == 249


async def test_a_rebalance_stops_the_fetch_and_counts_nothing_past_what_was_delivered() -> None:
    consumer = Consumer()

    async def rebalance_at(offset: int) -> None:
        if offset == 40:
            consumer.stop_flow()

    consumer.on_delivered = rebalance_at
    await consumer.fetch(CHANGELOG, range(0, 200))
    assert consumer.received == list(range(41))
    assert consumer._read_offset[CHANGELOG] == 40


async def test_the_recovery_after_a_rebalance_reads_again_everything_it_did_not_receive() -> None:
    """The case the crash run hit: the rebalance stops the flow while a fetch is delivered, the
    recovery seeks the partition back to the last record it received while the old loop is still
    running, then reads from there: every record from the seek on must reach it."""
    consumer = Consumer()
    received_before: list[int] = []
    tasks: list[asyncio.Future[None]] = []

    async def rebalance_then_seek(offset: int) -> None:
        if offset == 40:
            consumer.stop_flow()
            received_before.extend(consumer.received)

            async def recovery() -> None:
                await asyncio.sleep(0)  # the recovery's seek runs while the old loop goes on
                consumer.seek(CHANGELOG, 40)
                consumer.resume(generation=2)

            tasks.append(asyncio.ensure_future(recovery()))

    consumer.on_delivered = rebalance_then_seek
    await consumer.fetch(CHANGELOG, range(0, 200))
    await asyncio.gather(*tasks)  # the recovery's seek is done
    consumer.on_delivered = None
    consumer.received.clear()
    await consumer.fetch(CHANGELOG, range(40, 200), generation=2)
    assert consumer.received == list(range(40, 200))  # 40 again: faust re-reads the last one
    assert received_before == list(range(41))


async def test_a_seek_of_the_partition_makes_the_rest_of_its_fetch_stale() -> None:
    consumer = Consumer()

    async def seek_at(offset: int) -> None:
        if offset == 10:
            consumer.seek(CHANGELOG, 5)

    consumer.on_delivered = seek_at
    await consumer.fetch(CHANGELOG, range(0, 50))
    assert consumer.received == list(range(11))
    assert consumer._read_offset[CHANGELOG] == 5  # the seek's, not overwritten by stale records


async def test_a_seek_of_another_partition_changes_nothing_for_this_one() -> None:
    consumer = Consumer()

    async def seek_other(offset: int) -> None:
        if offset == 10:
            consumer.seek(OTHER, 0)

    consumer.on_delivered = seek_other
    await consumer.fetch(CHANGELOG, range(0, 50))
    assert consumer.received == list(range(50))
    assert consumer._read_offset[CHANGELOG] == 49


async def test_a_delivery_abandoned_by_the_flow_stopping_is_not_counted_read() -> None:
    consumer = Consumer()
    blocked = asyncio.Event()

    async def stuck(offset: int) -> None:
        if offset == 7:
            consumer.stop_flow()
            await blocked.wait()  # the queue is full: the delivery never completes

    consumer.on_delivered = stuck
    await consumer.fetch(CHANGELOG, range(0, 20))
    assert consumer._read_offset[CHANGELOG] == 6


async def test_a_seek_to_the_committed_offsets_makes_no_fetch_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    """faust seeks to the committed offsets after every recovery; aiokafka moves only the
    partitions with a committed offset (never a changelog: taking one for moved abandoned a
    standby's records with nothing to read them again), each after awaiting its offset, so no
    mark can be taken at the right moment: none is (the mailbox it moves is delivered under the
    offset rule)."""
    tail = TP("mailbox-tail", 3)
    thread = seek_bookkeeping()

    async def committed(self: Any) -> dict[TP, int | None]:
        return {CHANGELOG: None, OTHER: 0, tail: 42}

    monkeypatch.setattr(aiokafka_driver.AIOKafkaConsumerThread, "seek_to_committed", committed)
    thread.seeks = 0
    marks = {tp: thread.seek_mark(tp) for tp in (CHANGELOG, OTHER, tail)}
    await thread.seek_to_committed()
    assert {tp: thread.seek_mark(tp) for tp in marks} == marks


async def test_a_fetch_from_the_new_position_taken_while_a_seek_awaits_is_delivered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """faust's _seek_wait seeks, then awaits the positions; a fetch of this thread may return
    records from the new position meanwhile. The mark moved before the seek, not after it: those
    records are current (a mark moved again after the await abandoned them, and nothing read them
    again: a standby's table missed a row's record, the pin the crash run lost)."""

    async def seek_then_await_positions(self: Any, consumer: Any, partitions: Any) -> None:
        await asyncio.sleep(0)

    monkeypatch.setattr(aiokafka_driver.AIOKafkaConsumerThread, "_seek_wait", seek_then_await_positions)
    consumer = Consumer()
    consumer.thread.seeks = 0
    seeking = asyncio.ensure_future(consumer.thread._seek_wait(None, {CHANGELOG: 5}))
    await asyncio.sleep(0)  # the seek is done, its positions awaited
    mark = consumer.thread.seek_mark(CHANGELOG)  # a fetch from offset 5 returns now
    await seeking
    records = [
        ConsumerRecord(CHANGELOG.topic, CHANGELOG.partition, o, 0, 0, None, b"v", None, 0, 1, ())
        for o in range(5, 20)
    ]
    await consumer._deliver_each(CHANGELOG, records, 1, mark)
    assert consumer.received == list(range(5, 20))


async def test_a_changelog_fetch_goes_on_through_a_seek_to_the_committed_offsets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    consumer = Consumer()

    async def committed(self: Any) -> dict[TP, int | None]:
        return {CHANGELOG: None, TP("mailbox-tail", 3): 42}

    monkeypatch.setattr(aiokafka_driver.AIOKafkaConsumerThread, "seek_to_committed", committed)
    consumer.thread.seeks = 0

    async def seek_to_committed_at(offset: int) -> None:
        if offset == 10:
            await consumer.thread.seek_to_committed()

    consumer.on_delivered = seek_to_committed_at
    await consumer.fetch(CHANGELOG, range(0, 50))
    assert consumer.received == list(range(50))
    assert consumer._read_offset[CHANGELOG] == 49
