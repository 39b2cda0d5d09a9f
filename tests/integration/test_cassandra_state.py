"""UserConversationStateWriter on real Cassandra: staged rows, one batched flush, read back."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from app.settings import Settings
from app.stores.cassandra_exec import StoreError
from app.stores.cassandra_state import UserConversationStateWriter

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

U64_MAX = 2**64 - 1


class CountingSession:
    """Delegates to the real session and counts the requests a flush sends."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.requests = 0

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
    ensure_cassandra_schema(servers, keyspace=keyspace)
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
    # Batched: one request per user partition here (5 rows fit one batch), 3 for the heavy one.
    assert counting.requests == len(users) + 3

    rows = by_conversation(writer.load_user(100_017))
    assert sorted(rows) == sorted(conversations)
    assert [rows[c]["read_conversation_seq"] for c in conversations] == [100_017 + i for i in range(5)]
    assert rows[conversations[0]]["membership"] == "active"
    assert rows[conversations[0]]["user_id"] == 100_017
    heavy = writer.load_user(heavy_user)
    assert len(heavy) == heavy_count
    assert sorted(row["pin_rank"] for row in heavy) == list(range(heavy_count))
    assert writer.load_user(123456) == []


async def test_last_write_wins_within_a_batch(writer: UserConversationStateWriter) -> None:
    c = conv(1)
    writer.stage(7, c, {"read_conversation_seq": 3, "muted": True, "membership": "active"})
    writer.stage(7, c, {"read_conversation_seq": 5})
    writer.stage(7, c, {"muted": False, "membership": "left", "left_at_conversation_seq": 9})
    assert writer.staged == 1
    assert await writer.flush() == 1
    (row,) = writer.load_user(7)
    assert row["read_conversation_seq"] == 5
    assert row["muted"] is False
    assert row["membership"] == "left" and row["left_at_conversation_seq"] == 9


async def test_unstaged_fields_are_left_alone_and_none_clears(
    writer: UserConversationStateWriter,
) -> None:
    c = conv(2)
    writer.stage(8, c, {"membership": "active", "pin_rank": 3, "archived": True})
    await writer.flush()
    writer.stage(8, c, {"read_conversation_seq": 11, "updated_mailbox_seq": 40})
    await writer.flush()
    (row,) = writer.load_user(8)
    assert (row["pin_rank"], row["archived"], row["read_conversation_seq"]) == (3, True, 11)
    writer.stage(8, c, {"pin_rank": None})  # unpin
    await writer.flush()
    (row,) = writer.load_user(8)
    assert row["pin_rank"] is None and row["archived"] is True and row["updated_mailbox_seq"] == 40


async def test_a_row_with_no_values_still_exists(writer: UserConversationStateWriter) -> None:
    """Known from its first entry: the authority lists it even before any field has a value."""
    writer.stage(9, conv(3), {})
    assert await writer.flush() == 1
    assert [row["conversation_id"] for row in writer.load_user(9)] == [conv(3)]


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


def test_first_seen_needs_its_seq(writer: UserConversationStateWriter) -> None:
    with pytest.raises(ValueError, match="first_seen_mailbox_seq"):
        writer.stage(10, conv(4), {"first_seen_ts": 5})
    with pytest.raises(ValueError, match="first_seen_mailbox_seq"):
        writer.stage(10, conv(4), {"first_seen_mailbox_seq": None})


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


async def test_members_join_then_leave(writer: UserConversationStateWriter) -> None:
    c = conv(7)
    writer.stage_member(c, 5, "admin", "active", 10, None)
    writer.stage_member(c, 6, "member", "active", 10, None)
    writer.stage_member(c, 5, "admin", "removed", 10, 30)  # same batch: the leave wins
    assert await writer.flush() == 2
    members = {m["user_id"]: m for m in writer.load_members(c)}
    assert members[5]["state"] == "removed" and members[5]["left_at_conversation_seq"] == 30
    assert members[6]["state"] == "active" and members[6]["left_at_conversation_seq"] is None
    writer.stage_member(c, 5, "member", "active", 40, None)  # rejoin clears left_at
    await writer.flush()
    rejoined = {m["user_id"]: m for m in writer.load_members(c)}[5]
    assert (rejoined["state"], rejoined["joined_at_conversation_seq"]) == ("active", 40)
    assert rejoined["left_at_conversation_seq"] is None and rejoined["role"] == "member"


def test_flush_sync(writer: UserConversationStateWriter) -> None:
    writer.stage(11, conv(8), {"membership": "active"})
    assert writer.flush_sync() == 1
    assert len(writer.load_user(11)) == 1


async def test_failed_flush_keeps_the_rows_for_a_retry(
    writer: UserConversationStateWriter, counting: CountingSession
) -> None:
    writer.stage(12, conv(9), {"read_conversation_seq": 3, "first_seen_mailbox_seq": 5})

    real = counting.session
    counting.session = FailingSession()
    with pytest.raises(StoreError):
        await writer.flush()
    # Staged while the failed flush was out: newer values win, the lowest first_seen stays.
    writer.stage(12, conv(9), {"muted": True, "first_seen_mailbox_seq": 6})
    assert writer.staged == 1
    counting.session = real
    assert await writer.flush() == 1
    (row,) = writer.load_user(12)
    assert (row["read_conversation_seq"], row["muted"], row["first_seen_mailbox_seq"]) == (3, True, 5)


