"""Real-server fixtures. Integration tests FAIL (never skip) when a server is down: CI must really
exercise Kafka, Redis and Cassandra. `make test` starts them (`make services-up`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
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


def _default_topic_partitions(settings: Settings) -> dict[str, int]:
    """The product's default-named topics on the broker, with their partition counts."""
    from aiokafka.admin import AIOKafkaAdminClient

    names = Settings().topics.names

    async def described() -> dict[str, int]:
        admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka.kafka_bootstrap)
        await admin.start()
        try:
            present = [n for n in names if n in set(await admin.list_topics())]
            metas = await admin.describe_topics(present) if present else []
            return {meta["topic"]: len(meta["partitions"]) for meta in metas}
        finally:
            await admin.close()

    return asyncio.run(described())


@pytest.fixture(scope="session", autouse=True)
def _no_default_topics_created(servers: Settings) -> Iterator[None]:
    """The suite shares the broker `make run` uses: a test or benchmark that left one of the
    product's default topic names to its default created it with its own partition count, and
    `make run` after `make test` then refused to start ("topic 'push' has 1 partitions,
    settings want 4"). Every run names all its topics (Settings.topic_env); this fails the
    session if a default-named topic appeared with a partition count `make run` refuses (one
    `make run` creates meanwhile, with the product's count, is not the suite's doing)."""
    before = _default_topic_partitions(servers)
    yield
    wanted = Settings().topics.topic_partitions
    after = _default_topic_partitions(servers)
    created = sorted(f"{t} ({n} partitions)" for t, n in after.items() if t not in before and n != wanted)
    assert not created, (
        f"the suite created the product's default topics {created} on the shared broker: "
        "name every topic of a test or benchmark after its own prefix (Settings.topic_env)"
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Each phase's report on the test item (`make_stack` reads whether the call failed)."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


@pytest.fixture
async def make_stack(
    servers: Settings, unique_name: Callable[..., str], tmp_path: Any, request: pytest.FixtureRequest
) -> AsyncIterator[Callable[..., Any]]:
    """``make_stack(prefix, **Stack options)``: a private, bootstrapped copy of the product's
    stack on the local servers (tests/integration/stack.py), cleaned up after the test; with
    `--keep-failed-stacks`, a failed test's stacks stay (topics, keyspace, projection) for a
    post-mortem of what the workers wrote."""
    from tests.integration.stack import Stack

    stacks: list[Stack] = []

    def make(prefix: str = "stack", **options: Any) -> Stack:
        stack = Stack(unique_name(prefix), tmp_path / f"stack-{len(stacks)}", **options)
        stack.tmp.mkdir(parents=True, exist_ok=True)
        stack.run("bootstrap")
        stacks.append(stack)
        return stack

    yield make
    call = getattr(request.node, "report_call", None)
    if call is not None and call.failed and request.config.getoption("--keep-failed-stacks"):
        for stack in stacks:
            print(f"\nkept for inspection: stack {stack.settings.topics.app_id} (env: {stack.tmp}/stack.env)")
            stack.write_env(stack.tmp / "stack.env")
        return
    for stack in stacks:
        await stack.cleanup()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--chaos-seed", type=int, default=1, help="seed of a chaos run (make chaos-crash)")
    parser.addoption(
        "--keep-failed-stacks",
        action="store_true",
        help="leave a failed test's stacks (topics, keyspace, projection) on the servers",
    )


@pytest.fixture
def chaos_seed(request: pytest.FixtureRequest) -> int:
    seed: int = request.config.getoption("--chaos-seed")
    return seed
