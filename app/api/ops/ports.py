"""What the operator console reads and writes, as small ports (issue 17).

The console runs inside the API process, which must not import faust, mode or aiokafka: the Kafka
side (frames, dead letters, consumer-group offsets, correction frames out) is the `OpsBus` port,
implemented by app/kafka/ops.py and injected where the API is built (`projector api`); Cassandra
and Redis are the adapters the API already has. Tests inject in-memory ones.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from app.domain.flush import Correction, UserFlush
from app.domain.ports import MessageStore
from app.domain.projection_store import StoredProjection, StoredRows
from app.members.model import BaseMember
from app.rebuild.from_state import HeadLike

OPS_KEY: Final = "ops"  # Deps.extra[OPS_KEY]: the console's OpsDeps


@dataclass(frozen=True, slots=True)
class TopicRecord:
    """One record read back from a topic (a frame, a dead letter)."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: str | None
    value: bytes


@dataclass(frozen=True, slots=True)
class PartitionOffsets:
    """mailbox-tail offsets of one partition: what the workers' group committed, the log end."""

    partition: int
    committed: int | None  # None: the group never committed on it
    end: int

    @property
    def lag(self) -> int:
        """Records not yet committed (the whole log when nothing is)."""
        return max(0, self.end - (self.committed or 0))


class OpsBus(Protocol):
    def partition_of(self, user_id: int) -> int:
        """mailbox-tail's partition for this user (producers key by user id)."""
        ...

    async def last_records(self, topic: str, key: str, limit: int) -> list[TopicRecord]:
        """The newest `limit` records with this key on the key's partition of `topic`, oldest
        first, looking back at most `ops_scan_records` records."""
        ...

    async def tail(self, topic: str, limit: int, partition: int | None = None) -> list[TopicRecord]:
        """The newest `limit` records of `topic` (one partition, or all), newest first."""
        ...

    async def group_offsets(self) -> list[PartitionOffsets]:
        """mailbox-tail's partitions: the workers' consumer group's committed offsets, ends."""
        ...

    async def publish_frames(self, user_id: int, deltas: Sequence[bytes], badges: Sequence[bytes]) -> None:
        """Produce frames on the session-delta and badge topics, keyed by the user."""
        ...

    async def aclose(self) -> None: ...


class ProjectionAccess(Protocol):
    """The serving projection store (RedisProjectionStore, or the in-memory one in tests)."""

    async def load(self, user_id: int) -> StoredProjection: ...

    async def load_rows(self, user_id: int, conversation_ids: Sequence[str]) -> StoredRows: ...

    async def correct(self, corrections: Sequence[Correction]) -> list[bool]: ...

    async def write(self, batches: Sequence[UserFlush]) -> list[int | None]: ...


class StateAccess(Protocol):
    """UserConversationState (blocking driver calls: run in a worker thread)."""

    def load_user(self, user_id: int) -> list[dict[str, Any]]: ...


class MessageAccess(MessageStore, Protocol):
    """The MessageStore plus conversation heads (blocking: run in a worker thread)."""

    def heads(self, conversation_ids: Iterable[str]) -> Mapping[str, HeadLike]: ...


class MemberAccess(Protocol):
    """The member directory's reads (CassandraMemberReader)."""

    async def page(
        self, conversation_id: str, after_user_id: int | None, count: int, active_only: bool
    ) -> list[BaseMember]: ...

    async def read_seqs(self, conversation_id: str, user_ids: Sequence[int]) -> dict[int, int]: ...


class ServingNamespace(Protocol):
    async def __call__(self) -> str:
        """The namespace that serves now ({base}:serving, else the base)."""
        ...


@dataclass(slots=True)
class OpsDeps:
    store: ProjectionAccess
    state: StateAccess
    messages: MessageAccess
    members: MemberAccess
    serving: ServingNamespace
    bus: OpsBus | None = None  # None: the Kafka figures are shown as unavailable
    # GET of a /metrics URL (text); None = aiohttp's client (tests pass their own)
    metrics_fetch: Callable[[str], Awaitable[str]] | None = None
