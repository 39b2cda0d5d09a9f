"""Kafka for the operator console (issue 17): the `OpsBus` port of app/api/ops on aiokafka.

Lives outside app/api (which must not import aiokafka) and is injected where the API is built
(`projector api`, app/cli/api.py). Everything it reads is bounded:

* a user's last frames: the key's partition of the frame topic (the producers' default
  partitioner, murmur2 of the key), read from at most ``ops_scan_records`` records before its end;
* the dead-letter browser: the newest ``limit`` records of each partition (or one);
* the workers' lag: the consumer group ``app_id``'s committed offsets on mailbox-tail against
  the partitions' end offsets (ListOffsets and OffsetFetch: nothing joins the group).

Reads share one unassigned-then-assigned consumer (group_id None, so nothing is committed) under
a lock; the console's requests are few, and a lock keeps one reader's seek from moving another's.
Correction frames go out through one producer (acks=all), keyed by the user like the worker's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any, Final

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.partitioner import murmur2

from app.api.ops.ports import PartitionOffsets, TopicRecord
from app.settings import KafkaSettings, Settings, TopicSettings

log = logging.getLogger("projector.ops")

READ_BUDGET_S: Final = 10.0  # one read-back gives up (returns what it has) after this long


def partition_for(key: bytes, partitions: int) -> int:
    """Kafka's default partitioner (Java's and aiokafka's): murmur2, positive, modulo count."""
    hashed: int = murmur2(key)
    return (hashed & 0x7FFFFFFF) % partitions


