"""Real Kafka: explicit topics, produce/consume, and the broker never auto-creates topics."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import pytest

from app.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


async def test_produce_and_consume_on_an_explicit_topic(
    servers: Settings,
    make_topic: Callable[..., Awaitable[str]],
    unique_name: Callable[..., str],
) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    topic = await make_topic("roundtrip", partitions=3)
    sent = [(f"user-{i % 5}".encode(), f"value-{i}".encode()) for i in range(50)]

    producer = AIOKafkaProducer(bootstrap_servers=servers.kafka.kafka_bootstrap, acks="all")
    await producer.start()
    try:
        for key, value in sent:
            await producer.send(topic, value=value, key=key)
        await producer.flush()
    finally:
        await producer.stop()

    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=servers.kafka.kafka_bootstrap,
        group_id=unique_name("group"),
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    received: list[tuple[bytes, bytes, int]] = []
    try:
        async with asyncio.timeout(60):
            while len(received) < len(sent):
                batch = await consumer.getmany(timeout_ms=1000)
                for records in batch.values():
                    received.extend((r.key, r.value, r.partition) for r in records)
        await consumer.commit()
    finally:
        await consumer.stop()

    assert sorted((k, v) for k, v, _ in received) == sorted(sent)
    # Same key -> same partition, and per key the order of sending is kept.
    partitions_by_key: dict[bytes, set[int]] = {}
    for key, _, partition in received:
        partitions_by_key.setdefault(key, set()).add(partition)
    assert all(len(p) == 1 for p in partitions_by_key.values())
    for key in partitions_by_key:
        assert [v for k, v, _ in received if k == key] == [v for k, v in sent if k == key]


async def test_broker_does_not_auto_create_topics(
    servers: Settings, unique_name: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.CRITICAL, logger="aiokafka.cluster")  # one error per metadata retry
    from aiokafka import AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.errors import UnknownTopicOrPartitionError

    missing = unique_name("never-created")
    producer = AIOKafkaProducer(bootstrap_servers=servers.kafka.kafka_bootstrap, request_timeout_ms=3000)
    await producer.start()
    try:
        with pytest.raises(UnknownTopicOrPartitionError):
            # Metadata for an unknown topic never arrives: the send fails instead of creating it.
            await producer.send_and_wait(missing, b"x")
    finally:
        await producer.stop()
    admin = AIOKafkaAdminClient(bootstrap_servers=servers.kafka.kafka_bootstrap)
    await admin.start()
    try:
        assert missing not in await admin.list_topics()
    finally:
        await admin.close()
