"""The app-icon badge (docs/contract.md §3.8, §10): maintained by deltas, recomputable in full.

A row's contribution depends on the user's badge preferences (§10): `badge_mode` ("messages":
sums of counts; "conversations": how many rows have a count > 0) and `include_muted`. A row
marked unread counts as `max(unread_count, 1)` wherever an unread sum counts it (total_unread,
muted_unread, archived_unread); mentions are never moved by the mark. The folder totals
`archived_unread` / `archived_mention` are the same sums over active ∧ archived rows (muted
rows by the same include_muted rule for the unread; mentions, like total_mention, over every
active archived row)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final, NamedTuple, Protocol

from app.domain.conversation import ConversationState

MESSAGES: Final = "messages"
CONVERSATIONS: Final = "conversations"
BADGE_MODES: Final = (MESSAGES, CONVERSATIONS)


class Badge(NamedTuple):
    total_unread: int = 0
    total_mention: int = 0
    muted_unread: int = 0
    archived_unread: int = 0
    archived_mention: int = 0
    badge_mode: str = MESSAGES
    include_muted: bool = False

    @property
    def counts(self) -> tuple[int, int, int, int, int]:
        return (
            self.total_unread,
            self.total_mention,
            self.muted_unread,
            self.archived_unread,
            self.archived_mention,
        )

    def plus(self, after: Badge, before: Badge) -> Badge:
        """This badge moved by one row's change (after - before)."""
        return Badge(
            self.total_unread + after.total_unread - before.total_unread,
            self.total_mention + after.total_mention - before.total_mention,
            self.muted_unread + after.muted_unread - before.muted_unread,
            self.archived_unread + after.archived_unread - before.archived_unread,
            self.archived_mention + after.archived_mention - before.archived_mention,
            self.badge_mode,
            self.include_muted,
        )


ZERO = Badge()


class StoredBadge(Protocol):
    """The badge's seven fields as a stored record carries them (the projection store's meta,
    StoredRows, StoredProjection)."""

    @property
    def total_unread(self) -> int: ...
    @property
    def total_mention(self) -> int: ...
    @property
    def muted_unread(self) -> int: ...
    @property
    def archived_unread(self) -> int: ...
    @property
    def archived_mention(self) -> int: ...
    @property
    def badge_mode(self) -> str: ...
    @property
    def include_muted(self) -> bool: ...


def badge_of(stored: StoredBadge) -> Badge:
    """The badge a stored record holds."""
    return Badge(
        stored.total_unread,
        stored.total_mention,
        stored.muted_unread,
        stored.archived_unread,
        stored.archived_mention,
        stored.badge_mode,
        stored.include_muted,
    )


def badge_fields(badge: Badge, version: int) -> dict[str, Any]:
    """The badge as the contract spells it (docs/contract.md §3.8, §10), as of the projection
    version `version`: GET /v1/badge's body, the stream's hello, a BADGE_UPDATE frame's fields.
    The keys' order is part of the output (replay's deltas.jsonl is compared byte for byte)."""
    return {
        "total_unread": badge.total_unread,
        "total_mention": badge.total_mention,
        "muted_unread": badge.muted_unread,
        "archived_unread": badge.archived_unread,
        "archived_mention": badge.archived_mention,
        "badge_mode": badge.badge_mode,
        "include_muted": badge.include_muted,
        "projection_mailbox_seq": version,
    }

# What a row's contribution depends on: (unread, mention, membership, archived, muted, marked).
RowKey = tuple[int, int, str, bool, bool, bool]


def row_key(row: ConversationState) -> RowKey:
    return (
        row.unread_count,
        row.mention_count,
        row.membership,
        row.archived,
        row.muted,
        row.marked_unread,
    )


def moved(badge: Badge, row: ConversationState, before: RowKey) -> Badge:
    """The badge after one row changed from `before` (row_key) to its current values: delta
    maintenance, never a re-sum. The mode and include_muted are the badge's own."""
    mode = badge.badge_mode
    include_muted = badge.include_muted
    old = _contribution(*before, include_muted, mode)
    new = _contribution(*row_key(row), include_muted, mode)
    return badge.plus(new, old)


def _contribution(
    unread: int,
    mention: int,
    membership: str,
    archived: bool,
    muted: bool,
    marked: bool,
    include_muted: bool,
    mode: str,
) -> Badge:
    if marked and unread < 1:
        unread = 1  # a marked row counts as at least 1 (§10)
    if mode == CONVERSATIONS:
        unread = 1 if unread > 0 else 0
        mention = 1 if mention > 0 else 0
    active = membership == "active"
    counted = active and (include_muted or not muted)
    return Badge(
        unread if counted and not archived else 0,
        mention if active else 0,  # muting only silences notifications
        unread if muted else 0,
        unread if counted and archived else 0,
        mention if active and archived else 0,
    )


def contribution(row: ConversationState, include_muted: bool, mode: str = MESSAGES) -> Badge:
    """What one row adds to its user's badge."""
    return _contribution(*row_key(row), include_muted, mode)


def full_recompute(rows: Iterable[ConversationState], include_muted: bool, mode: str = MESSAGES) -> Badge:
    """The badge from scratch: run after every reconcile to cancel any accumulated drift."""
    return _total((contribution(row, include_muted, mode) for row in rows), include_muted, mode)


def from_rows(rows: Iterable[Mapping[str, Any]], include_muted: bool, mode: str = MESSAGES) -> Badge:
    """The full recompute over projection rows (docs/contract.md §4 dicts), for rows that no flush wrote
    a badge with: a login pull's rows filled from UserConversationState."""
    return _total(
        (
            _contribution(
                int(row["unread_count"]),
                int(row["mention_count"]),
                str(row["membership"]),
                bool(row["archived"]),
                bool(row["muted"]),
                bool(row.get("marked_unread", False)),
                include_muted,
                mode,
            )
            for row in rows
        ),
        include_muted,
        mode,
    )


def _total(parts: Iterable[Badge], include_muted: bool, mode: str) -> Badge:
    total_unread = total_mention = muted_unread = archived_unread = archived_mention = 0
    for part in parts:
        total_unread += part.total_unread
        total_mention += part.total_mention
        muted_unread += part.muted_unread
        archived_unread += part.archived_unread
        archived_mention += part.archived_mention
    return Badge(
        total_unread, total_mention, muted_unread, archived_unread, archived_mention, mode, include_muted
    )
