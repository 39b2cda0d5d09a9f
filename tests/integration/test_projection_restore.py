"""The projection repair on the real servers (issue 18, app/worker/repair.py): a worker and the
query API over a redis-server of the test's own that keeps nothing on disk. Mid-stream the
server is FLUSHALLed (flushes go on into the emptied store); after the whole stream it is
SIGKILLed and started again, empty, with a new run id (no entry comes after that: only the
restore can bring the projection back). After each loss, with nobody running a command, the API
serves every user's lists and badge equal to `projector replay` of the stream, the store holds
replay's rows and versions, and the worker says so in a metric and a log line. On the local Redis
Cluster, one master losing the test's keys (a part of the store) is restored the same way."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis.asyncio as redis
from aiohttp.test_utils import TestServer

from app.api import Deps, create_app
from app.api.sources import RedisProjectionReader
from app.api.tokens import TokenSigner
from app.domain.client import sort_rows
from app.sdk import SessionsClient
from app.settings import Settings
from app.stores.redis_projection import RedisProjectionStore
from tests.integration.private_redis import PrivateRedis
from tests.integration.stack import Stack, free_port, read_jsonl, scrape_until, simulated
from tests.support import redis_cluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

SECRET = "restore-test-secret-0123456789abcdef"  # >= 32 characters


@pytest.fixture
async def volatile_redis(tmp_path: Path) -> AsyncIterator[PrivateRedis]:
    """Never the shared 6379: this one is FLUSHALLed and restarted."""
    server = PrivateRedis(tmp_path / "volatile-redis", persistent=False)
    server.start()
    yield server
    server.stop()


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return float("nan")


def split_after_markers(lines: list[bytes], lanes: int) -> int:
    """The index just after the first point where every lane has sent a marker."""
    reported: set[int] = set()
    for index in range(len(lines)):
        record = orjson.loads(lines[index])
        if record.get("type") == "watermark":
            reported.add(record["lane"])
            if len(reported) == lanes:
                return index + 1
    raise AssertionError("the stream has no complete set of markers")


class Api:
    """The query API in this process, reading the projection from the volatile Redis only
    (never filled from Cassandra state: what it serves is what the store holds)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings.replace(api_secret=SECRET, api_fill_from_state="never")
        self.client = redis.Redis.from_url(self.settings.redis.redis_url)
        self.server: TestServer | None = None

    async def start(self) -> str:
        store = RedisProjectionStore(self.client, self.settings.redis.projection_namespace)
        app = create_app(self.settings, Deps(projections=RedisProjectionReader(store), state=None))
        self.server = TestServer(app, host="127.0.0.1")
        await self.server.start_server()
        return str(self.server.make_url(""))

    async def close(self) -> None:
        if self.server is not None:
            await self.server.close()
        await self.client.aclose()


def listed(rows: list[dict[str, Any]], user_id: int, archived: bool) -> list[dict[str, Any]]:
    mine = [r for r in rows if r["user_id"] == user_id and r["listed"] and r["archived"] is archived]
    return [dict(r) for r in sort_rows(mine)]


async def api_mismatches(
    base: str, rows: list[dict[str, Any]], badges: dict[int, dict[str, Any]]
) -> list[int]:
    """Users whose lists or badge, as the API serves them now, differ from replay's (a request
    that fails, e.g. while Redis restarts, counts as a difference)."""
    wrong: list[int] = []
    for user_id, badge in badges.items():
        token = TokenSigner(SECRET).mint(user_id, int(time.time()) + 3600)
        try:
            async with SessionsClient(base, token, busy_retries=0) as client:
                main = await client.walk("main", 20)
                archived = await client.walk("archived", 20)
                served_badge = await client.badge()
        except Exception:
            wrong.append(user_id)
            continue
        if (
            main.rows != listed(rows, user_id, archived=False)
            or archived.rows != listed(rows, user_id, archived=True)
            or served_badge != {k: v for k, v in badge.items() if k != "user_id"}
        ):
            wrong.append(user_id)
    return wrong


async def wait_api_equal(
    base: str,
    rows: list[dict[str, Any]],
    badges: dict[int, dict[str, Any]],
    timeout: float,
    alive: Callable[[], None],
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        alive()
        wrong = await api_mismatches(base, rows, badges)
        if not wrong:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"after {timeout}s the API still differs from replay for users {wrong[:10]}")
        await asyncio.sleep(1.0)


