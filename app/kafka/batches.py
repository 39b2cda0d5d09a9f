"""Produce many records with few calls: one aiokafka batch per (topic, partition).

The worker writes thousands of changelog records and frames per persist and flush. Through faust's per-record
send path each cost ~150-500 µs (ProducerBuffer hand-offs, futures, attachments); appending to a
`BatchBuilder` costs a few µs and `send_batch` hands a whole partition's records over at once.
Delivery is confirmed by faust's offset commit, which flushes the producer before it commits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

Record = tuple[bytes | None, bytes | None]  # (key, value); value None = tombstone


# Keys whose partition is remembered per topic (a flush sends two frames per user, and the
# producer's murmur2 is pure Python: ~10-30 us a key, the largest part of handing frames over).
KEY_PARTITIONS_MAX = 200_000


class BatchSender:
    def __init__(self, producer: Callable[[], Any]) -> None:
        self._producer = producer  # late-bound: faust starts its producer after the app is built
        # topic -> (its partitions when the keys were mapped, key -> partition)
        self._key_partitions: dict[str, tuple[frozenset[int], dict[bytes, int]]] = {}

    async def partitions(self, topic: str) -> list[int]:
        producer = self._producer()
        await producer.client._wait_on_metadata(topic)
        return sorted(producer.client.cluster.partitions_for_topic(topic))

    async def send(
        self,
        topic: str,
        by_partition: Mapping[int, Sequence[Record]],
        on_sent: Callable[[int, Any], None] | None = None,
    ) -> list[asyncio.Future[Any]]:
        """Hand every record over, grouped by partition; `on_sent(partition, metadata)` runs when
        each batch is delivered (metadata.offset = the batch's first offset)."""
        producer = self._producer()
        futures: list[asyncio.Future[Any]] = []
        for partition, records in by_partition.items():
            batch = producer.create_batch()
            for key, value in records:
                if batch.append(key=key, value=value, timestamp=None) is None:
                    futures.append(await self._submit(producer, batch, topic, partition, on_sent))
                    batch = producer.create_batch()
                    if batch.append(key=key, value=value, timestamp=None) is None:
                        raise ValueError(f"a record for {topic}[{partition}] exceeds max_batch_size")
            if batch.record_count():
                futures.append(await self._submit(producer, batch, topic, partition, on_sent))
        return futures

    async def send_keyed(
        self, topic: str, records: Sequence[tuple[bytes, bytes]]
    ) -> list[asyncio.Future[Any]]:
        """Records partitioned by key with the producer's own partitioner (Kafka's murmur2), so
        a user's frames land where a keyed `send` would put them, in order."""
        producer = self._producer()
        await producer.client._wait_on_metadata(topic)
        partitions = frozenset(producer.client.cluster.partitions_for_topic(topic) or ())
        known = self._key_partitions.get(topic)
        if known is None or known[0] != partitions or len(known[1]) > KEY_PARTITIONS_MAX:
            # A key's partition depends only on the key and the topic's partitions: remembered
            # until those change (or the map grows past its bound).
            known = self._key_partitions[topic] = (partitions, {})
        mapped = known[1]
        groups: dict[int, list[Record]] = {}
        for key, value in records:
            partition = mapped.get(key)
            if partition is None:
                partition = mapped[key] = producer._partition(topic, None, None, None, key, None)
            groups.setdefault(partition, []).append((key, value))
        return await self.send(topic, groups)

    @staticmethod
    async def _submit(
        producer: Any, batch: Any, topic: str, partition: int, on_sent: Callable[[int, Any], None] | None
    ) -> asyncio.Future[Any]:
        batch.close()
        future: asyncio.Future[Any] = await producer.send_batch(batch, topic, partition=partition)
        if on_sent is not None:

            def done(fut: asyncio.Future[Any]) -> None:
                if not fut.cancelled() and fut.exception() is None:
                    on_sent(partition, fut.result())

            future.add_done_callback(done)
        return future
