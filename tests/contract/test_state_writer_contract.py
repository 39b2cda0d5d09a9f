"""The `StateWriter` port (app/worker/ports.py): one suite, every implementation.

- ``double``: tests/support/mirror_writer.py, the worker core's unit tests' stand-in;
- ``cassandra``: app/stores/cassandra_state.UserConversationStateWriter on the real server, in a
  fresh keyspace per test (integration: `make test-fast` leaves it out).

What the worker relies on: stages accumulate until one flush writes them (last write per field
wins; a field not staged is left alone, None clears it); the core's attribute names are the
columns; first_seen keeps the lowest mailbox_seq, in the staging and in the table; member rows
are whole rows (last one wins); member statistics keep the highest mailbox_seq; a failed flush
raises StoreError and keeps everything for the next one; `owed` hands what is staged over as plain
values and `restage` takes it back in a new writer (anything staged since wins); `drop` forgets
keys; bad input is refused and stages nothing.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import pytest

from app.stores.cassandra_exec import StoreError
from app.stores.cassandra_state import (
    FIRST_SEEN_FIELDS,
    MEMBER_FIELDS,
    STATE_FIELDS,
    MemberStatsRow,
    UserConversationStateWriter,
)
from app.stores.schema import GROUP_MEMBERS, MEMBER_STATS, USER_CONVERSATION_STATE
from app.worker.ports import StateWriter
from tests.support.mirror_writer import MirrorCassandra, MirrorWriter

pytestmark = pytest.mark.timeout(120)

STATE_COLUMNS = (*STATE_FIELDS, *FIRST_SEEN_FIELDS)
U64_MAX = 2**64 - 1


class Mirror(Protocol):
    """A writer under test and a way to read back what its tables hold."""

    def new_writer(self) -> StateWriter:
        """Another writer over the same tables (a restarted worker: nothing staged)."""
        ...

    def set_down(self, down: bool) -> None:
        """While down, every flush of every writer fails."""
        ...

    def state(self, user_id: int, conversation_id: str) -> dict[str, Any] | None: ...

    def member(self, conversation_id: str, user_id: int) -> dict[str, Any] | None: ...

    def member_stats(self, conversation_id: str, user_id: int) -> MemberStatsRow | None: ...


class DoubleMirror:
    def __init__(self) -> None:
        self.cassandra = MirrorCassandra()
        self.writers: list[MirrorWriter] = []
        self.down = False

    def new_writer(self) -> StateWriter:
        writer = MirrorWriter(self.cassandra)
        writer.down = self.down
        self.writers.append(writer)
        return writer

    def set_down(self, down: bool) -> None:
        self.down = down
        for writer in self.writers:
            writer.down = down

    def state(self, user_id: int, conversation_id: str) -> dict[str, Any] | None:
        row = self.cassandra.state.get((user_id, conversation_id))
        return None if row is None else {name: row.get(name) for name in STATE_COLUMNS}

    def member(self, conversation_id: str, user_id: int) -> dict[str, Any] | None:
        row = self.cassandra.members.get((conversation_id, user_id))
        return None if row is None else {name: row[name] for name in MEMBER_FIELDS}

    def member_stats(self, conversation_id: str, user_id: int) -> MemberStatsRow | None:
        return self.cassandra.member_stats.get((conversation_id, user_id))


class SwitchableSession:
    """The real session; while `down`, every write request fails as an unreachable node does."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.down = False

    @property
    def cluster(self) -> Any:  # the ring the writer groups its batches by
        return self.session.cluster

    def prepare(self, cql: str) -> Any:
        return self.session.prepare(cql)

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        return self.session.execute(*args, **kwargs)

    def execute_async(self, *args: Any, **kwargs: Any) -> Any:
        if self.down:
            raise OSError("connection refused (test: node down)")
        return self.session.execute_async(*args, **kwargs)


