"""Projection rows and flushes for the projection store's tests: full docs/contract.md §4 rows
holding every value type a row has (nulls, bools, ints, strings), which a store must round-trip."""

from __future__ import annotations

from typing import Any

from app.domain.badge import Badge
from app.domain.flush import UserFlush

DEFAULT_BADGE = Badge(3, 1, 0)


def conv(n: int) -> str:
    return f"{n:08x}-0000-4000-8000-{n:012x}"


def row(user_id: int, conversation_id: str, version: int, **changes: Any) -> dict[str, Any]:
    """A full docs/contract.md §4 row (nulls, bools, ints and strings: all of them must round-trip)."""
    base: dict[str, Any] = {
        "user_id": user_id,
        "conversation_id": conversation_id,
        "listed": True,
        "membership": "active",
        "pinned": False,
        "pin_rank": None,
        "archived": False,
        "muted": False,
        "last_activity_id": f"{version:032x}",
        "latest_conversation_seq": version,
        "last_message_id": f"m-{version}",
        "unread_count": 3,
        "unread_exact": True,
        "mention_count": 1,
        "mention_first_conversation_seq": 2,
        "read_conversation_seq": 0,
        "hidden_before_conversation_seq": 0,
        "deleted_before_conversation_seq": 0,
        "joined_at_conversation_seq": 0,
        "left_at_conversation_seq": None,
        "projection_mailbox_seq": version,
    }
    base.update(changes)
    return base


def flush(
    user_id: int,
    version: int,
    conversations: list[str],
    badge: Badge = DEFAULT_BADGE,
    structure_version: int = 0,
    prev: int = 0,
    **changes: Any,
) -> UserFlush:
    return UserFlush(
        user_id=user_id,
        rows=[row(user_id, c, version, **changes) for c in conversations],
        badge=badge,
        projection_mailbox_seq=version,
        prev_projection_mailbox_seq=prev,
        structure_version=structure_version,
        driving_event_id=f"ev-{version}",
        driving_mailbox_seq=version,
    )
