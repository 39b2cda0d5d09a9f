"""Issue 31 items 5 and 6 through a real worker (tables/durable on the real Kafka): a checkpoint
is about one input. A worker whose checkpoint names a recreated mailbox-tail (a new topic id)
says so in one line and exits with code 3, never reading the new topic's records as "already
applied"; a worker whose checkpoint mailbox-tail's log start has passed (entries deleted unread)
counts and says the overrun and reads on from the log start."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic, RecordsToDelete

from app.runtime.worker import INPUT_MISMATCH_EXIT
from tests.integration.stack import Stack, simulated

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


async def _project_then_stop(stack: Stack, tmp_path: Path, seed: int) -> None:
    """A worker projects a small stream, then stops cleanly (its checkpoint persisted)."""
    stack.start_worker()
    _, expected = await asyncio.to_thread(simulated, stack, tmp_path, 60, seed)
    await stack.wait_for_versions(expected["versions"], timeout=240, alive=stack.alive())
    stack.stop_workers()
    stack.workers.clear()  # the next worker started is index 0 again


async def _admin(stack: Stack) -> AIOKafkaAdminClient:
    admin = AIOKafkaAdminClient(bootstrap_servers=stack.settings.kafka_bootstrap)
    await admin.start()
    return admin


async def _wait_for_line(stack: Stack, text: str, timeout: float = 180) -> str:
    deadline = time.monotonic() + timeout
    while text not in stack.log_tail(0, 100_000):
        assert time.monotonic() < deadline, f"no {text!r} in the worker's log:\n{stack.log_tail()}"
        await asyncio.sleep(0.5)
    return next(line for line in stack.log_tail(0, 100_000).splitlines() if text in line)


async def test_a_recreated_mailbox_tail_stops_the_worker_with_one_line(
    make_stack: Callable[..., Stack], tmp_path: Path
) -> None:
    stack = make_stack("recreated", partitions=1, lanes=1)
    await _project_then_stop(stack, tmp_path, seed=3)
    topic = stack.settings.topic_mailbox_tail
    admin = await _admin(stack)
    try:
        await admin.delete_topics([topic])
        for _ in range(60):  # deletion is asynchronous on the broker
            if topic not in await admin.list_topics():
                break
            await asyncio.sleep(0.5)
        await admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        await admin.close()
    worker = stack.start_worker()
    try:
        code = await asyncio.to_thread(worker.wait, 180)
    except subprocess.TimeoutExpired:
        worker.kill()
        raise AssertionError(f"the worker went on with another input:\n{stack.log_tail()}") from None
    assert code == INPUT_MISMATCH_EXIT, stack.log_tail()
    lines = [line for line in stack.log_tail(0, 100_000).splitlines() if "is of another input" in line]
    assert len(lines) == 1, stack.log_tail()
    assert "mailbox-tail topic id" in lines[0] and "projector rebuild" in lines[0]
    assert "cluster id" not in lines[0].split("is of another input", 1)[1]  # the same cluster


async def test_entries_deleted_under_the_checkpoint_are_a_retention_overrun(
    make_stack: Callable[..., Stack], tmp_path: Path
) -> None:
    stack = make_stack("overrun", partitions=1, lanes=1)
    await _project_then_stop(stack, tmp_path, seed=4)
    checkpointed = (await stack.end_offsets())[0]
    # While no worker runs: more entries arrive, then everything up to the end is deleted.
    await asyncio.to_thread(simulated, stack, tmp_path, 20, 5)
    end = (await stack.end_offsets())[0]
    assert end > checkpointed
    admin = await _admin(stack)
    try:
        tp = TopicPartition(stack.settings.topic_mailbox_tail, 0)
        await admin.delete_records({tp: RecordsToDelete(before_offset=end)})
    finally:
        await admin.close()
    stack.start_worker()
    line = await _wait_for_line(stack, "retention overrun")
    assert f"mailbox-tail starts at offset {end}, the checkpoint needs {checkpointed}" in line
    assert f"{end - checkpointed} entries were deleted unread" in line
    # It reads on from the log start: entries produced now are projected.
    await asyncio.to_thread(simulated, stack, tmp_path, 30, 6)
    deadline = time.monotonic() + 240
    while (await stack.group_offsets()).get(0, -1) < (await stack.end_offsets())[0]:
        stack.alive()()
        assert time.monotonic() < deadline, f"the worker did not read on:\n{stack.log_tail()}"
        await asyncio.sleep(0.5)
    stack.alive()()