async def test_the_projection_comes_back_by_itself_after_a_flushall_and_after_a_restart(
    volatile_redis: PrivateRedis, make_stack: Callable[..., Stack], tmp_path: Path
) -> None:
    port = free_port()
    overrides = {
        "PROJECTOR_REDIS_URL": volatile_redis.url,
        "PROJECTOR_WORKER_METRICS_PORT": str(port),
        "PROJECTOR_STORE_CHECK_INTERVAL_MS": "500",
        "PROJECTOR_WORKER_STORE_RETRY_MAX_MS": "1000",
    }
    if "PROJECTOR_REDIS_RETRY_BUDGET_MS" in Settings.env_names():
        overrides["PROJECTOR_REDIS_RETRY_BUDGET_MS"] = "200"
    stack = make_stack("restore", **overrides)
    metrics_url = f"http://127.0.0.1:{port}/metrics"
    stream = tmp_path / "stream.jsonl"
    stack.run(
        *("simulate", "--users", "30", "--conversations", "10", "--group-size", "15"),
        *("--messages", "400", "--rate", "0", "--lanes", "2", "--seed", "11"),
        *("--out", str(stream), "--no-kafka", "--progress", "never"),
    )
    lines = stream.read_bytes().splitlines()
    out = tmp_path / "replay"
    stack.run("replay", "--input", str(stream), "--out", str(out), "--lanes", "2", "--progress", "never")
    rows = read_jsonl(out / "projections.jsonl")
    badges = {b["user_id"]: b for b in read_jsonl(out / "badges.jsonl")}
    versions = {u: b["projection_mailbox_seq"] for u, b in badges.items()}
    # Three parts: the loss comes after the first, while the worker is still reading the second.
    first = split_after_markers(lines, 2)
    second = (first + len(lines)) // 2
    assert 0 < first < second < len(lines)
    head = tmp_path / "head.jsonl"
    head.write_bytes(b"\n".join(lines[:first]) + b"\n")
    stack.run(
        *("replay", "--input", str(head), "--out", str(tmp_path / "head")),
        *("--lanes", "2", "--progress", "never"),
    )
    head_versions = {
        b["user_id"]: b["projection_mailbox_seq"] for b in read_jsonl(tmp_path / "head" / "badges.jsonl")
    }

    api = Api(stack.settings)
    base = await api.start()
    probe = redis.Redis.from_url(volatile_redis.url)
    try:
        stack.start_worker()
        alive = stack.alive()
        await stack.produce(lines[:first])
        # The first part projected; the store was checked (its markers set at first sight: a
        # new store is no loss, nothing written again).
        await stack.wait_for_versions(head_versions, timeout=240, alive=alive)
        text = await scrape_until(
            metrics_url, lambda t: "projector_projection_restores_total" in t, 120, alive
        )
        assert metric(text, "projector_projection_restores_total") == 0
        assert metric(text, "projector_projection_restored_users_total") == 0
        assert metric(text, "projector_projection_restore_reflushed_users_total") == 0

        # FLUSHALL mid-stream: the second part is on its way, flushes write into the empty store.
        await stack.produce(lines[first:second])
        assert await probe.flushall() is True
        await stack.produce(lines[second:])
        await wait_api_equal(base, rows, badges, 300, alive)
        await stack.wait_for_versions(versions, timeout=60, alive=alive)
        assert await stack.projection(sorted(badges)) == (rows, read_jsonl(out / "badges.jsonl"))
        text = await scrape_until(
            metrics_url, lambda t: metric(t, "projector_projection_restores_total") >= 1, 60, alive
        )
        after_flushall = metric(text, "projector_projection_restores_total")
        restored_users = metric(text, "projector_projection_restored_users_total")
        # Users are written again at their version, or (entries applied since their last flush)
        # whole by their next flush: which, depends on when the check ran.
        assert restored_users + metric(text, "projector_projection_restore_reflushed_users_total") >= 1

        # A restart that keeps nothing, after the whole stream: no flush will come; only the
        # restore writes anything now.
        run_id = (await probe.info("server"))["run_id"]
        volatile_redis.kill()
        await probe.aclose()
        volatile_redis.start()
        probe = redis.Redis.from_url(volatile_redis.url)
        assert (await probe.info("server"))["run_id"] != run_id  # another server, empty at start
        await wait_api_equal(base, rows, badges, 300, alive)
        assert await stack.projection(sorted(badges)) == (rows, read_jsonl(out / "badges.jsonl"))
        text = await scrape_until(
            metrics_url,
            lambda t: metric(t, "projector_projection_restores_total") >= after_flushall + 2,
            60,
            alive,
        )
        # Arrival reconciliation through both losses: the markers' counts all met (the loss of
        # the store is not a loss of entries).
        missing = [line for line in text.splitlines() if line.startswith("projector_entries_missing{")]
        assert len(missing) == 4 and all(line.endswith(" 0.0") for line in missing), missing
        # Every user was written again (each had a flushed version: all restated at it).
        assert metric(text, "projector_projection_restored_users_total") >= restored_users + len(badges)
    finally:
        await probe.aclose()
        await api.close()
        if not volatile_redis.running:
            volatile_redis.start()  # make_stack's clean-up deletes the test's keys in it
    stack.stop_workers()
    log = (stack.tmp / "worker-0.log").read_text(errors="replace")
    assert stack.workers[0].returncode == 0, stack.log_tail(lines=120)
    # The FLUSHALL (one partition at least: users of the other may all have been flushed again
    # whole before it was checked), the restart (both).
    assert log.count("projection store lost data") >= 3, stack.log_tail(lines=120)
    assert "repaired partition" in log
    assert "Traceback" not in log


