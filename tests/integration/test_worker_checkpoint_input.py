"""Issue 31 items 5 and 6 through a real worker (tables/durable on the real Kafka): a checkpoint
is about one input. A worker whose checkpoint names a recreated mailbox-tail (a new topic id)
says so in one line and exits with code 3, never reading the new topic's records as "already
applied"; a worker whose checkpoint mailbox-tail's log start has passed (entries deleted unread)
counts and says the overrun and reads on from the log start; the projection epoch goes up by one
and every user of the partition is reconciled."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic, RecordsToDelete

from app.domain.reconcile import ReconcileRequest, decode_request
from app.runtime.worker import INPUT_MISMATCH_EXIT
from app.stores.redis_epoch import read_epoch
from app.stores.redis_projection import RedisProjectionStore
from tests.integration.stack import Stack, read_jsonl, simulated

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


async def _project_then_stop(stack: Stack, tmp_path: Path, seed: int) -> None:
    """A worker projects a small stream, then stops cleanly (its checkpoint persisted)."""
    stack.start_worker()
    _, expected = await asyncio.to_thread(simulated, stack, tmp_path, 60, seed)
    await stack.wait_for_versions(expected["versions"], timeout=240, alive=stack.alive())
    stack.stop_workers()
    stack.workers.clear()  # the next worker started is index 0 again


async def _admin(stack: Stack) -> AIOKafkaAdminClient:
    admin = AIOKafkaAdminClient(bootstrap_servers=stack.settings.kafka.kafka_bootstrap)
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
    topic = stack.settings.topics.topic_mailbox_tail
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
        tp = TopicPartition(stack.settings.topics.topic_mailbox_tail, 0)
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


async def _read_on(stack: Stack, timeout: float = 240) -> None:
    """Until the worker's committed offset reached mailbox-tail's end."""
    deadline = time.monotonic() + timeout
    while (await stack.group_offsets()).get(0, -1) < (await stack.end_offsets())[0]:
        stack.alive()()
        assert time.monotonic() < deadline, f"the worker did not read on:\n{stack.log_tail()}"
        await asyncio.sleep(0.5)


async def _reconcile_requests(stack: Stack) -> list[ReconcileRequest]:
    """Every record of the stack's reconcile-request topic, decoded."""
    topic = stack.settings.topics.topic_reconcile
    consumer = AIOKafkaConsumer(bootstrap_servers=stack.settings.kafka.kafka_bootstrap, group_id=None)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(stack.settings.topics.topic_partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        found: list[ReconcileRequest] = []
        while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
            for records in (await consumer.getmany(*tps, timeout_ms=1000)).values():
                found.extend(r for r in (decode_request(rec.value) for rec in records) if r is not None)
        return found
    finally:
        await consumer.stop()


def _marked(lines: list[bytes]) -> list[bytes]:
    """`lines` and a marker of lane 0 at their highest mailbox_seq."""
    entries = [orjson.loads(line) for line in lines]
    top = max(e["mailbox_seq"] for e in entries if "mailbox_seq" in e)
    ts = max(e["ts"] for e in entries)
    return [*lines, orjson.dumps({"type": "watermark", "lane": 0, "watermark": top, "ts": ts})]


def _replayed_versions(stack: Stack, tmp_path: Path, lines: list[bytes]) -> dict[int, int]:
    """Each user's version after `lines`, by `projector replay`."""
    part = tmp_path / "kept.jsonl"
    part.write_bytes(b"".join(line + b"\n" for line in lines))
    out = tmp_path / "replay-kept"
    stack.run(
        "replay", "--input", str(part), "--out", str(out), "--lanes", str(stack.settings.processing.lanes)
    )
    return {b["user_id"]: b["projection_mailbox_seq"] for b in read_jsonl(out / "badges.jsonl")}


def _pairs(lines: list[bytes]) -> dict[tuple[int, str], set[str]]:
    """(user, conversation) -> the entry types the lines hold for it."""
    out: dict[tuple[int, str], set[str]] = {}
    for line in lines:
        entry = orjson.loads(line)
        if "user_id" in entry and entry.get("conversation_id"):
            out.setdefault((entry["user_id"], entry["conversation_id"]), set()).add(entry["type"])
    return out


async def test_a_retention_overrun_bumps_the_epoch_and_reconciles_the_partitions_users(
    make_stack: Callable[..., Stack], tmp_path: Path
) -> None:
    """One stream in three parts: projected; deleted unread; kept after them. The MessageStore
    holds every message (`simulate --no-kafka`), the replay of the whole stream is the reference."""
    stack = make_stack("overrun-epoch", partitions=1, lanes=1)
    stream, expected = await asyncio.to_thread(simulated, stack, tmp_path, 300, 8, kafka=False)
    lines = stream.read_bytes().splitlines()
    cut1, cut2 = len(lines) // 3, 2 * len(lines) // 3
    # Each of the first two parts ends with a watermark marker (the lane's): all of it applicable.
    kept, deleted, after = _marked(lines[:cut1]), _marked(lines[cut1:cut2]), lines[cut2:]
    stack.start_worker()
    await stack.produce(kept)
    await stack.wait_for_versions(_replayed_versions(stack, tmp_path, kept), timeout=240, alive=stack.alive())
    users = sorted(expected["versions"])
    stored_before, _ = await stack.projection(users)
    stack.stop_workers()
    stack.workers.clear()
    checkpointed = (await stack.end_offsets())[0]
    await stack.produce(deleted)
    end = (await stack.end_offsets())[0]
    admin = await _admin(stack)
    try:
        tp = TopicPartition(stack.settings.topics.topic_mailbox_tail, 0)
        await admin.delete_records({tp: RecordsToDelete(before_offset=end)})
    finally:
        await admin.close()
    # The entries after the deleted ones are in the log when the worker comes back (an outage
    # longer than retention: the oldest of what arrived meanwhile is gone).
    await stack.produce(after)
    store = RedisProjectionStore.from_settings(stack.settings.redis)  # the base namespace
    try:
        assert await read_epoch(store) == 0
        stack.start_worker()
        await _wait_for_line(stack, "retention overrun")
        line = await _wait_for_line(stack, "projection epoch now")
        assert f"projection epoch now 1 (retention overrun at checkpoint offset {checkpointed})" in line
        assert await read_epoch(store) == 1
        await _read_on(stack)
        # Every user of the partition with a row was asked a reconcile, and handled it.
        asked_line = await _wait_for_line(stack, "users after the overrun")
        known = {row["user_id"] for row in stored_before}
        asked = {r.user_id for r in await _reconcile_requests(stack) if r.trigger == "retention"}
        assert known and known <= asked <= set(users), (known, asked)
        assert f"reconcile asked of {len(asked)} of its {len(asked)} users" in asked_line
        deadline = time.monotonic() + 240
        while stack.log_tail(0, 100_000).count("(retention):") < len(asked):
            stack.alive()()
            assert time.monotonic() < deadline, f"the reconciles were not handled:\n{stack.log_tail()}"
            await asyncio.sleep(0.5)
        assert await read_epoch(store) == 1  # once per overrun
    finally:
        await store.aclose()
    rows, _ = await stack.projection(users)
    stored = {(r["user_id"], r["conversation_id"]): r for r in rows}
    want = {(r["user_id"], r["conversation_id"]): r for r in expected["rows"]}
    before, lost, later = _pairs(kept), _pairs(deleted), _pairs(after)
    # A row known before the overrun whose deleted entries were only messages, with a message
    # after: unread and mentions as the replay of the whole stream says (the reconcile recounted
    # its window from the MessageStore, which holds the deleted messages).
    recovered = [
        pair
        for pair, kinds in lost.items()
        if pair in before and kinds == {"message"} and "message" in later.get(pair, set())
    ]
    assert recovered, "the stream has no row the test can check"
    for pair in recovered:
        fields = ("unread_count", "mention_count")
        assert {f: stored[pair][f] for f in fields} == {f: want[pair][f] for f in fields}, pair
    # The known gap: a conversation first seen in the deleted entries, nothing after, stays missing.
    gap = [pair for pair in lost if pair not in before and pair not in later]
    assert all(pair not in stored for pair in gap)
