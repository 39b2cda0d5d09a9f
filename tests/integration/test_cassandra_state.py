"""UserConversationStateWriter on real Cassandra, what is particular to it: few batched requests
for many staged rows, idempotent re-flushes, the synchronous flush, first_seen cells under an
ordinary DELETE, varint ids in numeric order. What every StateWriter does (staging, last write
wins, first_seen, member rows and statistics, failures, owed writes, drop, bad input) is the
contract suite's, run on this writer and on its test double: tests/contract/test_state_writer_contract.py."""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from app.settings import Settings
from app.stores.cassandra_state import UserConversationStateWriter

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

U64_MAX = 2**64 - 1


class CountingSession:
    """Delegates to the real session and counts the requests a flush sends."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.requests = 0

    @property
    def cluster(self) -> Any:  # the ring the writer groups its batches by
        return self.session.cluster

    def prepare(self, cql: str) -> Any:
        return self.session.prepare(cql)

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        self.requests += 1
        return self.session.execute(*args, **kwargs)

    def execute_async(self, *args: Any, **kwargs: Any) -> Any:
        self.requests += 1
        return self.session.execute_async(*args, **kwargs)


@pytest.fixture(scope="module")
def schema(servers: Settings, cassandra_session: Any) -> Iterator[str]:
    """One keyspace with the project schema for the module (creating one costs ~1 s); tests keep
    apart through their own user and conversation ids (`user`, `conv`)."""
    from app.cli.bootstrap import ensure_cassandra_schema

    keyspace = f"t_state_{uuid.uuid4().hex[:12]}"
    ensure_cassandra_schema(servers.cassandra, keyspace=keyspace)
    yield keyspace
    cassandra_session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}")


@pytest.fixture
def counting(cassandra_session: Any) -> CountingSession:
    return CountingSession(cassandra_session)


@pytest.fixture
def writer(counting: CountingSession, schema: str) -> Iterator[UserConversationStateWriter]:
    yield UserConversationStateWriter(counting, schema)


# Tests share the module's keyspace: each uses its own user ids and conversation numbers.
_RUN = uuid.uuid4().int >> 80


def conv(n: int) -> str:
    return str(uuid.UUID(int=(_RUN << 64) + n))


async def test_one_row_users_share_requests_and_stay_under_the_batch_warnings(
    writer: UserConversationStateWriter, counting: CountingSession, caplog: pytest.LogCaptureFixture
) -> None:
    """The mirror's usual round at a short window: one new row for each of many users, whole
    (every field and the first-seen mark), and their member rows. Alone, each user was a request
    of its own. Cassandra warns per batch over 10 partitions or 5 KiB (the driver logs it)."""
    users = list(range(300_001, 300_251))
    cid = conv(7)
    for user in users:
        writer.stage(
            user,
            cid,
            {
                "membership": "active",
                "role": "member",
                "joined_at_conversation_seq": 12_345,
                "left_at_conversation_seq": None,
                "read_conversation_seq": user,
                "hidden_before_conversation_seq": 0,
                "deleted_before_conversation_seq": 0,
                "pin_rank": None,
                "archived": False,
                "muted": True,
                "updated_mailbox_seq": 987_654_321,
                "first_seen_mailbox_seq": user,
                "first_seen_ts": 1_700_000_000_000,
            },
        )
        writer.stage_member(cid, user, "member", "active", 12_345, None)
        writer.stage_member_stats(cid, user, 3, 1, user)
    counting.requests = 0
    with caplog.at_level(logging.WARNING):
        assert await writer.flush() == 3 * len(users)
    assert not [r.getMessage() for r in caplog.records if "warning" in r.getMessage().lower()]
    # 250 users' rows in batches of at most ten users (whole rows: fewer, by size), the members'
    # rows in batches of one conversation's partition: far fewer requests than rows.
    assert counting.requests <= len(users) // 2
    for user in (users[0], users[137], users[-1]):
        row = writer.load_user(user)[0]
        assert (row["read_conversation_seq"], row["muted"], row["first_seen_mailbox_seq"]) == (
            user,
            True,
            user,
        )
    members = {row["user_id"]: row for row in writer.load_members(cid)}
    assert sorted(members) == users


def by_conversation(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {row["conversation_id"]: row for row in rows}


async def test_stage_many_flush_once_read_back(
    writer: UserConversationStateWriter, counting: CountingSession
) -> None:
    users = list(range(100_001, 100_201))
    conversations = [conv(i) for i in range(5)]
    heavy_user, heavy_count = 109_999, 100  # one user with many rows: one partition, few batches
    for user in users:
        for i, cid in enumerate(conversations):
            writer.stage(
                user,
                cid,
                {"membership": "active", "role": "member", "read_conversation_seq": user + i},
            )
    for i in range(heavy_count):
        writer.stage(heavy_user, conv(1000 + i), {"membership": "active", "pin_rank": i})
    expected_rows = len(users) * len(conversations) + heavy_count
    assert writer.staged == expected_rows

    counting.requests = 0
    assert await writer.flush() == expected_rows
    assert writer.staged == 0
    # Batched: a user's 5 rows stay together and several users share a batch (3 fill its bytes
    # here, app/stores/cassandra_exec.py); the heavy user's 100 rows go in batches of their own.
    assert counting.requests == math.ceil(len(users) / 3) + math.ceil(heavy_count / 20)

    rows = by_conversation(writer.load_user(100_017))
    assert sorted(rows) == sorted(conversations)
    assert [rows[c]["read_conversation_seq"] for c in conversations] == [100_017 + i for i in range(5)]
    assert rows[conversations[0]]["membership"] == "active"
    assert rows[conversations[0]]["user_id"] == 100_017
    heavy = writer.load_user(heavy_user)
    assert len(heavy) == heavy_count
    assert sorted(row["pin_rank"] for row in heavy) == list(range(heavy_count))
    assert writer.load_user(123456) == []


async def test_first_seen_keeps_the_first_appearance(writer: UserConversationStateWriter) -> None:
    c = conv(4)
    writer.stage(10, c, {"first_seen_mailbox_seq": 100, "first_seen_ts": 5000, "membership": "active"})
    writer.stage(10, c, {"first_seen_mailbox_seq": 120, "first_seen_ts": 6000, "read_conversation_seq": 1})
    await writer.flush()
    # A replay after a crash, or a rebuild from a truncated log, restages a later "first"
    # appearance: it cannot move the stored one.
    writer.stage(10, c, {"first_seen_mailbox_seq": 130, "first_seen_ts": 7000})
    await writer.flush()
    (row,) = writer.load_user(10)
    assert (row["first_seen_mailbox_seq"], row["first_seen_ts"]) == (100, 5000)
    assert row["read_conversation_seq"] == 1
    # An earlier appearance (a lower seq) is the truth, whenever it is learnt.
    writer.stage(10, c, {"first_seen_mailbox_seq": 90, "first_seen_ts": 4000})
    await writer.flush()
    (row,) = writer.load_user(10)
    assert (row["first_seen_mailbox_seq"], row["first_seen_ts"]) == (90, 4000)
    # And first_seen cells never hide an ordinary delete (their timestamps are below wall time).
    writer.session.execute(
        f"DELETE FROM {writer.keyspace}.user_conversation_state WHERE user_id = 10 AND conversation_id = {c}"
    )
    assert writer.load_user(10) == []


async def test_u64_user_ids(writer: UserConversationStateWriter) -> None:
    for user in (U64_MAX, 2**63, 0):
        writer.stage(user, conv(5), {"membership": "active", "role": "owner"})
        writer.stage_member(conv(5), user, "owner", "active", 1, None)
    await writer.flush()
    for user in (U64_MAX, 2**63, 0):
        (row,) = writer.load_user(user)
        assert row["user_id"] == user and row["role"] == "owner"
    # Numeric order of varint ids: what keyset paging of the member directory relies on.
    assert [m["user_id"] for m in writer.load_members(conv(5))] == [0, 2**63, U64_MAX]


async def test_idempotent_reflush(writer: UserConversationStateWriter) -> None:
    def stage_batch() -> None:
        for user in (301, 302, 303):
            writer.stage(
                user,
                conv(6),
                {
                    "membership": "active",
                    "joined_at_conversation_seq": 4,
                    "read_conversation_seq": 8,
                    "hidden_before_conversation_seq": 2,
                    "deleted_before_conversation_seq": 0,
                    "first_seen_mailbox_seq": 50 + user,
                    "first_seen_ts": 1000,
                    "updated_mailbox_seq": 70,
                },
            )
            writer.stage_member(conv(6), user, "member", "active", 4, None)

    stage_batch()
    assert await writer.flush() == 6
    first = [writer.load_user(u) for u in (301, 302, 303)], writer.load_members(conv(6))
    stage_batch()  # a replay after a crash re-sends the same batch
    assert await writer.flush() == 6
    assert ([writer.load_user(u) for u in (301, 302, 303)], writer.load_members(conv(6))) == first
    assert await writer.flush() == 0  # nothing staged: nothing written


def test_flush_sync(writer: UserConversationStateWriter) -> None:
    writer.stage(11, conv(8), {"membership": "active"})
    assert writer.flush_sync() == 1
    assert len(writer.load_user(11)) == 1
