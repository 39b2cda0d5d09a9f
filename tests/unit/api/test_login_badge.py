"""A login pull when the projection store holds nothing for the user (reconcile, seed §3.4): the
rows come from UserConversationState (the fill-in) and the badge is their full recompute, not
the zeros of an absent meta. With a stored meta, the badge is the worker's, as flushed."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from app.api import Deps, create_app
from app.api.sources import MemoryProjectionReader
from app.api.tokens import TokenSigner
from app.domain.badge import Badge, from_rows
from app.settings import Settings
from app.stores.memory_projection import InMemoryProjectionStore
from tests.support.api import SECRET
from tests.support.rows import flush, make_row

ME = 42
NOW_S = 1_800_000_000


class FilledFromState:
    """A StateFiller with fixed rows (what CassandraStateFiller derives from state)."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows_ = rows
        self.calls = 0

    async def rows(self, user_id: int, known: Collection[str]) -> list[dict[str, Any]]:
        self.calls += 1
        return [r for r in self.rows_ if r["user_id"] == user_id and r["conversation_id"] not in known]


def state_rows() -> list[dict[str, Any]]:
    muted = dict(make_row(ME, 3, act=3, unread=4), muted=True, mention_count=1)
    return [
        dict(make_row(ME, 1, act=1, unread=2), mention_count=1),
        make_row(ME, 2, act=2, unread=5, archived=True),
        muted,
        make_row(ME, 4, act=4, unread=7, membership="left"),
    ]


async def badge_and_pages(
    store: InMemoryProjectionStore, filler: FilledFromState, fill: str, include_muted: bool = False
) -> tuple[dict[str, Any], dict[str, Any]]:
    settings = Settings.build(api_secret=SECRET, api_fill_from_state=fill, include_muted=include_muted)
    app = create_app(
        settings, Deps(projections=MemoryProjectionReader(store), state=filler, clock_ms=lambda: NOW_S * 1000)
    )
    auth = {"Authorization": "Bearer " + TokenSigner(SECRET).mint(ME, NOW_S + 600)}
    async with TestClient(TestServer(app)) as client:
        async with client.get("/v1/sessions", headers=auth) as resp:
            page = await resp.json()
        async with client.get("/v1/badge", headers=auth) as resp:
            assert resp.status == 200
            badge = await resp.json()
    return badge, page


async def test_nothing_stored_the_badge_is_the_full_recompute_of_the_rows_filled_from_state() -> None:
    filler = FilledFromState(state_rows())
    badge, page = await badge_and_pages(InMemoryProjectionStore(), filler, "empty")
    assert page["filled_from_state"] is True and page["projection_mailbox_seq"] == 0
    # Active, not archived, not muted: 2; mentions over active rows (muted too): 2; muted: 4.
    # The archived folder (§10): the archived active row's 5 unread, no mention.
    assert badge == {
        "total_unread": 2,
        "total_mention": 2,
        "muted_unread": 4,
        "archived_unread": 5,
        "archived_mention": 0,
        "badge_mode": "messages",
        "include_muted": False,
        "projection_mailbox_seq": 0,
    }
    assert Badge(2, 2, 4, 5, 0) == from_rows(state_rows(), include_muted=False)
    muted_too, _ = await badge_and_pages(
        InMemoryProjectionStore(), FilledFromState(state_rows()), "empty", True
    )
    assert muted_too["total_unread"] == 6


async def test_a_stored_meta_is_served_as_flushed_even_with_rows_missing() -> None:
    store = InMemoryProjectionStore()
    # The worker's badge counts a row the store has lost: it is the authority, not a re-sum.
    await store.write([flush(ME, [make_row(ME, 1, act=1, unread=2)], 9, 0, Badge(9, 1, 0))])
    filler = FilledFromState(state_rows())
    badge, _ = await badge_and_pages(store, filler, "always")
    assert badge == {
        "total_unread": 9,
        "total_mention": 1,
        "muted_unread": 0,
        "archived_unread": 0,
        "archived_mention": 0,
        "badge_mode": "messages",
        "include_muted": False,
        "projection_mailbox_seq": 9,
    }


async def test_without_a_fill_in_nothing_stored_is_zeros() -> None:
    filler = FilledFromState(state_rows())
    badge, page = await badge_and_pages(InMemoryProjectionStore(), filler, "never")
    assert page["items"] == [] and filler.calls == 0
    assert badge == {
        "total_unread": 0,
        "total_mention": 0,
        "muted_unread": 0,
        "archived_unread": 0,
        "archived_mention": 0,
        "badge_mode": "messages",
        "include_muted": False,
        "projection_mailbox_seq": 0,
    }


def test_from_rows_agrees_with_the_core_full_recompute() -> None:
    from app.domain.badge import full_recompute
    from app.domain.conversation import ConversationState

    states = []
    for row in state_rows():
        state = ConversationState(ME, row["conversation_id"])
        state.unread_count, state.mention_count = row["unread_count"], row["mention_count"]
        state.membership, state.archived, state.muted = row["membership"], row["archived"], row["muted"]
        states.append(state)
    for include_muted in (False, True):
        assert from_rows(state_rows(), include_muted) == full_recompute(states, include_muted)
