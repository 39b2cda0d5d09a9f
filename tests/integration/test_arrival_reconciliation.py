"""Arrival reconciliation on the real servers (docs/contract.md §9, issue 18; app/domain/arrivals.py):
`projector simulate` sends its stream to Kafka with lanes writing some entries twice (retries)
and ONE entry left out on purpose, its markers carrying per-partition counts. A worker reads part
of it and is SIGKILLed (what it had not committed is read again by the next one); a third of the
entries is sent again; a second worker, restored from the changelogs, reads everything. It reports
exactly one entry missing, on one partition and lane (no false report from the duplicates, the
re-sent records or the re-reads), with a log line, and its projection is replay's."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from tests.integration.stack import PROJECTOR, ROOT, Stack, free_port, read_jsonl, scrape_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

SERIES = re.compile(r'^projector_entries_missing\{lane="(\d+)",partition="(\d+)"\} (\S+)$')


def missing(text: str) -> dict[tuple[int, int], float]:
    """(partition, lane) -> entries missing, from a worker's /metrics."""
    out: dict[tuple[int, int], float] = {}
    for line in text.splitlines():
        found = SERIES.match(line)
        if found:
            out[int(found.group(2)), int(found.group(1))] = float(found.group(3))
    return out


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return float("nan")


async def test_one_dropped_entry_is_reported_once_through_duplicates_a_kill_and_re_reads(
    make_stack: Callable[..., Stack], tmp_path: Path
) -> None:
    port = free_port()
    stack = make_stack("arrivals", PROJECTOR_WORKER_METRICS_PORT=str(port))
    metrics_url = f"http://127.0.0.1:{port}/metrics"
    stream = tmp_path / "stream.jsonl"
    # The worker reads while the stream is being sent (100 messages/s): it is killed mid-stream.
    stack.start_worker(0)
    await scrape_until(metrics_url, lambda t: "projector_flushes_total" in t, 240, stack.alive(0))
    simulate = subprocess.Popen(
        [
            *PROJECTOR,
            *("simulate", "--users", "30", "--conversations", "10", "--group-size", "12"),
            *("--messages", "300", "--rate", "100", "--lanes", "2", "--seed", "5"),
            *("--duplicates", "0.1", "--drop-entries", "1"),
            *("--out", str(stream), "--progress", "never"),
        ],
        cwd=ROOT,
        env=stack.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        await scrape_until(
            metrics_url, lambda t: metric(t, "projector_flushes_total") >= 1, 240, stack.alive(0)
        )
        stack.workers[0].send_signal(signal.SIGKILL)
        stack.workers[0].wait(timeout=60)
        _, stderr = await asyncio.to_thread(simulate.communicate, timeout=300)
    finally:
        if simulate.poll() is None:
            simulate.kill()
            simulate.wait()
    assert simulate.returncode == 0, stderr.decode()[-2000:]
    assert b"1 entries dropped on purpose" in stderr, stderr.decode()[-2000:]
    lines = stream.read_bytes().splitlines()
    markers = [orjson.loads(line) for line in lines if b'"watermark"' in line]
    assert markers and all("count" in m for m in markers)  # the markers carry counts
    out = tmp_path / "replay"
    stack.run("replay", "--input", str(stream), "--out", str(out), "--lanes", "2", "--progress", "never")
    badges = read_jsonl(out / "badges.jsonl")
    versions = {b["user_id"]: b["projection_mailbox_seq"] for b in badges}

    # Records read again: a third of the entries sent once more (the markers are not).
    entries = [line for line in lines if b'"watermark"' not in line]
    await stack.produce(entries[::3])

    stack.start_worker(1)
    alive = stack.alive(1)
    await stack.wait_for_versions(versions, timeout=300, alive=alive)
    text = await scrape_until(
        metrics_url,
        lambda t: len(missing(t)) == 4 and sum(missing(t).values()) >= 1,
        120,
        alive,
        detail=missing,
    )
    report = missing(text)
    assert sorted(report.values()) == [0.0, 0.0, 0.0, 1.0], report
    assert await stack.projection(sorted(versions)) == (read_jsonl(out / "projections.jsonl"), badges)

    stack.stop_workers()
    log = (stack.tmp / "worker-1.log").read_text(errors="replace")
    ((partition, lane),) = [key for key, value in report.items() if value == 1]
    assert f"partition {partition}, lane {lane}: 1 entries missing" in log, stack.log_tail(1, lines=80)
