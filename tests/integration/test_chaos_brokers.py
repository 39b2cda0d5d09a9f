"""Issue 18, a Kafka broker dies mid-stream. The shared broker on 9092 serves everyone's tests and
is never touched:

* "broker-single": a private single-node Kafka (tests/private_kafka.py) holds the stack's topics;
  a backlog is produced, the worker starts on it, and the broker is SIGKILLed when about a third
  is applied, stays down, and is started again on the same data. The worker must ride it out
  (never exit) and end equal to replay.
* "broker-cluster": the local 3-node KRaft cluster (RF 3, min.insync.replicas 2,
  tests/kafka_cluster.py); the leader of mailbox-tail partition 0 is SIGKILLed while the simulator
  produces at a steady rate (acks=all, idempotent), a new leader takes over, the node is started
  again later and rejoins the in-sync replicas. End state equal to replay.

The CI size runs the single-broker case small; `make chaos` runs both at full size."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.integration.chaos_flow import (
    Traffic,
    compare,
    one,
    replay,
    scrape,
    start_worker,
    traffic_task,
    wait_ready,
)
from tests.integration.stack import Stack, free_port
from tests.support import kafka_cluster as cluster
from tests.support.chaos_results import record, scale, scaled
from tests.support.private_kafka import PrivateKafka

pytestmark = [pytest.mark.integration, pytest.mark.timeout(2400)]

APPLIED = "projector_entries_applied_total"


async def _applied_at_least(stack: Stack, port: int, count: float, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while one(await scrape(port), APPLIED) < count:
        stack.alive()()
        assert time.monotonic() < deadline, f"fewer than {count} entries applied:\n{stack.log_tail()}"
        await asyncio.sleep(0.5)


async def run_single_broker(
    unique_name: Callable[..., str],
    tmp: Path,
    traffic: Traffic,
    down_s: float,
    name: str,
    kill_at: float = 1 / 3,
) -> dict[str, Any]:
    numbers: dict[str, Any] = {"down_s": down_s}
    broker = await asyncio.to_thread(PrivateKafka.start, tmp / "kafka")
    stack: Stack | None = None
    try:
        stack = Stack(
            unique_name("kafkakill"),
            tmp / "stack",
            partitions=4,
            lanes=2,
            PROJECTOR_KAFKA_BOOTSTRAP=broker.bootstrap,
        )
        stack.tmp.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(stack.run, "bootstrap")
        task, stream = traffic_task(stack, tmp, traffic)  # rate 0: the whole stream, a backlog
        await task
        expected = replay(stack, stream, tmp)
        numbers["entries"] = expected.entries
        port = free_port()
        worker = start_worker(stack, 0, PROJECTOR_WORKER_METRICS_PORT=str(port))
        await _applied_at_least(stack, port, max(1, expected.entries * kill_at))
        numbers["applied_at_kill"] = int(one(await scrape(port), APPLIED))
        await asyncio.to_thread(broker.kill)
        end = time.monotonic() + down_s
        while time.monotonic() < end:
            stack.alive()()  # the worker waits for the broker; it must not give up and exit
            await asyncio.sleep(1)
        restarted = time.monotonic()
        await asyncio.to_thread(broker.restart)
        numbers["broker_restart_s"] = round(time.monotonic() - restarted, 1)
        await stack.wait_for_versions(expected.versions, timeout=1200, alive=stack.alive())
        numbers["caught_up_after_restart_s"] = round(time.monotonic() - restarted, 1)
        outcome = await compare(stack, expected)
        numbers.update(
            mismatched_rows=outcome.mismatched_rows,
            mismatched_badges=outcome.mismatched_badges,
            lost=outcome.lost,
            double_counted=outcome.double_counted,
            worker_exited=worker.poll() is not None,
        )
        record(name, **numbers)
        stack.alive()()
        assert outcome.equal, numbers
        return numbers
    finally:
        if stack is not None:
            await stack.cleanup()
        await asyncio.to_thread(broker.stop)


async def test_single_broker_killed_small(unique_name: Callable[..., str], tmp_path: Path) -> None:
    traffic = Traffic(users=30, conversations=20, group_size=10, messages=1500, rate=0, seed=8)
    # Killed at the first entries applied: the small backlog goes fast.
    print(await run_single_broker(unique_name, tmp_path, traffic, 8.0, "broker-single-small", kill_at=0))


@pytest.mark.chaos
async def test_full_size_single_broker_killed(
    unique_name: Callable[..., str], tmp_path: Path, chaos_seed: int
) -> None:
    traffic = Traffic(
        users=200, conversations=150, group_size=20, messages=scaled(20_000, 1000), rate=0, seed=chaos_seed
    )
    print(await run_single_broker(unique_name, tmp_path, traffic, 60.0 * scale(), "broker-single"))


@pytest.mark.chaos
async def test_full_size_cluster_leader_killed(
    make_stack: Callable[..., Stack], tmp_path: Path, chaos_seed: int
) -> None:
    cluster.up()
    cluster.quiet_kafka_logs()
    stack = make_stack(
        "chaosrf3",
        partitions=4,
        lanes=2,
        PROJECTOR_KAFKA_BOOTSTRAP=cluster.BOOTSTRAP,
        PROJECTOR_TOPIC_REPLICATION_FACTOR="3",
    )
    topic = stack.settings.topics.topic_mailbox_tail
    numbers: dict[str, Any] = {}

    async def fully_replicated() -> bool:
        leader, isr = await cluster.partition_state(topic, 0)
        return leader in cluster.NODES and isr == [1, 2, 3]

    await cluster.wait_for(f"{topic}/0 on all three brokers", fully_replicated, 180)
    port = free_port()
    worker = start_worker(stack, 0, PROJECTOR_WORKER_METRICS_PORT=str(port))
    await wait_ready(stack)
    rate = 40.0
    down_s = 60.0 * scale()
    traffic = Traffic(
        users=200,
        conversations=150,
        group_size=20,
        messages=int(rate * (down_s + 120)),
        rate=rate,
        seed=chaos_seed,
    )
    task, stream = traffic_task(stack, tmp_path, traffic)
    await _applied_at_least(stack, port, 1000)
    leader = await cluster.leader_of(topic, 0)
    killed = await asyncio.to_thread(cluster.kill_broker, leader)
    numbers["killed_node"] = leader
    killed_at = time.monotonic()
    try:

        async def failed_over() -> bool:
            now, isr = await cluster.partition_state(topic, 0)
            return now in cluster.NODES and now != leader and leader not in isr

        await cluster.wait_for(f"a new leader for {topic}/0", failed_over, 180)
        numbers["new_leader_after_s"] = round(time.monotonic() - killed_at, 1)
        while time.monotonic() - killed_at < down_s:
            stack.alive()()
            await asyncio.sleep(1)
    finally:
        await asyncio.to_thread(killed.restart)
    restarted = time.monotonic()

    async def back_in_sync() -> bool:
        _, isr = await cluster.partition_state(topic, 0)
        return isr == [1, 2, 3]

    await cluster.wait_for(f"broker {leader} back in the in-sync replicas", back_in_sync, 300)
    numbers["back_in_isr_after_restart_s"] = round(time.monotonic() - restarted, 1)
    await task
    expected = replay(stack, stream, tmp_path)
    await stack.wait_for_versions(expected.versions, timeout=1200, alive=stack.alive())
    outcome = await compare(stack, expected)
    numbers.update(
        entries=expected.entries,
        down_s=down_s,
        mismatched_rows=outcome.mismatched_rows,
        mismatched_badges=outcome.mismatched_badges,
        lost=outcome.lost,
        double_counted=outcome.double_counted,
        worker_exited=worker.poll() is not None,
    )
    record("broker-cluster", **numbers)
    print(numbers)
    stack.alive()()
    assert outcome.equal, numbers
