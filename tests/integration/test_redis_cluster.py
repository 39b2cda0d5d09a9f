"""Issue 15 on the local Redis Cluster (3 masters + 3 replicas, tests/support/redis_cluster.py): the
worker writes the cluster through `PROJECTOR_REDIS_URL=redis+cluster://...` and ends equal to
`projector replay`; `projector api` serves every user's pages and badge from it; J-7 (a SIGKILL
between the store write and the frames); slots migrate (`redis-cli --cluster reshard`, and one
slot held half-migrated) while the worker writes; a master is killed mid-stream and its replica
promoted. Each test runs a private stack (stack.py)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import aiohttp
import orjson
import pytest

from app.stores.redis_projection import RedisProjectionStore, serving_key
from tests.integration.stack import PROJECTOR, ROOT, Stack, assert_final_equals_replay, free_port, simulated
from tests.support import redis_cluster
from tests.support.api import SECRET, token
from tests.support.rows import listed

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


@pytest.fixture(autouse=True)
def healthy_cluster() -> Iterator[None]:
    """Each test starts on a healthy cluster and leaves one (a killed node is restarted, a
    migration finished, by the tests themselves; this waits until the cluster agrees)."""
    redis_cluster.require_healthy()
    yield
    redis_cluster.wait_healthy()


def cluster_stack(make_stack: Callable[..., Stack], prefix: str, **env: str) -> Stack:
    return make_stack(prefix, partitions=2, lanes=2, PROJECTOR_REDIS_URL=redis_cluster.URL, **env)


async def stored_users(stack: Stack, at_least: int, timeout: float = 180) -> list[int]:
    """The users the worker has written so far, once there are `at_least` of them."""
    store = RedisProjectionStore.from_settings(
        stack.settings.redis, stack.settings.redis.projection_namespace
    )
    deadline = time.monotonic() + timeout
    try:
        while True:
            users = await store.user_ids()
            if len(users) >= at_least:
                return users
            stack.alive()()
            assert time.monotonic() < deadline, f"only {len(users)} users written after {timeout}s"
            await asyncio.sleep(0.3)
    finally:
        await store.aclose()


async def wait_for_log(stack: Stack, needles: tuple[str, ...], timeout: float, after: int = 0) -> str:
    """The first of `needles` the worker logs (past the first `after` characters of its log)."""
    deadline = time.monotonic() + timeout
    while True:
        text = stack.log_tail(0, 100_000)[after:]
        found = next((n for n in needles if n in text), None)
        if found is not None:
            return found
        stack.alive()()
        assert time.monotonic() < deadline, f"the worker never logged any of {needles} in {timeout}s"
        await asyncio.sleep(0.3)


class ApiProcess:
    """`projector api` as an operator runs it, on the stack's settings (the cluster URL)."""

    def __init__(self, stack: Stack) -> None:
        self.port = free_port()
        env = {
            **stack.env,
            "PROJECTOR_API_SECRET": SECRET,
            "PROJECTOR_API_PORT": str(self.port),
            "PROJECTOR_API_FILL_FROM_STATE": "never",  # only what the cluster holds
        }
        self.log = (stack.tmp / "api.log").open("ab")
        self.proc = subprocess.Popen(
            [*PROJECTOR, "api"], cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log
        )
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = stack.tmp / "api.log"

    async def ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession() as http:
            while True:
                if self.proc.poll() is not None:
                    raise AssertionError(f"projector api exited {self.proc.returncode}:\n{self.tail()}")
                try:
                    async with http.get(f"{self.base}/metrics") as resp:
                        if resp.status == 200:
                            return
                except aiohttp.ClientConnectionError:
                    pass  # still starting
                assert time.monotonic() < deadline, f"projector api not up after {timeout}s:\n{self.tail()}"
                await asyncio.sleep(0.3)

    def tail(self) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-40:])

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


