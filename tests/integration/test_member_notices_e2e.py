"""Member notifications produced by the system, end to end (docs/contract.md §9; issue 16 part 2):
mailbox entries through the real worker → MEMBER_NOTICE frames on the session-delta topic →
the gateway's /v1/stream → SDK devices (LiveStream + MemberDirectoryRegistry) on the local servers.

A 500-member group whose roster the worker itself wrote (its Cassandra mirror of the `join`
entries). Carol joins, and every member's mailbox gets the t=24 message: the worker sends each of
the 501 members a notice, and the connected members' directories re-read the roster, which
already holds Carol (the worker writes its roster changes before the notices that follow them).
A member leaves, the others get t=27: the connected directories drop their history window and
re-read. An entry delivered twice is applied once: no second notice reaches the devices.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import aiohttp
import orjson
import pytest

from app.members.directory import MemberDirectory, MemberDirectoryRegistry
from app.members.server import MemberService
from app.members.source import HttpMemberSource
from app.replay import ReplayOptions, run_replay
from app.sdk import LiveSessionList, SessionsClient
from app.sdk.stream import LiveStream, members_to
from app.stores.cassandra_members import CassandraMemberReader
from app.stores.cassandra_session import open_cluster
from tests.integration.gateway_stack import eventually, gateway_instance, token
from tests.integration.stack import Stack, read_jsonl
from tests.support.builders import StreamBuilder

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ALICE, BOB, CAROL = 11982011376358104761, 17, 5000  # Alice and Bob have their devices online
OTHERS = [1000 + i for i in range(498)]
GROUP = str(uuid.UUID(int=0x5EED_0004))
WAIT_S = 120  # generous: a loaded 2-core machine; it takes well under a second


class Mailbox:
    """Entries as the chat backend's mailbox writer makes them (one lane; a marker closes each
    batch), produced through the stack to mailbox-tail."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.stream = StreamBuilder(lanes=1)
        self.conversation_seq = 0

    def notice(self, kind: int, about: int, members: list[int]) -> dict[int, int]:
        """The group's system message of `kind` about `about`, fanned out to `members`:
        {member: mailbox_seq of their entry}."""
        self.conversation_seq += 1
        seq = self.conversation_seq
        return {
            member: self.stream.entry(
                "message",
                member,
                GROUP,
                conversation_seq=seq,
                message_id=f"notice-{seq}",
                activity_id=f"{seq:032x}",
                sender_id=about,
                created_at=self.stream.ts,
                counts_unread=False,
                mention=False,
                notification=kind,
            )
            for member in members
        }

    def message(self, member: int, kind: object) -> int:
        """A counted group message to `member` carrying `notification` = kind as given (None:
        JSON null); its mailbox_seq."""
        self.conversation_seq += 1
        seq = self.conversation_seq
        return self.stream.entry(
            "message",
            member,
            GROUP,
            conversation_seq=seq,
            message_id=f"m-{seq}",
            activity_id=f"{seq:032x}",
            sender_id=BOB,
            created_at=self.stream.ts,
            counts_unread=True,
            mention=False,
            notification=kind,
        )

    async def send(self) -> list[bytes]:
        self.stream.marker(0)
        lines, self.stream.lines = self.stream.lines, []
        await self.stack.produce(lines)
        return lines


