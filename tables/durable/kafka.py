"""The Kafka side of tables.durable: `KafkaChangelog` (the `Changelog` port on aiokafka) and the
lookups the input checks need (cluster id, mailbox-tail's topic id and partition count, a
partition's log start offset).

A persist is one producer batch (one produce request, one acknowledgement; idempotent, acks=all),
or several batches of one append awaited together past `max_batch_bytes` (the topic's
`max.message.bytes` must allow one): the checkpoint rule keeps it atomic either way. The topic id
needs Metadata v10+, which aiokafka 0.14 lacks: `_MetadataRequestV10` declares it with aiokafka's
public protocol types (no private member used).
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Mapping, Sequence
from io import BytesIO
from typing import Any, ClassVar

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.client import AIOKafkaClient
from aiokafka.errors import KafkaError
from aiokafka.protocol.abstract import AbstractType
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import Boolean, CompactArray, CompactString, Int16, Int32, Schema, TaggedFields

from tables.durable.changelog import Appended, ChangelogUnavailable, LoggedRecord
from tables.durable.records import InputIdentity, WireRecord

# 8 MiB: a flush of ~450 users with their rows fits one batch; the topic must accept it.
MAX_BATCH_BYTES = 8 * 1024 * 1024


def changelog_topic_configs(
    min_compaction_lag_ms: int, max_batch_bytes: int = MAX_BATCH_BYTES
) -> dict[str, str]:
    """The changelog topic's configuration. Compacted, never deleted by time. Compaction waits
    `min_compaction_lag_ms` before it may drop a record superseded by a later one of its key:
    a reader lagging less than that reads every persist whole, and an owner has that long to
    write again the keys a torn or refused persist left last (docs/durability.md)."""
    return {
        "cleanup.policy": "compact",
        "min.compaction.lag.ms": str(min_compaction_lag_ms),
        "max.message.bytes": str(max_batch_bytes + 64 * 1024),
    }


class KafkaChangelog:
    """The changelog topic `topic`; `start()` before use, `stop()` after."""

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        *,
        max_batch_bytes: int = MAX_BATCH_BYTES,
        request_timeout_ms: int = 30_000,
        read_timeout_s: float = 10.0,
        security: Mapping[str, Any] | None = None,
    ) -> None:
        """`security`: aiokafka's security keyword arguments (app.connections.kafka_security_options)."""
        self.topic = topic
        self.read_timeout_s = read_timeout_s
        extra = dict(security or {})
        self._producer = AIOKafkaProducer(
            **extra,
            bootstrap_servers=bootstrap_servers,
            acks="all",
            enable_idempotence=True,
            linger_ms=0,
            max_batch_size=max_batch_bytes,
            max_request_size=max_batch_bytes + 64 * 1024,
            request_timeout_ms=request_timeout_ms,
        )
        self._consumer = AIOKafkaConsumer(
            **extra,
            bootstrap_servers=bootstrap_servers,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=max_batch_bytes + 64 * 1024,
            fetch_max_bytes=max_batch_bytes + 64 * 1024,
            request_timeout_ms=request_timeout_ms,
        )
        self._assigned: set[int] = set()
        self._positions: dict[int, int] = {}  # where the consumer stands, per partition read
        # One read at a time: reads of several partitions (an owner's claim, standby copies)
        # share the consumer, and a new partition's assignment resets every position.
        self._reading = asyncio.Lock()

    async def start(self) -> None:
        await self._producer.start()
        await self._consumer.start()

    async def stop(self) -> None:
        await self._producer.stop()
        await self._consumer.stop()

    async def append(self, partition: int, records: Sequence[WireRecord]) -> Appended:
        if not records:
            raise ValueError("an append has at least one record")
        batches: list[tuple[Any, int]] = []
        batch = self._producer.create_batch()
        count = 0
        for record in records:
            while (
                batch.append(key=record.key, value=record.value, timestamp=None, headers=list(record.headers))
                is None
            ):
                if not count:
                    raise ChangelogUnavailable(
                        f"a record of {len(record.value or b'')} bytes exceeds a batch"
                    )
                batches.append((batch, count))
                batch, count = self._producer.create_batch(), 0
            count += 1
        batches.append((batch, count))
        try:
            # In order: the checkpoint's batch is enqueued last.
            sent = [await self._producer.send_batch(b, self.topic, partition=partition) for b, _ in batches]
            acknowledged = await asyncio.gather(*sent)
        except KafkaError as exc:
            raise ChangelogUnavailable(f"{self.topic}[{partition}]: {exc!r}") from None
        first = acknowledged[0].offset
        last = acknowledged[-1].offset + batches[-1][1] - 1
        return Appended(first, last, len(records))

    def _partition(self, partition: int) -> TopicPartition:
        tp = TopicPartition(self.topic, partition)
        if partition not in self._assigned:
            self._assigned.add(partition)
            self._consumer.assign([TopicPartition(self.topic, p) for p in sorted(self._assigned)])
            self._positions.clear()  # a new assignment forgets every partition's position
        return tp

    async def read(self, partition: int, start: int, end: int) -> tuple[list[LoggedRecord], int]:
        if start >= end:
            return [], start
        async with self._reading:
            return await self._read(partition, start, end)

    async def _read(self, partition: int, start: int, end: int) -> tuple[list[LoggedRecord], int]:
        tp = self._partition(partition)
        if self._positions.get(partition) != start:
            self._consumer.seek(tp, start)
        try:
            async with asyncio.timeout(self.read_timeout_s):
                while True:
                    fetched = await self._consumer.getmany(tp, timeout_ms=500)
                    position: int = await self._consumer.position(tp)
                    records = [
                        LoggedRecord(m.offset, m.key, m.value, tuple(m.headers))
                        for m in fetched.get(tp, [])
                        if start <= m.offset < end
                    ]
                    if records or position > start:
                        break
        except (TimeoutError, KafkaError) as exc:
            raise ChangelogUnavailable(f"{self.topic}[{partition}] read from {start}: {exc!r}") from None
        self._positions[partition] = position
        if position > end:  # fetched past `end`: read on from `end` next time
            self._consumer.seek(tp, end)
            self._positions[partition] = position = end
        return records, position

    async def end_offset(self, partition: int) -> int:
        tp = TopicPartition(self.topic, partition)
        try:
            offsets = await self._consumer.end_offsets([tp])
        except KafkaError as exc:
            raise ChangelogUnavailable(f"{self.topic}[{partition}] end offset: {exc!r}") from None
        end: int = offsets[tp]
        return end

    async def start_offset(self, partition: int) -> int:
        return await log_start_offset(self._consumer, self.topic, partition)

    async def topic_end_offset(self, topic: str, partition: int) -> int:
        """The end of another topic's partition (mailbox-tail's: how far a partition read on after
        a retention overrun before its users are reconciled, app/worker/retention.py)."""
        tp = TopicPartition(topic, partition)
        try:
            offsets = await self._consumer.end_offsets([tp])
        except KafkaError as exc:
            raise ChangelogUnavailable(f"{topic}[{partition}] end offset: {exc!r}") from None
        end: int = offsets[tp]
        return end

    async def topic_start_offset(self, topic: str, partition: int) -> int:
        """The log start of another topic's partition (mailbox-tail's: where a partition with no
        checkpoint starts, and the retention check)."""
        return await log_start_offset(self._consumer, topic, partition)


