"""The real worker (subprocess) on real Kafka/Cassandra keeps group_members and member_stats
as the mailbox entries say; the member API then pages what the worker wrote."""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from app.members.server import MemberService
from app.stores.cassandra_members import CassandraMemberReader
from app.stores.cassandra_session import open_cluster
from tests.integration.stack import Stack, read_jsonl

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


@pytest.fixture
def stack(make_stack: Callable[..., Stack]) -> Stack:
    return make_stack("members")


def expected_from_stream(lines: list[dict[str, Any]]) -> tuple[dict[Any, Any], dict[Any, Any]]:
    """The spec, evaluated on the stream itself: member rows (last join/leave per member in
    mailbox_seq order) and statistics (sets of seqs, so duplicates and order do not matter)."""
    seen: set[tuple[int, int]] = set()
    entries = []
    for e in lines:
        if e.get("type") == "watermark" or (e["user_id"], e["mailbox_seq"]) in seen:
            continue
        seen.add((e["user_id"], e["mailbox_seq"]))
        entries.append(e)
    entries.sort(key=lambda e: (e["user_id"], e["mailbox_seq"]))
    members: dict[tuple[str, int], tuple[Any, ...]] = {}
    sent: dict[tuple[str, int], set[int]] = {}
    mentioned: dict[tuple[str, int], set[int]] = {}
    gone: dict[tuple[str, int], set[int]] = {}
    for e in entries:
        key = (e["conversation_id"], e["user_id"])
        kind = e["type"]
        if kind == "join":
            members[key] = (e.get("role", "member"), "active", e["joined_at_conversation_seq"], None)
        elif kind == "leave":
            role, _, joined, _ = members.get(key, ("member", "", 0, None))
            members[key] = (role, e["reason"], joined, e["left_at_conversation_seq"])
        elif kind == "message":
            if e["sender_id"] == e["user_id"]:
                sent.setdefault(key, set()).add(e["conversation_seq"])
            if e["mention"]:
                mentioned.setdefault(key, set()).add(e["conversation_seq"])
        elif kind in ("recall", "delete_message") and (
            e["target_sender_id"] == e["user_id"] or e["target_mention"]
        ):
            gone.setdefault(key, set()).add(e["target_conversation_seq"])
    stats = {}
    for key in set(sent) | set(mentioned):
        counts = (
            len(sent.get(key, set()) - gone.get(key, set())),
            len(mentioned.get(key, set()) - gone.get(key, set())),
        )
        if counts != (0, 0) or key in sent or key in mentioned:
            stats[key] = counts
    return members, stats


def read_back(session: Any, keyspace: str) -> tuple[dict[Any, Any], dict[Any, Any]]:
    # Test-only full reads of two small tables (the product never scans them).
    members = {
        (str(r.conversation_id), int(r.user_id)): (
            r.role,
            r.state,
            r.joined_at_conversation_seq,
            r.left_at_conversation_seq,
        )
        for r in session.execute(f"SELECT * FROM {keyspace}.group_members")
    }
    stats = {
        (str(r.conversation_id), int(r.user_id)): (int(r.record_count), int(r.mention_count))
        for r in session.execute(f"SELECT * FROM {keyspace}.member_stats")
    }
    return members, stats


def simulate(
    stack: Stack, out: Path, *, users: int, conversations: int, group_size: int, messages: int, seed: int
) -> None:
    """`projector simulate` into the stack, all at once, its entries also written to `out`."""
    sizes = {"users": users, "conversations": conversations, "group-size": group_size, "messages": messages}
    args = [arg for name, value in sizes.items() for arg in (f"--{name}", str(value))]
    lanes = str(stack.settings.processing.lanes)
    stack.run("simulate", *args, "--rate", "0", "--lanes", lanes, "--seed", str(seed),
              "--out", str(out), "--progress", "never")  # fmt: skip


