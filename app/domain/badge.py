"""The app-icon badge (DESIGN §3.8): maintained by deltas, recomputable in full."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

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


def contribution(row: ConversationState, include_muted: bool) -> Badge:
    """What one row adds to its user's badge."""
    active = row.membership == "active"
    unread = row.unread_count
    counted = active and not row.archived and (include_muted or not row.muted)
    return Badge(
        unread if counted else 0,
        row.mention_count if active else 0,  # muting only silences notifications
        unread if row.muted else 0,
    )


def full_recompute(rows: Iterable[ConversationState], include_muted: bool) -> Badge:
    """The badge from scratch: run after every reconcile to cancel any accumulated drift."""
    total_unread = total_mention = muted_unread = 0
    for row in rows:
        part = contribution(row, include_muted)
        total_unread += part.total_unread
        total_mention += part.total_mention
        muted_unread += part.muted_unread
    return Badge(total_unread, total_mention, muted_unread)
