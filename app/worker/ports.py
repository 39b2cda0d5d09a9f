"""What the worker core needs from faust and Kafka, as Protocols."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

from app.domain.conversation_ids import conversation_uuid_bytes


class RawRecord(NamedTuple):
    """One Kafka record of the mailbox-tail topic, undecoded."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes


def raw_record(topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None) -> RawRecord:
    """A consumed record as the core takes it: a null value (a tombstone, or a producer that
    sent none) becomes empty, which the decoder dead-letters with its reason."""
    return RawRecord(topic, partition, offset, key, value if value is not None else b"")


# -- the changelog tables' layout -----------------------------------------------------------------
# Keys are bytes in an order that is the state's order: a user id as 8 big-endian bytes (so a
# user's rows are one prefix, and users sort numerically), a conversation id as its 16 UUID
# bytes. A table holds one partition per RocksDB database (and changelog partition), so the key
# needs no partition.
GATE_KEY = b"gate"
# Beside the gate, in the same table: what a restore must redo if a persist died after its data
# records reached the changelog and before its gate record did (see StateTables.commit).
GATE_INTENT_KEY = b"gate-intent"

# The steps of `StateTables.commit`, each delivered before the next is sent. A worker can die
# with any subset of a step's records delivered (they go to several changelog partitions), so:
# 0. the gate intent: the users and rows this persist leaves unflushed or owing, for a restore
#    that finds the data below without the gate that lists them;
# 1. the rows and the entries that start waiting: a row ahead of its user is applied again on
#    a re-read (the entry is above the user's version), which its seq sets make harmless;
# 2. the users: a user's version says which entries are in; never ahead of its rows, or a
#    re-read would skip an entry whose row lacks it;
# 3. the waiting entries released (their effects are in the rows and users now) and the gate,
#    whose next offset says every entry below it is in. The gate and the intent carry the
#    persist's number: an intent no newer than the gate is stale (its persist completed) and
#    is ignored (it would have a restore restage Cassandra writes already made).
# Within one commit the last write of a key wins (applied before the steps are formed).
COMMIT_STEPS = 4


def commit_step(table: str, key: bytes, value: bytes | None) -> int:
    """The step of `StateTables.commit` a record (table name, key, value) is delivered in."""
    if table == "gates":
        return 0 if key == GATE_INTENT_KEY else 3
    if table == "users":
        return 2
    if table == "pending" and value is None:
        return 3
    return 1


def user_key(user_id: int) -> bytes:
    return user_id.to_bytes(8, "big")


def row_key(user_id: int, conversation_id: str) -> bytes:
    return user_id.to_bytes(8, "big") + conversation_uuid_bytes(conversation_id)


def pending_key(user_id: int, mailbox_seq: int) -> bytes:
    return user_id.to_bytes(8, "big") + mailbox_seq.to_bytes(8, "big")


def parse_row_key(key: bytes) -> tuple[int, str]:
    # str(uuid.UUID(bytes=...)) spelled out: 3x cheaper, and every row read after a restart or an
    # eviction parses its key (a user's 50 rows at its first touch).
    h = key[8:24].hex()
    if len(h) != 32:
        raise ValueError(f"a row key has 24 bytes, not {len(key)}")
    return int.from_bytes(key[:8], "big"), f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def parse_user_key(key: bytes) -> int:
    return int.from_bytes(key[:8], "big")


class StateTables(Protocol):
    """The changelog-backed tables (RocksDB + Kafka changelog in production). Every call names
    its partition: writes go to that partition's store and changelog partition, reads read it."""

    def hand_over(self, partition: int) -> None:
        """The partition's last persist here is done (or it is dropped): another worker writes
        it next. Until then the worker's commits are the only writes its local store takes
        that are older than them (tables/state.WorkerTable)."""
        ...

    def put_row(self, partition: int, user_id: int, conversation_id: str, blob: bytes) -> None: ...

    def put_user(self, partition: int, user_id: int, blob: bytes) -> None: ...

    def put_gate(self, partition: int, blob: bytes) -> None: ...

    def put_gate_intent(self, partition: int, blob: bytes) -> None:
        """What the restore must redo should this persist stop between its data and its gate
        (the users and rows it makes unflushed or owing): delivered before the data."""
        ...

    def put_pending(self, partition: int, user_id: int, mailbox_seq: int, raw: bytes) -> None: ...

    def delete_pending(self, partition: int, user_id: int, mailbox_seq: int) -> None: ...

    async def commit(self) -> None:
        """End of a persist: every write since the last commit is in the changelog (delivered)
        and in the local store. Reads see a write only once it is committed.

        In steps, each delivered before the next is sent (`COMMIT_STEPS`, `commit_step`),
        because the records of one persist go to several changelog partitions and a worker can
        die with any subset of them delivered. So a gate is never ahead of the data it covers,
        a user never ahead of its rows, and data ahead of its gate is found by the intent."""
        ...

    def get_users(self, partition: int, user_ids: Collection[int]) -> dict[int, bytes]:
        """The users' records that exist (one multi-get)."""
        ...

    def get_rows(self, partition: int, keys: Collection[tuple[int, str]]) -> dict[tuple[int, str], bytes]:
        """The rows' records that exist (one multi-get)."""
        ...

    def user_rows(self, partition: int, user_id: int) -> list[tuple[str, bytes]]:
        """Every row of the user (one prefix scan), by conversation id."""
        ...

    def row_keys(self, partition: int) -> Iterator[tuple[int, str]]:
        """Every row's (user, conversation), in key order, values not read."""
        ...

    def gate(self, partition: int) -> bytes | None: ...

    def gate_intent(self, partition: int) -> bytes | None: ...

    def pending(self, partition: int) -> list[bytes]:
        """The waiting entries' raw records."""
        ...


class Outbox(Protocol):
    """Records the worker produces: frames, member notices and dead letters."""

    async def dead_letters(self, letters: Sequence[tuple[bytes | None, bytes]]) -> None: ...

    async def frames(
        self, session_deltas: Sequence[tuple[bytes, bytes]], badges: Sequence[tuple[bytes, bytes]]
    ) -> None: ...

    async def notices(self, notices: Sequence[tuple[bytes, bytes]]) -> None:
        """MEMBER_NOTICE frames (key = user id): on the session-delta topic, so they stay in
        order with the user's SESSION_DELTA frames (docs/contract.md §9)."""
        ...


class StateWriter(Protocol):
    """Batched UserConversationState / group_members persistence (Cassandra)."""

    def stage(self, user_id: int, conversation_id: str, fields: dict[str, object]) -> None: ...

    def stage_member(
        self,
        conversation_id: str,
        user_id: int,
        role: str | None,
        state: str,
        joined_at: int | None,
        left_at: int | None,
    ) -> None: ...

    def stage_member_stats(
        self, conversation_id: str, user_id: int, record_count: int, mention_count: int, mailbox_seq: int
    ) -> None: ...

    async def flush(self) -> int: ...

    def owed(self) -> dict[tuple[int, str], dict[str, Any]]:
        """Staged and not written yet, per (user, conversation), as plain values."""
        ...

    def restage(self, user_id: int, conversation_id: str, owed: Mapping[str, Any]) -> None:
        """Stage again what `owed` returned before a restart."""
        ...

    def drop(self, keys: Iterable[tuple[int, str]]) -> None:
        """Forget what is staged for these (user, conversation) keys (another worker owes it now)."""
        ...


class FlushObserver(Protocol):
    """Told how long each flush took (the worker's Prometheus metrics); the counters are pulled
    from the core's stats instead, so the core never depends on the metrics module."""

    def observe_flush(self, seconds: float) -> None: ...