class CassandraMirror:
    def __init__(self, session: Any, keyspace: str) -> None:
        self.raw = session
        self.session = SwitchableSession(session)
        self.keyspace = keyspace
        self.reader = UserConversationStateWriter(session, keyspace)  # its reads only
        self._stats = session.prepare(
            f"SELECT record_count, mention_count, stats_mailbox_seq FROM {keyspace}.member_stats"
            " WHERE conversation_id = ? AND user_id = ?"
        )

    def new_writer(self) -> StateWriter:
        return UserConversationStateWriter(self.session, self.keyspace)

    def set_down(self, down: bool) -> None:
        self.session.down = down

    def state(self, user_id: int, conversation_id: str) -> dict[str, Any] | None:
        rows = [r for r in self.reader.load_user(user_id) if r["conversation_id"] == conversation_id]
        return {name: rows[0][name] for name in STATE_COLUMNS} if rows else None

    def member(self, conversation_id: str, user_id: int) -> dict[str, Any] | None:
        rows = [r for r in self.reader.load_members(conversation_id) if r["user_id"] == user_id]
        return {name: rows[0][name] for name in MEMBER_FIELDS} if rows else None

    def member_stats(self, conversation_id: str, user_id: int) -> MemberStatsRow | None:
        row = self.raw.execute(self._stats, (uuid.UUID(conversation_id), user_id)).one()
        return None if row is None else (row.record_count, row.mention_count, row.stats_mailbox_seq)


@pytest.fixture
def writer_keyspace(cassandra_session: Any, keyspace: str) -> str:
    """A fresh keyspace with the tables the writer writes (dropped after the test)."""
    for table in (USER_CONVERSATION_STATE, GROUP_MEMBERS, MEMBER_STATS):
        cassandra_session.execute(table.create_cql(keyspace))
    return keyspace


@pytest.fixture(
    params=[
        pytest.param("double", id="double"),
        pytest.param("cassandra", id="cassandra", marks=pytest.mark.integration),
    ]
)
def mirror(request: pytest.FixtureRequest) -> Mirror:
    if request.param == "cassandra":
        # Requested lazily so the double's runs never touch (or need) the server.
        session = request.getfixturevalue("cassandra_session")
        return CassandraMirror(session, request.getfixturevalue("writer_keyspace"))
    return DoubleMirror()


@pytest.fixture
def writer(mirror: Mirror) -> StateWriter:
    return mirror.new_writer()


_CONVERSATIONS = itertools.count(1)


@pytest.fixture
def conv() -> Iterator[Callable[[], str]]:
    """New conversation ids, canonical (lowercase) UUID strings."""
    yield lambda: str(uuid.UUID(int=(0xC0DE << 96) + next(_CONVERSATIONS)))


def state_values(row: dict[str, Any] | None, *names: str) -> tuple[Any, ...]:
    assert row is not None, "no row"
    return tuple(row[name] for name in names)


# -- stage and flush -----------------------------------------------------------------------------


async def test_nothing_is_written_before_the_flush_and_one_flush_writes_every_staged_row(
    mirror: Mirror, writer: StateWriter, conv: Callable[[], str]
) -> None:
    a, b = conv(), conv()
    writer.stage(7, a, {"membership": "active", "read_conversation_seq": 3})
    writer.stage(8, a, {"membership": "active"})
    writer.stage(7, b, {"archived": True})
    writer.stage_member(a, 7, "admin", "active", 1, None)
    writer.stage_member_stats(a, 7, 2, 1, 40)
    assert mirror.state(7, a) is None and mirror.member(a, 7) is None and mirror.member_stats(a, 7) is None
    assert await writer.flush() == 5  # state rows + member rows + statistics rows
    assert state_values(mirror.state(7, a), "membership", "read_conversation_seq") == ("active", 3)
    assert state_values(mirror.state(8, a), "membership", "read_conversation_seq") == ("active", None)
    assert state_values(mirror.state(7, b), "archived", "membership") == (True, None)
    assert mirror.member(a, 7) == {
        "role": "admin",
        "state": "active",
        "joined_at_conversation_seq": 1,
        "left_at_conversation_seq": None,
    }
    assert mirror.member_stats(a, 7) == (2, 1, 40)
    assert await writer.flush() == 0  # nothing staged: nothing written
    assert writer.owed() == {}


