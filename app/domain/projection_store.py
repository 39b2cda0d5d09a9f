"""The projection store port: the serving copy of the projection (Redis in production, a dict
in replay and tests), as the core and the worker use it. One contract suite
(tests/contract/test_projection_store_contract.py) runs against every implementation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol

if TYPE_CHECKING:
    from app.domain.flush import Correction, UserFlush


class StoredProjection(NamedTuple):
    """One user's projection as the projection store holds it."""

    user_id: int
    rows: dict[str, dict[str, object]]  # conversation_id -> row (docs/contract.md §4)
    total_unread: int
    total_mention: int
    muted_unread: int
    projection_mailbox_seq: int  # the version of the last batch written (0: nothing stored)
    structure_version: int  # moves on pin/unpin/archive/unarchive/leave/delete
    # docs/contract.md §10 (defaults: nothing stored, or a store written before them)
    archived_unread: int = 0
    archived_mention: int = 0
    badge_mode: str = "messages"
    include_muted: bool = False


class StoredRows(NamedTuple):
    """Some of one user's stored rows and the user's meta, read at one instant (the audit)."""

    user_id: int
    rows: dict[str, dict[str, object] | None]  # conversation_id -> row; None: not stored
    total_unread: int
    total_mention: int
    muted_unread: int
    projection_mailbox_seq: int  # 0: nothing stored
    # docs/contract.md §10 (defaults: a store written before them, or a test's literal)
    archived_unread: int = 0
    archived_mention: int = 0
    badge_mode: str = "messages"
    include_muted: bool = False


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
