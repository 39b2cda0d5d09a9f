"""J-6 from state on the real servers (issue 7): a generated stream through the worker; snapshot
every row and badge; `projector rebuild --from-state` into a fresh namespace is identical on every
field state can know (app/rebuild/from_state.py lists the rest: the row's and the user's
projection_mailbox_seq) and does not change what serves; then with the projection deleted, a
rebuild with --swap brings it back and the API serves the rebuilt namespace."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from app.api import Deps, create_app
from app.api.sources import RedisProjectionReader
from app.api.tokens import TokenSigner
from app.domain.badge import Badge
from app.domain.flush import UserFlush
from app.rebuild.from_state import UNKNOWABLE_FROM_STATE
from app.stores.redis_projection import RedisProjectionStore, serving_key
from tests.integration.stack import PROJECTOR, ROOT, Stack, read_jsonl
from tests.support.api import SECRET

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

BADGE = ("user_id", "total_unread", "total_mention", "muted_unread")


def knowable(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if k not in UNKNOWABLE_FROM_STATE} for row in rows]


async def namespace_projection(stack: Stack, namespace: str, users: list[int]) -> tuple[list[Any], list[Any]]:
    store = RedisProjectionStore.from_settings(stack.settings.redis, namespace)
    try:
        rows: list[dict[str, Any]] = []
        badges: list[dict[str, Any]] = []
        for user_id in users:
            stored = await store.load(user_id)
            rows += [stored.rows[cid] for cid in sorted(stored.rows)]
            badges.append({"user_id": user_id, **{k: getattr(stored, k) for k in BADGE[1:]}})
        return rows, badges
    finally:
        await store.aclose()


async def test_rebuild_from_state_then_swap(make_stack: Callable[..., Stack], tmp_path: Path) -> None:
    stack = make_stack("rebuild")
    base = stack.settings.redis.projection_namespace
    stream = tmp_path / "stream.jsonl"
    stack.run(
        *("simulate", "--users", "30", "--conversations", "10", "--group-size", "20"),
        *("--messages", "300", "--rate", "0", "--lanes", "2", "--seed", "5"),
        *("--out", str(stream), "--progress", "never"),
    )
    out = tmp_path / "replay"
    stack.run("replay", "--input", str(stream), "--out", str(out), "--lanes", "2", "--progress", "never")
    expected_badges = read_jsonl(out / "badges.jsonl")
    versions = {b["user_id"]: b["projection_mailbox_seq"] for b in expected_badges}
    users = sorted(versions)
    stack.start_worker()
    await stack.wait_for_versions(versions, timeout=240, alive=stack.alive())
    stack.stop_workers()  # quiescent: the state mirror and the projection are final
    live_rows, live_badges = await stack.projection(users)
    assert live_rows
    cleared = [r for r in live_rows if r["hidden_before_conversation_seq"] > 0]
    deleted = [r for r in live_rows if r["deleted_before_conversation_seq"] > 0]

    fresh_ns, swapped_ns = f"{base}-r1", f"{base}-r2"
    cleanup = RedisProjectionStore.from_settings(stack.settings.redis, base)
    try:
        # 1. Into a fresh namespace while the live one serves: identical, and nothing swapped.
        report1 = tmp_path / "r1.json"
        stack.run("rebuild", "--from-state", "--namespace", fresh_ns, "--all-known", "--report", str(report1))
        diff = orjson.loads(report1.read_bytes())["diff"]
        assert diff["identical"], diff
        assert diff["users"] == len(users) and diff["rows_rebuilt"] == diff["rows_live"] == len(live_rows)
        assert await cleanup.client.get(serving_key(base)) is None
        rows1, badges1 = await namespace_projection(stack, fresh_ns, users)
        assert knowable(rows1) == knowable(live_rows)
        assert badges1 == [{k: b[k] for k in BADGE} for b in live_badges]
        assert (await stack.projection(users)) == (live_rows, live_badges)  # the live one untouched

        # 2. Projection lost: delete it, rebuild by user list, swap.
        assert await cleanup.delete_all() == len(users)
        report2 = tmp_path / "r2.json"
        listing = ",".join(map(str, users))
        stack.run(
            "rebuild",
            "--from-state",
            "--namespace",
            swapped_ns,
            "--users",
            listing,
            "--swap",
            "--report",
            str(report2),
        )
        report = orjson.loads(report2.read_bytes())
        assert report["swapped"] is True
        assert report["diff"]["rows_added"] == len(live_rows) and report["diff"]["rows_live"] == 0
        assert (await cleanup.client.get(serving_key(base))) == swapped_ns.encode()
        rows2, badges2 = await namespace_projection(stack, swapped_ns, users)
        assert knowable(rows2) == knowable(live_rows)
        assert badges2 == badges1
        # Cleared and deleted stay distinguishable (two columns; a deleted row is not listed).
        by_key = {(r["user_id"], r["conversation_id"]): r for r in rows2}
        for row in cleared + deleted:
            again = by_key[(row["user_id"], row["conversation_id"])]
            assert again["hidden_before_conversation_seq"] == row["hidden_before_conversation_seq"]
            assert again["deleted_before_conversation_seq"] == row["deleted_before_conversation_seq"]
            assert again["listed"] == row["listed"]

        # 3. The API built from the settings (as `projector api`) follows the swap.
        settings = stack.settings.replace(api_secret=SECRET)
        store = RedisProjectionStore.from_settings(settings.redis)
        try:
            app = create_app(settings, Deps(projections=RedisProjectionReader(store)))
            async with TestClient(TestServer(app)) as client:
                # The user with the most unread: the deleted base namespace would serve 0.
                user = max(live_badges, key=lambda b: b["total_unread"])["user_id"]
                bearer = TokenSigner(SECRET).mint(user, int(time.time()) + 600)
                async with client.get("/v1/badge", headers={"Authorization": f"Bearer {bearer}"}) as resp:
                    body = await resp.json()
                expected = next(b for b in live_badges if b["user_id"] == user)
                assert body["total_unread"] == expected["total_unread"] > 0
                assert store.namespace == swapped_ns
            # The worker's store (from_settings, no namespace) writes where the API now reads.
            writer = RedisProjectionStore.from_settings(stack.settings.redis)
            try:
                newcomer = UserFlush(10**9, [], Badge(3, 0, 0), 1, 0, 1, "after-swap", 1)
                assert await writer.write([newcomer]) == [0]
            finally:
                await writer.aclose()
            after = await RedisProjectionStore(cleanup.client, swapped_ns).load(10**9)
            assert after.total_unread == 3 and after.projection_mailbox_seq == 1
        finally:
            await store.aclose()

        # Rebuilding into the namespace that serves is refused.
        with pytest.raises(AssertionError, match="serving namespace"):
            stack.run("rebuild", "--from-state", "--namespace", swapped_ns, "--users", "1")
    finally:
        for ns in (fresh_ns, swapped_ns):
            await RedisProjectionStore(cleanup.client, ns).delete_all()
        await cleanup.client.delete(serving_key(base))
        await cleanup.aclose()


async def test_rebuild_by_replay_is_identical_field_by_field_then_swap(
    make_stack: Callable[..., Stack], tmp_path: Path
) -> None:
    """J-6 by replay: every field, versions included; with the projection deleted, too."""
    stack = make_stack("rebuild-replay")
    base = stack.settings.redis.projection_namespace
    stream = tmp_path / "stream.jsonl"
    stack.run(
        *("simulate", "--users", "30", "--conversations", "10", "--group-size", "20"),
        *("--messages", "300", "--rate", "0", "--lanes", "2", "--seed", "9"),
        *("--out", str(stream), "--progress", "never"),
    )
    out = tmp_path / "replay"
    stack.run("replay", "--input", str(stream), "--out", str(out), "--lanes", "2", "--progress", "never")
    versions = {b["user_id"]: b["projection_mailbox_seq"] for b in read_jsonl(out / "badges.jsonl")}
    users = sorted(versions)
    stack.start_worker()
    await stack.wait_for_versions(versions, timeout=240, alive=stack.alive())
    stack.stop_workers()
    live_rows, live_badges = await stack.projection(users)
    assert live_rows

    first_ns, swapped_ns, disk_ns = f"{base}-p1", f"{base}-p2", f"{base}-p3"
    cleanup = RedisProjectionStore.from_settings(stack.settings.redis, base)
    try:
        report1 = tmp_path / "p1.json"
        stack.run("rebuild", "--by-replay", "--namespace", first_ns, "--report", str(report1))
        report = orjson.loads(report1.read_bytes())
        assert report["diff"]["identical"] and report["diff"]["unknowable_differing"] == {}, report["diff"]
        assert report["replay"]["pending"] == 0 and report["swapped"] is False
        rows1, badges1 = await namespace_projection(stack, first_ns, users)
        assert rows1 == live_rows
        assert badges1 == [{k: b[k] for k in BADGE} for b in live_badges]
        assert await cleanup.client.get(serving_key(base)) is None

        # The same with the core's state in RocksDB (--state-dir) and a hot set of 5 rows: rows
        # leave memory after every persist and are read back as entries touch them.
        state_dir = tmp_path / "rebuild-state"
        report3 = tmp_path / "p3.json"
        stack.run(
            *("rebuild", "--by-replay", "--namespace", disk_ns, "--report", str(report3)),
            *("--state-dir", str(state_dir), "--hot-rows", "5"),
        )
        report = orjson.loads(report3.read_bytes())
        assert report["diff"]["identical"] and report["diff"]["unknowable_differing"] == {}, report["diff"]
        assert report["users_rebuilt"] == len(users), report  # counted from what was written
        rows3, badges3 = await namespace_projection(stack, disk_ns, users)
        assert rows3 == live_rows
        assert badges3 == badges1
        assert {"rows", "users"} <= {p.name.split("-")[0] for p in state_dir.iterdir()}
        # A folder holding a run's state is not scratch space any more: refused, nothing written.
        argv = [*PROJECTOR, "rebuild", "--by-replay", "--namespace", f"{base}-p4", "--state-dir"]
        refused = subprocess.run(
            [*argv, str(state_dir)],
            cwd=ROOT,
            env=stack.env,
            capture_output=True,
            timeout=300,
            check=False,
        )
        assert refused.returncode == 2 and b"not empty" in refused.stderr

        assert await cleanup.delete_all() == len(users)
        stack.run(
            "rebuild",
            "--by-replay",
            "--namespace",
            swapped_ns,
            "--swap",
            "--report",
            str(tmp_path / "p2.json"),
        )
        assert (await cleanup.client.get(serving_key(base))) == swapped_ns.encode()
        store = RedisProjectionStore.from_settings(stack.settings.redis, swapped_ns)
        try:
            for badge in live_badges:  # the user's version too: same core, same entries
                assert (await store.load(badge["user_id"])).projection_mailbox_seq == badge[
                    "projection_mailbox_seq"
                ]
        finally:
            await store.aclose()
        rows2, _ = await namespace_projection(stack, swapped_ns, users)
        assert rows2 == live_rows
    finally:
        for ns in (first_ns, swapped_ns, disk_ns):
            await RedisProjectionStore(cleanup.client, ns).delete_all()
        await cleanup.client.delete(serving_key(base))
        await cleanup.aclose()


async def test_a_rebuild_beside_a_running_worker_serves_nothing_until_swap(
    make_stack: Callable[..., Stack], tmp_path: Path
) -> None:
    """The worker keeps running: a rebuild changes nothing the API serves; --swap moves the API
    and the worker's next writes onto the rebuilt namespace."""
    from tests.support.builders import StreamBuilder

    stack = make_stack("rebuild-live")
    base = stack.settings.redis.projection_namespace
    s = StreamBuilder(lanes=2)
    for seq in range(1, 4):
        s.message(7, seq, lane=seq % 2)
        s.message(8, seq, lane=seq % 2)
    await stack.produce(s.close())
    stack.start_worker()
    alive = stack.alive()
    await stack.wait_for_versions({7: s.seq - 1, 8: s.seq}, timeout=180, alive=alive)

    settings = stack.settings.replace(api_secret=SECRET, api_fill_from_state="never")
    store = RedisProjectionStore.from_settings(settings.redis)  # as `projector api`: follows the swap
    app = create_app(settings, Deps(projections=RedisProjectionReader(store)))
    cleanup = RedisProjectionStore.from_settings(stack.settings.redis, base)
    namespaces = (f"{base}-l1", f"{base}-l2")
    try:
        async with TestClient(TestServer(app)) as client:

            async def unread(user_id: int) -> int:
                bearer = TokenSigner(SECRET).mint(user_id, int(time.time()) + 600)
                async with client.get("/v1/badge", headers={"Authorization": f"Bearer {bearer}"}) as resp:
                    assert resp.status == 200
                    value: int = (await resp.json())["total_unread"]
                    return value

            async def until(user_id: int, value: int, timeout: float = 60) -> None:
                deadline = time.monotonic() + timeout
                while (got := await unread(user_id)) != value:
                    alive()
                    assert time.monotonic() < deadline, f"user {user_id}: unread {got}, want {value}"
                    await asyncio.sleep(0.3)

            await until(7, 3)
            assert await cleanup.delete_all() == 2  # the projection is lost
            await until(7, 0)
            stack.run(
                "rebuild", "--by-replay", "--namespace", namespaces[0], "--report", str(tmp_path / "a.json")
            )
            await asyncio.sleep(1.5)  # longer than the API's serving recheck
            assert await unread(7) == 0  # not swapped: nothing served changed
            assert await cleanup.client.get(serving_key(base)) is None

            stack.run(
                *("rebuild", "--by-replay", "--namespace", namespaces[1], "--swap"),
                *("--report", str(tmp_path / "b.json")),
            )
            await until(7, 3)
            s.lines = []
            s.message(7, 4)
            await stack.produce(s.close())
            await until(7, 4)  # the worker wrote into the swapped namespace, where the API reads
            assert await cleanup.user_ids() == []  # and not into the old one
    finally:
        await store.aclose()
        for ns in namespaces:
            await RedisProjectionStore(cleanup.client, ns).delete_all()
        await cleanup.client.delete(serving_key(base))
        await cleanup.aclose()
