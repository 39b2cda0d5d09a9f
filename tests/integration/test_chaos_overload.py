"""Issue 18, scenario "overload": the worker offered twice what it can do, for 5 minutes.

First its capacity is measured on this machine in this run: a backlog produced before a worker
starts, drained as fast as it can (entries applied per second between 20% and 80% of it). Then
a second stack gets a stream paced at twice that rate for the overload window. Checked: the lag
(end offsets minus the group's committed offsets) grows, the worker's resident memory stays
bounded, the worker never exits, it catches up after the window, and the end state equals
`projector replay`.

The CI size runs here (a short window); `make chaos` runs the full one (`-m chaos`)."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.integration.chaos_flow import (
    compare,
    one,
    placed,
    replay,
    scrape,
    send_batches,
    start_worker,
    wait_ready,
)
from tests.integration.stack import Stack, free_port
from tests.support.chaos_results import record, scale, scaled
from tests.support.probes import RssWatch, peak_rss_kib, rss_kib

pytestmark = [pytest.mark.integration, pytest.mark.timeout(3600)]

APPLIED = "projector_entries_applied_total"


async def measure_capacity(stack: Stack, tmp: Path, messages: int, seed: int) -> tuple[float, float]:
    """(entries applied per second while draining a backlog, entries per simulated message)."""
    stream = tmp / "capacity.jsonl"
    await asyncio.to_thread(
        stack.run,
        *("simulate", "--users", "200", "--conversations", "150", "--group-size", "20"),
        *("--messages", str(messages), "--rate", "0", "--lanes", str(stack.settings.processing.lanes)),
        *("--seed", str(seed), "--out", str(stream), "--progress", "never"),
        timeout=1800,
    )
    expected = replay(stack, stream, tmp)
    port = free_port()
    start_worker(stack, 0, PROJECTOR_WORKER_METRICS_PORT=str(port))
    # From 10% to 90% of the backlog: the start-up (seconds, more than a small backlog takes to
    # drain) is outside the measure. Scraped every 0.1 s; when both marks fall between two
    # scrapes, the span from the scrape before counts: a capacity measured high only makes the
    # overload harder (CI once measured it from the start: 786 entries/s for a worker that
    # applied everything offered, and the lag never grew).
    low, high = 0.1 * expected.entries, 0.9 * expected.entries
    marks: dict[str, tuple[float, float]] = {}
    before = (time.monotonic(), 0.0)
    deadline = time.monotonic() + 1800
    while "high" not in marks:
        stack.alive()()
        assert time.monotonic() < deadline, "the capacity backlog was not drained"
        applied = one(await scrape(port), APPLIED)
        now = time.monotonic()
        if applied >= low and "low" not in marks:
            marks["low"] = (now, applied) if applied < high else before
        if applied >= high and "low" in marks:
            marks["high"] = (now, applied)
        before = (now, applied)
        await asyncio.sleep(0.1)
    (t0, a0), (t1, a1) = marks["low"], marks["high"]
    capacity = (a1 - a0) / max(t1 - t0, 0.1)
    assert capacity > 0, f"no capacity measured: {marks}"
    stack.stop_workers()
    return capacity, expected.entries / messages


async def run_overload(
    make_stack: Callable[..., Stack], tmp: Path, backlog_messages: int, window_s: float, seed: int
) -> dict[str, Any]:
    numbers: dict[str, Any] = {}
    probe = make_stack("capacity", partitions=4, lanes=2)
    (tmp / "capacity").mkdir(exist_ok=True)
    capacity, per_message = await measure_capacity(probe, tmp / "capacity", backlog_messages, seed)
    numbers.update(capacity_entries_per_s=round(capacity), window_s=window_s)
    target = 2 * capacity
    record("overload", **numbers)

    stack = make_stack("overload", partitions=4, lanes=2)
    stream = tmp / "overload.jsonl"
    messages = max(1, math.ceil(target * window_s / per_message))  # simulate reads 0 as "no end"
    # Generated ahead (messages stored in Cassandra, records to a file): the simulator cannot
    # reach twice the worker's rate live on the same two cores, a producer of ready lines can.
    await asyncio.to_thread(
        stack.run,
        *("simulate", "--users", "200", "--conversations", "150", "--group-size", "20"),
        *("--messages", str(messages), "--rate", "0", "--lanes", str(stack.settings.processing.lanes)),
        *("--seed", str(seed + 1), "--out", str(stream), "--no-kafka", "--progress", "never"),
        timeout=3600,
    )
    with stream.open("rb") as f:  # line by line: no second copy of a multi-GB file in memory
        lines = [line.rstrip(b"\r\n") for line in f if line.strip()]
    lines_per_entry = len(lines) / max(1, _entries(lines))
    records = placed(lines, stack.settings.topics.topic_partitions)
    port = free_port()
    worker = start_worker(stack, 0, PROJECTOR_WORKER_METRICS_PORT=str(port))
    await wait_ready(stack)
    rss_start = rss_kib(worker.pid)
    lag: list[tuple[float, int]] = []
    producer = await stack.open_producer()
    sent = 0
    started = time.monotonic()
    with RssWatch(lambda: [worker.pid]) as rss:
        try:
            # Paced: each 0.5 s tick sends what the target rate owes by then.
            next_lag = started
            while sent < len(lines):
                stack.alive()()
                elapsed = time.monotonic() - started
                owed = min(len(lines), int(target * elapsed * lines_per_entry))
                if owed > sent:
                    chunk = [r for line in records[sent:owed] for r in line]
                    await send_batches(producer, stack.settings.topics.topic_mailbox_tail, chunk)
                    sent = owed
                if time.monotonic() >= next_lag:
                    lag.append((round(time.monotonic() - started, 1), await _lag(stack)))
                    next_lag += 10
                await asyncio.sleep(0.5)
        finally:
            await producer.stop()
        window_end = time.monotonic()
        lag.append((round(window_end - started, 1), await _lag(stack)))
        rss_end_of_window = rss_kib(worker.pid)
        applied_in_window = one(await scrape(port), APPLIED)
        expected = replay(stack, stream, tmp)
        await stack.wait_for_versions(expected.versions, timeout=3600, alive=stack.alive())
        caught_up = time.monotonic()
        outcome = await compare(stack, expected)
    numbers.update(
        offered_entries_per_s=round(expected.entries / max(window_end - started, 1)),
        offered_vs_capacity=round(expected.entries / max(window_end - started, 1) / capacity, 2),
        entries=expected.entries,
        applied_per_s_in_window=round(applied_in_window / max(window_end - started, 1)),
        lag_first=lag[0][1] if lag else 0,
        lag_at_window_end=lag[-1][1],
        lag_max=max(v for _, v in lag),
        catch_up_after_window_s=round(caught_up - window_end, 1),
        rss_start_mib=round(rss_start / 1024, 1),
        rss_window_end_mib=round(rss_end_of_window / 1024, 1),
        peak_rss_mib=round(max(rss.peak_kib, peak_rss_kib(worker.pid)) / 1024, 1),
        worker_exited=worker.poll() is not None,
        mismatched_rows=outcome.mismatched_rows,
        mismatched_badges=outcome.mismatched_badges,
        lost=outcome.lost,
        double_counted=outcome.double_counted,
    )
    record("overload", **numbers)
    stack.alive()()
    assert numbers["lag_at_window_end"] > numbers["lag_first"], ("the lag did not grow", lag)
    assert outcome.equal, numbers
    # Bounded: the backlog waits in Kafka, not in the worker (a worker that buffered it would
    # grow with the backlog, tens of MiB per 100,000 entries).
    assert numbers["peak_rss_mib"] < 1536, numbers
    return numbers


def _entries(lines: list[bytes]) -> int:
    return sum(1 for line in lines if b'"watermark"' not in line)


async def _lag(stack: Stack) -> int:
    """Records on mailbox-tail not yet committed by the group (committed offsets lag the
    applied ones by at most a commit interval)."""
    ends = await stack.end_offsets()
    committed = await stack.group_offsets()
    return sum(max(0, end - committed.get(p, 0)) for p, end in ends.items())


async def test_twice_capacity_small(make_stack: Callable[..., Stack], tmp_path: Path) -> None:
    numbers = await run_overload(make_stack, tmp_path, backlog_messages=1500, window_s=5.0, seed=7)
    print(numbers)


@pytest.mark.chaos
async def test_full_size_twice_capacity(
    make_stack: Callable[..., Stack], tmp_path: Path, chaos_seed: int
) -> None:
    numbers = await run_overload(
        make_stack, tmp_path, backlog_messages=scaled(8000, 600), window_s=300.0 * scale(), seed=chaos_seed
    )
    print(numbers)
