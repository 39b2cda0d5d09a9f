"""GET /v1/stream over HTTP (aiohttp TestServer, in-memory projection store, frames published to the
hub as the Kafka adapter would): auth and tickets, hello, frames, resume, slow clients, heartbeats,
shutdown; the SDK's LiveStream over it; the browser client's files."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestServer

from app.api import Deps, create_app
from app.api.sources import MemoryProjectionReader
from app.api.stream import STREAM_KEY, TICKET_PURPOSE
from app.api.tokens import TokenSigner
from app.domain.badge import Badge
from app.gateway.hub import FrameHub
from app.gateway.service import Gateway
from app.sdk import LiveSessionList, SessionsClient
from app.sdk.sse import SseEvent, SseParser
from app.sdk.stream import LiveStream
from app.settings import Settings
from app.stores.memory_projection import InMemoryProjectionStore
from tests.support.api import SECRET
from tests.support.rows import cid, flush, make_row

ME = 11982011376358104761  # JS-unsafe: every id on the wire must be its exact decimal string
SETTINGS = Settings.build(api_secret=SECRET, api_fill_from_state="never", api_snapshot_cache_rows=5000)
NOW_S = 1_800_000_000


@dataclass
class Served:
    url: str
    store: InMemoryProjectionStore
    hub: FrameHub
    gateway: Gateway
    server: TestServer
    versions: dict[int, int]

    def token(self, user_id: int = ME, purpose: str = "token") -> str:
        return TokenSigner(SECRET, purpose).mint(user_id, NOW_S + 600)

    def auth(self, user_id: int = ME) -> dict[str, str]:
        return {"Authorization": "Bearer " + self.token(user_id)}

    async def flush(
        self, user_id: int, rows: list[dict[str, Any]], structure: int = 1, unread: int = 0
    ) -> int:
        """What a worker flush does: the store first, then the frames (here: to the hub)."""
        prev = self.versions.get(user_id, 0)
        version = prev + 1
        self.versions[user_id] = version
        batch = flush(user_id, [{**r, "projection_mailbox_seq": version} for r in rows], version, structure)
        batch = dataclasses.replace(batch, badge=Badge(unread, 0, 0), prev_projection_mailbox_seq=prev)
        await self.store.write([batch])
        self.hub.publish(batch.session_delta())
        self.hub.publish(batch.badge_update())
        return version


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    store = InMemoryProjectionStore()
    hub = FrameHub(buffer_bytes=64 * 1024, resume_frames=16)
    gateway = Gateway(hub, heartbeat_s=0.2, partition_of=lambda user: user % 4, partitions=None)
    deps = Deps(
        projections=MemoryProjectionReader(store), clock_ms=lambda: NOW_S * 1000, extra={STREAM_KEY: gateway}
    )
    server = TestServer(create_app(SETTINGS, deps), host="127.0.0.1")
    await server.start_server()
    gateway.start()
    try:
        yield Served(str(server.make_url("")), store, hub, gateway, server, {})
    finally:
        await gateway.stop()
        await server.close()


class Stream:
    """A raw SSE reader over aiohttp (what a test needs to see event by event)."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response
        self.parser = SseParser()
        self.pending: list[SseEvent] = []

    async def next(self, skip_heartbeats: bool = True) -> SseEvent | None:
        while True:
            while self.pending:
                event = self.pending.pop(0)
                if not (skip_heartbeats and event.event == "heartbeat"):
                    return event
            chunk = await asyncio.wait_for(self.response.content.readany(), timeout=30)
            if not chunk:
                return None
            self.pending.extend(self.parser.feed(chunk))


async def open_stream(
    http: aiohttp.ClientSession, served: Served, headers: dict[str, str] | None = None, **params: str
) -> Stream:
    headers = served.auth() if headers is None else headers
    response = await http.get(served.url + "/v1/stream", headers=headers, params=params)
    assert response.status == 200, await response.text()
    assert response.headers["Content-Type"].startswith("text/event-stream")
    return Stream(response)


def body(event: SseEvent | None) -> dict[str, Any]:
    assert event is not None
    data: dict[str, Any] = orjson.loads(event.data)
    return data


# -- authentication -------------------------------------------------------------------------------


