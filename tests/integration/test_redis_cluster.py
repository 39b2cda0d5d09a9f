"""Issue 15 on the local Redis Cluster (3 masters + 3 replicas, tests/support/redis_cluster.py): the
worker writes the cluster through `PROJECTOR_REDIS_URL=redis+cluster://...` and ends equal to
`projector replay`; `projector api` serves every user's pages and badge from it; slots migrate
(`redis-cli --cluster reshard`, and one slot held half-migrated) while the worker writes; a master
is killed mid-stream and its replica promoted. Each test runs a private stack (stack.py)."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import aiohttp
import pytest

from app.stores.redis_projection import RedisProjectionStore
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
    store = RedisProjectionStore.from_settings(stack.settings, stack.settings.projection_namespace)
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


async def wait_for_log(stack: Stack, needles: tuple[str, ...], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while True:
        text = stack.log_tail(0, 100_000)
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


async def test_slots_migrate_while_the_worker_writes(
    make_stack: Callable[..., Stack], tmp_path: Path
) -> None:
    stack = cluster_stack(make_stack, "rcm", PROJECTOR_REDIS_RETRY_BUDGET_MS="120000")
    stack.start_worker()
    load = asyncio.create_task(asyncio.to_thread(simulated, stack, tmp_path, 1200, 61, "80"))
    try:
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
        out = await asyncio.to_thread(redis_cluster.reshard, source, target, count)
        assert f"Moving slot {slot} from" in out
        assert redis_cluster.master_of(slot).port == target.port
        # 2. One slot held half-migrated (MIGRATING/IMPORTING, the user's rows key moved, its meta
        #    not) until the worker has met it: its script gets TRYAGAIN, redis-py retries, then
        #    the store's backoff; the migration then completes and the write goes through.
        second = next(u for u in users if redis_cluster.user_slot(u) != slot)
        slot2 = redis_cluster.user_slot(second)
        source2 = redis_cluster.master_of(slot2)
        target2 = next(
            n for n in redis_cluster.nodes() if n.is_master and not n.failed and n.id != source2.id
        )
        rows_key = f"{stack.settings.projection_namespace}:rows:{{{second}}}"
        with redis_cluster.slot_half_migrated(slot2, source2, target2, first=[rows_key]):
            met = await wait_for_log(stack, ("TTL exhausted", "TryAgain", "TRYAGAIN"), timeout=120)
        assert met
        assert redis_cluster.master_of(slot2).port == target2.port
        _, expected = await load
        await stack.wait_for_versions(expected["versions"], timeout=300, alive=stack.alive())
        await assert_final_equals_replay(stack, expected)
        stack.alive()()  # the worker never died
    finally:
        if not load.done():
            await asyncio.wait([load], timeout=300)
        # Even the slots out again, so that runs after runs do not drain one master.
        await asyncio.to_thread(redis_cluster.rebalance)


async def test_a_master_killed_mid_stream_fails_over_and_the_worker_goes_on(
    make_stack: Callable[..., Stack], tmp_path: Path
) -> None:
    stack = cluster_stack(make_stack, "rcf", PROJECTOR_REDIS_RETRY_BUDGET_MS="120000")
    stack.start_worker()
    load = asyncio.create_task(asyncio.to_thread(simulated, stack, tmp_path, 1200, 71, "80"))
    killed: redis_cluster.KilledNode | None = None
    try:
        users = await stored_users(stack, at_least=10)
        masters = [n for n in redis_cluster.nodes() if n.is_master and not n.failed and n.slots]
        # The master holding most of the stream's users: the worker is bound to write to it.
        victim = max(masters, key=lambda m: sum(m.owns(redis_cluster.user_slot(u)) for u in users))
        assert any(victim.owns(redis_cluster.user_slot(u)) for u in users)
        killed = redis_cluster.kill_node(victim.port)
        promoted = await asyncio.to_thread(redis_cluster.wait_failover, victim)
        assert promoted.port != victim.port
        _, expected = await load
        await stack.wait_for_versions(expected["versions"], timeout=300, alive=stack.alive())
        await assert_final_equals_replay(stack, expected)
        stack.alive()()  # one worker, never restarted
        # It did meet the dead master and retried (the store's warning), rather than being lucky.
        assert "); retry " in stack.log_tail(0, 100_000)
    finally:
        if not load.done():
            await asyncio.wait([load], timeout=300)
        if killed is not None:
            await asyncio.to_thread(killed.restart)