async def test_joins_and_leaves_reach_the_members_directories_through_worker_and_gateway(
    make_stack: Callable[..., Stack],
) -> None:
    # One partition: Carol's join and the members' notices share a partition, so the worker
    # applies the join first (lower mailbox_seq) and its roster write precedes the notices.
    stack = make_stack("mne", partitions=1, lanes=1)
    mailbox = Mailbox(stack)
    members = [ALICE, BOB, *OTHERS]
    joins = {
        user: mailbox.stream.entry("join", user, GROUP, joined_at_conversation_seq=0) for user in members
    }
    stack.start_worker()
    await mailbox.send()
    await stack.wait_for_versions(joins, WAIT_S, stack.alive())  # the roster: the worker's writes

    cluster, session = open_cluster(stack.settings.cassandra)
    service = MemberService(
        CassandraMemberReader(session, stack.settings.cassandra.cassandra_keyspace), stats_budget_s=30.0
    )
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    history_dropped: list[int] = []
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
                registry.subscribe(GROUP)
                registry.directory(GROUP).on_history_invalidated = lambda d, u=user: history_dropped.append(u)
                follow = LiveStream(
                    LiveSessionList(api, user), on_notice=members_to(registry), read_timeout_s=20
                )
                devices[user] = (api, registry, follow)
                tasks.append(asyncio.create_task(follow.run(stop)))

            def directory(user: int) -> MemberDirectory:
                return devices[user][1].directory(GROUP)

            def stream(user: int) -> LiveStream:
                return devices[user][2]

            for user in devices:
                await stream(user).until(lambda u=user: stream(u).synced, WAIT_S)  # type: ignore[misc]
                await asyncio.wait_for(
                    directory(user).until(lambda d: d.fresh and len(d.members) == 500), WAIT_S
                )
            reads = {user: directory(user).counters.traversals_completed for user in devices}
            assert all(stream(user).stats.notices == 0 for user in devices)

            # t=24: Carol joins; every member's mailbox (hers too) gets the notice message.
            mailbox.stream.entry("join", CAROL, GROUP, joined_at_conversation_seq=mailbox.conversation_seq)
            joined = mailbox.notice(24, CAROL, [*members, CAROL])
            sent = await mailbox.send()
            for user in devices:
                again = reads[user] + 1
                await asyncio.wait_for(
                    directory(user).until(
                        cast(
                            "Callable[[MemberDirectory], bool]",
                            lambda d, n=again: d.counters.traversals_completed == n,
                        )
                    ),
                    WAIT_S,
                )
                # The re-read roster holds Carol: the worker wrote it before it sent the notice.
                assert CAROL in directory(user).members and len(directory(user).members) == 501
                assert stream(user).stats.notices == 1
            assert history_dropped == []
            # One frame per member, keyed by the member, ids as numbers on the internal topic.
            frames = await notices_on_topic(stack, lambda fs: len(fs) >= len(joined))
            assert len(frames) == len(joined)
            assert {(key, f["user_id"]) for key, f in frames} == {(str(u).encode(), u) for u in joined}
            assert {(f["kind"], f["conversation_id"], f["conversation_seq"]) for _, f in frames} == {
                (24, GROUP, mailbox.conversation_seq)
            }
            assert {f["user_id"]: f["projection_mailbox_seq"] for _, f in frames} == joined

            # The same records again (a lane's retry): duplicates, applied never, notified never.
            await stack.produce(sent)
            read = mailbox.stream.read(ALICE, mailbox.conversation_seq)
            await mailbox.send()
            live = stream(ALICE).live
            await eventually(lambda: live.view.version >= read, WAIT_S, "Alice's list reached her read")
            assert stream(ALICE).stats.notices == 1 and stream(ALICE).stats.notices_repeated == 0

            # t=27: a member leaves; the others get the notice: history windows dropped, re-read.
            gone = OTHERS[0]
            mailbox.stream.entry(
                "leave", gone, GROUP, left_at_conversation_seq=mailbox.conversation_seq, reason="left"
            )
            mailbox.notice(27, gone, [u for u in [*members, CAROL] if u != gone])
            await mailbox.send()
            for user in devices:
                again = reads[user] + 2
                await asyncio.wait_for(
                    directory(user).until(
                        cast(
                            "Callable[[MemberDirectory], bool]",
                            lambda d, n=again: d.counters.traversals_completed == n,
                        )
                    ),
                    WAIT_S,
                )
                assert gone not in directory(user).members and len(directory(user).members) == 500
                assert stream(user).stats.notices == 2
            assert sorted(history_dropped) == sorted(devices)

            # Bad kinds are dead letters naming the field; an unknown kind is a plain message.
            bad = [mailbox.message(ALICE, kind) for kind in ("24", 2**32, None)]
            plain = mailbox.message(ALICE, 99)
            await mailbox.send()
            await eventually(lambda: live.view.version >= plain, WAIT_S, "Alice's list took the kind 99")
            letters = await stack.consume(
                stack.settings.topics.topic_dead_letter, lambda got: len(got) >= 3, WAIT_S
            )
            assert sorted(orjson.loads(d["value"])["mailbox_seq"] for d in letters) == bad
            assert all("$.notification" in d["reason"] for d in letters), letters
            assert stream(ALICE).stats.notices == 2
            stop.set()
            await asyncio.gather(*tasks)
            for api, registry, _ in devices.values():
                await registry.aclose()
                await api.close()
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        cluster.shutdown()


