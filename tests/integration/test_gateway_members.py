"""Member notifications through the gateway (seed 004, docs/contract.md §9): MEMBER_NOTICE frames on the
session-delta topic (keyed by user, as the worker produces them) reach each member's device over
/v1/stream, and the SDK's MemberDirectory reacts: t=24 (a member joined a 500-member group) makes
the other members' directories re-read the roster; t=27 (a member left, history) also drops the
history window. A notice reaches only its own user's stream."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import cast

import aiohttp
import orjson
import pytest

from app.members.directory import MemberDirectory, MemberDirectoryRegistry
from app.members.server import MemberService
from app.members.source import HttpMemberSource
from app.sdk import LiveSessionList, SessionsClient
from app.sdk.stream import LiveStream, members_to
from app.stores.cassandra_members import CassandraMemberReader
from app.stores.cassandra_session import open_cluster
from app.stores.cassandra_state import UserConversationStateWriter
from tests.integration.gateway_stack import gateway_instance, token
from tests.integration.stack import Stack

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ALICE, BOB = 11982011376358104761, 17  # two members with their devices online


def notice(user: int, group: str, kind: int, seq: int) -> bytes:
    return orjson.dumps(
        {
            "type": "MEMBER_NOTICE",
            "user_id": user,
            "conversation_id": group,
            "kind": kind,
            "conversation_seq": seq,
            "projection_mailbox_seq": seq,
        }
    )


async def test_member_notices_make_the_other_members_directories_re_read(
    make_stack: Callable[..., Stack],
) -> None:
    stack = make_stack("gwm", partitions=2)
    cluster, session = open_cluster(stack.settings.cassandra)
    keyspace = stack.settings.cassandra.cassandra_keyspace
    writer = UserConversationStateWriter(session, keyspace)
    group, elsewhere = str(uuid.uuid4()), str(uuid.uuid4())
    others = [1000 + i for i in range(498)]
    for user in (ALICE, BOB, *others):
        writer.stage_member(group, user, "member", "active", 1, None)
    await writer.flush()  # a 500-member group

    service = MemberService(CassandraMemberReader(session, keyspace), stats_budget_s=30.0)
    producer = await stack.open_producer()
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    history_dropped: list[tuple[int, str]] = []
    try:
        async with (
            gateway_instance(stack.settings, extra={"members": service}, gateway_heartbeat_ms=1000) as gw,
            aiohttp.ClientSession() as http,
        ):
            devices: dict[int, tuple[SessionsClient, MemberDirectoryRegistry, LiveStream]] = {}
            for user in (ALICE, BOB):
                api = SessionsClient(gw.url, token(user))
                registry = MemberDirectoryRegistry(
                    "it", str(user), HttpMemberSource(gw.url, token(user), http)
                )
                registry.subscribe(group)
                subscribed = registry.directory(group)
                subscribed.on_history_invalidated = lambda d, u=user: history_dropped.append((u, d.key.group))
                follow = LiveStream(
                    LiveSessionList(api, user), on_notice=members_to(registry), read_timeout_s=20
                )
                devices[user] = (api, registry, follow)
                tasks.append(asyncio.create_task(follow.run(stop)))
            for _, registry, follow in devices.values():
                await follow.until(lambda f=follow: f.synced, 60)  # type: ignore[misc]
                await asyncio.wait_for(registry.directory(group).until(lambda d: d.fresh), 60)
                assert len(registry.directory(group).members) == 500

            def directory(user: int) -> MemberDirectory:
                return devices[user][1].directory(group)

            reads = {user: directory(user).counters.traversals_completed for user in devices}

            # t=24: Carol joins; the worker tells every other member's stream.
            carol = 5000
            writer.stage_member(group, carol, "member", "active", 40, None)
            await writer.flush()
            topic = stack.settings.topics.topic_session_delta
            for user in (ALICE, BOB):
                await producer.send_and_wait(topic, notice(user, group, 24, 40), key=str(user).encode())
            for user in devices:
                again = reads[user] + 1
                await asyncio.wait_for(
                    directory(user).until(
                        cast(
                            "Callable[[MemberDirectory], bool]",
                            lambda d, n=again: d.counters.traversals_completed == n,
                        )
                    ),
                    60,
                )
                assert carol in directory(user).members and len(directory(user).members) == 501
            assert history_dropped == []

            # t=27 to Bob only: Bob's directory drops history and re-reads; Alice's is untouched.
            writer.stage_member(group, others[0], "member", "left", 1, 41)
            await writer.flush()
            await producer.send_and_wait(topic, notice(BOB, group, 27, 41), key=str(BOB).encode())
            bob_again = reads[BOB] + 2
            await asyncio.wait_for(
                directory(BOB).until(lambda d: d.counters.traversals_completed == bob_again), 60
            )
            assert others[0] not in directory(BOB).members and len(directory(BOB).members) == 500
            assert history_dropped == [(BOB, group)]
            assert directory(ALICE).counters.traversals_completed == reads[ALICE] + 1
            # A notice for a group the device holds no store of changes nothing.
            await producer.send_and_wait(topic, notice(ALICE, elsewhere, 24, 42), key=str(ALICE).encode())
            _, _, alice_stream = devices[ALICE]
            await alice_stream.until(lambda: alice_stream.stats.notices == 2, 60)
            assert directory(ALICE).counters.traversals_completed == reads[ALICE] + 1
            stop.set()
            await asyncio.gather(*tasks)
            for api, registry, _ in devices.values():
                await registry.aclose()
                await api.close()
    finally:
        stop.set()
        await asyncio.gather(*tasks)
        await producer.stop()
        cluster.shutdown()
