"""Rows and SESSION_DELTA / BADGE_UPDATE frames as a client receives them (docs/contract.md §4),
built by hand for the client rule's tests."""

from __future__ import annotations

USER = 42
C1 = "00000000-0000-4000-8000-000000000001"
C2 = "00000000-0000-4000-8000-000000000002"
C3 = "00000000-0000-4000-8000-000000000003"


def row(
    conversation_id: str,
    unread: int,
    *,
    listed: bool = True,
    activity: str | None = None,
    pin_rank: int | None = None,
    mention: int = 0,
) -> dict[str, object]:
    return {
        "user_id": USER,
        "conversation_id": conversation_id,
        "listed": listed,
        "membership": "active",
        "pinned": pin_rank is not None,
        "pin_rank": pin_rank,
        "archived": False,
        "muted": False,
        "last_activity_id": activity,
        "unread_count": unread,
        "unread_exact": True,
        "mention_count": mention,
    }


def delta(
    version: int, prev: int, rows: list[dict[str, object]], *, user_id: int = USER
) -> dict[str, object]:
    return {
        "type": "SESSION_DELTA",
        "user_id": user_id,
        "projection_mailbox_seq": version,
        "prev_projection_mailbox_seq": prev,
        "driving_event_id": f"e{version}",
        "driving_mailbox_seq": version,
        "conversations": [{**r, "projection_mailbox_seq": version} for r in rows],
    }


def badge(version: int, prev: int, unread: int, mention: int = 0) -> dict[str, object]:
    return {
        "type": "BADGE_UPDATE",
        "user_id": USER,
        "total_unread": unread,
        "total_mention": mention,
        "muted_unread": 0,
        "projection_mailbox_seq": version,
        "prev_projection_mailbox_seq": prev,
    }