class KafkaOpsBus:
    def __init__(self, kafka: KafkaSettings, topics: TopicSettings, scan_records: int) -> None:
        self.bootstrap = kafka.kafka_bootstrap
        self.topics = topics
        self.scan_records = scan_records  # records read back per partition for one key
        self._lock = asyncio.Lock()
        self._reader: AIOKafkaConsumer | None = None
        self._admin: AIOKafkaAdminClient | None = None
        self._producer: AIOKafkaProducer | None = None
        self._partitions: dict[str, int] = {}

    # -- lifecycle (lazy: the API starts even while Kafka is away) ------------------------------

    async def _consumer(self) -> AIOKafkaConsumer:
        if self._reader is None:
            reader = AIOKafkaConsumer(
                bootstrap_servers=self.bootstrap,
                group_id=None,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                client_id="projector-ops-console",
            )
            await reader.start()
            self._reader = reader
        return self._reader

    async def _admin_client(self) -> AIOKafkaAdminClient:
        if self._admin is None:
            admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, client_id="projector-ops-console")
            await admin.start()
            self._admin = admin
        return self._admin

    async def aclose(self) -> None:
        for closer in (
            self._reader.stop if self._reader else None,
            self._admin.close if self._admin else None,
            self._producer.stop if self._producer else None,
        ):
            if closer is not None:
                try:
                    await closer()
                except Exception as exc:  # closing is best effort
                    log.debug("ops console: closing a Kafka client: %s", exc)
        self._reader = self._admin = self._producer = None

    # -- the port ------------------------------------------------------------------------------

    def partition_of(self, user_id: int) -> int:
        return partition_for(str(user_id).encode(), self.topics.topic_partitions)

    async def _count(self, consumer: AIOKafkaConsumer, topic: str) -> int:
        count = self._partitions.get(topic)
        if count is None:
            found = consumer.partitions_for_topic(topic)
            if not found:
                await consumer._client.force_metadata_update()  # a topic the consumer never saw
                found = consumer.partitions_for_topic(topic)
            if not found:
                raise LookupError(f"topic {topic!r} does not exist")
            count = self._partitions[topic] = len(found)
        return count

    async def last_records(self, topic: str, key: str, limit: int) -> list[TopicRecord]:
        async with self._lock:
            consumer = await self._consumer()
            tp = TopicPartition(topic, partition_for(key.encode(), await self._count(consumer, topic)))
            found = await self._read(consumer, [tp], self.scan_records)
        mine = [r for r in found if r.key == key]
        return mine[-limit:]

    async def tail(self, topic: str, limit: int, partition: int | None = None) -> list[TopicRecord]:
        async with self._lock:
            consumer = await self._consumer()
            count = await self._count(consumer, topic)
            wanted = range(count) if partition is None else [partition] if partition < count else []
            found = await self._read(consumer, [TopicPartition(topic, p) for p in wanted], limit)
        found.sort(key=lambda r: (r.timestamp_ms, r.partition, r.offset), reverse=True)
        return found[:limit]

    async def group_offsets(self) -> list[PartitionOffsets]:
        topic = self.topics.topic_mailbox_tail
        admin = await self._admin_client()
        committed = await admin.list_consumer_group_offsets(self.topics.app_id)
        async with self._lock:
            consumer = await self._consumer()
            tps = [TopicPartition(topic, p) for p in range(await self._count(consumer, topic))]
            ends = await consumer.end_offsets(tps)
        by_partition = {
            tp.partition: meta.offset
            for tp, meta in committed.items()
            if tp.topic == topic and meta.offset >= 0
        }
        return [PartitionOffsets(tp.partition, by_partition.get(tp.partition), ends[tp]) for tp in tps]

    async def publish_frames(self, user_id: int, deltas: Sequence[bytes], badges: Sequence[bytes]) -> None:
        if self._producer is None:
            producer = AIOKafkaProducer(
                bootstrap_servers=self.bootstrap, acks="all", client_id="projector-ops-console"
            )
            await producer.start()
            self._producer = producer
        key = str(user_id).encode()
        sent = [await self._producer.send(self.topics.topic_session_delta, d, key=key) for d in deltas]
        sent += [await self._producer.send(self.topics.topic_badge, b, key=key) for b in badges]
        await asyncio.gather(*sent)

    # -- reading back --------------------------------------------------------------------------

    async def _read(
        self, consumer: AIOKafkaConsumer, tps: Sequence[TopicPartition], per_partition: int
    ) -> list[TopicRecord]:
        """The last `per_partition` records of each partition (up to the ends seen now)."""
        if not tps:
            return []
        begins = await consumer.beginning_offsets(list(tps))
        ends = await consumer.end_offsets(list(tps))
        todo = [tp for tp in tps if ends[tp] > begins[tp]]
        if not todo:
            return []
        consumer.assign(todo)
        for tp in todo:
            consumer.seek(tp, max(begins[tp], ends[tp] - per_partition))
        out: list[TopicRecord] = []
        open_tps = set(todo)
        deadline = time.monotonic() + READ_BUDGET_S
        try:
            while open_tps and time.monotonic() < deadline:
                batch: dict[Any, list[Any]] = await consumer.getmany(
                    *open_tps, timeout_ms=300, max_records=5000
                )
                for tp, records in batch.items():
                    for r in records:
                        if r.offset < ends[tp]:
                            out.append(
                                TopicRecord(
                                    topic=tp.topic,
                                    partition=tp.partition,
                                    offset=r.offset,
                                    timestamp_ms=int(r.timestamp),
                                    key=None if r.key is None else r.key.decode("utf-8", "replace"),
                                    value=r.value if r.value is not None else b"",
                                )
                            )
                for tp in list(open_tps):
                    if await consumer.position(tp) >= ends[tp]:
                        open_tps.discard(tp)
        finally:
            consumer.assign([])
        out.sort(key=lambda r: (r.partition, r.offset))
        return out


def open_ops(settings: Settings, session: Any, store: Any) -> Any:
    """The console's dependencies for `projector api` (an `OpsDeps`): the serving Redis store,
    Cassandra's state, MessageStore and member directory on `session`, this Kafka bus."""
    from app.api.ops import OpsDeps
    from app.stores.cassandra_members import CassandraMemberReader
    from app.stores.cassandra_messages import CassandraMessageStore
    from app.stores.cassandra_state import UserConversationStateWriter

    async def serving() -> str:
        return str(await store.follow_serving())

    keyspace = settings.cassandra.cassandra_keyspace
    return OpsDeps(
        store=store,
        state=UserConversationStateWriter(session, keyspace),
        messages=CassandraMessageStore(session, keyspace),
        members=CassandraMemberReader(session, keyspace),
        serving=serving,
        bus=KafkaOpsBus(settings.kafka, settings.topics, settings.ops.ops_scan_records),
    )
