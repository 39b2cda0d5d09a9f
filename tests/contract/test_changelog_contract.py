"""One contract for every `Changelog` (tables.durable): the in-memory one and KafkaChangelog on
the real broker (marked integration, as the other real-server parametrizations here are)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from app.settings import Settings
from tables.durable.changelog import Changelog, InMemoryChangelog, LoggedRecord
from tables.durable.checkpointer import PersistBatch
from tables.durable.records import WireRecord
from tests.support.durable import open_partition, state_of


@pytest.fixture(params=["memory", pytest.param("kafka", marks=pytest.mark.integration)])
async def changelog(request: pytest.FixtureRequest) -> AsyncIterator[Changelog]:
    if request.param == "memory":
        yield InMemoryChangelog()
        return
    from aiokafka.admin import AIOKafkaAdminClient

    from tables.durable.kafka import KafkaChangelog, ensure_changelog_topic

    servers: Settings = request.getfixturevalue("servers")
    topic = request.getfixturevalue("unique_name")("changelog")
    await ensure_changelog_topic(
        servers.kafka.kafka_bootstrap, topic, partitions=2, min_compaction_lag_ms=60_000
    )
    kafka = KafkaChangelog(servers.kafka.kafka_bootstrap, topic)
    await kafka.start()
    try:
        yield kafka
    finally:
        await kafka.stop()
        admin = AIOKafkaAdminClient(bootstrap_servers=servers.kafka.kafka_bootstrap)
        await admin.start()
        try:
            await admin.delete_topics([topic])
        finally:
            await admin.close()


def _records(count: int, tag: bytes = b"") -> list[WireRecord]:
    return [
        WireRecord(b"k%d" % i, None if i % 3 == 2 else tag + b"v%d" % i, (("h", b"%d" % i),))
        for i in range(count)
    ]


async def _read_all(changelog: Changelog, partition: int, start: int = 0) -> list[LoggedRecord]:
    end = await changelog.end_offset(partition)
    out: list[LoggedRecord] = []
    while start < end:
        batch, start = await changelog.read(partition, start, end)
        out += batch
    return out


async def test_a_fresh_partition_is_empty(changelog: Changelog) -> None:
    assert await changelog.start_offset(0) == 0
    assert await changelog.end_offset(0) == 0
    assert await changelog.read(0, 0, 0) == ([], 0)


async def test_an_append_lands_contiguously_at_the_end(changelog: Changelog) -> None:
    first = await changelog.append(0, _records(3))
    assert (first.first, first.last, first.contiguous) == (0, 2, True)
    second = await changelog.append(0, _records(5))
    assert (second.first, second.last, second.contiguous) == (3, 7, True)
    assert await changelog.end_offset(0) == 8


async def test_records_read_back_with_keys_values_tombstones_and_headers_in_order(
    changelog: Changelog,
) -> None:
    await changelog.append(0, _records(4, b"a"))
    await changelog.append(0, _records(2, b"b"))
    read = await _read_all(changelog, 0)
    assert [r.offset for r in read] == list(range(6))
    expected = _records(4, b"a") + _records(2, b"b")
    assert [(r.key, r.value, tuple(r.headers)) for r in read] == [
        (w.key, w.value, w.headers) for w in expected
    ]
    assert [r.offset for r in await _read_all(changelog, 0, start=4)] == [4, 5]


async def test_partitions_are_independent(changelog: Changelog) -> None:
    await changelog.append(1, _records(2))
    assert await changelog.end_offset(0) == 0
    assert await changelog.end_offset(1) == 2
    assert [r.key for r in await _read_all(changelog, 1)] == [b"k0", b"k1"]


async def test_a_persist_is_one_append_and_a_standby_reads_the_same_state(
    changelog: Changelog, tmp_path: Path
) -> None:
    owner = open_partition(tmp_path / "owner", changelog, partition=1)
    await owner.checkpointer.claim(input_start=17)
    conversation = "00000000-0000-4000-8000-00000000000a"
    for offset in (20, 30):
        batch = PersistBatch(
            offset, rows={(5, conversation): b"row%d" % offset}, users={5: b"user", 6: None}, meta=b"m"
        )
        rounds = owner.checkpointer.round_trips
        await owner.checkpointer.persist(batch)
        assert owner.checkpointer.round_trips == rounds + 1
    standby = open_partition(tmp_path / "standby", changelog, partition=1)
    await standby.reader.catch_up()
    assert state_of(standby.store) == state_of(owner.store) != {}
    assert standby.store.position == owner.store.position
    checkpoint = standby.store.position.checkpoint
    assert checkpoint is not None and checkpoint.input_next_offset == 30
