"""Issue 18, security hardening of the query API: secret rotation, request size limits (413 /
431), the per-user rate limit (429 + Retry-After), and what the access log keeps."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import pytest
from aiohttp.test_utils import TestClient, TestServer

from app.api import Deps, create_app
from app.api.cursor import Cursor, CursorCodec, CursorError
from app.api.fleet import MemorySnapshots
from app.api.guard import RateLimiter, RedactedAccessLogger, runner_args
from app.api.sources import MemoryProjectionReader
from app.api.tokens import TokenError, TokenSigner
from app.domain.listing import Folder, Position, Zone
from app.settings import Settings, SettingsError
from app.stores.memory_projection import InMemoryProjectionStore
from app.stores.redis_projection import ProjectionStoreError
from tests.support.api import SECRET, T0
from tests.support.clock import ManualClock
from tests.support.rows import flush, mixed_rows

OLD = "old-secret-" + "o" * 32
NEW = "new-secret-" + "n" * 32
ME = 42


# --------------------------------------------------------------------------- rotation


def test_a_token_signed_with_the_previous_secret_is_accepted_until_it_is_removed() -> None:
    old_token = TokenSigner(OLD).mint(ME, 2_000_000_000)
    rotating = TokenSigner(NEW, previous=OLD)
    assert rotating.verify(old_token, 1_000) == ME
    new_token = rotating.mint(ME, 2_000_000_000)
    assert TokenSigner(NEW).verify(new_token, 1_000) == ME  # minted with the new secret only
    with pytest.raises(TokenError):
        TokenSigner(OLD).verify(new_token, 1_000)
    with pytest.raises(TokenError, match="signature"):
        TokenSigner(NEW).verify(old_token, 1_000)  # the previous secret removed: refused
    # The purpose still separates keys under rotation: an old bearer token is no ticket.
    with pytest.raises(TokenError):
        TokenSigner(NEW, "stream-ticket", previous=OLD).verify(old_token, 1_000)


def test_a_cursor_signed_with_the_previous_secret_still_pages() -> None:
    cursor = Cursor(
        revision=3,
        user_id=ME,
        folder=Folder.MAIN,
        position=Position.checked(Zone.NORMAL, 0, None, b"\x01" * 16),
        snapshot_id=1,
    )
    text = CursorCodec(OLD).encode(cursor)
    assert CursorCodec(NEW, previous=OLD).decode(text, ME, Folder.MAIN).revision == 3
    with pytest.raises(CursorError, match="signature"):
        CursorCodec(NEW).decode(text, ME, Folder.MAIN)


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"PROJECTOR_API_SECRET_PREVIOUS": OLD}, "set without PROJECTOR_API_SECRET"),
        ({"PROJECTOR_API_SECRET": NEW, "PROJECTOR_API_SECRET_PREVIOUS": "short"}, "use at least 32"),
        ({"PROJECTOR_API_SECRET": NEW, "PROJECTOR_API_SECRET_PREVIOUS": NEW}, "nothing is being rotated"),
        ({"PROJECTOR_API_MAX_BODY_BYTES": "10"}, "PROJECTOR_API_MAX_BODY_BYTES"),
        ({"PROJECTOR_API_MAX_HEADER_BYTES": "10"}, "PROJECTOR_API_MAX_HEADER_BYTES"),
        ({"PROJECTOR_API_RATE_LIMIT_PER_S": "-1"}, "PROJECTOR_API_RATE_LIMIT_PER_S"),
        ({"PROJECTOR_API_RATE_LIMIT_BURST": "0"}, "PROJECTOR_API_RATE_LIMIT_BURST"),
    ],
)
def test_bad_hardening_settings_are_refused(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(SettingsError, match=fragment) as caught:
        Settings.from_env(env)
    assert OLD not in str(caught.value) and NEW not in str(caught.value)


def test_the_previous_secret_never_shows_in_repr() -> None:
    assert OLD not in repr(Settings.build(api_secret=NEW, api_secret_previous=OLD))


# --------------------------------------------------------------------------- over HTTP


class Served:
    def __init__(self, client: TestClient[Any, Any], clock: ManualClock) -> None:
        self.client = client
        self.clock = clock

    def auth(self, user_id: int = ME, secret: str = SECRET) -> dict[str, str]:
        return {"Authorization": "Bearer " + TokenSigner(secret).mint(user_id, self.clock.now // 1000 + 600)}


async def serve(settings: Settings) -> AsyncIterator[Served]:
    store = InMemoryProjectionStore()
    await store.write([flush(ME, mixed_rows(ME, 30), version=10, structure_version=1)])
    clock = ManualClock(T0)
    app = create_app(settings, Deps(projections=MemoryProjectionReader(store), clock_ms=clock))
    client = TestClient(TestServer(app, **runner_args(settings.api)))
    await client.start_server()
    try:
        yield Served(client, clock)
    finally:
        await client.close()


@pytest.fixture
async def limited() -> AsyncIterator[Served]:
    settings = Settings.build(
        api_secret=SECRET,
        api_fill_from_state="never",
        api_rate_limit_per_s=2,
        api_rate_limit_burst=3,
        api_max_header_bytes=4096,
        api_max_body_bytes=2048,
    )
    async for served in serve(settings):
        yield served


@pytest.fixture
async def rotating() -> AsyncIterator[Served]:
    settings = Settings.build(api_secret=NEW, api_secret_previous=SECRET, api_fill_from_state="never")
    async for served in serve(settings):
        yield served


async def test_the_api_accepts_both_secrets_while_rotating(rotating: Served) -> None:
    client = rotating.client
    for secret in (SECRET, NEW):
        async with client.get("/v1/badge", headers=rotating.auth(secret=secret)) as resp:
            assert resp.status == 200, await resp.text()
    async with client.get("/v1/badge", headers=rotating.auth(secret="x" * 40)) as resp:
        assert resp.status == 401
    # A walk begun before the rotation (a cursor of the old secret) goes on.
    old_cursor = CursorCodec(SECRET).encode(
        Cursor(
            revision=1,
            user_id=ME,
            folder=Folder.MAIN,
            position=Position.checked(Zone.NORMAL, 0, None, b"\0" * 16),
            snapshot_id=1,
        )
    )
    async with client.get("/v1/sessions", params={"cursor": old_cursor}, headers=rotating.auth()) as resp:
        assert resp.status == 200, await resp.text()


async def test_over_the_burst_a_user_gets_429_with_retry_after_and_others_do_not(limited: Served) -> None:
    client = limited.client
    statuses = []
    for _ in range(5):
        async with client.get("/v1/badge", headers=limited.auth()) as resp:
            statuses.append(resp.status)
            if resp.status == 429:
                body = await resp.json()
                assert body["error"]["code"] == "rate_limited"
                assert int(resp.headers["Retry-After"]) >= 1
    assert statuses == [200, 200, 200, 429, 429]
    async with client.get("/v1/badge", headers=limited.auth(ME + 1)) as resp:
        assert resp.status == 200  # the bucket is the user's, not the process's
    async with client.get("/livez") as resp:
        assert resp.status == 200  # public routes are not limited
    limited.clock.now += 1_000  # 2 tokens a second
    for want in (200, 200, 429):
        async with client.get("/v1/badge", headers=limited.auth()) as resp:
            assert resp.status == want


async def test_oversized_headers_are_431_and_bodies_413_with_a_clear_error(limited: Served) -> None:
    client = limited.client
    headers = {**limited.auth(), "X-Padding": "p" * 5000}
    async with client.get("/v1/badge", headers=headers) as resp:
        assert resp.status == 431
        assert (await resp.json())["error"]["code"] == "headers_too_large"
    many = {**limited.auth(), **{f"X-H{i}": "v" * 60 for i in range(80)}}
    async with client.get("/v1/badge", headers=many) as resp:
        assert resp.status == 431  # the total counts, not only one line
    body = b'{"chat_session_uid": "' + b"0" * 4000 + b'"}'
    async with client.post("/api/v1/chats/members/page", data=body, headers=limited.auth()) as resp:
        assert resp.status == 413
        assert "2048" in (await resp.json())["error"]["message"]
    async with client.get("/openapi.json") as resp:
        description = await resp.json()
    responses = description["paths"]["/v1/badge"]["get"]["responses"]
    assert {"413", "429", "431"} <= set(responses)
    assert "429" not in description["paths"]["/livez"]["get"]["responses"]


def test_the_bucket_refills_at_the_rate_and_is_bounded_by_the_burst() -> None:
    now = [T0]
    limiter = RateLimiter(rate=10, burst=5, clock_ms=lambda: now[0])
    assert [limiter.take(1) for _ in range(5)] == [0.0] * 5
    assert limiter.take(1) == pytest.approx(0.1)
    now[0] += 60_000  # a long pause fills the bucket to the burst, no more
    assert sum(limiter.take(1) == 0 for _ in range(8)) == 5


def test_the_access_log_keeps_no_query_and_no_header(caplog: pytest.LogCaptureFixture) -> None:
    class Request:
        method = "GET"
        path = "/v1/stream"
        path_qs = "/v1/stream?access_token=v1.secret-ticket.mac"
        remote = "127.0.0.1"
        headers: ClassVar[dict[str, str]] = {"Authorization": "Bearer v1.secret-token.mac"}

    class Response:
        status = 200
        body_length = 10

    logger = logging.getLogger("test.access")
    with caplog.at_level(logging.INFO, logger="test.access"):
        RedactedAccessLogger(logger, "").log(Request(), Response(), 0.01)  # type: ignore[arg-type]
    text = caplog.text + repr([r.__dict__ for r in caplog.records])
    assert "/v1/stream" in text and "200" in text
    assert "secret-ticket" not in text and "secret-token" not in text


class _DownFleet:
    """A fleet state whose store does not answer the rate check."""

    snapshots = MemorySnapshots()

    async def take_token(self, user_id: int, burst: float, per_s: float, now_ms: int) -> int:
        raise ProjectionStoreError("projection store (test) unreachable during rate limit")

    async def claim_reconcile(
        self, user_id: int, token: str, interval_ms: int, now_ms: int, epoch: int = 0
    ) -> int:
        raise ProjectionStoreError("projection store (test) unreachable during reconcile claim")

    async def release_reconcile(self, user_id: int, token: str, epoch: int = 0) -> None:
        raise ProjectionStoreError("projection store (test) unreachable during reconcile release")

    async def projection_epoch(self) -> int:
        raise ProjectionStoreError("projection store (test) unreachable during epoch read")


@pytest.mark.parametrize(("mode", "want"), [("open", 200), ("closed", 503)])
async def test_a_store_outage_fails_the_rate_check_open_or_closed_and_counts_it(mode: str, want: int) -> None:
    settings = Settings.build(
        api_secret=SECRET,
        api_fill_from_state="never",
        api_rate_limit_per_s=2,
        api_rate_limit_burst=3,
        api_rate_limit_on_store_error=mode,
    )
    store = InMemoryProjectionStore()
    await store.write([flush(ME, mixed_rows(ME, 3), version=10, structure_version=1)])
    reader = MemoryProjectionReader(store)
    reader.fleet = _DownFleet()
    clock = ManualClock(T0)
    client = TestClient(TestServer(create_app(settings, Deps(projections=reader, clock_ms=clock))))
    await client.start_server()
    try:
        served = Served(client, clock)
        for _ in range(5):  # more than the burst: the bucket is not consulted at all
            async with client.get("/v1/badge", headers=served.auth()) as resp:
                assert resp.status == want, await resp.text()
                if want == 503:
                    assert (
                        resp.headers["Retry-After"] and (await resp.json())["error"]["code"] == "unavailable"
                    )
        async with client.get("/metrics") as resp:
            assert "projector_api_rate_limit_store_errors_total 5.0" in await resp.text()
    finally:
        await client.close()


async def test_apps_over_one_store_share_the_bucket() -> None:
    """The in-memory fleet state is the store's, as Redis is every instance's."""
    settings = Settings.build(
        api_secret=SECRET, api_fill_from_state="never", api_rate_limit_per_s=2, api_rate_limit_burst=3
    )
    store = InMemoryProjectionStore()
    await store.write([flush(ME, mixed_rows(ME, 3), version=10, structure_version=1)])
    clock = ManualClock(T0)
    clients = [
        TestClient(
            TestServer(create_app(settings, Deps(projections=MemoryProjectionReader(store), clock_ms=clock)))
        )
        for _ in range(2)
    ]
    for client in clients:
        await client.start_server()
    try:
        statuses = []
        for n in range(6):
            async with clients[n % 2].get("/v1/badge", headers=Served(clients[0], clock).auth()) as resp:
                statuses.append(resp.status)
        assert statuses == [200, 200, 200, 429, 429, 429]
    finally:
        for client in clients:
            await client.close()
