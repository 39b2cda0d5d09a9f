"""The chaos tests (issue 18): faults on real servers, beyond what `make test` runs. Everything
under tests/chaos is marked `chaos` (and `integration`): `make test` runs `-m "not chaos"`,
`make chaos-infra-check` runs `-m chaos`. They start what they need themselves (the 3-node Kafka
cluster: tests/support/kafka_cluster.py) and stop what they started (KAFKA_CLUSTER_KEEP=1 keeps it)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.support import kafka_cluster as cluster


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/tests/chaos/" in str(item.path):
            item.add_marker(pytest.mark.chaos)
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def kafka_cluster() -> Iterator[str]:
    """The 3-node KRaft cluster's bootstrap address, started here if it was not up."""
    started = cluster.up()
    cluster.quiet_kafka_logs()
    yield cluster.BOOTSTRAP
    if started and os.environ.get("KAFKA_CLUSTER_KEEP") != "1":
        cluster.down()