async def test_credentials(served: Served) -> None:
    ticket = served.token(purpose=TICKET_PURPOSE)
    async with aiohttp.ClientSession() as http:
        for headers, params, status in [
            ({}, {}, 401),
            ({"Authorization": "Bearer v1.nope.nope"}, {}, 401),
            ({"Authorization": "Bearer " + ticket}, {}, 401),  # a ticket is no bearer token
            ({}, {"access_token": served.token()}, 401),  # nor a bearer token a ticket
            # Both credentials: they must name the same user (one identity per stream).
            (served.auth(ME + 1), {"access_token": ticket}, 401),
            (served.auth(), {"access_token": "v1.nope.nope"}, 401),
            (served.auth(), {"last_event_id": "-1"}, 400),
            ({**served.auth(), "Last-Event-ID": "x"}, {}, 400),
            # A bad parameter is refused even beside a valid header that would win (API fuzz).
            ({**served.auth(), "Last-Event-ID": "2"}, {"last_event_id": "\u0080x"}, 400),
            (served.auth(), {"nope": "1"}, 400),
        ]:
            async with http.get(served.url + "/v1/stream", headers=headers, params=params) as resp:
                assert resp.status == status, (headers, params, await resp.text())
        async with http.get(
            served.url + "/v1/sessions", headers={"Authorization": "Bearer " + ticket}
        ) as resp:
            assert resp.status == 401  # a ticket opens streams only
        # The browser's way: a ticket (bearer-authenticated POST), then ?access_token=.
        async with http.post(served.url + "/v1/stream/ticket", headers=served.auth()) as resp:
            assert resp.status == 200 and resp.headers["Cache-Control"] == "no-store"
            got = await resp.json()
        assert got["user_id"] == "11982011376358104761" and got["expires_in"] == 60
        stream = await open_stream(http, served, headers={}, access_token=got["ticket"])
        hello = body(await stream.next())
        assert hello["user_id"] == "11982011376358104761"
        stream.response.close()
        # A header and a ticket of the same user: the stream opens (the description's two
        # security alternatives may both be sent).
        stream = await open_stream(http, served, headers=served.auth(), access_token=got["ticket"])
        assert body(await stream.next())["user_id"] == "11982011376358104761"
        stream.response.close()


async def test_a_user_of_a_partition_this_instance_does_not_read_is_misdirected(served: Served) -> None:
    served.gateway.partitions = frozenset({ME % 4})
    async with aiohttp.ClientSession() as http:
        async with http.get(served.url + "/v1/stream", headers=served.auth(ME + 1)) as resp:
            assert resp.status == 421
            assert f"partition {(ME + 1) % 4}" in (await resp.json())["error"]["message"]
        stream = await open_stream(http, served)
        assert (await stream.next()) is not None
        stream.response.close()


async def test_streams_beyond_the_bound_are_503_with_retry_after(served: Served) -> None:
    served.hub.max_connections = 1
    async with aiohttp.ClientSession() as http:
        first = await open_stream(http, served)
        await first.next()
        async with http.get(served.url + "/v1/stream", headers=served.auth(7)) as resp:
            assert resp.status == 503 and resp.headers["Retry-After"] == "5"
        first.response.close()


async def test_without_a_gateway_the_stream_is_503_and_the_description_names_it() -> None:
    app = create_app(SETTINGS, Deps(projections=MemoryProjectionReader(InMemoryProjectionStore())))
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as http:
            auth = {"Authorization": "Bearer " + TokenSigner(SECRET).mint(ME, 2**40)}
            async with http.get(str(server.make_url("/v1/stream")), headers=auth) as resp:
                assert resp.status == 503
            async with http.get(str(server.make_url("/openapi.json"))) as resp:
                doc = await resp.json()
    finally:
        await server.close()
    op = doc["paths"]["/v1/stream"]["get"]
    assert "text/event-stream" in op["responses"]["200"]["content"]
    assert {"streamTicket": []} in op["security"]
    assert "/v1/stream/ticket" in doc["paths"]


# -- the stream ----------------------------------------------------------------------------------


