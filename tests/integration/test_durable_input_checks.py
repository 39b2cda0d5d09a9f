"""Issue 31 items 5 and 6 on real Kafka, for tables.durable's checks: a checkpoint taken on one
mailbox-tail is refused on a recreated topic and on another cluster (one line naming what
differs), and a retention overrun (records deleted below the checkpoint's next offset with the
admin API) is detected."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic, RecordsToDelete
from aiokafka.errors import KafkaError

from app.settings import Settings
from tables.durable.changelog import InMemoryChangelog
from tables.durable.checkpointer import Checkpointer, PersistBatch
from tables.durable.identity import InputMismatch, check_identity, retention_overrun
from tables.durable.kafka import InputLookupFailed, input_identity, log_start_offset
from tables.durable.records import Checkpoint, InputIdentity
from tables.durable.store import PartitionStore
from tests.support.private_kafka import PrivateKafka


async def _checkpoint_on(identity: InputIdentity, path: Path, input_next_offset: int) -> Checkpoint:
    """A worker's checkpoint of partition 0 of the input `identity` names, read back from its store."""
    store = PartitionStore.open(path)
    try:
        checkpointer = Checkpointer(store, InMemoryChangelog(), 0, identity)
        await checkpointer.claim()
        await checkpointer.persist(PersistBatch(input_next_offset, users={1: b"u"}))
    finally:
        store.close()
    reopened = PartitionStore.open(path)
    try:
        checkpoint = reopened.position.checkpoint
    finally:
        reopened.close()
    assert checkpoint is not None and checkpoint.identity == identity
    return checkpoint


async def _produce(bootstrap: str, topic: str, count: int) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for i in range(count):
            await producer.send_and_wait(topic, b'{"n":%d}' % i, key=b"1", partition=0)
    finally:
        await producer.stop()


@pytest.fixture
async def admin(servers: Settings) -> AsyncIterator[AIOKafkaAdminClient]:
    client = AIOKafkaAdminClient(bootstrap_servers=servers.kafka.kafka_bootstrap)
    await client.start()
    yield client
    await client.close()


async def test_a_topic_just_created_is_described_and_a_missing_one_refused(
    servers: Settings, make_topic: Callable[..., Awaitable[str]], unique_name: Callable[..., str]
) -> None:
    """A broker may answer a metadata request before it knows a topic created a moment ago
    (UNKNOWN_TOPIC_OR_PARTITION): the lookup asks again; a topic that never comes is refused."""
    for _ in range(3):
        topic = await make_topic("fresh", partitions=3)
        assert (await input_identity(servers.kafka.kafka_bootstrap, topic)).partition_count == 3
    with pytest.raises(InputLookupFailed, match="not described"):
        await input_identity(servers.kafka.kafka_bootstrap, unique_name("never"), settle_s=0.5)


async def test_a_recreated_mailbox_tail_is_refused_in_one_line(
    servers: Settings, make_topic: Callable[..., Awaitable[str]], admin: AIOKafkaAdminClient, tmp_path: Path
) -> None:
    topic = await make_topic("mailbox", partitions=2)
    before = await input_identity(servers.kafka.kafka_bootstrap, topic)
    assert before.partition_count == 2 and before.topic_id and before.cluster_id
    checkpoint = await _checkpoint_on(before, tmp_path / "store", input_next_offset=3)
    check_identity(
        checkpoint, await input_identity(servers.kafka.kafka_bootstrap, topic), 0
    )  # the same topic

    await admin.delete_topics([topic])
    deadline = asyncio.get_running_loop().time() + 60
    while True:  # deletion completes asynchronously; the name is free once it has
        try:
            await admin.create_topics([NewTopic(topic, 2, 1)])
            break
        except KafkaError:
            assert asyncio.get_running_loop().time() < deadline, f"{topic} not recreated in 60 s"
            await asyncio.sleep(0.5)
    after = await input_identity(servers.kafka.kafka_bootstrap, topic)
    assert after.cluster_id == before.cluster_id and after.topic_id != before.topic_id

    with pytest.raises(InputMismatch) as refused:
        check_identity(checkpoint, after, 0)
    line = str(refused.value)
    assert "\n" not in line
    assert f"mailbox-tail topic id {before.topic_id!r} (checkpoint) != {after.topic_id!r} (live)" in line
    assert "cluster id" not in line and "projector rebuild" in line


@pytest.mark.timeout(600)
async def test_a_checkpoint_of_another_cluster_is_refused_in_one_line(
    servers: Settings, make_topic: Callable[..., Awaitable[str]], tmp_path: Path
) -> None:
    topic = await make_topic("mailbox", partitions=2)
    shared = await input_identity(servers.kafka.kafka_bootstrap, topic)
    checkpoint = await _checkpoint_on(shared, tmp_path / "store", input_next_offset=5)
    broker = await asyncio.to_thread(PrivateKafka.start, tmp_path / "kafka")
    try:
        admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(topic, 2, 1)])  # the same name, on another cluster
        finally:
            await admin.close()
        other = await input_identity(broker.bootstrap, topic)
    finally:
        await asyncio.to_thread(broker.stop)
    assert other.cluster_id != shared.cluster_id
    with pytest.raises(InputMismatch) as refused:
        check_identity(checkpoint, other, 0)
    line = str(refused.value)
    assert "\n" not in line
    assert f"cluster id {shared.cluster_id!r} (checkpoint) != {other.cluster_id!r} (live)" in line


async def test_records_deleted_below_the_checkpoint_are_a_retention_overrun(
    servers: Settings, make_topic: Callable[..., Awaitable[str]], admin: AIOKafkaAdminClient, tmp_path: Path
) -> None:
    topic = await make_topic("mailbox", partitions=1)
    await _produce(servers.kafka.kafka_bootstrap, topic, 10)
    identity = await input_identity(servers.kafka.kafka_bootstrap, topic)
    checkpoint = await _checkpoint_on(identity, tmp_path / "store", input_next_offset=4)  # 0..3 applied
    consumer = AIOKafkaConsumer(bootstrap_servers=servers.kafka.kafka_bootstrap, group_id=None)
    await consumer.start()
    try:
        assert await log_start_offset(consumer, topic, 0) == 0
        assert retention_overrun(checkpoint, await log_start_offset(consumer, topic, 0), 0) is None
        # Records the state has applied may go: no overrun.
        await admin.delete_records({TopicPartition(topic, 0): RecordsToDelete(before_offset=4)})
        assert await log_start_offset(consumer, topic, 0) == 4
        assert retention_overrun(checkpoint, 4, 0) is None
        # Records it has not applied go: 4, 5 and 6 are lost.
        await admin.delete_records({TopicPartition(topic, 0): RecordsToDelete(before_offset=7)})
        log_start = await log_start_offset(consumer, topic, 0)
    finally:
        await consumer.stop()
    assert log_start == 7
    overrun = retention_overrun(checkpoint, log_start, 0)
    assert overrun is not None and overrun.lost == 3
    assert (
        str(overrun)
        == "partition 0: mailbox-tail starts at 7, the checkpoint needs 4: 3 offsets deleted unread"
    )
