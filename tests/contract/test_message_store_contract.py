"""One contract for every MessageStore: the in-memory one replay uses and the Cassandra one the
worker uses must answer the core's two questions (``range``, ``get``) identically.

Each implementation gets a small writer adapter, so every test states its setup once ("given
these messages, this recall, these mentions") and runs against both. The Cassandra parameter is
an integration test (it needs the real server; it fails, never skips, when Cassandra is down);
``-m "not integration"`` runs the in-memory half alone.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol, cast

import pytest

from app.domain.ports import MessageStore, StoredMessage
from app.settings import Settings
from app.stores.cassandra_messages import NewMessage
from app.stores.memory_messages import InMemoryMessageStore

U64_MAX = 2**64 - 1


class Writer(Protocol):
    """What a test may do to a store before asking it questions."""

    store: MessageStore

    def given(self, messages: Iterable[NewMessage]) -> None: ...
    def recall(self, conversation_id: str, seq: int, deleted: bool = False) -> None: ...
    def mention(self, conversation_id: str, seq: int, users: Iterable[int]) -> None: ...
    def recall_many(self, targets: Iterable[tuple[str, int, bool]]) -> None: ...


class MemoryWriter:
    """InMemoryMessageStore learns messages the way replay feeds it: one recipient's entry at a
    time, each naming at most one mentioned user."""

    def __init__(self) -> None:
        self.memory = InMemoryMessageStore()
        self.store: MessageStore = self.memory

    def given(self, messages: Iterable[NewMessage]) -> None:
        for m in messages:
            for mentioned in cast("list[int | None]", sorted(m.mentions)) or [None]:
                self.memory.record_message(
                    m.conversation_id,
                    m.conversation_seq,
                    message_id=m.message_id,
                    activity_id=m.activity_id,
                    sender_id=m.sender_id,
                    counts_unread=m.counts_unread,
                    mentioned_user=mentioned,
                )

    def recall(self, conversation_id: str, seq: int, deleted: bool = False) -> None:
        self.memory.record_recall(conversation_id, seq)  # recall and delete are one flag there

    def recall_many(self, targets: Iterable[tuple[str, int, bool]]) -> None:
        for conversation_id, seq, deleted in targets:
            self.recall(conversation_id, seq, deleted)

    def mention(self, conversation_id: str, seq: int, users: Iterable[int]) -> None:
        message = self.memory.get(conversation_id, seq)
        assert message is not None, "the in-memory store learns mentions with the message"
        for user in users:
            self.memory.record_message(
                conversation_id,
                seq,
                message_id=message.message_id,
                activity_id=message.activity_id,
                sender_id=message.sender_id,
                counts_unread=message.counts_unread,
                mentioned_user=user,
            )


class RocksWriter(MemoryWriter):
    """RocksMessageStore (replay with --state-dir) learns as the in-memory store does; it is asked
    both before and after its commit (what it learned in memory, and what it reads back)."""

    def __init__(self, folder: Path, commit: bool) -> None:
        from app.stores.rocks_messages import RocksMessageStore
        from app.stores.rocks_tables import RocksTables, scratch_options

        tables = RocksTables(folder)
        self.rocks = RocksMessageStore(folder / "messages", scratch_options(tables.cache, tables.memtables))
        self.memory = self.rocks  # type: ignore[assignment]  # the same learning calls
        self.store = self.rocks
        self.commit = commit

    def given(self, messages: Iterable[NewMessage]) -> None:
        super().given(messages)
        if self.commit:
            self.rocks.commit()

    def recall(self, conversation_id: str, seq: int, deleted: bool = False) -> None:
        super().recall(conversation_id, seq, deleted)
        if self.commit:
            self.rocks.commit()

    def mention(self, conversation_id: str, seq: int, users: Iterable[int]) -> None:
        super().mention(conversation_id, seq, users)
        if self.commit:
            self.rocks.commit()


class CassandraWriter:
    def __init__(self, session: Any, keyspace: str) -> None:
        from app.stores.cassandra_messages import CassandraMessageStore

        self.cassandra = CassandraMessageStore(session, keyspace)
        self.store: MessageStore = self.cassandra

    def given(self, messages: Iterable[NewMessage]) -> None:
        self.cassandra.put_messages(messages)

    def recall(self, conversation_id: str, seq: int, deleted: bool = False) -> None:
        self.cassandra.mark_recalled(conversation_id, seq, deleted=deleted)

    def recall_many(self, targets: Iterable[tuple[str, int, bool]]) -> None:
        self.cassandra.mark_recalled_many(targets)

    def mention(self, conversation_id: str, seq: int, users: Iterable[int]) -> None:
        self.cassandra.add_mentions(conversation_id, seq, users)


@pytest.fixture(scope="module")
def cassandra_keyspace(settings: Settings) -> Iterator[tuple[Any, str]]:
    """One keyspace with the project schema for the whole module; tests keep apart by using
    fresh conversation ids. Created lazily: only the Cassandra parameter asks for it."""
    from app.cli.bootstrap import ensure_cassandra_schema
    from app.stores.cassandra_session import open_cluster

    host, port = settings.cassandra.cassandra_contact_points[0], settings.cassandra.cassandra_port
    try:
        socket.create_connection((host, port), timeout=3).close()
    except OSError:
        pytest.fail(f"Cassandra not reachable at {host}:{port}; run `make services-up`", pytrace=False)
    keyspace = f"t_msgcontract_{uuid.uuid4().hex[:10]}"
    ensure_cassandra_schema(settings.cassandra, keyspace=keyspace)
    cluster, session = open_cluster(settings.cassandra)
    try:
        yield session, keyspace
    finally:
        session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}")
        cluster.shutdown()


@pytest.fixture(
    params=[
        "memory",
        "rocks",
        "rocks-committed",
        pytest.param("cassandra", marks=[pytest.mark.integration, pytest.mark.timeout(120)]),
    ]
)
def writer(request: pytest.FixtureRequest, tmp_path: Path) -> Writer:
    if request.param == "memory":
        return MemoryWriter()
    if request.param.startswith("rocks"):
        return RocksWriter(tmp_path, commit=request.param == "rocks-committed")
    session, keyspace = request.getfixturevalue("cassandra_keyspace")
    return CassandraWriter(session, keyspace)


@pytest.fixture
def conv() -> Callable[[], str]:
    """Fresh conversation ids: tests sharing one Cassandra keyspace never see each other."""
    return lambda: str(uuid.uuid4())


def message(
    conversation_id: str,
    seq: int,
    *,
    sender: int = 42,
    counts: bool = True,
    mentions: Iterable[int] = (),
) -> NewMessage:
    return NewMessage(
        conversation_id=conversation_id,
        conversation_seq=seq,
        message_id=f"msg-{seq}",
        activity_id=f"{seq:032x}",
        sender_id=sender,
        created_at=1_767_225_600_000 + seq,
        counts_unread=counts,
        mentions=frozenset(mentions),
    )


def seqs(messages: Iterable[StoredMessage]) -> list[int]:
    return [m.conversation_seq for m in messages]


# -- range --------------------------------------------------------------------------------------


def test_range_is_after_exclusive_upto_inclusive_ascending(writer: Writer, conv: Callable[[], str]) -> None:
    c = conv()
    writer.given(message(c, s) for s in (7, 3, 10, 1, 5, 2, 9, 4, 8, 6))  # any write order
    assert seqs(writer.store.range(c, 3, 7)) == [4, 5, 6, 7]
    assert seqs(writer.store.range(c, 0, 10)) == list(range(1, 11))
    assert seqs(writer.store.range(c, 9, 10)) == [10]
    assert seqs(writer.store.range(c, 8, 100)) == [9, 10]


def test_range_empty_and_degenerate_bounds(writer: Writer, conv: Callable[[], str]) -> None:
    c = conv()
    writer.given(message(c, s) for s in range(1, 6))
    assert list(writer.store.range(c, 5, 5)) == []
    assert list(writer.store.range(c, 4, 2)) == []  # upto below after: nothing, not an error
    assert list(writer.store.range(c, 5, 50)) == []
    # The core asks for (latest - 200, latest] even when latest < 200: a negative lower bound.
    assert seqs(writer.store.range(c, -195, 5)) == [1, 2, 3, 4, 5]


def test_range_skips_gaps(writer: Writer, conv: Callable[[], str]) -> None:
    c = conv()
    writer.given(message(c, s) for s in (2, 5, 9))
    assert seqs(writer.store.range(c, 0, 10)) == [2, 5, 9]
    assert seqs(writer.store.range(c, 2, 8)) == [5]


def test_unknown_conversation_is_empty(writer: Writer, conv: Callable[[], str]) -> None:
    assert list(writer.store.range(conv(), 0, 200)) == []
    assert writer.store.get(conv(), 1) is None


def test_conversations_are_separate(writer: Writer, conv: Callable[[], str]) -> None:
    a, b = conv(), conv()
    writer.given([message(a, 1), message(a, 2), message(b, 2, sender=7), message(b, 3, sender=7)])
    assert [(m.conversation_seq, m.sender_id) for m in writer.store.range(b, 0, 10)] == [(2, 7), (3, 7)]
    assert [(m.conversation_seq, m.sender_id) for m in writer.store.range(a, 0, 10)] == [(1, 42), (2, 42)]


# -- get and the fields -------------------------------------------------------------------------


def test_get_returns_every_field(writer: Writer, conv: Callable[[], str]) -> None:
    c = conv()
    writer.given([message(c, 4, sender=9, counts=False, mentions={5, 6})])
    assert writer.store.get(c, 4) == StoredMessage(
        conversation_seq=4,
        message_id="msg-4",
        activity_id=f"{4:032x}",
        sender_id=9,
        counts_unread=False,
        recalled=False,
        mentions=frozenset({5, 6}),
    )
    assert writer.store.get(c, 3) is None
    assert writer.store.get(c, 5) is None


def test_range_and_get_agree(writer: Writer, conv: Callable[[], str]) -> None:
    c = conv()
    writer.given(
        message(c, s, sender=s % 3, counts=s % 2 == 0, mentions={s} if s % 4 == 0 else ())
        for s in range(1, 13)
    )
    writer.recall(c, 6)
    for stored in writer.store.range(c, 0, 12):
        assert writer.store.get(c, stored.conversation_seq) == stored


def test_u64_sender_and_mention_ids(writer: Writer, conv: Callable[[], str]) -> None:
    c = conv()
    big = [U64_MAX, 2**63, 2**63 - 1, 0]
    writer.given(message(c, i + 1, sender=sender, mentions={sender}) for i, sender in enumerate(big))
    got = writer.store.range(c, 0, 10)
    assert [m.sender_id for m in got] == big
    assert [m.mentions for m in got] == [frozenset({s}) for s in big]


def test_activity_ids_round_trip_as_lowercase_hex(writer: Writer, conv: Callable[[], str]) -> None:
    c = conv()
    activity = "0123456789abcdeffedcba9876543210"
    writer.given([message(c, 1)._replace(activity_id=activity)])
    stored = writer.store.get(c, 1)
    assert stored is not None and stored.activity_id == activity


# -- recall, delete, mentions -------------------------------------------------------------------


def test_recalled_and_deleted_messages_are_flagged(writer: Writer, conv: Callable[[], str]) -> None:
    c = conv()
    writer.given(message(c, s) for s in range(1, 6))
    writer.recall(c, 2)
    writer.recall(c, 4, deleted=True)
    flags = {m.conversation_seq: m.recalled for m in writer.store.range(c, 0, 5)}
    assert flags == {1: False, 2: True, 3: False, 4: True, 5: False}
    recalled = writer.store.get(c, 2)
    assert recalled is not None and recalled.recalled and recalled.message_id == "msg-2"


def test_recall_before_its_message(writer: Writer, conv: Callable[[], str]) -> None:
    """Disorder is normal (docs/contract.md §3.6): the recall may be stored first. Until the message
    arrives the store does not hold it; once it does, it is recalled."""
    c = conv()
    writer.given([message(c, 1)])
    writer.recall(c, 2)
    assert writer.store.get(c, 2) is None
    assert seqs(writer.store.range(c, 0, 5)) == [1]
    writer.given([message(c, 2)])
    stored = writer.store.get(c, 2)
    assert stored is not None and stored.recalled and stored.message_id == "msg-2"


def test_recall_is_idempotent(writer: Writer, conv: Callable[[], str]) -> None:
    c = conv()
    writer.given([message(c, 1)])
    writer.recall(c, 1)
    writer.recall(c, 1)
    writer.given([message(c, 1)])  # a re-delivered message does not un-recall it
    stored = writer.store.get(c, 1)
    assert stored is not None and stored.recalled


def test_mentions_accumulate(writer: Writer, conv: Callable[[], str]) -> None:
    c = conv()
    writer.given([message(c, 1, mentions={3}), message(c, 2)])
    writer.mention(c, 1, [4, U64_MAX])
    writer.given([message(c, 1, mentions={5})])  # the same message again, another mention
    one, two = writer.store.range(c, 0, 2)
    assert one.mentions == frozenset({3, 4, 5, U64_MAX})
    assert two.mentions == frozenset()


def test_range_reads_a_wide_window(writer: Writer, conv: Callable[[], str]) -> None:
    """The bounded recompute reads up to unread_precise_limit (200) rows in one go."""
    c = conv()
    writer.given(message(c, s) for s in range(1, 451))
    assert seqs(writer.store.range(c, 250, 450)) == list(range(251, 451))


def test_many_recalls_at_once(writer: Writer, conv: Callable[[], str]) -> None:
    """The batched form the simulator uses: several conversations, recalls and deletes mixed,
    one of them ahead of its message."""
    a, b = conv(), conv()
    writer.given([message(a, s) for s in range(1, 4)] + [message(b, s) for s in range(1, 4)])
    writer.recall_many([(a, 1, False), (a, 3, True), (b, 2, True), (b, 9, False)])
    assert [m.recalled for m in writer.store.range(a, 0, 9)] == [True, False, True]
    assert [m.recalled for m in writer.store.range(b, 0, 9)] == [False, True, False]
    assert writer.store.get(b, 9) is None


# -- Cassandra-only: conversation heads (no in-memory counterpart) -------------------------------


@pytest.fixture
def cassandra_store(request: pytest.FixtureRequest) -> Any:
    from app.stores.cassandra_messages import CassandraMessageStore

    session, keyspace = request.getfixturevalue("cassandra_keyspace")
    return CassandraMessageStore(session, keyspace)


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_heads_only_move_forward(cassandra_store: Any, conv: Callable[[], str]) -> None:
    from app.stores.cassandra_messages import ConversationHead

    a, b, missing = conv(), conv(), conv()
    cassandra_store.update_head(a, 5, "m5", f"{5:032x}")
    cassandra_store.update_head(a, 3, "m3", f"{3:032x}")  # late: ignored
    cassandra_store.update_head(a, 5, "m5", f"{5:032x}")  # again: idempotent
    # One call, several conversations, out of order: each keeps its highest.
    cassandra_store.update_heads(
        [ConversationHead(b, 2, "b2", f"{2:032x}"), ConversationHead(b, 9, "b9", f"{9:032x}"),
         ConversationHead(b, 4, "b4", f"{4:032x}")]
    )  # fmt: skip
    heads = cassandra_store.heads([a, b, missing, a])
    assert heads == {
        a: ConversationHead(a, 5, "m5", f"{5:032x}"),
        b: ConversationHead(b, 9, "b9", f"{9:032x}"),
    }
    cassandra_store.update_head(a, 6, "m6", f"{6:032x}")
    assert cassandra_store.heads([a])[a].last_message_id == "m6"
    assert cassandra_store.heads([]) == {}