async def test_worker_writes_the_cluster_equal_to_replay_and_the_api_serves_it(
    make_stack: Callable[..., Stack], tmp_path: Path
) -> None:
    from app.sdk import SessionsClient

    stack = cluster_stack(make_stack, "rcw")
    _, expected = simulated(stack, tmp_path, messages=300, seed=51)
    stack.start_worker()
    await stack.wait_for_versions(expected["versions"], timeout=300, alive=stack.alive())
    await assert_final_equals_replay(stack, expected)
    # The users really are spread over the masters, each user's keys on the master of its slot.
    users = sorted(expected["versions"])
    owners = {redis_cluster.master_of(redis_cluster.user_slot(u)).port for u in users}
    assert len(owners) >= 2, owners
    stack.stop_workers()

    # `projector rebuild` on the cluster: by replay into a fresh namespace, identical field by
    # field (same core, same entries), and --swap sets the serving pointer (one key, one slot):
    # the API below follows it, so every page and badge it serves comes from the rebuild.
    base = stack.settings.redis.projection_namespace
    rebuilt = f"{base}-r"
    report_path = tmp_path / "rebuild.json"
    stack.run("rebuild", "--by-replay", "--namespace", rebuilt, "--swap", "--report", str(report_path))
    report = orjson.loads(report_path.read_bytes())
    assert report["diff"]["identical"] and report["diff"]["users"] == len(users), report["diff"]
    assert report["swapped"] is True
    pointer = RedisProjectionStore.from_settings(stack.settings.redis, base)
    try:
        assert await pointer.client.get(serving_key(base)) == rebuilt.encode()
    finally:
        await pointer.aclose()

    api = ApiProcess(stack)
    try:
        await api.ready()
        rows = expected["rows"]
        for user_id, badge in ((b["user_id"], b) for b in expected["badges"]):
            async with SessionsClient(api.base, token(user_id)) as client:
                for limit in (3, 50):
                    main = await client.walk("main", limit, max_restarts=0)
                    archived = await client.walk("archived", limit, max_restarts=0)
                    assert main.rows == listed(rows, user_id, archived=False), (user_id, limit)
                    assert archived.rows == listed(rows, user_id, archived=True), (user_id, limit)
                assert await client.badge() == {k: v for k, v in badge.items() if k != "user_id"}
    finally:
        api.stop()
        cleanup = RedisProjectionStore.from_settings(stack.settings.redis, rebuilt)
        try:
            await cleanup.delete_all()
            await cleanup.client.delete(serving_key(base))
        finally:
            await cleanup.aclose()


async def test_j7_sigkill_between_store_write_and_frames_on_the_cluster(
    make_stack: Callable[..., Stack], tmp_path: Path
) -> None:
    """Acceptance J-7 on the cluster: the worker is SIGKILLed right after a store write (before
    its frames and commit), restarts, and ends equal to replay with badges that are the sum of
    their rows (each user's rows and badge are one script on one slot, on whichever master)."""
    stack = cluster_stack(make_stack, "rcj", PROJECTOR_FAULT_KILL_AFTER_STORE_WRITES="2")
    _, expected = simulated(stack, tmp_path, messages=300, seed=81)
    crashing = stack.start_worker()
    assert crashing.wait(timeout=240) == -signal.SIGKILL, stack.log_tail()
    assert "fault injection" in stack.log_tail()
    stack.env["PROJECTOR_FAULT_KILL_AFTER_STORE_WRITES"] = "0"
    stack.start_worker()
    await stack.wait_for_versions(expected["versions"], timeout=300, alive=stack.alive(1))
    await assert_final_equals_replay(stack, expected)
    owners = {redis_cluster.master_of(redis_cluster.user_slot(u)).port for u in expected["versions"]}
    assert len(owners) >= 2, owners


def cut_after_markers(lines: list[bytes], lanes: int, start: int) -> int:
    """The index just after the first point at or past `start` where every lane has sent a
    watermark marker since `start`: the entries before it are all applicable."""
    reported: set[int] = set()
    for index in range(start, len(lines)):
        record = orjson.loads(lines[index])
        if record.get("type") == "watermark":
            reported.add(record["lane"])
            if len(reported) == lanes:
                return index + 1
    raise AssertionError(f"no complete set of markers after line {start}")


def users_in(lines: list[bytes]) -> set[int]:
    return {
        record["user_id"]
        for record in map(orjson.loads, lines)
        if record.get("type") != "watermark" and isinstance(record.get("user_id"), int)
    }


async def produce_paced(stack: Stack, lines: list[bytes], chunk: int = 40, pause_s: float = 0.2) -> None:
    """The entries in small chunks with pauses: the worker keeps writing while a reshard runs."""
    for at in range(0, len(lines), chunk):
        await stack.produce(lines[at : at + chunk])
        await asyncio.sleep(pause_s)


