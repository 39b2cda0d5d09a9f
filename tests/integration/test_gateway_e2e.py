"""The live push gateway end to end, two instances: `projector simulate` traffic through the real
worker; half the users online (each on the instance that reads their partition, through the SDK's
LiveStream), half offline. Online users' lists and badges follow the stream to exactly what a
fresh pull and `projector replay` say; offline users get APNs/FCM push records on topic `push`
(newest badge, ids as strings) from the instance that owns their badge partition; online users
get none; presence in Redis agrees across instances; a user at the wrong instance is told so."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import redis.asyncio as redis

from app.gateway.presence import RedisPresence
from app.sdk import LiveSessionList, SessionsClient
from app.sdk.stream import LiveStream
from tests.integration.gateway_stack import (
    Instance,
    assert_device_matches,
    eventually,
    gateway_instance,
    token,
)
from tests.integration.stack import PROJECTOR, ROOT, Stack, read_jsonl

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

GATEWAY: dict[str, Any] = {
    "push_window_ms": 500,
    "gateway_heartbeat_ms": 1000,
    "gateway_presence_ttl_ms": 6000,
}


async def run_async(stack: Stack, *args: str) -> None:
    """`projector ARGS` without blocking the event loop (the gateways and clients run on it)."""
    proc = await asyncio.create_subprocess_exec(
        *PROJECTOR, *args, cwd=ROOT, env=stack.env, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(), timeout=300)
    assert proc.returncode == 0, f"projector {' '.join(args)}: {err.decode()[-2000:]}"


async def _online_is(presence: RedisPresence, users: list[int], expected: set[int]) -> bool:
    return await presence.online(users) == expected


async def consume_push(
    stack: Stack, done: Callable[[list[dict[str, Any]]], bool], timeout: float
) -> list[Any]:
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        stack.settings.topics.topic_push,
        bootstrap_servers=stack.settings.kafka.kafka_bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        group_id=None,
    )
    await consumer.start()
    records: list[dict[str, Any]] = []
    try:
        await eventually(lambda: _read(consumer, records, done), timeout, "push records")
    finally:
        await consumer.stop()
    return records


async def _read(consumer: Any, records: list[dict[str, Any]], done: Callable[[list[Any]], bool]) -> bool:
    batch = await consumer.getmany(timeout_ms=300)
    for got in batch.values():
        for record in got:
            value = orjson.loads(record.value)
            assert record.key == value["user_id"].encode()  # keyed by user: one partition each
            records.append(value)
    return done(records)


async def test_two_instances_stream_online_users_and_push_offline_ones(
    make_stack: Callable[..., Stack], tmp_path: Path
) -> None:
    stack = make_stack("gwe", partitions=2)
    sim: tuple[str, ...]
    sim = ("--users", "24", "--conversations", "10", "--group-size", "12", "--messages", "300")
    sim += ("--lanes", "2", "--seed", "5", "--progress", "never")
    # The same seed gives the same users: learn them first (nothing written anywhere).
    preview = tmp_path / "preview.jsonl"
    stack.run("simulate", *sim, "--rate", "0", "--no-kafka", "--no-cassandra", "--out", str(preview))
    users = sorted({e["user_id"] for e in read_jsonl(preview) if "user_id" in e})
    online, offline = set(users[::2]), set(users[1::2])
    stack.start_worker()

    async with (
        gateway_instance(stack.settings, gateway_partitions="0", **GATEWAY) as first,
        gateway_instance(stack.settings, gateway_partitions="1", **GATEWAY) as second,
    ):
        instances = [first, second]
        assert first.gateway.partition_of is not None  # open_gateway sets it

        def home(user: int) -> Instance:
            assert first.gateway.partition_of is not None
            return instances[first.gateway.partition_of(user)]

        # One push group over the badge topic: each partition (so each user) has one producer.
        def push_split() -> bool:
            mine, theirs = first.gateway.push.assigned(), second.gateway.push.assigned()
            return len(mine) == 1 and len(theirs) == 1 and mine | theirs == {0, 1}

        await eventually(push_split, 90, "the push group split the badge partitions")
        stray = next(iter(online))
        async with (
            aiohttp.ClientSession() as http,
            http.get(
                instances[1 - first.gateway.partition_of(stray)].url + "/v1/stream",
                headers={"Authorization": "Bearer " + token(stray)},
            ) as resp,
        ):
            assert resp.status == 421  # this instance does not read that user's partition

        stop = asyncio.Event()
        clients: dict[int, tuple[SessionsClient, LiveSessionList, LiveStream]] = {}
        tasks = []
        for user in sorted(online):
            api = SessionsClient(home(user).url, token(user))
            live = LiveSessionList(api, user, limit=20)
            follow = LiveStream(live, read_timeout_s=20)
            clients[user] = (api, live, follow)
            tasks.append(asyncio.create_task(follow.run(stop)))
        try:
            for _, _, follow in clients.values():
                await follow.until(lambda f=follow: f.synced, 60)  # type: ignore[misc]
            for index, instance in enumerate(instances):
                served = {u for u in online if first.gateway.partition_of(u) == index}
                assert set(instance.gateway.hub.connected_users()) == served
            client = redis.Redis.from_url(stack.settings.redis.redis_url)
            presence = RedisPresence(client, stack.settings.redis.projection_namespace, "probe", 6000)
            try:
                # Both instances' claims (written in batches), one view.
                await eventually(lambda: _online_is(presence, users, online), 30, "presence")
            finally:
                await client.aclose()

            # Live traffic (MessageStore, then mailbox entries) while the users are connected.
            stream = tmp_path / "stream.jsonl"
            await run_async(stack, "simulate", *sim, "--rate", "150", "--out", str(stream))
            out = tmp_path / "replay"
            await run_async(stack, "replay", "--input", str(stream), "--out", str(out), "--lanes", "2")
            badges = {b["user_id"]: b for b in read_jsonl(out / "badges.jsonl")}
            versions = {u: b["projection_mailbox_seq"] for u, b in badges.items()}
            assert sorted(badges) == users
            await stack.wait_for_versions(versions, timeout=300, alive=stack.alive())

            for user, (api, live, follow) in clients.items():
                await assert_device_matches(api, live, follow, badges[user])

            def all_pushed(records: list[dict[str, Any]]) -> bool:
                last = {int(r["user_id"]): r["projection_mailbox_seq"] for r in records}
                return all(last.get(u) == versions[u] for u in offline)

            records = await consume_push(stack, all_pushed, 120)
        finally:
            stop.set()
            await asyncio.gather(*tasks)
            for api, _, _ in clients.values():
                await api.close()

        pushed_users = {int(r["user_id"]) for r in records}
        assert pushed_users == offline  # online users had their badge on the stream instead
        for user in offline:
            mine = [r for r in records if int(r["user_id"]) == user]
            seen = [r["projection_mailbox_seq"] for r in mine]
            assert seen == sorted(seen), seen  # one producer per user: in version order
            total = badges[user]["total_unread"]
            assert mine[-1] == {
                "user_id": str(user),
                "projection_mailbox_seq": versions[user],
                "apns": {"aps": {"badge": total}},
                "fcm": {"notification_count": total},
            }
        sent = first.gateway.push.stats.sent + second.gateway.push.stats.sent
        assert sent == len(records) and first.gateway.push.stats.sent and second.gateway.push.stats.sent
        stats = (first.gateway.push.stats, second.gateway.push.stats)
        assert sum(s.skipped_online for s in stats) > 0  # online users' badge changes: no push
        # Coalesced: never more than one record per badge change of an offline user.
        assert sent <= sum(s.frames - s.skipped_online for s in stats)
