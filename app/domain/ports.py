"""Ports: what the pure core needs from the outside world, as Protocols.

Adapters (in-memory for replay, Cassandra for the worker) implement them; one contract test
suite runs against every implementation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol

if TYPE_CHECKING:
    from app.domain.audit import Correction
    from app.domain.flush import UserFlush


class StoredMessage(NamedTuple):
    """One message as the MessageStore knows it (the authority for recomputes)."""

    conversation_seq: int
    message_id: str
    activity_id: str
    sender_id: int
    counts_unread: bool
    recalled: bool  # recalled or deleted for everyone: it never counts
    mentions: frozenset[int]  # users the message mentions (@all included)


class MessageStore(Protocol):
    """Read side of the MessageStore, as the core uses it."""

    def range(self, conversation_id: str, after_seq: int, upto_seq: int) -> Sequence[StoredMessage]:
        """Messages with `after_seq < conversation_seq <= upto_seq`, ascending.

        One single-partition range read; callers bound the width (unread_precise_limit).
        """
        ...

    def get(self, conversation_id: str, conversation_seq: int) -> StoredMessage | None:
        """One message, or None when the store does not hold it."""
        ...


class StoredProjection(NamedTuple):
    """One user's projection as the projection store holds it."""

    user_id: int
    rows: dict[str, dict[str, object]]  # conversation_id -> row (DESIGN §4)
    total_unread: int
    total_mention: int
    muted_unread: int
    projection_mailbox_seq: int  # the version of the last batch written (0: nothing stored)
    structure_version: int  # moves on pin/unpin/archive/unarchive/leave/delete


class StoredRows(NamedTuple):
    """Some of one user's stored rows and the user's meta, read at one instant (the audit)."""

    user_id: int
    rows: dict[str, dict[str, object] | None]  # conversation_id -> row; None: not stored
    total_unread: int
    total_mention: int
    muted_unread: int
    projection_mailbox_seq: int  # 0: nothing stored


class ProjectionStore(Protocol):
    """The serving copy of the projection (Redis in production)."""

    async def write(self, batches: Sequence[UserFlush]) -> list[int | None]:
        """Write each user's batch atomically: changed rows, badge, version and structure
        version together, refused when the stored version is not older than the batch's.

        Many users go in one round trip. Returns, per batch, the version stored before it
        (written) or None (refused: a replay after a crash re-sends what is already there).
        """
        ...

    async def versions(self, user_ids: Sequence[int]) -> list[int]:
        """The stored version per user (0 when nothing is stored)."""
        ...

    async def load(self, user_id: int) -> StoredProjection:
        """Everything stored for one user, in one read."""
        ...

    async def load_rows(self, user_id: int, conversation_ids: Sequence[str]) -> StoredRows:
        """These rows of one user and the user's version and badge, in one atomic read."""
        ...

    async def correct(self, corrections: Sequence[Correction]) -> list[bool]:
        """The unread audit's repair: per user, atomically, the given rows and the badge are
        written and the version is left as it is — only if the stored version still equals the
        correction's (the one the audit compared against); otherwise nothing is written.

        The flush path's rule (refuse a version that is not newer) stays as it is: a correction
        restates version V with the values V should have had, it never moves a version.
        Returns, per correction, whether it was written."""
        ...
