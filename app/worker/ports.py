"""What the worker core needs from faust and Kafka, as Protocols."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol


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


class PartitionSnapshot(NamedTuple):
    """What the changelog tables hold for one partition."""

    rows: list[bytes]
    users: list[bytes]
    gate: bytes | None
    pending: list[bytes]


class StateTables(Protocol):
    """The changelog-backed tables (RocksDB + Kafka changelog in production). Every write
    names its partition: it goes to that partition's store and changelog partition."""

    def put_row(self, partition: int, user_id: int, conversation_id: str, blob: bytes) -> None: ...

    def put_user(self, partition: int, user_id: int, blob: bytes) -> None: ...

    def put_gate(self, partition: int, blob: bytes) -> None: ...

    def put_pending(self, partition: int, user_id: int, mailbox_seq: int, raw: bytes) -> None: ...

    def delete_pending(self, partition: int, user_id: int, mailbox_seq: int) -> None: ...

    def snapshot(self, partition: int) -> PartitionSnapshot: ...

    def republish(self, partition: int) -> None:
        """Queue every record the partition's tables hold for the changelog (sent by `commit`)."""
        ...

    async def commit(self) -> None:
        """End of a persist: the changelog records of its writes are on their way."""
        ...


class Outbox(Protocol):
    """Records the worker produces: frames and dead letters."""

    async def dead_letters(self, letters: Sequence[tuple[bytes | None, bytes]]) -> None: ...

    async def frames(
        self, session_deltas: Sequence[tuple[bytes, bytes]], badges: Sequence[tuple[bytes, bytes]]
    ) -> None: ...


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
