"""The API's health endpoints, Retry-After on every 503, and its request metrics (issue 15).

/livez and /readyz answer without a token; ready means every backing store answers (the
projection store through the pages' own reader, plus the checks `Deps.readiness` adds).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from app.api import Deps, create_app
from app.api.health import RETRY_AFTER_S, cassandra_check
from app.api.sources import MemoryProjectionReader
from app.api.tokens import TokenSigner
from app.build import build_info
from app.metrics import API_METRICS, PROCESS_METRICS, names, sample
from app.stores.memory_projection import InMemoryProjectionStore
from app.stores.redis_projection import ProjectionStoreError
from tests.support.api import ME, SECRET, SETTINGS, T0
from tests.support.clock import ManualClock


class Switch:
    """A projection reader (or a readiness check) that is up or down on demand."""

    def __init__(self) -> None:
        self.up = True
        self.hang = False
        self.inner = MemoryProjectionReader(InMemoryProjectionStore())
        self.fleet = self.inner.fleet

    async def _gate(self) -> None:
        if self.hang:
            await asyncio.Event().wait()  # never set: the check's timeout must end it
        if not self.up:
            raise ProjectionStoreError("redis at 10.1.2.3:6379: connection refused")

    async def load_rows(self, user_id: int) -> Any:
        await self._gate()
        return await self.inner.load_rows(user_id)

    async def meta(self, user_id: int) -> Any:
        await self._gate()
        return await self.inner.meta(user_id)

    async def some_rows(self, user_id: int, conversation_ids: list[str]) -> Any:
        await self._gate()
        return await self.inner.some_rows(user_id, conversation_ids)

    async def check(self) -> None:
        await self._gate()


class Client:
    def __init__(self, client: TestClient[Any, Any]) -> None:
        self.client = client

    async def get(
        self, path: str, auth: bool = False, method: str = "GET", json: Any = None
    ) -> tuple[int, Any, dict[str, str]]:
        headers = {}
        if auth:
            headers["Authorization"] = "Bearer " + TokenSigner(SECRET).mint(ME, T0 // 1000 + 600)
        async with self.client.request(method, path, headers=headers, json=json) as resp:
            body = await resp.json() if resp.content_type == "application/json" else await resp.text()
            return resp.status, body, dict(resp.headers)


@pytest.fixture
async def store() -> Switch:
    return Switch()


@pytest.fixture
async def cassandra() -> Switch:
    return Switch()


@pytest.fixture
async def http(store: Switch, cassandra: Switch) -> AsyncIterator[Client]:
    deps = Deps(projections=store, clock_ms=ManualClock(T0), readiness={"cassandra": cassandra.check})
    async with TestClient(TestServer(create_app(SETTINGS, deps))) as client:
        yield Client(client)


async def test_livez_and_readyz_need_no_token(http: Client) -> None:
    assert (await http.get("/livez"))[:2] == (200, {"status": "live"})
    status, body, _ = await http.get("/readyz")
    assert status == 200
    assert body == {"status": "ready", "checks": {"projection_store": "ok", "cassandra": "ok"}}


async def test_readyz_is_503_with_retry_after_naming_the_store_that_is_down(
    http: Client, store: Switch, cassandra: Switch
) -> None:
    cassandra.up = False
    status, body, headers = await http.get("/readyz")
    assert status == 503 and headers["Retry-After"] == str(RETRY_AFTER_S)
    assert body["checks"] == {"projection_store": "ok", "cassandra": "unavailable"}
    assert body["error"]["code"] == "not_ready" and "cassandra" in body["error"]["message"]
    assert "10.1.2.3" not in str(body)  # the reason goes to the log, not to an anonymous caller
    cassandra.up, store.up = True, False
    status, body, _ = await http.get("/readyz")
    assert status == 503 and body["checks"]["projection_store"] == "unavailable"
    # Liveness does not depend on the stores: the process still serves.
    assert (await http.get("/livez"))[0] == 200
    store.up = True
    assert (await http.get("/readyz"))[0] == 200


async def test_a_check_that_hangs_is_a_timeout_not_a_hung_probe(
    http: Client, cassandra: Switch, monkeypatch: pytest.MonkeyPatch
) -> None:
    import app.api.health as health

    monkeypatch.setattr(health, "CHECK_TIMEOUT_S", 0.05)
    cassandra.hang = True
    status, body, headers = await http.get("/readyz")
    assert status == 503 and body["checks"]["cassandra"] == "timeout" and "Retry-After" in headers


async def test_every_503_carries_retry_after(http: Client, store: Switch) -> None:
    store.up = False
    for path in ("/v1/sessions", "/v1/badge"):
        status, body, headers = await http.get(path, auth=True)
        assert status == 503 and body["error"]["code"] == "unavailable"
        assert headers["Retry-After"] == str(RETRY_AFTER_S), path
    # No member service configured: that 503 too.
    group = {"chat_session_uid": "7d444840-9dc0-11d1-b245-5ffdce74fad2"}
    status, _, headers = await http.get("/api/v1/chats/members/page", auth=True, method="POST", json=group)
    assert status == 503 and headers["Retry-After"] == str(RETRY_AFTER_S)
    # Other errors do not.
    status, _, headers = await http.get("/v1/badge")
    assert status == 401 and "Retry-After" not in headers


async def test_health_routes_are_in_the_description_without_security(http: Client) -> None:
    _, doc, _ = await http.get("/openapi.json")
    for path in ("/livez", "/readyz"):
        assert doc["paths"][path]["get"]["security"] == []
    ready = doc["paths"]["/readyz"]["get"]["responses"]
    assert "Retry-After" in ready["503"]["headers"]
    assert "Retry-After" in doc["components"]["responses"]["Unavailable"]["headers"]


async def test_requests_are_counted_by_route_template_method_and_code(http: Client, store: Switch) -> None:
    await http.get("/v1/badge", auth=True)
    await http.get("/v1/badge")  # 401
    await http.get("/v1/no/such/path/12345", auth=True)  # 404: the raw path never becomes a label
    await http.get("/v1/badge", method="BREW")  # an unknown method is "other"
    store.up = False
    await http.get("/v1/sessions", auth=True)  # 503
    _, text, _ = await http.get("/metrics")
    assert set(API_METRICS) | set(PROCESS_METRICS) <= names(text)

    def count(route: str, method: str, code: str) -> float:
        labels = [("route", route), ("method", method), ("code", code)]
        return sample(text, "projector_api_requests_total", labels)

    assert count("/v1/badge", "GET", "200") == 1
    assert count("/v1/badge", "GET", "401") == 1
    assert count("unmatched", "GET", "404") == 1
    assert count("/v1/sessions", "GET", "503") == 1
    assert "12345" not in text and "BREW" not in text
    assert sample(text, "projector_api_request_duration_seconds_count", [("route", "/v1/badge")]) >= 2
    version = sample(text, "projector_build_info", [("compiled", build_info().labels()["compiled"])])
    assert version == 1


async def test_the_cassandra_check_runs_the_query_with_a_timeout() -> None:
    calls: list[tuple[str, float]] = []

    class Session:
        def execute(self, query: str, timeout: float) -> list[Any]:
            calls.append((query, timeout))
            return []

    await cassandra_check(Session())()
    assert calls == [("SELECT release_version FROM system.local", 2.0)]