async def test_last_write_wins_per_field_unstaged_fields_stay_and_none_clears(
    mirror: Mirror, writer: StateWriter, conv: Callable[[], str]
) -> None:
    c = conv()
    writer.stage(7, c, {"read_conversation_seq": 3, "muted": True, "membership": "active", "pin_rank": 2})
    writer.stage(7, c, {"read_conversation_seq": 5})
    writer.stage(7, c, {"muted": False})
    assert await writer.flush() == 1  # one row, however many stages
    row = mirror.state(7, c)
    assert state_values(row, "read_conversation_seq", "muted", "membership", "pin_rank") == (
        5,
        False,
        "active",
        2,
    )
    writer.stage(7, c, {"pin_rank": None, "updated_mailbox_seq": 40})  # unpin
    await writer.flush()
    row = mirror.state(7, c)
    assert state_values(row, "pin_rank", "read_conversation_seq", "muted", "updated_mailbox_seq") == (
        None,
        5,
        False,
        40,
    )


async def test_a_row_with_no_values_still_exists(
    mirror: Mirror, writer: StateWriter, conv: Callable[[], str]
) -> None:
    c = conv()
    writer.stage(9, c, {})
    assert await writer.flush() == 1
    assert mirror.state(9, c) == dict.fromkeys(STATE_COLUMNS)


async def test_the_cores_attribute_names_are_the_columns(
    mirror: Mirror, writer: StateWriter, conv: Callable[[], str]
) -> None:
    """The worker stages `{name: getattr(row, name)}` with ConversationState's names."""
    c = conv()
    core_names = {"joined_at": 2, "left_at": 9, "read_seq": 7, "hidden_before": 3, "deleted_before": 1}
    writer.stage(13, c, {"membership": "left", **core_names})
    writer.stage(13, c, {"read_conversation_seq": 8})  # the alias and the column are one field
    await writer.flush()
    row = mirror.state(13, c)
    assert state_values(
        row,
        "joined_at_conversation_seq",
        "left_at_conversation_seq",
        "read_conversation_seq",
        "hidden_before_conversation_seq",
        "deleted_before_conversation_seq",
        "membership",
    ) == (2, 9, 8, 3, 1, "left")


async def test_any_spelling_of_a_conversation_id_is_one_row(
    mirror: Mirror, writer: StateWriter, conv: Callable[[], str]
) -> None:
    c = conv()
    writer.stage(7, c.upper(), {"read_seq": 1})
    writer.stage(7, c, {"muted": True})
    assert await writer.flush() == 1
    assert state_values(mirror.state(7, c), "read_conversation_seq", "muted") == (1, True)


async def test_u64_user_ids(mirror: Mirror, writer: StateWriter, conv: Callable[[], str]) -> None:
    c = conv()
    for user in (U64_MAX, 2**63, 0):
        writer.stage(user, c, {"role": "owner"})
        writer.stage_member(c, user, "owner", "active", 1, None)
    await writer.flush()
    for user in (U64_MAX, 2**63, 0):
        assert state_values(mirror.state(user, c), "role") == ("owner",)
        assert state_values(mirror.member(c, user), "role") == ("owner",)


# -- first_seen: the lowest mailbox_seq ------------------------------------------------------------


async def test_first_seen_keeps_the_lowest_seq_in_the_staging_and_in_the_table(
    mirror: Mirror, writer: StateWriter, conv: Callable[[], str]
) -> None:
    c = conv()
    writer.stage(10, c, {"first_seen_mailbox_seq": 100, "first_seen_ts": 5000, "membership": "active"})
    writer.stage(10, c, {"first_seen_mailbox_seq": 120, "first_seen_ts": 6000, "read_seq": 1})
    await writer.flush()
    row = mirror.state(10, c)
    assert state_values(row, "first_seen_mailbox_seq", "first_seen_ts", "read_conversation_seq") == (
        100,
        5000,
        1,
    )
    # A replay after a crash, or a rebuild from a truncated log, restages a later "first"
    # appearance: it cannot move the stored one.
    writer.stage(10, c, {"first_seen_mailbox_seq": 130, "first_seen_ts": 7000})
    await writer.flush()
    assert state_values(mirror.state(10, c), "first_seen_mailbox_seq", "first_seen_ts") == (100, 5000)
    # An earlier appearance (a lower seq) is the truth, whenever it is learnt.
    writer.stage(10, c, {"first_seen_mailbox_seq": 90, "first_seen_ts": 4000})
    await writer.flush()
    assert state_values(mirror.state(10, c), "first_seen_mailbox_seq", "first_seen_ts") == (90, 4000)


# -- member rows and member statistics -----------------------------------------------------------