async def test_slots_migrate_while_the_worker_writes(
    make_stack: Callable[..., Stack], tmp_path: Path
) -> None:
    stack = cluster_stack(make_stack, "rcm", PROJECTOR_REDIS_RETRY_BUDGET_MS="120000")
    # The entries go to Kafka in three parts the test controls (the MessageStore has every message
    # first): (A) before anything moves, (B) paced while `redis-cli --cluster reshard` runs, (C)
    # only once a slot is held half-migrated, so the worker is bound to write into it — with the
    # load running on its own, a loaded machine could finish it before the slot was split.
    stream, expected = await asyncio.to_thread(simulated, stack, tmp_path, 1200, 61, "0", kafka=False)
    lines = stream.read_bytes().splitlines()
    lanes = stack.settings.processing.lanes
    cut_a = cut_after_markers(lines, lanes, len(lines) // 4)
    cut_b = cut_after_markers(lines, lanes, len(lines) // 2)
    assert 0 < cut_a < cut_b < len(lines)
    stack.start_worker()
    try:
        await stack.produce(lines[:cut_a])
        users = await stored_users(stack, at_least=10)
        # 1. redis-cli --cluster reshard, the tool an operator uses: it moves the source's lowest
        #    slots first, so move all of them up to one user's slot (its keys move under writes):
        #    the user for which that is the fewest slots, never all of a master's (an emptied
        #    master would turn itself into a replica).
        masters = [n for n in redis_cluster.nodes() if n.is_master and not n.failed and n.slots]

        def cost(user: int) -> int:
            owner = next(m for m in masters if m.owns(redis_cluster.user_slot(user)))
            count = redis_cluster.slots_up_to(owner, redis_cluster.user_slot(user))
            return count if count < owner.slot_count else 1 << 20

        first = min(users, key=cost)
        slot = redis_cluster.user_slot(first)
        source = redis_cluster.master_of(slot)
        target = min((n for n in masters if n.id != source.id), key=lambda n: n.slot_count)
        count = redis_cluster.slots_up_to(source, slot)
        assert count < source.slot_count
        writing = asyncio.create_task(produce_paced(stack, lines[cut_a:cut_b]))
        out = await asyncio.to_thread(redis_cluster.reshard, source, target, count)
        await writing
        assert f"Moving slot {slot} from" in out
        assert redis_cluster.master_of(slot).port == target.port
        # 2. One slot held half-migrated (MIGRATING/IMPORTING, the user's rows key moved, its meta
        #    not) while the entries of part C reach the worker: a user stored already that part C
        #    names. Its script gets TRYAGAIN, redis-py retries, then the store's backoff; the
        #    migration then completes and the write goes through.
        later = users_in(lines[cut_b:])
        second = next(u for u in users if u in later and redis_cluster.user_slot(u) != slot)
        slot2 = redis_cluster.user_slot(second)
        source2 = redis_cluster.master_of(slot2)
        target2 = next(
            n for n in redis_cluster.nodes() if n.is_master and not n.failed and n.id != source2.id
        )
        rows_key = f"{stack.settings.redis.projection_namespace}:rows:{{{second}}}"
        with redis_cluster.slot_half_migrated(slot2, source2, target2, first=[rows_key]):
            await stack.produce(lines[cut_b:])
            met = await wait_for_log(stack, ("TTL exhausted", "TryAgain", "TRYAGAIN"), timeout=180)
        assert met
        assert redis_cluster.master_of(slot2).port == target2.port
        await stack.wait_for_versions(expected["versions"], timeout=300, alive=stack.alive())
        await assert_final_equals_replay(stack, expected)
        stack.alive()()  # the worker never died
    finally:
        # Even the slots out again, so that runs after runs do not drain one master.
        await asyncio.to_thread(redis_cluster.rebalance)


async def test_a_master_killed_mid_stream_fails_over_and_the_worker_goes_on(
    make_stack: Callable[..., Stack], tmp_path: Path
) -> None:
    stack = cluster_stack(make_stack, "rcf", PROJECTOR_REDIS_RETRY_BUDGET_MS="120000")
    # As in the migration test, the test sends the entries: a part before the kill, the rest
    # while the master is dead, its failover held until the worker has met it (with a load
    # running on its own, a loaded machine could finish it before the kill).
    stream, expected = await asyncio.to_thread(simulated, stack, tmp_path, 1200, 71, "0", kafka=False)
    lines = stream.read_bytes().splitlines()
    cut = cut_after_markers(lines, stack.settings.processing.lanes, len(lines) // 3)
    assert 0 < cut < len(lines)
    stack.start_worker()
    killed: redis_cluster.KilledNode | None = None
    try:
        await stack.produce(lines[:cut])
        await stored_users(stack, at_least=10)
        later = users_in(lines[cut:])
        masters = [n for n in redis_cluster.nodes() if n.is_master and not n.failed and n.slots]
        # The master holding most of the users the rest of the stream names: the worker is
        # bound to write to it.
        victim = max(masters, key=lambda m: sum(m.owns(redis_cluster.user_slot(u)) for u in later))
        assert any(victim.owns(redis_cluster.user_slot(u)) for u in later)
        logged = len(stack.log_tail(0, 100_000))
        with redis_cluster.failover_held(victim):
            killed = redis_cluster.kill_node(victim.port)
            await stack.produce(lines[cut:])
            # It meets the dead master and retries (the store's warning), and lives on.
            await wait_for_log(stack, ("); retry ",), timeout=180, after=logged)
        promoted = await asyncio.to_thread(redis_cluster.wait_failover, victim)
        assert promoted.port != victim.port
        await stack.wait_for_versions(expected["versions"], timeout=300, alive=stack.alive())
        await assert_final_equals_replay(stack, expected)
        stack.alive()()  # one worker, never restarted
    finally:
        if killed is not None:
            await asyncio.to_thread(killed.restart)
