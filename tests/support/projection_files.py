"""A projection store's content in `projector replay`'s file layout, for comparisons."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from app.domain.projection_store import ProjectionStore


async def as_replay_files(
    store: ProjectionStore, user_ids: Iterable[int]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(projections.jsonl rows, badges.jsonl lines) for these users, sorted as replay sorts."""
    rows: list[dict[str, Any]] = []
    badges: list[dict[str, Any]] = []
    for user_id in user_ids:
        stored = await store.load(user_id)
        rows += [dict(stored.rows[cid]) for cid in sorted(stored.rows)]
        badges.append(
            {
                "user_id": user_id,
                "total_unread": stored.total_unread,
                "total_mention": stored.total_mention,
                "muted_unread": stored.muted_unread,
                "archived_unread": stored.archived_unread,
                "archived_mention": stored.archived_mention,
                "badge_mode": stored.badge_mode,
                "include_muted": stored.include_muted,
                "projection_mailbox_seq": stored.projection_mailbox_seq,
            }
        )
    return rows, badges