async def test_hello_then_the_users_frames_in_order_then_heartbeats(served: Served) -> None:
    await served.flush(ME, [make_row(ME, 1, act=1)], unread=2)
    async with aiohttp.ClientSession() as http:
        stream = await open_stream(http, served)
        hello = await stream.next()
        assert hello is not None and hello.event == "hello" and hello.last_event_id == "1"
        assert body(hello)["status"] == "fresh" and body(hello)["projection_mailbox_seq"] == 1
        assert body(hello)["badge"] == {
            "total_unread": 2,
            "total_mention": 0,
            "muted_unread": 0,
            "archived_unread": 0,
            "archived_mention": 0,
            "badge_mode": "messages",
            "include_muted": False,
            "projection_mailbox_seq": 1,
        }
        await served.flush(7, [make_row(7, 9, act=1)])  # someone else's: never on this stream
        await served.flush(ME, [make_row(ME, 1, act=2, unread=1)], unread=1)
        served.hub.publish(
            {
                "type": "MEMBER_NOTICE",
                "user_id": ME,
                "conversation_id": cid(1),
                "kind": 24,
                "conversation_seq": 5,
                "projection_mailbox_seq": 2,
            }
        )
        delta, badge, notice = await stream.next(), await stream.next(), await stream.next()
        assert delta is not None and (delta.event, delta.last_event_id) == ("SESSION_DELTA", "2")
        assert body(delta)["prev_projection_mailbox_seq"] == 1
        assert body(delta)["conversations"][0]["user_id"] == "11982011376358104761"
        assert badge is not None and badge.event == "BADGE_UPDATE" and body(badge)["total_unread"] == 1
        assert notice is not None and notice.event == "MEMBER_NOTICE" and body(notice)["kind"] == 24
        beat = await stream.next(skip_heartbeats=False)  # nothing else to say: a heartbeat
        assert beat is not None and beat.event == "heartbeat"
        stream.response.close()


async def test_reconnecting_with_last_event_id_replays_what_was_missed(served: Served) -> None:
    await served.flush(ME, [make_row(ME, 1, act=1)])
    async with aiohttp.ClientSession() as http:
        stream = await open_stream(http, served)
        await stream.next()
        await served.flush(ME, [make_row(ME, 1, act=2)])
        assert (await stream.next()) is not None
        stream.response.close()
        await asyncio.sleep(0)
        await served.flush(ME, [make_row(ME, 2, act=3)])  # while away
        await served.flush(ME, [make_row(ME, 3, act=4)])
        again = await open_stream(http, served, headers={**served.auth(), "Last-Event-ID": "2"})
        hello = body(await again.next())
        assert (hello["status"], hello["resumed_from"], hello["replayed"]) == ("resumed", 2, 4)
        replayed = [await again.next() for _ in range(4)]
        assert [(e.event, e.last_event_id) for e in replayed if e is not None] == [
            ("SESSION_DELTA", "3"),
            ("BADGE_UPDATE", "3"),
            ("SESSION_DELTA", "4"),
            ("BADGE_UPDATE", "4"),
        ]
        again.response.close()
        # A version the chain never passed through cannot be resumed: re-pull, never a skip.
        odd = await open_stream(http, served, last_event_id="999")
        assert body(await odd.next())["status"] == "repull"
        odd.response.close()


async def test_a_client_that_cannot_keep_up_gets_repull_and_the_end_of_the_stream(served: Served) -> None:
    rows = [make_row(ME, n, act=n) for n in range(1, 40)]
    await served.flush(ME, rows)
    async with aiohttp.ClientSession() as http:
        stream = await open_stream(http, served)
        await stream.next()
        # Frames arrive faster than the connection writes (nothing awaits in between): its
        # 64 KiB buffer overflows.
        base = served.versions[ME]
        for n in range(40):
            batch = flush(ME, rows, base + n + 1, 1)
            served.hub.publish(
                dataclasses.replace(batch, prev_projection_mailbox_seq=base + n).session_delta()
            )
        events = []
        while (event := await stream.next()) is not None:
            events.append(event)
        assert events[-1].event == "repull" and body(events[-1])["reason"] == "slow"
    assert served.hub.counters.overflows == 1 and served.hub.connections == 0


async def test_shutdown_ends_open_streams_at_once(served: Served) -> None:
    async with aiohttp.ClientSession() as http:
        stream = await open_stream(http, served)
        await stream.next()
        # aiohttp waits up to 60 s for open handlers; the gateway ends its streams first.
        await asyncio.wait_for(served.server.close(), timeout=30)
        assert await stream.next() is None


# -- the SDK ---------------------------------------------------------------------------------------


