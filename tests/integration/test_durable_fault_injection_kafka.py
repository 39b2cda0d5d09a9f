"""The persist fault injection of tests/unit/durable/test_fault_injection.py on real Kafka: a
worker killed at every await of its persists (each append also after every possible number of
its records went in), data dir kept or lost, restarts on KafkaChangelog and restores a whole
prefix of its persists with its input offset, never older than what was acknowledged. Each kill
runs on its own partition of one topic (a fresh log)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from app.settings import Settings
from tables.durable.kafka import KafkaChangelog, ensure_changelog_topic
from tables.durable.store import PartitionStore
from tests.support.durable import KillingChangelog
from tests.unit.durable.test_fault_injection import (
    BATCHES,
    PREFIXES,
    count_writer_calls,
    kill_points,
    recover,
    run_writer,
)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("data_dir", ["kept", "lost"])
async def test_a_kill_at_any_await_of_a_persist_on_kafka_restores_a_whole_prefix(
    servers: Settings, unique_name: Callable[..., str], tmp_path: Path, data_dir: str
) -> None:
    counting = await count_writer_calls(tmp_path)
    points = kill_points(counting.calls, counting.append_sizes)
    topic = unique_name("durable-kills")
    await ensure_changelog_topic(
        servers.kafka.kafka_bootstrap, topic, partitions=len(points), min_compaction_lag_ms=3_600_000
    )
    kafka = KafkaChangelog(servers.kafka.kafka_bootstrap, topic)
    await kafka.start()
    restored_prefixes = set()
    try:
        for partition, (kill_at, delivered) in enumerate(points):
            path = tmp_path / f"w{partition}"
            acknowledged = await run_writer(KillingChangelog(kafka, kill_at, delivered), path, partition)
            if data_dir == "lost":
                PartitionStore.destroy(path)
            restored = await recover(KillingChangelog(kafka), path, partition)
            assert restored is not None and acknowledged <= restored <= acknowledged + 1, (kill_at, delivered)
            restored_prefixes.add(restored)
            PartitionStore.destroy(path)
    finally:
        await kafka.stop()
        admin = AIOKafkaAdminClient(bootstrap_servers=servers.kafka.kafka_bootstrap)
        await admin.start()
        try:
            await admin.delete_topics([topic])
        finally:
            await admin.close()
    assert restored_prefixes == set(range(len(PREFIXES)))
    assert len(BATCHES) + 1 == len(PREFIXES)