async def test_member_rows_are_whole_rows_last_stage_wins(
    mirror: Mirror, writer: StateWriter, conv: Callable[[], str]
) -> None:
    c = conv()
    writer.stage_member(c, 5, "admin", "active", 10, None)
    writer.stage_member(c, 6, "member", "active", 10, None)
    writer.stage_member(c, 5, "admin", "removed", 10, 30)  # same batch: the leave wins
    assert await writer.flush() == 2
    assert state_values(mirror.member(c, 5), "state", "left_at_conversation_seq") == ("removed", 30)
    assert state_values(mirror.member(c, 6), "state", "left_at_conversation_seq") == ("active", None)
    writer.stage_member(c, 5, "member", "active", 40, None)  # a rejoin clears left_at
    await writer.flush()
    assert mirror.member(c, 5) == {
        "role": "member",
        "state": "active",
        "joined_at_conversation_seq": 40,
        "left_at_conversation_seq": None,
    }


async def test_member_statistics_keep_the_highest_mailbox_seq(
    mirror: Mirror, writer: StateWriter, conv: Callable[[], str]
) -> None:
    c = conv()
    writer.stage_member_stats(c, 5, 3, 1, 50)
    writer.stage_member_stats(c, 5, 2, 1, 40)  # older, staged later: loses
    assert await writer.flush() == 1
    assert mirror.member_stats(c, 5) == (3, 1, 50)
    writer.stage_member_stats(c, 5, 1, 0, 45)  # a replay of an older state: the table keeps 50
    await writer.flush()
    assert mirror.member_stats(c, 5) == (3, 1, 50)
    writer.stage_member_stats(c, 5, 4, 2, 60)
    await writer.flush()
    assert mirror.member_stats(c, 5) == (4, 2, 60)
    # Seqs past a write timestamp's 63 bits are valid u64 entries: clamped, never refused.
    writer.stage_member_stats(c, 6, 1, 1, U64_MAX)
    await writer.flush()
    assert mirror.member_stats(c, 6) == (1, 1, 2**63 - 1)


# -- failures, owed writes, hand-overs -----------------------------------------------------------


async def test_a_failed_flush_raises_and_keeps_everything_for_the_next_one(
    mirror: Mirror, writer: StateWriter, conv: Callable[[], str]
) -> None:
    c = conv()
    writer.stage(12, c, {"read_seq": 3, "first_seen_mailbox_seq": 5, "first_seen_ts": 50})
    writer.stage_member(c, 12, "member", "active", 1, None)
    writer.stage_member_stats(c, 12, 1, 0, 5)
    mirror.set_down(True)
    with pytest.raises(StoreError):
        await writer.flush()
    assert mirror.state(12, c) is None
    # Staged after the failure: newer values win, the lowest first_seen stays.
    writer.stage(12, c, {"muted": True, "read_seq": 4, "first_seen_mailbox_seq": 6, "first_seen_ts": 60})
    mirror.set_down(False)
    assert await writer.flush() == 3
    row = mirror.state(12, c)
    assert state_values(row, "read_conversation_seq", "muted", "first_seen_mailbox_seq", "first_seen_ts") == (
        4,
        True,
        5,
        50,
    )
    assert state_values(mirror.member(c, 12), "state") == ("active",)
    assert mirror.member_stats(c, 12) == (1, 0, 5)
    assert writer.owed() == {}


async def test_owed_is_what_is_staged_as_plain_values(writer: StateWriter, conv: Callable[[], str]) -> None:
    c = conv()
    writer.stage(
        21, c, {"read_seq": 4, "membership": "active", "first_seen_mailbox_seq": 9, "first_seen_ts": 90}
    )
    writer.stage_member(c, 21, "admin", "active", 2, None)
    writer.stage_member_stats(c, 21, 5, 1, 300)
    writer.stage(22, c, {"muted": True})
    assert writer.owed() == {
        (21, c): {
            "state": {
                "read_conversation_seq": 4,
                "membership": "active",
                "first_seen_mailbox_seq": 9,
                "first_seen_ts": 90,
            },
            "member": {
                "role": "admin",
                "state": "active",
                "joined_at_conversation_seq": 2,
                "left_at_conversation_seq": None,
            },
            "stats": [5, 1, 300],
        },
        (22, c): {"state": {"muted": True}},
    }


