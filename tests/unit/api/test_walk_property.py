"""Property (J-5 in general): whatever structural and content changes land between the page
requests of a sync, the SDK's live list, after the SESSION_DELTA frames of those changes, equals a
fresh walk; and every completed walk is its snapshot's list exactly once, in order."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp.test_utils import TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.api import Deps, create_app
from app.api.sources import MemoryProjectionReader
from app.api.tokens import TokenSigner
from app.domain.badge import Badge
from app.domain.flush import UserFlush
from app.sdk import LiveSessionList, SessionsClient
from app.sdk.client import Page
from app.stores.memory_projection import InMemoryProjectionStore
from tests.support.api import ME, SECRET, SETTINGS, T0
from tests.support.clock import ManualClock
from tests.support.rows import make_row

CONVERSATIONS = 24

# (kind, conversation, value): kinds that change the structure bump structure_version.
change = st.tuples(
    st.sampled_from(["message", "read", "pin", "unpin", "archive", "unarchive", "delete", "revive"]),
    st.integers(1, CONVERSATIONS),
    st.integers(1, 10_000),
)
STRUCTURAL = {"pin", "unpin", "archive", "unarchive", "delete"}


class World:
    """The store plus the frames the worker would have emitted for each change."""

    def __init__(self, store: InMemoryProjectionStore) -> None:
        self.store = store
        self.rows = {n: make_row(ME, n, act=n * 3, version=1) for n in range(1, CONVERSATIONS + 1)}
        self.version = 1
        self.structure = 1
        self.frames: list[dict[str, Any]] = []

    async def start(self) -> None:
        await self.store.write([self._batch(list(self.rows.values()), prev=0)])

    def _batch(self, rows: list[dict[str, Any]], prev: int) -> UserFlush:
        return UserFlush(
            ME, rows, Badge(), self.version, prev, self.structure, f"e{self.version}", self.version
        )

    async def apply(self, kind: str, n: int, value: int) -> None:
        prev = self.version
        self.version += 1
        row = dict(self.rows[n], projection_mailbox_seq=self.version)
        if kind in ("message", "revive"):
            row.update(
                last_activity_id=f"{value + 100_000:032x}", unread_count=row["unread_count"] + 1, listed=True
            )
        elif kind == "read":
            row["unread_count"] = 0
        elif kind == "pin":
            row.update(pin_rank=value % 4, pinned=True)
        elif kind == "unpin":
            row.update(pin_rank=None, pinned=False)
        elif kind in ("archive", "unarchive"):
            row["archived"] = kind == "archive"
        elif kind == "delete":
            row["listed"] = False
        if kind in STRUCTURAL:
            self.structure += 1
        self.rows[n] = row
        batch = self._batch([row], prev)
        await self.store.write([batch])
        self.frames.append(batch.session_delta())


class Interleaved(SessionsClient):
    """Applies the planned changes (a list per page request) right after each page request."""

    def __init__(self, url: str, world: World, plan: list[list[tuple[str, int, int]]]) -> None:
        super().__init__(url, TokenSigner(SECRET).mint(ME, T0 // 1000 + 600))
        self.world, self.plan = world, list(plan)

    async def page(self, folder: str = "main", limit: int = 50, cursor: str | None = None) -> Page:
        result = await super().page(folder, limit, cursor)
        if self.plan:
            for kind, n, value in self.plan.pop(0):
                await self.world.apply(kind, n, value)
        return result


async def scenario(plan: list[list[tuple[str, int, int]]], limit: int) -> None:
    store = InMemoryProjectionStore()
    world = World(store)
    await world.start()
    app = create_app(SETTINGS, Deps(projections=MemoryProjectionReader(store), clock_ms=ManualClock(T0)))
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        url = str(server.make_url(""))
        async with Interleaved(url, world, plan) as client:
            live = LiveSessionList(client, ME, limit=limit, max_restarts=len(plan) + 1)
            await live.sync()
            for frame in world.frames:  # the frames, in order, as the follower would see them
                assert not (await live.apply(frame)).needs_repull
            assert live.view.version == world.version
        async with SessionsClient(url, TokenSigner(SECRET).mint(ME, T0 // 1000 + 600)) as fresh:
            main = await fresh.walk("main", limit, max_restarts=0)
            archived = await fresh.walk("archived", limit, max_restarts=0)
        assert [dict(r) for r in live.main()] == main.rows
        assert [dict(r) for r in live.archived()] == archived.rows
        ids = [r["conversation_id"] for r in main.rows + archived.rows]
        assert len(ids) == len(set(ids))
    finally:
        await server.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])  # each runs a server
@given(st.lists(st.lists(change, max_size=3), max_size=12), st.integers(1, 7))
def test_live_list_after_frames_equals_a_fresh_walk(
    plan: list[list[tuple[str, int, int]]], limit: int
) -> None:
    asyncio.run(scenario(plan, limit))
