"""Mistakes at start on the real servers (issue 15): each is ONE line on the process's output,
naming what to fix, and a non-zero exit — where faust, aiokafka or the Cassandra driver printed
tracebacks, or a worker without its source topic said "Worker ready" and idled."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from app.settings import Settings
from tests.integration.stack import PROJECTOR, ROOT, Stack, free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

HINT = "start the local servers with `make services-up`"


def run(env: dict[str, str], *args: str) -> tuple[int, list[str]]:
    done = subprocess.run(
        [*PROJECTOR, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180, check=False
    )
    return done.returncode, (done.stdout + done.stderr).splitlines()


@pytest.fixture
def stack(make_stack: Callable[..., Stack], tmp_path: Path) -> Stack:
    stack = make_stack("starterr")
    stack.env["PROJECTOR_DATA_DIR"] = str(tmp_path / "worker-data")
    return stack


def test_a_worker_without_its_source_topic_says_so_and_exits(stack: Stack) -> None:
    env = {**stack.env, "PROJECTOR_TOPIC_MAILBOX_TAIL": f"{stack.settings.topics.app_id}-no-such-topic"}
    code, lines = run(env, "worker")
    assert code == 1
    app_id, bootstrap = stack.settings.topics.app_id, stack.settings.kafka.kafka_bootstrap
    assert lines == [
        f"projector worker: topic '{app_id}-no-such-topic' (PROJECTOR_TOPIC_MAILBOX_TAIL) "
        f"does not exist on Kafka at {bootstrap}: create it with `projector bootstrap`"
    ]


def test_a_worker_with_kafka_down_says_so_and_exits(stack: Stack) -> None:
    env = {**stack.env, "PROJECTOR_KAFKA_BOOTSTRAP": f"127.0.0.1:{free_port()}"}
    code, lines = run(env, "worker")
    assert code == 1 and len(lines) == 1, lines
    assert lines[0].startswith("projector worker: cannot reach Kafka at 127.0.0.1:") and lines[0].endswith(
        HINT
    )


def test_a_worker_with_redis_down_says_so_and_exits(stack: Stack) -> None:
    env = {**stack.env, "PROJECTOR_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    code, lines = run(env, "worker")
    assert code == 1 and len(lines) == 1, lines
    assert lines[0].startswith("projector worker: cannot reach Redis at 127.0.0.1 (") and lines[0].endswith(
        HINT
    )


def test_a_worker_without_its_keyspace_says_so_and_exits(stack: Stack) -> None:
    env = {**stack.env, "PROJECTOR_CASSANDRA_KEYSPACE": "starterr_no_such_keyspace"}
    code, lines = run(env, "worker")
    assert code == 1
    assert lines == [
        "projector worker: keyspace 'starterr_no_such_keyspace' (PROJECTOR_CASSANDRA_KEYSPACE) does not "
        "exist in Cassandra: create it with `projector bootstrap`"
    ]


@pytest.mark.parametrize(
    "args",
    [("api",), ("rebuild", "--from-state", "--all-known", "--progress", "never")],
    ids=["api", "rebuild-from-state"],
)
def test_the_api_and_rebuild_without_the_keyspace_say_so_in_one_line(
    stack: Stack, args: tuple[str, ...]
) -> None:
    # Both used to prepare statements in the missing keyspace: the API printed the driver's
    # traceback before its error line, the rebuild died in a StoreError traceback.
    env = {
        **stack.env,
        "PROJECTOR_CASSANDRA_KEYSPACE": "starterr_no_such_keyspace",
        "PROJECTOR_API_SECRET": "starterr-api-secret-0123456789-abcdef",
        "PROJECTOR_API_PORT": str(free_port()),
    }
    extra = ("--namespace", f"{stack.settings.redis.projection_namespace}-rb") if args[0] == "rebuild" else ()
    code, lines = run(env, *args, *extra)
    assert code == 1
    assert lines == [
        f"projector {args[0]}: keyspace 'starterr_no_such_keyspace' (PROJECTOR_CASSANDRA_KEYSPACE) does not "
        "exist in Cassandra: create it with `projector bootstrap`"
    ]


def test_rebuild_with_redis_down_is_one_line(stack: Stack) -> None:
    # It used to retry for the store's whole budget first (a warning per attempt), then fail.
    env = {**stack.env, "PROJECTOR_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    fresh = f"{stack.settings.redis.projection_namespace}-rb"
    code, lines = run(
        env, "rebuild", "--from-state", "--users", "1", "--namespace", fresh, "--progress", "never"
    )
    assert code == 1 and len(lines) == 1, lines
    assert lines[0].startswith("projector rebuild: cannot reach Redis at 127.0.0.1 (") and lines[0].endswith(
        HINT
    )


def test_a_topic_with_other_partitions_than_the_settings_says_which_count_to_set(stack: Stack) -> None:
    real = stack.settings.topics.topic_partitions
    other = real + 1
    code, lines = run({**stack.env, "PROJECTOR_TOPIC_PARTITIONS": str(other)}, "worker")
    assert code == 1
    assert lines == [
        f"projector worker: topic '{stack.settings.topics.topic_mailbox_tail}' has {real} partitions but "
        f"PROJECTOR_TOPIC_PARTITIONS is {other}: set PROJECTOR_TOPIC_PARTITIONS={real}"
    ]


async def test_a_reconcile_topic_not_co_partitioned_with_mailbox_tail_says_so(
    stack: Stack, make_topic: Callable[..., Any]
) -> None:
    other = stack.settings.topics.topic_partitions + 1
    topic = await make_topic("rcq-other", partitions=other)
    code, lines = run({**stack.env, "PROJECTOR_TOPIC_RECONCILE": topic}, "worker")
    assert code == 1
    assert lines == [
        f"projector worker: topic '{topic}' has {other} partitions but mailbox-tail has "
        f"{stack.settings.topics.topic_partitions}: reconcile requests must be co-partitioned with "
        "mailbox-tail (recreate it with `projector bootstrap`)"
    ]


def test_rebuild_by_replay_with_kafka_down_is_one_line(stack: Stack, tmp_path: Path) -> None:
    env = {**stack.env, "PROJECTOR_KAFKA_BOOTSTRAP": f"127.0.0.1:{free_port()}"}
    fresh = f"{stack.settings.redis.projection_namespace}-rb"
    code, lines = run(env, "rebuild", "--by-replay", "--namespace", fresh, "--progress", "never")
    assert code == 1
    assert len(lines) == 1 and "Unclosed" not in lines[0], lines
    assert lines[0].startswith("projector rebuild: cannot reach Kafka at 127.0.0.1:")
    assert lines[0].endswith(f"(no broker answered); {HINT}")


def test_bootstrap_with_cassandra_down_is_one_line(servers: Settings) -> None:
    # Nothing listens there: no keyspace or topic of anyone is touched (Kafka is skipped).
    env = {"PATH": "/usr/bin:/bin", "PROJECTOR_CASSANDRA_PORT": str(free_port())}
    code, lines = run(env, "bootstrap", "--skip-kafka", "--timeout", "5")
    assert code == 1 and len(lines) == 1, lines
    assert lines[0].startswith("cassandra: cannot reach Cassandra at 127.0.0.1 port ") and lines[0].endswith(
        HINT
    )
