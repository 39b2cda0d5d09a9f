"""The SDK against the API on the in-memory store: bounded restarts, the live list's gap rule."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from app.api import Deps, create_app
from app.api.sources import MemoryProjectionReader
from app.api.tokens import TokenSigner
from app.sdk import LiveSessionList, SessionsClient, TooManyRestarts
from app.sdk.client import ClientError, Page
from app.stores.memory_projection import InMemoryProjectionStore
from tests.support.api import ME, SECRET, SETTINGS, T0
from tests.support.clock import ManualClock
from tests.support.rows import cid, flush, make_row


@pytest.fixture
async def served() -> AsyncIterator[tuple[str, InMemoryProjectionStore]]:
    store = InMemoryProjectionStore()
    app = create_app(SETTINGS, Deps(projections=MemoryProjectionReader(store), clock_ms=ManualClock(T0)))
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("")), store
    finally:
        await server.close()


def token(user_id: int = ME) -> str:
    return TokenSigner(SECRET).mint(user_id, T0 // 1000 + 600)


class Reshuffling(SessionsClient):
    """Pins another conversation (a structural change) after every `every`-th page."""

    def __init__(self, url: str, store: InMemoryProjectionStore, every: int, times: int) -> None:
        super().__init__(url, token())
        self.store, self.every, self.left = store, every, times
        self.version, self.structure, self.requests = 1, 1, 0

    async def page(self, folder: str = "main", limit: int = 50, cursor: str | None = None) -> Page:
        result = await super().page(folder, limit, cursor)
        self.requests += 1
        if self.left and self.requests % self.every == 0:
            self.left -= 1
            self.version += 1
            self.structure += 1
            pinned = make_row(ME, self.version, act=self.version, pin_rank=self.version, version=self.version)
            await self.store.write([flush(ME, [pinned], self.version, self.structure)])
        return result


async def test_walk_restarts_and_ends_with_the_current_list(served: tuple[str, Any]) -> None:
    url, store = served
    await store.write([flush(ME, [make_row(ME, n, act=n) for n in range(1, 21)], 1, 1)])
    async with Reshuffling(url, store, every=2, times=2) as client:
        walk = await client.walk(limit=3, max_restarts=2)
    assert walk.restarts == 2
    pinned = [cid(2), cid(3)]  # pin_rank 2 and 3
    assert [r["conversation_id"] for r in walk.rows] == pinned + [
        cid(n) for n in range(20, 0, -1) if cid(n) not in pinned
    ]


async def test_restarts_are_bounded(served: tuple[str, Any]) -> None:
    url, store = served
    await store.write([flush(ME, [make_row(ME, n, act=n) for n in range(1, 21)], 1, 1)])
    async with Reshuffling(url, store, every=1, times=10) as client:
        with pytest.raises(TooManyRestarts):
            await client.walk(limit=3, max_restarts=1)


async def test_api_errors_surface_with_their_code(served: tuple[str, Any]) -> None:
    url, _ = served
    async with SessionsClient(url, "v1.bad.token") as client:
        with pytest.raises(ClientError) as err:
            await client.page()
    assert err.value.status == 401 and err.value.code == "unauthorized"


async def test_live_list_applies_frames_and_re_pulls_on_a_gap(served: tuple[str, Any]) -> None:
    url, store = served
    await store.write([flush(ME, [make_row(ME, n, act=n) for n in range(1, 6)], 1, 1)])
    async with SessionsClient(url, token()) as client:
        live = LiveSessionList(client, ME, limit=2)
        await live.sync()
        assert [r["conversation_id"] for r in live.main()] == [cid(n) for n in range(5, 0, -1)]
        assert live.view.badge is not None and live.view.badge.version == 1
        # The next frame in the chain: applied by overwrite.
        bumped = make_row(ME, 1, act=9, unread=2, version=2)
        frame2 = {**flush(ME, [bumped], 2, 1).session_delta(), "prev_projection_mailbox_seq": 1}
        await store.write([flush(ME, [bumped], 2, 1)])
        assert (await live.apply(frame2)).applied
        assert live.main()[0] == bumped and live.syncs == 1
        assert not (await live.apply(frame2)).applied  # a redelivery applies zero times
        # A frame whose prev is not the last seen version: frames were lost -> re-pull, no patch.
        archived = make_row(ME, 2, act=2, archived=True, version=4)
        await store.write([flush(ME, [archived], 4, 2)])
        frame4 = {**flush(ME, [archived], 4, 2).session_delta(), "prev_projection_mailbox_seq": 3}
        result = await live.apply(frame4)
        assert result.needs_repull and live.syncs == 2 and live.view.version == 4
        assert [r["conversation_id"] for r in live.archived()] == [cid(2)]
        assert cid(2) not in [r["conversation_id"] for r in live.main()]


async def test_a_non_json_answer_is_a_client_error() -> None:
    from aiohttp import web

    async def html(request: web.Request) -> web.Response:
        return web.Response(status=502, text="<html>bad gateway</html>", content_type="text/html")

    app = web.Application()
    app.router.add_get("/v1/sessions", html)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        async with SessionsClient(str(server.make_url("")), token()) as client:
            with pytest.raises(ClientError) as err:
                await client.page()
    finally:
        await server.close()
    assert (
        err.value.status == 502
        and err.value.code == "invalid_response"
        and "bad gateway" in err.value.message
    )


async def test_the_sdk_turns_a_js_unsafe_string_id_back_into_the_exact_int(served: tuple[str, Any]) -> None:
    url, store = served
    user = 11982011376358104761  # > 2^53: the API sends it as "11982011376358104761"
    await store.write([flush(user, [make_row(user, n, act=n) for n in range(1, 6)], 7, 1)])
    async with SessionsClient(url, token(user)) as client:
        walk = await client.walk(limit=2)
    assert [r["user_id"] for r in walk.rows] == [user] * 5
    assert all(type(r["user_id"]) is int for r in walk.rows)


async def test_the_sdk_waits_out_429_and_503_as_retry_after_says_within_its_retries() -> None:
    from aiohttp import web

    answers: list[tuple[int, dict[str, str]]] = []

    async def badge(request: web.Request) -> web.Response:
        status, headers = answers.pop(0) if answers else (200, {})
        if status != 200:
            body = {"error": {"code": "busy", "message": "later"}}
            return web.json_response(body, status=status, headers=headers)
        return web.json_response({"total_unread": 1})

    app = web.Application()
    app.router.add_get("/v1/badge", badge)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    later = {"Retry-After": "0"}
    try:
        async with SessionsClient(str(server.make_url("")), token(), busy_retries=2) as client:
            answers[:] = [(429, later), (503, later)]
            assert (await client.badge())["total_unread"] == 1
            answers[:] = [(429, later)] * 3  # one more than it retries
            with pytest.raises(ClientError) as err:
                await client.badge()
            assert err.value.status == 429 and err.value.code == "busy"
            answers[:] = [(429, {})]  # no Retry-After: nothing says when, the error surfaces
            with pytest.raises(ClientError):
                await client.badge()
            assert not answers
    finally:
        await server.close()


async def test_reconcile_is_accepted_then_says_when_to_ask_again() -> None:
    from app.api.reconcile import REQUESTS_KEY
    from app.domain.reconcile import ReconcileRequest
    from app.sdk import ReconcileAnswer

    sent: list[ReconcileRequest] = []

    class Requests:
        async def send(self, request: ReconcileRequest) -> None:
            sent.append(request)

    store = InMemoryProjectionStore()
    deps = Deps(
        projections=MemoryProjectionReader(store), clock_ms=ManualClock(T0), extra={REQUESTS_KEY: Requests()}
    )
    server = TestServer(create_app(SETTINGS, deps), host="127.0.0.1")
    await server.start_server()
    try:
        async with SessionsClient(str(server.make_url("")), token()) as api:
            interval = SETTINGS.reconcile.reconcile_min_interval_s
            assert await api.reconcile() == ReconcileAnswer(True, None, interval)
            assert await api.reconcile() == ReconcileAnswer(False, interval, None)
        assert [r.user_id for r in sent] == [ME]
        async with SessionsClient(str(server.make_url("")), "not-a-token") as api:
            with pytest.raises(ClientError) as refused:
                await api.reconcile()
            assert refused.value.status == 401
    finally:
        await server.close()
