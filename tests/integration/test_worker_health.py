"""The worker's health and its store outages on the real servers (issue 15).

A worker on a redis-server of the test's own: ready once it has its partitions, not ready (and
still live) while that Redis is down, and it never dies of the outage: its flushes are held (one
log line, a metric), its intake paused (past a bound on held rows, 0 here), and when Redis is
back everything it held is written, the projection equal to replay's."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from app.settings import Settings
from tests.integration.private_redis import PrivateRedis
from tests.integration.stack import Stack, free_port, read_jsonl, scrape_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


@pytest.fixture
async def private_redis(tmp_path: Path) -> AsyncIterator[PrivateRedis]:
    redis = PrivateRedis(tmp_path / "private-redis")
    redis.start()
    yield redis
    redis.stop()


@pytest.fixture
def running_after(private_redis: PrivateRedis) -> Iterator[None]:
    """Runs before make_stack's clean-up (which deletes the test's keys in that Redis): a test
    that failed during its outage leaves the server killed."""
    yield
    if not private_redis.running:
        private_redis.start()


async def get(url: str) -> tuple[int, dict[str, Any], dict[str, str]]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(url, timeout=aiohttp.ClientTimeout(total=10)) as resp,
    ):
        body: dict[str, Any] = await resp.json()
        return resp.status, body, dict(resp.headers)


async def wait_status(
    url: str, status: int, timeout: float, alive: Callable[[], None]
) -> tuple[dict[str, Any], dict[str, str]]:
    """GET `url` until it answers `status` (the worker may still be starting)."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        alive()
        try:
            got, body, headers = await get(url)
            if got == status:
                return body, headers
            last = (got, body)
        except (aiohttp.ClientError, TimeoutError) as exc:
            last = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"{url}: no {status} after {timeout}s; last: {last}")
        await asyncio.sleep(0.3)


def split_after_markers(lines: list[bytes], lanes: int) -> int:
    """The index just after the first point where every lane has sent a watermark marker."""
    reported: set[int] = set()
    for index, line in enumerate(lines):
        record = orjson.loads(line)
        if record.get("type") == "watermark":
            reported.add(record["lane"])
            if len(reported) == lanes:
                return index + 1
    raise AssertionError("the stream has no complete set of markers")


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return float("nan")


async def test_a_worker_is_ready_then_rides_out_its_redis_going_down_and_coming_back(
    private_redis: PrivateRedis, make_stack: Callable[..., Stack], running_after: None, tmp_path: Path
) -> None:
    port = free_port()
    overrides = {
        "PROJECTOR_REDIS_URL": private_redis.url,
        "PROJECTOR_WORKER_METRICS_PORT": str(port),
        "PROJECTOR_WORKER_STORE_RETRY_MAX_MS": "1000",
        "PROJECTOR_WORKER_HELD_ROWS_MAX": "0",  # stop reading at the first held flush
    }
    if "PROJECTOR_REDIS_RETRY_BUDGET_MS" in Settings.env_names():
        # The store's own retries of one call (Redis Cluster work): short, so that each of the
        # worker's attempts fails within a second here.
        overrides["PROJECTOR_REDIS_RETRY_BUDGET_MS"] = "200"
    stack = make_stack("outage", **overrides)
    base = f"http://127.0.0.1:{port}"
    stream = tmp_path / "stream.jsonl"
    # The MessageStore gets every message first; the entries go to Kafka in two halves.
    stack.run(
        *("simulate", "--users", "30", "--conversations", "10", "--group-size", "20"),
        *("--messages", "300", "--rate", "0", "--lanes", "2", "--seed", "7"),
        *("--out", str(stream), "--no-kafka", "--progress", "never"),
    )
    lines = stream.read_bytes().splitlines()
    out = tmp_path / "replay"
    stack.run("replay", "--input", str(stream), "--out", str(out), "--lanes", "2", "--progress", "never")
    expected_rows = read_jsonl(out / "projections.jsonl")
    expected_badges = read_jsonl(out / "badges.jsonl")
    versions = {b["user_id"]: b["projection_mailbox_seq"] for b in expected_badges}
    # The first part ends where both lanes have reported: the worker flushes it before the outage.
    half = split_after_markers(lines, lanes=2)
    assert 0 < half < len(lines)

    stack.start_worker()
    alive = stack.alive()
    body, _ = await wait_status(f"{base}/readyz", 200, 180, alive)
    assert body["status"] == "ready"
    assert set(body["checks"]) == {
        "assignment",
        "kafka",
        "source_topic",
        "redis",
        "store_writes",
        "cassandra",
    }
    assert set(body["checks"].values()) == {"ok"}

    await stack.produce(lines[:half])
    await scrape_until(f"{base}/metrics", lambda t: metric(t, "projector_flushes_total") >= 1, 120, alive)

    private_redis.kill()
    await stack.produce(lines[half:])
    text = await scrape_until(
        f"{base}/metrics",
        # Several attempts failed (the backoff is at most 1 s here): still one streak.
        lambda t: metric(t, "projector_store_write_failures_total") >= 3,
        120,
        alive,
    )
    assert metric(text, "projector_store_failing") == 1
    assert metric(text, "projector_flushes_held") >= 1
    body, headers = await wait_status(f"{base}/readyz", 503, 60, alive)
    assert body["status"] == "not_ready" and headers["Retry-After"] == "5"
    # Refused at once, or (a client that retries its connection) no answer within the budget.
    assert (
        body["checks"]["redis"] in ("unavailable", "timeout") and body["checks"]["store_writes"] == "failing"
    )
    assert body["checks"]["kafka"] == body["checks"]["cassandra"] == "ok"
    assert {"redis", "store_writes"} <= set(body["failed"])
    status, live, _ = await get(f"{base}/livez")
    assert (status, live) == (200, {"status": "live"})  # not ready, still live: no restart needed

    private_redis.start()
    await wait_status(f"{base}/readyz", 200, 120, alive)
    await stack.wait_for_versions(versions, timeout=240, alive=alive)
    assert await stack.projection(sorted(versions)) == (expected_rows, expected_badges)
    text = await scrape_until(
        f"{base}/metrics", lambda t: metric(t, "projector_flushes_held") == 0, 60, alive
    )
    assert metric(text, "projector_store_failing") == 0

    stack.stop_workers()
    assert stack.workers[0].returncode == 0, stack.log_tail()
    log = (stack.tmp / "worker-0.log").read_text(errors="replace")
    assert log.count("writing a flush failed") == 1, stack.log_tail(lines=120)
    assert log.count("flushes are written again after") == 1
    assert log.count("intake paused (flushes held") == 1 and log.count("intake resumed") == 1
    assert "Event loop is closed" not in log
    assert "Traceback" not in log  # not one per attempt, not one at all
