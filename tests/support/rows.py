"""Projection rows (docs/contract.md §4) and user flushes as the stores hold them, built by hand for
the API, gateway, metrics and listing tests."""

from __future__ import annotations

import random
import uuid
from typing import Any

from app.domain.badge import Badge
from app.domain.client import sort_rows
from app.domain.flush import UserFlush
from app.domain.listing import Folder


def cid(n: int) -> str:
    return str(uuid.UUID(int=n))


def activity(n: int) -> str:
    return f"{n:032x}"


def make_row(
    user_id: int,
    n: int,
    *,
    act: int | None = None,
    pin_rank: int | None = None,
    archived: bool = False,
    listed: bool = True,
    unread: int = 0,
    version: int = 1,
    membership: str = "active",
) -> dict[str, Any]:
    """A docs/contract.md §4 row for conversation `cid(n)`; activity `act` (None: no message yet)."""
    return {
        "user_id": user_id,
        "conversation_id": cid(n),
        "listed": listed,
        "membership": membership,
        "pinned": pin_rank is not None,
        "pin_rank": pin_rank,
        "archived": archived,
        "muted": False,
        "last_activity_id": None if act is None else activity(act),
        "latest_conversation_seq": None if act is None else 10,
        "last_message_id": None if act is None else f"m-{n}-{act}",
        "unread_count": unread,
        "unread_exact": True,
        "mention_count": 0,
        "mention_first_conversation_seq": None,
        "read_conversation_seq": 0,
        "hidden_before_conversation_seq": 0,
        "deleted_before_conversation_seq": 10 if not listed else 0,
        "joined_at_conversation_seq": 0,
        "left_at_conversation_seq": None if membership == "active" else 10,
        "projection_mailbox_seq": version,
    }


def flush(
    user_id: int, rows: list[dict[str, Any]], version: int, structure_version: int, badge: Badge | None = None
) -> UserFlush:
    return UserFlush(
        user_id=user_id,
        rows=rows,
        badge=badge or Badge(),
        projection_mailbox_seq=version,
        prev_projection_mailbox_seq=0,
        structure_version=structure_version,
        driving_event_id=f"e{version}",
        driving_mailbox_seq=version,
    )


def mixed_rows(user_id: int, count: int, seed: int = 5) -> list[dict[str, Any]]:
    """Pinned (with equal ranks), archived, deleted, left, null-activity and equal-activity rows."""
    rnd = random.Random(seed)
    rows = []
    for n in range(1, count + 1):
        kind = rnd.random()
        rows.append(
            make_row(
                user_id,
                n,
                act=None if kind < 0.02 else rnd.randrange(1, count // 3 + 2),  # many equal activities
                pin_rank=rnd.randrange(0, 5) if 0.02 <= kind < 0.05 else None,
                archived=0.05 <= kind < 0.12,
                listed=not 0.12 <= kind < 0.15,
                membership="left" if 0.15 <= kind < 0.17 else "active",
            )
        )
    return rows


def expected_order(rows: list[dict[str, Any]], folder: Folder) -> list[str]:
    """The order by the client library's sort (an independent implementation)."""
    chosen = [r for r in rows if r["listed"] and (r["archived"] is (folder is Folder.ARCHIVED))]
    return [str(r["conversation_id"]) for r in sort_rows(chosen)]


def listed(rows: list[dict[str, Any]], user_id: int, archived: bool) -> list[dict[str, Any]]:
    """A user's listed rows of one folder, in the client library's order."""
    mine = [r for r in rows if r["user_id"] == user_id and r["listed"] and r["archived"] is archived]
    return [dict(r) for r in sort_rows(mine)]
