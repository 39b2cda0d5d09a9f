"""`projector bootstrap` against the real servers: creates, is idempotent, reports mismatches."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from app.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _bootstrap(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", "bootstrap", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def test_bootstrap_twice_is_idempotent(
    servers: Settings,
    unique_name: Callable[..., str],
    topics_to_delete: list[str],
    cassandra_session: Any,
) -> None:
    from aiokafka.admin import AIOKafkaAdminClient

    from app.stores.schema import TABLES

    keyspace = unique_name("boot", sep="_")
    topics = Settings.topic_env(unique_name("boot"))
    topics_to_delete.extend(topics.values())
    env = {
        **servers.as_env(),
        **topics,
        "PROJECTOR_CASSANDRA_KEYSPACE": keyspace,
        "PROJECTOR_TOPIC_PARTITIONS": "3",
    }
    try:
        first = _bootstrap(env)
        assert first.returncode == 0, first.stderr
        assert f"keyspace {keyspace}: created" in first.stdout
        assert "(3 partitions)" in first.stdout

        second = _bootstrap(env)
        assert second.returncode == 0, second.stderr
        assert f"keyspace {keyspace}: exists" in second.stdout
        assert "already there: " + ", ".join(topics.values()) in second.stdout

        tables = {
            r.table_name
            for r in cassandra_session.execute(
                "SELECT table_name FROM system_schema.tables WHERE keyspace_name = %s", (keyspace,)
            )
        }
        assert tables == {t.name for t in TABLES}
        admin = AIOKafkaAdminClient(bootstrap_servers=servers.kafka.kafka_bootstrap)
        await admin.start()
        try:
            described = await admin.describe_topics(list(topics.values()))
        finally:
            await admin.close()
        assert {d["topic"]: len(d["partitions"]) for d in described} == {name: 3 for name in topics.values()}

        # Same topics, another partition count: reported clearly, exit 1, topics untouched.
        mismatch = _bootstrap({**env, "PROJECTOR_TOPIC_PARTITIONS": "5"}, "--skip-cassandra")
        assert mismatch.returncode == 1
        assert "has 3 partitions, settings want 5" in mismatch.stderr
    finally:
        cassandra_session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}")


def test_bootstrap_reports_bad_settings() -> None:
    result = _bootstrap({"PROJECTOR_TOPIC_PARTITIONS": "zero"})
    assert result.returncode == 2
    assert "PROJECTOR_TOPIC_PARTITIONS: expected a decimal integer, got 'zero'" in result.stderr
