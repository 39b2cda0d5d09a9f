"""Fixtures for tests on the real servers (Kafka, Redis, Cassandra), shared by the integration
tests and the real-server parametrizations of the contract suites; the conftest of each layer
imports the ones it offers. A test that needs a server FAILS (never skips) when it is down: CI
must really exercise Kafka, Redis and Cassandra. `make test` starts them (`make services-up`)."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any
from urllib.parse import urlparse

import pytest

from app.settings import Settings

HINT = "integration tests need the real servers: run `make services-up` (or `make test`)"


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=3):
            return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def servers(settings: Settings) -> Settings:
    """Fails the requesting test with a clear message if any server does not accept connections."""
    redis_url = urlparse(settings.redis.redis_url)
    kafka_host, _, kafka_port = settings.kafka.kafka_bootstrap.split(",")[0].rpartition(":")
    checks = {
        "Kafka": (kafka_host, int(kafka_port)),
        "Redis": (redis_url.hostname or "127.0.0.1", redis_url.port or 6379),
        "Cassandra": (settings.cassandra.cassandra_contact_points[0], settings.cassandra.cassandra_port),
    }
    down = [f"{name} at {h}:{p}" for name, (h, p) in checks.items() if not _reachable(h, p)]
    if down:
        pytest.fail(f"not reachable: {', '.join(down)}; {HINT}", pytrace=False)
    return settings


@pytest.fixture
async def topics_to_delete(servers: Settings) -> AsyncIterator[list[str]]:
    """Topic names appended here are deleted after the test (keeps the dev broker tidy)."""
    from aiokafka.admin import AIOKafkaAdminClient

    names: list[str] = []
    yield names
    if names:
        admin = AIOKafkaAdminClient(bootstrap_servers=servers.kafka.kafka_bootstrap)
        await admin.start()
        try:
            present = set(await admin.list_topics())
            doomed = [t for t in names if t in present]
            if doomed:
                await admin.delete_topics(doomed)
        finally:
            await admin.close()


@pytest.fixture
def make_topic(
    servers: Settings, unique_name: Callable[..., str], topics_to_delete: list[str]
) -> Callable[..., Awaitable[str]]:
    """``await make_topic("orders", partitions=2)`` creates a unique topic explicitly (the broker
    never auto-creates topics); it is deleted after the test."""
    from app.cli.bootstrap import ensure_topics

    async def make(prefix: str, partitions: int = 1) -> str:
        name = unique_name(prefix)
        report = await ensure_topics(servers.kafka, servers.topics, [name], partitions=partitions)
        assert report.created == [name], report
        topics_to_delete.append(name)
        return name

    return make


@pytest.fixture(scope="session")
def cassandra_session(servers: Settings) -> Iterator[Any]:
    """One driver session for the whole run (connecting costs ~0.2 s plus driver start-up)."""
    from app.stores.cassandra_session import open_cluster

    cluster, session = open_cluster(servers.cassandra)
    yield session
    cluster.shutdown()


@pytest.fixture
def keyspace(cassandra_session: Any, unique_name: Callable[..., str]) -> Iterator[str]:
    """A fresh, empty keyspace (SimpleStrategy rf=1), dropped after the test."""
    name = unique_name("ks", sep="_")
    cassandra_session.execute(
        f"CREATE KEYSPACE {name} WITH replication = {{'class': 'SimpleStrategy', 'replication_factor': 1}}"
    )
    yield name
    cassandra_session.execute(f"DROP KEYSPACE IF EXISTS {name}")
