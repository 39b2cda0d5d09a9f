"""A user's list kept current: pulled by walks, then patched by SESSION_DELTA / BADGE_UPDATE frames
with the client rule of app.domain.client.SessionView (absolute rows, versions, gap -> re-pull)."""

from __future__ import annotations

from collections.abc import Mapping

from app.domain.client import ApplyResult, Frame, SessionView, badge_of
from app.sdk.client import SessionsClient


class LiveSessionList:
    def __init__(
        self, client: SessionsClient, user_id: int, *, limit: int = 100, max_restarts: int = 3
    ) -> None:
        self.client = client
        self.user_id = user_id
        self.limit = limit
        self.max_restarts = max_restarts
        self.view = SessionView(user_id)
        self.syncs = 0

    async def sync(self) -> None:
        """Re-pull both folders (and the badge) and load them into the view.

        The view's version becomes the *lower* of the two walks' versions: frames above it are
        then applied on top (each overwrites whole rows with newer absolute values), so rows of
        a walk that was a little newer end up where the frames take them, never older.
        """
        main = await self.client.walk("main", self.limit, self.max_restarts)
        archived = await self.client.walk("archived", self.limit, self.max_restarts)
        totals = await self.client.badge()
        version = min(main.projection_mailbox_seq, archived.projection_mailbox_seq)
        badge = badge_of(totals)
        # A badge older than the one held (a BADGE_UPDATE already applied) is not taken.
        held = self.view.badge
        self.view.reset(
            [*main.rows, *archived.rows],
            version,
            badge=badge if held is None or held.version < badge.version else None,
        )
        self.syncs += 1

    async def apply(self, frame: Frame) -> ApplyResult:
        """Apply a frame; on a gap (a frame was lost) re-pull instead of patching."""
        result = self.view.apply(frame)
        if result.needs_repull:
            await self.sync()
        return result

    def main(self) -> list[Mapping[str, object]]:
        """The main folder as the client shows it (list order, docs/contract.md §5)."""
        return [row for row in self.view.listed() if row.get("archived") is not True]

    def archived(self) -> list[Mapping[str, object]]:
        return [row for row in self.view.listed() if row.get("archived") is True]