async def test_worker_writes_member_rows_and_statistics_the_api_serves(stack: Stack, tmp_path: Path) -> None:
    stream = tmp_path / "stream.jsonl"
    simulate(stack, stream, users=40, conversations=10, group_size=25, messages=500, seed=23)
    want_members, want_stats = expected_from_stream(read_jsonl(stream))
    assert want_members and any(r != (0, 0) for r in want_stats.values())
    assert any(state != "active" for _, state, _, _ in want_members.values()), "the mix has no leave"

    stack.start_worker()
    cluster, session = open_cluster(stack.settings.cassandra)
    keyspace = stack.settings.cassandra.cassandra_keyspace
    try:
        deadline = time.monotonic() + 240
        while True:
            members, stats = await asyncio.to_thread(read_back, session, keyspace)
            # Statistics rows exist only once a count moved away from zero (or back to it).
            stats_match = all(stats.get(k, (0, 0)) == v for k, v in want_stats.items())
            if members == want_members and stats_match:
                break
            for proc in stack.workers:
                assert proc.poll() is None, stack.log_tail()
            if time.monotonic() > deadline:
                missing = {k: v for k, v in want_members.items() if members.get(k) != v}
                wrong = {k: (stats.get(k), v) for k, v in want_stats.items() if stats.get(k, (0, 0)) != v}
                raise AssertionError(
                    f"members off: {list(missing.items())[:5]}; stats off: {list(wrong.items())[:5]}"
                )
            await asyncio.sleep(1)

        # The API's service over what the worker wrote: pages of active members, with the
        # statistics the worker aggregated.
        service = MemberService(CassandraMemberReader(session, keyspace))
        group = max({c for c, _ in want_members}, key=lambda c: sum(1 for k in want_members if k[0] == c))
        active = sorted(u for (c, u), row in want_members.items() if c == group and row[1] == "active")
        caller = active[0]
        got: list[int] = []
        after = None
        while True:
            page = await service.page(group, caller, after, 7, True)
            got += [m.user_id for m in page.items]
            if not page.has_more:
                break
            after = page.next_user_id
        assert got == active
        shown = await service.present(group, caller, active[:50], True)
        assert shown.stats is not None
        for user_id in active[:50]:
            assert shown.stats[user_id] == want_stats.get((group, user_id), (0, 0))
        assert uuid.UUID(group)
    finally:
        cluster.shutdown()
        stack.stop_workers()


async def test_writes_owed_while_cassandra_failed_are_written_after_a_kill(
    stack: Stack, tmp_path: Path
) -> None:
    """The member tables are gone while the worker applies a stream (every mirror write fails;
    the projection goes on and each persist records what the rows still owe); the worker is
    then SIGKILLed with every offset committed, so no entry is ever read again. Once the tables
    are back, the restarted worker writes the member rows and statistics from its records."""
    stream = tmp_path / "stream.jsonl"
    cluster, session = open_cluster(stack.settings.cassandra)
    keyspace = stack.settings.cassandra.cassandra_keyspace
    try:
        stack.start_worker()
        # The worker prepares its statements at start: wait until it is ready.
        deadline = time.monotonic() + 120
        while "Worker ready" not in stack.log_tail(lines=400):
            stack.alive()()
            assert time.monotonic() < deadline, stack.log_tail()
            await asyncio.sleep(0.5)
        for table in ("group_members", "member_stats"):
            session.execute(f"DROP TABLE {keyspace}.{table}", timeout=60)
        simulate(stack, stream, users=30, conversations=8, group_size=20, messages=300, seed=29)
        want_members, want_stats = expected_from_stream(read_jsonl(stream))
        end = await stack.end_offsets()
        deadline = time.monotonic() + 240
        while await stack.group_offsets() != end:  # committed = persisted: all in the records
            stack.alive()()
            assert time.monotonic() < deadline, stack.log_tail()
            await asyncio.sleep(0.5)
        stack.stop_workers(signal.SIGKILL)

        stack.run("bootstrap")  # the tables come back, empty
        assert await asyncio.to_thread(read_back, session, keyspace) == ({}, {})
        stack.start_worker()  # same data dir: restores the partitions from its local store
        deadline = time.monotonic() + 240
        while True:
            members, stats = await asyncio.to_thread(read_back, session, keyspace)
            if members == want_members and all(stats.get(k, (0, 0)) == v for k, v in want_stats.items()):
                break
            stack.alive(1)()
            assert time.monotonic() < deadline, (
                f"{len(members)}/{len(want_members)} member rows back\n{stack.log_tail(1)}"
            )
            await asyncio.sleep(1)
        assert await stack.group_offsets() == end  # nothing was read again
    finally:
        cluster.shutdown()
        stack.stop_workers()
