"""Issue 4 acceptance on the real servers: dead letters, J-3 (never past the watermark), J-7
(SIGKILL between the store write and the frames, and at random points), two workers sharing
and handing over partitions. Each test runs a private stack (tests/integration/stack.py)."""

from __future__ import annotations

import asyncio
import random
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.integration.stack import Stack, assert_final_equals_replay, simulated
from tests.support.builders import CONV_A, StreamBuilder

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


async def test_bad_records_go_to_the_dead_letter_topic_and_the_worker_keeps_running(
    make_stack: Callable[..., Stack],
) -> None:
    stack = make_stack(partitions=1, lanes=1)
    s = StreamBuilder()
    s.message(7, 1)
    good = s.close()
    bad = [
        b"{not json",
        b'{"type":"teleport","mailbox_seq":5,"lane":0,"ts":1,"event_id":"e","user_id":7}',
        b'{"type":"read","mailbox_seq":6,"lane":0,"ts":1,"event_id":"e","user_id":7,"conversation_id":"'
        + CONV_A.encode()
        + b'"}',
        b'{"type":"read","mailbox_seq":7,"lane":0,"ts":1,"event_id":"e","user_id":7,"conversation_id":'
        b'"not-a-uuid","read_conversation_seq":1}',
        b'{"type":"read","mailbox_seq":8,"lane":0,"ts":1,"event_id":"e","user_id":-4,"conversation_id":"'
        + CONV_A.encode()
        + b'","read_conversation_seq":1}',
        b"\xff\xfe binary",
    ]
    await stack.produce([bad[0], bad[1], *good[:1], *bad[2:], *good[1:]])
    producer = await stack.open_producer()
    try:  # a tombstone (null value) and a zero-length value
        for value in (None, b""):
            await producer.send_and_wait(stack.settings.topics.topic_mailbox_tail, value, key=b"7")
    finally:
        await producer.stop()
    expected = len(bad) + 2
    stack.start_worker()
    await stack.wait_for_versions({7: 1}, timeout=180, alive=stack.alive())

    def once_each(got: list[dict[str, Any]]) -> list[dict[str, Any]]:
        # Delivery is at least once: a rebalance while starting may re-read (and so dead-letter
        # again) a record whose offset was not committed yet. A letter names its record.
        return list({(letter["partition"], letter["offset"]): letter for letter in got}.values())

    got = await stack.consume(
        stack.settings.topics.topic_dead_letter, lambda got: len(once_each(got)) >= expected, 60
    )
    letters = once_each(got)
    reasons = [letter["reason"] for letter in letters]
    assert len(letters) == expected, reasons
    assert sum("empty record" in r for r in reasons) == 2
    assert all(letter["topic"] == stack.settings.topics.topic_mailbox_tail for letter in letters)
    assert all(isinstance(letter["offset"], int) and letter["partition"] == 0 for letter in letters)
    assert any("malformed" in r.lower() or "truncated" in r.lower() for r in reasons)
    assert any("teleport" in r for r in reasons)
    assert any("read_conversation_seq" in r for r in reasons)
    assert any("UUID" in r for r in reasons)
    assert any("user_id" in r for r in reasons)
    assert [letter["value_encoding"] for letter in letters].count("base64") == 1  # the binary one
    stack.alive()()  # still running
    rows, _ = await stack.projection([7])
    assert rows[0]["unread_count"] == 1


async def test_j3_nothing_above_min_over_lanes_is_applied_and_the_late_entry_counts_once(
    make_stack: Callable[..., Stack],
) -> None:
    stack = make_stack(partitions=1, lanes=2)
    s = StreamBuilder(lanes=2)
    s.message(7, 1, lane=0)  # seq 1
    s.message(7, 2, lane=1)  # seq 2: lane 1's retry, delivered late
    late = s.lines.pop()
    s.message(7, 3, lane=0)  # seq 3
    s.marker(0, 3)
    s.marker(1, 1)  # lane 1 has written everything up to 1 only: hi = 1
    stack.start_worker()
    await stack.produce(s.lines)
    await stack.wait_for_versions({7: 1}, timeout=180, alive=stack.alive())
    await asyncio.sleep(2.0)  # several windows: anything applied above hi would have flushed
    rows, badges = await stack.projection([7])
    assert badges[0]["projection_mailbox_seq"] == 1, "applied past the min-over-lanes watermark"
    assert rows[0]["unread_count"] == 1
    await stack.produce([late, orjson.dumps({"type": "watermark", "lane": 1, "watermark": 3, "ts": s.ts})])
    await stack.wait_for_versions({7: 3}, timeout=120, alive=stack.alive())
    rows, _ = await stack.projection([7])
    assert rows[0]["unread_count"] == 3  # counted exactly once, never undercounted


async def test_j7_sigkill_between_store_write_and_frames_then_restart(
    make_stack: Callable[..., Stack], tmp_path: Path
) -> None:
    stack = make_stack(partitions=2, lanes=2, PROJECTOR_FAULT_KILL_AFTER_STORE_WRITES="2")
    _, expected = simulated(stack, tmp_path, messages=300, seed=21)
    crashing = stack.start_worker()
    assert crashing.wait(timeout=240) == -signal.SIGKILL, stack.log_tail()
    assert "fault injection" in stack.log_tail()
    stack.env["PROJECTOR_FAULT_KILL_AFTER_STORE_WRITES"] = "0"
    stack.start_worker()
    await stack.wait_for_versions(expected["versions"], timeout=300, alive=stack.alive(1))
    await assert_final_equals_replay(stack, expected)


async def test_j7_sigkill_at_random_points_during_a_load(
    make_stack: Callable[..., Stack], tmp_path: Path
) -> None:
    stack = make_stack(partitions=2, lanes=2)
    rnd = random.Random(7)
    stack.start_worker()
    load = asyncio.create_task(asyncio.to_thread(simulated, stack, tmp_path, 600, 33, "150"))
    for round_ in range(3):
        await asyncio.sleep(rnd.uniform(1.0, 3.0))
        stack.workers[-1].send_signal(signal.SIGKILL)
        stack.workers[-1].wait(timeout=30)
        stack.start_worker(index=0)  # same data dir: the local RocksDB survives, as on a real host
        if round_ == 1:
            # and once the local state is lost too: everything comes back from the changelogs
            stack.workers[-1].send_signal(signal.SIGKILL)
            stack.workers[-1].wait(timeout=30)
            stack.start_worker(index=round_ + 10)
    _, expected = await load
    await stack.wait_for_versions(expected["versions"], timeout=300, alive=lambda: None)
    await assert_final_equals_replay(stack, expected)


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["clean-stop", "killed"])
async def test_two_workers_share_partitions_and_hand_over_when_one_stops(
    make_stack: Callable[..., Stack], tmp_path: Path, stop: signal.Signals
) -> None:
    stack = make_stack(partitions=4, lanes=2)
    stack.start_worker(0)
    stack.start_worker(1)
    load = asyncio.create_task(asyncio.to_thread(simulated, stack, tmp_path, 600, 44, "120"))
    await asyncio.sleep(4.0)
    # Mid-stream, its partitions move to worker 0: after a clean stop (its hot state persisted
    # and offsets committed on revocation), or a kill (worker 0 restores the changelog as of the
    # last persist and reads again from the offsets committed with it).
    stack.workers[1].send_signal(stop)
    stack.workers[1].wait(timeout=120)
    _, expected = await load
    await stack.wait_for_versions(expected["versions"], timeout=300, alive=stack.alive(0))
    await assert_final_equals_replay(stack, expected)
    assert "assigned" in stack.log_tail(0, 400).lower()