async def log_start_offset(consumer: AIOKafkaConsumer, topic: str, partition: int) -> int:
    """The lowest offset still readable in `topic`[`partition`] (retention, delete-records)."""
    tp = TopicPartition(topic, partition)
    try:
        offsets = await consumer.beginning_offsets([tp])
    except KafkaError as exc:
        raise ChangelogUnavailable(f"{topic}[{partition}] log start: {exc!r}") from None
    start: int = offsets[tp]
    return start


async def ensure_changelog_topic(
    bootstrap_servers: str,
    topic: str,
    partitions: int,
    min_compaction_lag_ms: int,
    replication: int = 1,
    security: Mapping[str, Any] | None = None,
) -> None:
    admin = AIOKafkaAdminClient(**dict(security or {}), bootstrap_servers=bootstrap_servers)
    await admin.start()
    try:
        if topic not in set(await admin.list_topics()):
            configs = changelog_topic_configs(min_compaction_lag_ms)
            await admin.create_topics([NewTopic(topic, partitions, replication, topic_configs=configs)])
    finally:
        await admin.close()


# -- the input's identity: Metadata v10 (topic ids) ------------------------------------------------


class _Uuid(AbstractType[bytes]):  # type: ignore[misc]  # aiokafka's types are Any here (pyproject: ignore_missing_imports)
    """Kafka's UUID type: 16 raw bytes."""

    @classmethod
    def encode(cls, value: bytes) -> bytes:
        return value

    @classmethod
    def decode(cls, data: BytesIO) -> bytes:
        raw = data.read(16)
        if len(raw) != 16:
            raise ValueError("buffer underrun decoding a UUID")
        return raw