async def test_the_sdk_live_stream_pulls_applies_frames_notices_and_resumes(served: Served) -> None:
    await served.flush(ME, [make_row(ME, n, act=n) for n in range(1, 6)], unread=3)
    notices: list[Any] = []
    async with SessionsClient(served.url, served.token()) as api:
        live = LiveSessionList(api, ME, limit=2)
        stream = LiveStream(live, on_notice=notices.append, read_timeout_s=10)
        stop = asyncio.Event()
        task = asyncio.create_task(stream.run(stop))
        try:
            await stream.until(lambda: stream.synced, 30)
            assert [r["conversation_id"] for r in live.main()] == [cid(n) for n in range(5, 0, -1)]
            assert live.main()[0]["user_id"] == ME  # back to an int, exactly
            await served.flush(ME, [make_row(ME, 1, act=99, unread=4)], unread=4)
            await stream.until(lambda: live.main()[0]["conversation_id"] == cid(1), 30)
            await stream.until(lambda: live.view.badge is not None and live.view.badge.total_unread == 4, 30)
            served.hub.publish(
                {
                    "type": "MEMBER_NOTICE",
                    "user_id": ME,
                    "conversation_id": cid(2),
                    "kind": 27,
                    "conversation_seq": 8,
                    "projection_mailbox_seq": served.versions[ME],
                }
            )
            await stream.until(lambda: len(notices) == 1, 30)
            assert notices[0]["user_id"] == ME and notices[0]["kind"] == 27
            syncs = live.syncs
            served.hub.close_all()  # the gateway drops every connection (e.g. a deploy)
            await served.flush(ME, [make_row(ME, 3, act=100)], unread=4)
            await stream.until(lambda: stream.stats.hellos.get("resumed", 0) == 1, 30)
            await stream.until(lambda: live.main()[0]["conversation_id"] == cid(3), 30)
            assert live.syncs == syncs  # resumed from the gateway's log: no re-pull
            assert live.view.version == served.versions[ME]
        finally:
            stop.set()
            await task


# -- the browser client's files --------------------------------------------------------------------


async def test_the_browser_client_is_served_with_a_strict_policy(served: Served) -> None:
    async with aiohttp.ClientSession() as http:
        for path, kind in (("/app/", "text/html"), ("/app/app.js", "text/javascript")):
            async with http.get(served.url + path) as resp:
                assert resp.status == 200 and resp.content_type == kind
                assert "script-src 'self'" in resp.headers["Content-Security-Policy"]
                assert resp.headers["Referrer-Policy"] == "no-referrer"


async def test_readiness_fails_when_a_part_of_the_live_stream_stopped() -> None:
    hub = FrameHub()
    gateway = Gateway(hub, heartbeat_s=1.0)
    running = {"frame topics": True}
    gateway.parts["frame topics"] = lambda: running["frame topics"]
    deps = Deps(
        projections=MemoryProjectionReader(InMemoryProjectionStore()),
        extra={STREAM_KEY: gateway},
        readiness={"live_stream": gateway.ready},
    )
    server = TestServer(create_app(SETTINGS, deps), host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(str(server.make_url("/readyz"))) as resp:
                assert resp.status == 200
            running["frame topics"] = False  # e.g. the Kafka read loop died
            async with http.get(str(server.make_url("/readyz"))) as resp:
                assert resp.status == 503 and (await resp.json())["checks"]["live_stream"] == "unavailable"
    finally:
        await server.close()


async def test_the_hello_is_a_login_asking_the_owner_for_a_reconcile_once_per_interval() -> None:
    from app.api.http import CONTEXT
    from app.api.reconcile import REQUESTS_KEY
    from app.domain.reconcile import ReconcileRequest

    sent: list[ReconcileRequest] = []

    class Requests:
        async def send(self, request: ReconcileRequest) -> None:
            sent.append(request)

    store = InMemoryProjectionStore()
    hub = FrameHub(buffer_bytes=64 * 1024, resume_frames=16)
    gateway = Gateway(hub, heartbeat_s=0.2, partition_of=lambda user: user % 4, partitions=None)
    deps = Deps(
        projections=MemoryProjectionReader(store),
        clock_ms=lambda: NOW_S * 1000,
        extra={STREAM_KEY: gateway, REQUESTS_KEY: Requests()},
    )
    app = create_app(SETTINGS, deps)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    gateway.start()
    served = Served(str(server.make_url("")), store, hub, gateway, server, {})
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(3):  # three connects (a flapping network): one reconcile asked
                stream = await open_stream(http, served)
                hello = await stream.next()
                assert hello is not None and hello.event == "hello"
                stream.response.close()
        reconciler = app[CONTEXT].reconciler
        assert reconciler is not None
        await reconciler.drain()
        assert sent == [ReconcileRequest(ME, NOW_S * 1000, "stream")]
        assert reconciler.counts[("stream", "limited")] == 2
    finally:
        await gateway.stop()
        await server.close()