async def test_owed_writes_restaged_by_a_new_writer_land_as_the_first_would_have_written_them(
    mirror: Mirror, writer: StateWriter, conv: Callable[[], str]
) -> None:
    """A worker persists what its failed flushes still owe and a restarted one stages it again:
    the rows end as if the first writer's flush had gone through, under anything newer."""
    c = conv()
    writer.stage(
        21, c, {"read_seq": 4, "membership": "active", "first_seen_mailbox_seq": 9, "first_seen_ts": 90}
    )
    writer.stage_member(c, 21, "admin", "active", 2, None)
    writer.stage_member_stats(c, 21, 5, 1, 300)
    mirror.set_down(True)
    with pytest.raises(StoreError):
        await writer.flush()
    mirror.set_down(False)
    owed = writer.owed()

    restarted = mirror.new_writer()  # the first writer's process is gone with its staging
    restarted.stage(21, c, {"read_seq": 6, "first_seen_mailbox_seq": 11, "first_seen_ts": 110})
    restarted.stage_member_stats(c, 21, 6, 1, 310)
    for (user_id, conversation_id), writes in owed.items():
        restarted.restage(user_id, conversation_id, writes)
    assert restarted.owed().keys() == owed.keys()
    assert await restarted.flush() == 3 and restarted.owed() == {}
    row = mirror.state(21, c)
    assert state_values(row, "read_conversation_seq", "membership") == (6, "active")  # newer wins
    assert state_values(row, "first_seen_mailbox_seq", "first_seen_ts") == (9, 90)  # the lowest seq stays
    assert state_values(mirror.member(c, 21), "role", "joined_at_conversation_seq") == ("admin", 2)
    assert mirror.member_stats(c, 21) == (6, 1, 310)  # the highest seq


async def test_dropped_keys_are_not_written(
    mirror: Mirror, writer: StateWriter, conv: Callable[[], str]
) -> None:
    c, other = conv(), conv()
    writer.stage(22, c, {"read_seq": 1})
    writer.stage_member(c, 22, "member", "active", 1, None)
    writer.stage_member_stats(c, 22, 1, 0, 5)
    writer.stage(22, other, {"read_seq": 2})
    writer.drop([(22, c.upper())])  # any spelling of the conversation id
    assert set(writer.owed()) == {(22, other)}
    assert await writer.flush() == 1
    assert mirror.state(22, c) is None and mirror.member(c, 22) is None and mirror.member_stats(c, 22) is None
    assert state_values(mirror.state(22, other), "read_conversation_seq") == (2,)


# -- bad input -----------------------------------------------------------------------------------


BAD_INPUT: list[tuple[str, Callable[[StateWriter, str], None]]] = [
    ("unknown field", lambda w, c: w.stage(1, c, {"unread_count": 3})),
    ("membership", lambda w, c: w.stage(1, c, {"membership": "gone"})),
    ("role", lambda w, c: w.stage(1, c, {"role": "king"})),
    ("first_seen_ts without its seq", lambda w, c: w.stage(1, c, {"first_seen_ts": 5})),
    ("user id", lambda w, c: w.stage(2**64, c, {})),
    ("conversation id", lambda w, c: w.stage(1, "not-a-uuid", {})),
    ("member role", lambda w, c: w.stage_member(c, 1, "king", "active", 1, None)),
    ("member state", lambda w, c: w.stage_member(c, 1, "member", "gone", 1, None)),
    ("statistics count", lambda w, c: w.stage_member_stats(c, 1, -1, 0, 5)),
    ("statistics seq", lambda w, c: w.stage_member_stats(c, 1, 1, 0, 0)),
    ("restaged field", lambda w, c: w.restage(1, c, {"state": {"unread_count": 3}})),
    ("restaged member", lambda w, c: w.restage(1, c, {"member": {"role": "king", "state": "active"}})),
    ("restaged statistics", lambda w, c: w.restage(1, c, {"stats": [1, 0, 0]})),
]


async def test_bad_input_is_refused_and_stages_nothing(writer: StateWriter, conv: Callable[[], str]) -> None:
    for what, stage in BAD_INPUT:
        with pytest.raises(ValueError):
            stage(writer, conv())
        assert writer.owed() == {}, what
    assert await writer.flush() == 0