def test_bad_fields_are_refused(writer: UserConversationStateWriter) -> None:
    with pytest.raises(ValueError, match="unknown"):
        writer.stage(1, conv(1), {"unread_count": 3})
    with pytest.raises(ValueError, match="membership"):
        writer.stage(1, conv(1), {"membership": "gone"})
    with pytest.raises(ValueError):
        writer.stage(2**64, conv(1), {})
    with pytest.raises(ValueError):
        writer.stage(1, "not-a-uuid", {})
    assert writer.staged == 0


class FailingSession:
    def execute_async(self, *args: Any, **kwargs: Any) -> Any:
        raise OSError("connection refused")


async def test_the_cores_field_names_are_accepted(writer: UserConversationStateWriter) -> None:
    """The worker stages `{name: getattr(row, name)}` with ConversationState's own names."""
    c = conv(10)
    writer.stage(
        13,
        c,
        {
            "membership": "left",
            "role": "admin",
            "joined_at": 2,
            "left_at": 9,
            "read_seq": 7,
            "hidden_before": 3,
            "deleted_before": 0,
            "pin_rank": None,
            "archived": False,
            "muted": True,
            "updated_mailbox_seq": 55,
        },
    )
    writer.stage(13, c, {"read_conversation_seq": 8})  # the column name and the alias are one field
    await writer.flush()
    (row,) = writer.load_user(13)
    assert (
        row["joined_at_conversation_seq"],
        row["left_at_conversation_seq"],
        row["read_conversation_seq"],
        row["hidden_before_conversation_seq"],
        row["deleted_before_conversation_seq"],
    ) == (2, 9, 8, 3, 0)
    assert (row["membership"], row["role"], row["muted"], row["updated_mailbox_seq"]) == (
        "left",
        "admin",
        True,
        55,
    )


async def test_owed_writes_restaged_by_a_new_writer_land_as_the_first_would_have_written_them(
    writer: UserConversationStateWriter, counting: CountingSession, schema: str, cassandra_session: Any
) -> None:
    """A worker persists what its failed flushes still owe (`owed`) and a restarted one stages
    it again (`restage`): the rows end as if the first writer's flush had gone through."""
    c = conv(20)
    writer.stage(
        21, c, {"read_seq": 4, "membership": "active", "first_seen_mailbox_seq": 9, "first_seen_ts": 90}
    )
    writer.stage_member(c, 21, "admin", "active", 2, None)
    writer.stage_member_stats(c, 21, 5, 1, 300)
    real = counting.session
    counting.session = FailingSession()
    with pytest.raises(StoreError):
        await writer.flush()
    counting.session = real
    owed = writer.owed()
    assert set(owed) == {(21, c)} and set(owed[(21, c)]) == {"state", "member", "stats"}

    restarted = UserConversationStateWriter(counting, schema)
    # Something newer was staged for the same row before the owed writes came back: it wins.
    restarted.stage(21, c, {"read_seq": 6, "first_seen_mailbox_seq": 11, "first_seen_ts": 110})
    for (user_id, conversation_id), writes in owed.items():
        restarted.restage(user_id, conversation_id, writes)
    assert restarted.owed().keys() == owed.keys()
    assert await restarted.flush() == 3 and restarted.owed() == {}
    (row,) = writer.load_user(21)
    assert (row["read_conversation_seq"], row["membership"]) == (6, "active")
    assert (row["first_seen_mailbox_seq"], row["first_seen_ts"]) == (9, 90)  # the lowest seq stays
    (member,) = writer.load_members(c)
    assert (member["role"], member["state"], member["joined_at_conversation_seq"]) == ("admin", "active", 2)
    stats = cassandra_session.execute(
        f"SELECT record_count, mention_count FROM {schema}.member_stats WHERE conversation_id = %s",
        (uuid.UUID(c),),
    ).one()
    assert (stats.record_count, stats.mention_count) == (5, 1)


def test_restage_refuses_what_it_cannot_write(writer: UserConversationStateWriter) -> None:
    with pytest.raises(ValueError):
        writer.restage(1, conv(21), {"member": {"role": "king", "state": "active"}})
    with pytest.raises(ValueError):
        writer.restage(1, conv(21), {"stats": [1, 0, 0]})  # not a mailbox_seq
    with pytest.raises(ValueError, match="unknown"):
        writer.restage(1, conv(21), {"state": {"unread_count": 3}})
    assert writer.staged == 0


async def test_dropped_keys_are_not_written(writer: UserConversationStateWriter) -> None:
    c, other = conv(22), conv(23)
    writer.stage(22, c.upper(), {"read_seq": 1})
    writer.stage_member(c, 22, "member", "active", 1, None)
    writer.stage_member_stats(c, 22, 1, 0, 5)
    writer.stage(22, other, {"read_seq": 2})
    writer.drop([(22, c)])  # any spelling of the conversation id
    assert set(writer.owed()) == {(22, other)}
    assert await writer.flush() == 1
    assert [row["conversation_id"] for row in writer.load_user(22)] == [other]