class _MetadataResponseV10(Response):  # type: ignore[misc]  # aiokafka's types are Any here (pyproject: ignore_missing_imports)
    API_KEY = 3
    API_VERSION = 10
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "brokers",
            CompactArray(
                ("node_id", Int32),
                ("host", CompactString("utf-8")),
                ("port", Int32),
                ("rack", CompactString("utf-8")),
                ("tags", TaggedFields),
            ),
        ),
        ("cluster_id", CompactString("utf-8")),
        ("controller_id", Int32),
        (
            "topics",
            CompactArray(
                ("error_code", Int16),
                ("name", CompactString("utf-8")),
                ("topic_id", _Uuid),
                ("is_internal", Boolean),
                (
                    "partitions",
                    CompactArray(
                        ("error_code", Int16),
                        ("partition_index", Int32),
                        ("leader_id", Int32),
                        ("leader_epoch", Int32),
                        ("replica_nodes", CompactArray(Int32)),
                        ("isr_nodes", CompactArray(Int32)),
                        ("offline_replicas", CompactArray(Int32)),
                        ("tags", TaggedFields),
                    ),
                ),
                ("topic_authorized_operations", Int32),
                ("tags", TaggedFields),
            ),
        ),
        ("cluster_authorized_operations", Int32),
        ("tags", TaggedFields),
    )


class _MetadataRequestV10Struct(RequestStruct):  # type: ignore[misc]  # aiokafka's types are Any here (pyproject: ignore_missing_imports)
    FLEXIBLE_VERSION = True
    API_KEY = 3
    API_VERSION = 10
    RESPONSE_TYPE = _MetadataResponseV10
    SCHEMA = Schema(
        (
            "topics",
            CompactArray(("topic_id", _Uuid), ("name", CompactString("utf-8")), ("tags", TaggedFields)),
        ),
        ("allow_auto_topic_creation", Boolean),
        ("include_cluster_authorized_operations", Boolean),
        ("include_topic_authorized_operations", Boolean),
        ("tags", TaggedFields),
    )


class _MetadataRequestV10(Request[_MetadataRequestV10Struct]):  # type: ignore[misc]  # aiokafka's types are Any here (pyproject: ignore_missing_imports)
    API_KEY: ClassVar[int] = 3

    def __init__(self, topics: Sequence[str]) -> None:
        self.topics = list(topics)

    def build(self, request_struct_class: type[_MetadataRequestV10Struct]) -> _MetadataRequestV10Struct:
        return request_struct_class([(bytes(16), name, {}) for name in self.topics], False, False, False, {})


class InputLookupFailed(Exception):
    """The input's identity could not be read (the topic is missing, the broker too old)."""


# Metadata errors that mean "not yet" for a topic that was just created: the broker answering
# may not have it in its metadata cache yet (UNKNOWN_TOPIC_OR_PARTITION, LEADER_NOT_AVAILABLE).
_NOT_YET_DESCRIBED = frozenset({3, 5})
_DESCRIBE_SETTLE_S = 10.0


async def input_identity(
    bootstrap_servers: str,
    topic: str,
    security: Mapping[str, Any] | None = None,
    settle_s: float = _DESCRIBE_SETTLE_S,
) -> InputIdentity:
    """The cluster id, `topic`'s topic id (Kafka's base64 form) and partition count, live.
    A topic a broker does not know yet is asked again for up to `settle_s` seconds, then
    refused as missing."""
    client = AIOKafkaClient(**dict(security or {}), bootstrap_servers=bootstrap_servers)
    await client.bootstrap()
    deadline = time.monotonic() + settle_s
    try:
        while True:
            try:
                response: Any = await client.send(client.get_random_node(), _MetadataRequestV10([topic]))
            except (KafkaError, NotImplementedError) as exc:
                raise InputLookupFailed(f"metadata of {topic!r}: {exc!r}") from None
            described = [t for t in response.topics if t[1] == topic]
            code = described[0][0] if described else "missing"
            if code == 0:
                break
            if code not in _NOT_YET_DESCRIBED or time.monotonic() >= deadline:
                raise InputLookupFailed(f"topic {topic!r} not described (error {code})")
            await asyncio.sleep(0.2)
    finally:
        await client.close()
    _, _, topic_id, _, partitions, *_ = described[0]
    if response.cluster_id is None:
        raise InputLookupFailed("the cluster has no id")
    return InputIdentity(
        cluster_id=response.cluster_id,
        topic_id=base64.urlsafe_b64encode(topic_id).decode().rstrip("="),
        partition_count=len(partitions),
    )