async def notices_on_topic(
    stack: Stack, done: Callable[[list[tuple[bytes, dict[str, Any]]]], bool]
) -> list[tuple[bytes, dict[str, Any]]]:
    """The MEMBER_NOTICE records of the session-delta topic, with their keys."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        stack.settings.topics.topic_session_delta,
        bootstrap_servers=stack.settings.kafka.kafka_bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        group_id=None,
    )
    await consumer.start()
    out: list[tuple[bytes, dict[str, Any]]] = []

    async def read() -> bool:
        batch = await consumer.getmany(timeout_ms=300)
        for records in batch.values():
            for record in records:
                frame = orjson.loads(record.value)
                if frame.get("type") == "MEMBER_NOTICE":
                    out.append((record.key, frame))
        return done(out)

    try:
        await eventually(read, WAIT_S, "MEMBER_NOTICE frames on the session-delta topic")
    finally:
        await consumer.stop()
    return out


async def test_simulated_traffic_with_member_notices_takes_the_path_through_the_worker(
    make_stack: Callable[..., Stack], tmp_path: Path
) -> None:
    """`projector simulate --member-notices` through a real worker (two partitions, two lanes):
    every notice entry (kinds 24/27) becomes exactly one MEMBER_NOTICE frame for its member, and
    the projection is the replay's, which the kinds do not change."""
    stack = make_stack("mns", partitions=2, lanes=2)
    out = tmp_path / "traffic.jsonl"
    stack.start_worker()
    done = await asyncio.to_thread(
        stack.run, "simulate", "--users", "30", "--conversations", "6", "--group-size", "20",
        "--messages", "400", "--rate", "0", "--lanes", "2", "--seed", "4", "--member-notices",
        "--progress", "never", "--out", str(out),
    )  # fmt: skip
    stream = read_jsonl(out)
    expected = {
        (e["user_id"], e["conversation_id"], e["notification"], e["conversation_seq"], e["mailbox_seq"])
        for e in stream
        if e.get("notification") in (24, 27)
    }
    assert {k for _, _, k, _, _ in expected} == {24, 27}, "the seed makes joins and leaves"
    assert "of them member notices" in done.stderr.decode()
    frames = await notices_on_topic(stack, lambda fs: len(fs) >= len(expected))
    got = [
        (f["user_id"], f["conversation_id"], f["kind"], f["conversation_seq"], f["projection_mailbox_seq"])
        for _, f in frames
    ]
    assert len(got) == len(expected) and set(got) == expected
    assert all(key == str(f["user_id"]).encode() for key, f in frames)

    replayed = run_replay(out.read_bytes().splitlines(), ReplayOptions(lanes=2))
    badges = {b["user_id"]: b for b in replayed.badges}
    await stack.wait_for_versions(
        {u: b["projection_mailbox_seq"] for u, b in badges.items()}, WAIT_S, stack.alive()
    )
    _, stored = await stack.projection(sorted(badges))
    assert {b["user_id"]: b for b in stored} == badges
