"""The app-icon badge (docs/contract.md §3.8): maintained by deltas, recomputable in full."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from app.domain.conversation import ConversationState


class Badge(NamedTuple):
    total_unread: int = 0
    total_mention: int = 0
    muted_unread: int = 0

    def plus(self, after: Badge, before: Badge) -> Badge:
        """This badge moved by one row's change (after - before)."""
        return Badge(
            self.total_unread + after.total_unread - before.total_unread,
            self.total_mention + after.total_mention - before.total_mention,
            self.muted_unread + after.muted_unread - before.muted_unread,
        )


ZERO = Badge()


def moved(
    badge: Badge,
    row: ConversationState,
    before: tuple[int, int, str, bool, bool],
    include_muted: bool,
) -> Badge:
    """The badge after one row changed from `before` = (unread, mention, membership, archived,
    muted) to its current values: delta maintenance, never a re-sum."""
    unread, mention, membership, archived, muted = before
    if row.membership == membership and row.archived == archived and row.muted == muted:
        # Same zone: only the counts moved (the hot path: messages and reads).
        d_unread = row.unread_count - unread
        d_mention = row.mention_count - mention
        active = membership == "active"
        return Badge(
            badge.total_unread
            + (d_unread if active and not archived and (include_muted or not muted) else 0),
            badge.total_mention + (d_mention if active else 0),
            badge.muted_unread + (d_unread if muted else 0),
        )
    old = _contribution(unread, mention, membership, archived, muted, include_muted)
    return badge.plus(contribution(row, include_muted), old)


def _contribution(
    unread: int, mention: int, membership: str, archived: bool, muted: bool, include_muted: bool
) -> Badge:
    active = membership == "active"
    counted = active and not archived and (include_muted or not muted)
    return Badge(
        unread if counted else 0,
        mention if active else 0,  # muting only silences notifications
        unread if muted else 0,
    )


def contribution(row: ConversationState, include_muted: bool) -> Badge:
    """What one row adds to its user's badge."""
    return _contribution(
        row.unread_count, row.mention_count, row.membership, row.archived, row.muted, include_muted
    )


def full_recompute(rows: Iterable[ConversationState], include_muted: bool) -> Badge:
    """The badge from scratch: run after every reconcile to cancel any accumulated drift."""
    return _total(contribution(row, include_muted) for row in rows)


def from_rows(rows: Iterable[Mapping[str, Any]], include_muted: bool) -> Badge:
    """The full recompute over projection rows (docs/contract.md §4 dicts), for rows that no flush wrote
    a badge with: a login pull's rows filled from UserConversationState."""
    return _total(
        _contribution(
            int(row["unread_count"]),
            int(row["mention_count"]),
            str(row["membership"]),
            bool(row["archived"]),
            bool(row["muted"]),
            include_muted,
        )
        for row in rows
    )


def _total(parts: Iterable[Badge]) -> Badge:
    total_unread = total_mention = muted_unread = 0
    for part in parts:
        total_unread += part.total_unread
        total_mention += part.total_mention
        muted_unread += part.muted_unread
    return Badge(total_unread, total_mention, muted_unread)
