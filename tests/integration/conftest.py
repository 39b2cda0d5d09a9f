"""Real-server fixtures. Integration tests FAIL (never skip) when a server is down: CI must really
exercise Kafka, Redis and Cassandra. `make test` starts them (`make services-up`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from app.settings import Settings

# The real-server fixtures (servers, cassandra_session, keyspace, make_topic, topics_to_delete)
# live in tests/support/servers.py, registered for every layer by tests/conftest.py.


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Everything under tests/integration is an integration test, marked or not, so
    # `-m "not integration"` can never pick up one of them by accident.
    for item in items:
        if "/tests/integration/" in str(item.path):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(autouse=True)
def _require_servers(servers: Settings) -> None:
    """Every integration test needs the servers: checked once per session."""


@pytest.fixture
async def make_stack(
    servers: Settings, unique_name: Callable[..., str], tmp_path: Any
) -> AsyncIterator[Callable[..., Any]]:
    """``make_stack(prefix, **Stack options)``: a private, bootstrapped copy of the product's
    stack on the local servers (tests/integration/stack.py), cleaned up after the test."""
    from tests.integration.stack import Stack

    stacks: list[Stack] = []

    def make(prefix: str = "stack", **options: Any) -> Stack:
        stack = Stack(unique_name(prefix), tmp_path / f"stack-{len(stacks)}", **options)
        stack.tmp.mkdir(parents=True, exist_ok=True)
        stack.run("bootstrap")
        stacks.append(stack)
        return stack

    yield make
    for stack in stacks:
        await stack.cleanup()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--chaos-seed", type=int, default=1, help="seed of a chaos run (make chaos-crash)")


@pytest.fixture
def chaos_seed(request: pytest.FixtureRequest) -> int:
    seed: int = request.config.getoption("--chaos-seed")
    return seed
