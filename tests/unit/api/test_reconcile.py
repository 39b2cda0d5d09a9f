"""POST /v1/reconcile and the login trigger (app/api/reconcile.py, docs/contract.md §10) over the
in-memory fleet: 202 then 429 with Retry-After within the interval (shared by every instance over
one store), the slot free again after it, bad requests 400/401/405 that take no slot, a failed
send given back as 503, a first page without cursor (and only that) asking once, the counts in
/metrics, the route in /openapi.json."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from app.api import Deps, create_app
from app.api.http import CONTEXT
from app.api.reconcile import REQUESTS_KEY
from app.api.sources import MemoryProjectionReader
from app.api.tokens import TokenSigner
from app.domain.reconcile import ReconcileRequest, decode_request, encode_request, request_key
from app.metrics import sample
from app.settings import Settings
from app.stores.memory_projection import InMemoryProjectionStore
from tests.support.api import SECRET, T0
from tests.support.clock import ManualClock
from tests.support.rows import flush, mixed_rows

ME, OTHER = 42, 43
INTERVAL_S = 300
SETTINGS = Settings.build(
    api_secret=SECRET,
    api_fill_from_state="never",
    api_rate_limit_per_s=0,
    reconcile_min_interval_s=INTERVAL_S,
)


class Requests:
    """The ReconcileRequests port: what was sent (or a failure to send)."""

    def __init__(self) -> None:
        self.sent: list[ReconcileRequest] = []
        self.failing = False

    async def send(self, request: ReconcileRequest) -> None:
        if self.failing:
            raise ConnectionError("kafka (test) unreachable")
        # What goes on the wire decodes back to the same request, keyed by the user.
        assert decode_request(encode_request(request)) == request
        assert request_key(request.user_id) == str(request.user_id).encode()
        self.sent.append(request)


class Api:
    def __init__(self, clients: list[TestClient[Any, Any]], clock: ManualClock, requests: Requests) -> None:
        self.clients = clients
        self.clock = clock
        self.requests = requests

    def auth(self, user_id: int = ME) -> dict[str, str]:
        return {"Authorization": "Bearer " + TokenSigner(SECRET).mint(user_id, self.clock.now // 1000 + 600)}

    async def post(
        self, user_id: int = ME, instance: int = 0, **kwargs: Any
    ) -> tuple[int, dict[str, Any], Any]:
        async with self.clients[instance].post("/v1/reconcile", headers=self.auth(user_id), **kwargs) as resp:
            return resp.status, await resp.json(), resp.headers

    async def drain(self) -> None:
        for client in self.clients:
            reconciler = client.app[CONTEXT].reconciler
            assert reconciler is not None
            await reconciler.drain()


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    store = InMemoryProjectionStore()
    await store.write([flush(ME, mixed_rows(ME, 30), version=10, structure_version=1)])
    clock = ManualClock(T0)
    requests = Requests()
    clients = []
    for _ in range(2):  # two instances over one store: one fleet
        deps = Deps(projections=MemoryProjectionReader(store), clock_ms=clock, extra={REQUESTS_KEY: requests})
        client = TestClient(TestServer(create_app(SETTINGS, deps)))
        await client.start_server()
        clients.append(client)
    try:
        yield Api(clients, clock, requests)
    finally:
        for client in clients:
            await client.close()


async def test_post_is_accepted_then_refused_with_retry_after_until_the_interval_passed(api: Api) -> None:
    status, body, _ = await api.post()
    assert status == 202
    assert body == {"accepted": True, "user_id": str(ME), "min_interval_s": INTERVAL_S}
    assert api.requests.sent == [ReconcileRequest(ME, T0, "request")]
    api.clock.now += 10_000
    status, body, headers = await api.post(instance=1)  # another instance: the same slot
    assert status == 429
    assert body["error"]["code"] == "reconcile_too_soon"
    assert headers["Retry-After"] == str(INTERVAL_S - 10)
    assert len(api.requests.sent) == 1
    status, _, _ = await api.post(OTHER)  # another user: its own slot
    assert status == 202
    api.clock.now += INTERVAL_S * 1000 - 10_000
    status, _, _ = await api.post()
    assert status == 202
    assert [r.user_id for r in api.requests.sent] == [ME, OTHER, ME]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"data": b"not json"}, "body must be empty"),
        ({"json": {"user_id": 1}}, "no parameters"),
        ({"json": []}, "no parameters"),
        ({"params": {"user_id": "1"}}, "unknown query parameter"),
    ],
)
async def test_a_bad_request_is_a_clear_400_and_takes_no_slot(
    api: Api, kwargs: dict[str, Any], message: str
) -> None:
    status, body, _ = await api.post(**kwargs)
    assert status == 400
    assert body["error"]["code"] == "bad_request" and message in body["error"]["message"]
    assert api.requests.sent == []
    status, _, _ = await api.post(json={})  # {} is fine
    assert status == 202


async def test_no_token_is_401_and_another_method_is_405(api: Api) -> None:
    async with api.clients[0].post("/v1/reconcile") as resp:
        assert resp.status == 401
    async with api.clients[0].get("/v1/reconcile", headers=api.auth()) as resp:
        assert resp.status == 405
        assert (await resp.json())["error"]["code"] == "method_not_allowed"
    assert api.requests.sent == []


async def test_a_failed_send_is_503_and_gives_the_slot_back(api: Api) -> None:
    api.requests.failing = True
    status, body, headers = await api.post()
    assert status == 503 and headers["Retry-After"]
    assert body["error"]["code"] == "unavailable"
    api.requests.failing = False
    status, _, _ = await api.post()
    assert status == 202


async def test_a_first_page_without_cursor_is_a_login_asking_once_per_interval(api: Api) -> None:
    client = api.clients[0]
    async with client.get("/v1/sessions", params={"limit": "5"}, headers=api.auth()) as resp:
        assert resp.status == 200
        cursor = (await resp.json())["next_cursor"]
    await api.drain()
    assert api.requests.sent == [ReconcileRequest(ME, T0, "login")]
    # The rest of the walk is no login; a flood of first pages within the interval asks nothing.
    async with client.get("/v1/sessions", params={"cursor": cursor}, headers=api.auth()) as resp:
        assert resp.status == 200
    for instance in (0, 1, 0, 1):
        async with api.clients[instance].get("/v1/sessions", headers=api.auth()) as resp:
            assert resp.status == 200
    await api.drain()
    assert len(api.requests.sent) == 1
    status, _, headers = await api.post()  # the login took the slot
    assert status == 429 and int(headers["Retry-After"]) == INTERVAL_S
    async with client.get("/metrics") as resp:
        text = await resp.text()
    name = "projector_api_reconcile_requests_total"
    assert sample(text, name, [("trigger", "login"), ("outcome", "accepted")]) == 1
    assert sample(text, name, [("trigger", "login"), ("outcome", "limited")]) == 2  # this instance's
    assert sample(text, name, [("trigger", "request"), ("outcome", "limited")]) == 1


async def test_a_login_goes_on_when_the_request_cannot_be_sent(api: Api) -> None:
    api.requests.failing = True
    async with api.clients[0].get("/v1/sessions", headers=api.auth()) as resp:
        assert resp.status == 200  # never failed nor delayed by its reconcile
    await api.drain()
    async with api.clients[0].get("/metrics") as resp:
        text = await resp.text()
    assert (
        sample(text, "projector_api_reconcile_requests_total", [("trigger", "login"), ("outcome", "failed")])
        == 1
    )


async def test_no_request_topic_answers_503_and_logins_ask_nothing() -> None:
    store = InMemoryProjectionStore()
    clock = ManualClock(T0)
    client = TestClient(
        TestServer(create_app(SETTINGS, Deps(projections=MemoryProjectionReader(store), clock_ms=clock)))
    )
    await client.start_server()
    try:
        headers = {"Authorization": "Bearer " + TokenSigner(SECRET).mint(ME, T0 // 1000 + 600)}
        async with client.get("/v1/sessions", headers=headers) as resp:
            assert resp.status == 200
        async with client.post("/v1/reconcile", headers=headers) as resp:
            assert resp.status == 503 and resp.headers["Retry-After"]
    finally:
        await client.close()


async def test_the_route_is_described(api: Api) -> None:
    async with api.clients[0].get("/openapi.json") as resp:
        doc = orjson.loads(await resp.read())
    op = doc["paths"]["/v1/reconcile"]["post"]
    assert op["operationId"] == "reconcile"
    assert {"202", "400", "401", "429", "503"} <= set(op["responses"])
    assert "Retry-After" in op["responses"]["429"]["headers"]
    assert "ReconcileAccepted" in doc["components"]["schemas"]


async def test_a_login_after_a_projection_epoch_bump_is_reconciled_again_in_the_interval(api: Api) -> None:
    from app.api.fleet import memory_fleet
    from app.api.reconcile import EPOCH_REFRESH_MS

    client = api.clients[0]
    async with client.get("/v1/sessions", headers=api.auth()) as resp:
        assert resp.status == 200
    await api.drain()
    assert api.requests.sent == [ReconcileRequest(ME, T0, "login")]
    # A retention overrun bumps the epoch (the worker's side: app/stores/redis_epoch.py).
    reader = client.app[CONTEXT].deps.projections
    assert isinstance(reader, MemoryProjectionReader)
    memory_fleet(reader.store).epoch = 1
    api.clock.now += EPOCH_REFRESH_MS  # the instance reads the epoch again
    async with client.get("/v1/sessions", headers=api.auth()) as resp:
        assert resp.status == 200
    await api.drain()
    later = T0 + EPOCH_REFRESH_MS
    assert api.requests.sent[1:] == [ReconcileRequest(ME, later, "epoch")]
    # Once per epoch: the next login within the interval asks nothing.
    async with client.get("/v1/sessions", headers=api.auth()) as resp:
        assert resp.status == 200
    await api.drain()
    assert len(api.requests.sent) == 2
    async with client.get("/metrics") as resp:
        text = await resp.text()
    name = "projector_api_reconcile_requests_total"
    assert sample(text, name, [("trigger", "epoch"), ("outcome", "accepted")]) == 1
    assert sample(text, name, [("trigger", "login"), ("outcome", "limited")]) == 1