async def wait_store_equal(stack: Stack, expected: dict[str, Any], timeout: float) -> None:
    users = sorted(expected["versions"])
    deadline = time.monotonic() + timeout
    while True:
        stack.alive()()
        rows, badges = await stack.projection(users)
        if rows == expected["rows"] and badges == expected["badges"]:
            return
        assert time.monotonic() < deadline, f"the store differs from replay after {timeout}s"
        await asyncio.sleep(0.5)


async def test_on_a_cluster_a_master_that_lost_its_keys_is_restored(
    make_stack: Callable[..., Stack], tmp_path: Path
) -> None:
    """One master of the local Redis Cluster loses every key of the test's namespace (as a master
    restarted without its data would, its slots only; the cluster is shared with other tests, so
    only this namespace's keys go): its stretches' markers go with them, and the users of its
    slots come back from the worker's state."""
    redis_cluster.require_healthy()
    port = free_port()
    stack = make_stack(
        "rcrestore",
        partitions=2,
        lanes=2,
        PROJECTOR_REDIS_URL=redis_cluster.URL,
        PROJECTOR_STORE_CHECK_INTERVAL_MS="500",
        PROJECTOR_WORKER_METRICS_PORT=str(port),
    )
    _, expected = simulated(stack, tmp_path, messages=300, seed=61)
    stack.start_worker()
    alive = stack.alive()
    await stack.wait_for_versions(expected["versions"], timeout=300, alive=alive)
    await wait_store_equal(stack, expected, 60)
    # Both partitions' markers were set (the first check of a new store finds nothing lost).
    deadline = time.monotonic() + 120
    while stack.log_tail(0, 100_000).count("nothing lost in partition") < 2:
        alive()
        assert time.monotonic() < deadline, stack.log_tail(0, 80)
        await asyncio.sleep(0.3)

    users = sorted(expected["versions"])
    victim = redis_cluster.master_of(redis_cluster.user_slot(users[0]))
    lost = [u for u in users if victim.owns(redis_cluster.user_slot(u))]
    assert 0 < len(lost) < len(users)  # a part of the store, not all of it
    node = redis_cluster.client(victim.port)
    try:
        # SCAN on that node only: the keys of its slots.
        doomed = list(node.scan_iter(match=f"{stack.settings.redis.projection_namespace}:*", count=1000))
        assert any(":alive:" in key for key in doomed)  # markers of its stretches among them
        for key in doomed:
            node.delete(key)
    finally:
        node.close()
    await wait_store_equal(stack, expected, 240)
    text = await scrape_until(
        f"http://127.0.0.1:{port}/metrics",
        lambda t: metric(t, "projector_projection_restored_users_total") >= len(lost),
        60,
        alive,
    )
    assert metric(text, "projector_projection_restores_total") >= 1
    stack.stop_workers()
    log = stack.log_tail(0, 100_000)
    assert "projection store lost data (its markers in the store are gone)" in log, stack.log_tail(0, 80)
    assert "Traceback" not in log
