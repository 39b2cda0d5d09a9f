"""``GET /livez`` and ``GET /readyz``: the API's health for load balancers and orchestrators
(no token, like /metrics and /openapi.json; they reveal no user data and no addresses).

* live: the process serves HTTP (restart it when this fails);
* ready: every backing store the API reads answers now (take it out of rotation when this fails):
  the projection store (Redis, through the same reader the pages use: the serving pointer
  included) and whatever ``Deps.readiness`` adds (``projector api``: Cassandra, and the live
  stream's Kafka side when it runs: app/gateway, injected).

Each check has :data:`CHECK_TIMEOUT_S`; a check that fails or times out makes /readyz 503 with
``Retry-After`` and names the check (the reason goes to the log, not to the unauthenticated
caller).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final

from aiohttp import web

from app.api.http import ApiContext, Route, error_body

log = logging.getLogger(__name__)

LIVEZ_PATH: Final = "/livez"
READYZ_PATH: Final = "/readyz"
CHECK_TIMEOUT_S: Final = 2.0
# Seconds a client (or a load balancer) is told to wait after any 503 of the API.
RETRY_AFTER_S: Final = 5

ReadinessCheck = Callable[[], Awaitable[object]]


def cassandra_check(session: Any) -> ReadinessCheck:
    """A readiness check on a Cassandra session: the cheapest query a coordinator answers."""

    async def check() -> None:
        # The driver's own timeout bounds the thread; wait_for bounds the await.
        await asyncio.to_thread(
            session.execute, "SELECT release_version FROM system.local", timeout=CHECK_TIMEOUT_S
        )

    return check


async def _run(name: str, check: ReadinessCheck) -> str:
    try:
        await asyncio.wait_for(check(), timeout=CHECK_TIMEOUT_S)
    except TimeoutError:
        log.warning("readiness: %s did not answer within %.1fs", name, CHECK_TIMEOUT_S)
        return "timeout"
    except Exception as exc:  # any failure of a store is "not ready", never a 500
        log.warning("readiness: %s failed: %s: %s", name, type(exc).__name__, exc)
        return "unavailable"
    return "ok"


def routes(ctx: ApiContext) -> list[Route]:
    checks: dict[str, ReadinessCheck] = {
        # User 0's meta: one HMGET through the pages' own path (and the serving pointer).
        "projection_store": lambda: ctx.deps.projections.meta(0),
        **ctx.deps.readiness,
    }

    async def livez(request: web.Request) -> web.Response:
        return web.json_response({"status": "live"})

    async def readyz(request: web.Request) -> web.Response:
        results = await asyncio.gather(*(_run(name, check) for name, check in checks.items()))
        outcome = dict(zip(checks, results, strict=True))
        failed = [name for name, result in outcome.items() if result != "ok"]
        if not failed:
            return web.json_response({"status": "ready", "checks": outcome})
        body = error_body(503, "not_ready", "not ready: " + ", ".join(failed)) | {"checks": outcome}
        return web.json_response(body, status=503, headers={"Retry-After": str(RETRY_AFTER_S)})

    return [
        Route("GET", LIVEZ_PATH, livez, _LIVEZ, public=True),
        Route("GET", READYZ_PATH, readyz, _READYZ, public=True),
    ]


_CHECKS_SCHEMA: Final = {
    "type": "object",
    "description": "Each check's outcome by name (projection_store, cassandra, ...)",
    "additionalProperties": {"type": "string", "enum": ["ok", "timeout", "unavailable"]},
}

SCHEMAS: Final[dict[str, Any]] = {
    "Live": {
        "type": "object",
        "properties": {"status": {"const": "live"}},
        "required": ["status"],
    },
    "Ready": {
        "type": "object",
        "properties": {"status": {"const": "ready"}, "checks": _CHECKS_SCHEMA},
        "required": ["status", "checks"],
    },
    "NotReady": {
        "allOf": [{"$ref": "#/components/schemas/Error"}],
        "type": "object",
        "properties": {"checks": _CHECKS_SCHEMA},
        "required": ["error", "checks"],
    },
}

_RETRY_AFTER_HEADER: Final = {
    "Retry-After": {"description": "Seconds to wait before retrying", "schema": {"type": "integer"}}
}

_LIVEZ: Final[dict[str, Any]] = {
    "operationId": "getLivez",
    "summary": "Liveness (no token needed): 200 while the process serves HTTP",
    "security": [],
    "responses": {
        "200": {
            "description": "The process serves",
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Live"}}},
        }
    },
}

_READYZ: Final[dict[str, Any]] = {
    "operationId": "getReadyz",
    "summary": "Readiness (no token needed): 200 when the projection store (Redis) and Cassandra "
    "answer, else 503 with Retry-After naming the failed checks",
    "security": [],
    "responses": {
        "200": {
            "description": "Every backing store answers",
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Ready"}}},
        },
        "503": {
            "description": "A backing store does not answer (the checks say which)",
            "headers": _RETRY_AFTER_HEADER,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/NotReady"}}},
        },
    },
}
