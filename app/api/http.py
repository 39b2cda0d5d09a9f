"""What every resource module shares: the context, routes, errors, auth helpers, query parsing.

A resource module (``sessions.py``, ``badge.py``, later ``members.py``) exposes
``routes(ctx) -> list[Route]`` and ``SCHEMAS`` (its OpenAPI component schemas); ``create_app``
registers the routes and builds /openapi.json from the same list, so a route cannot exist
without its description.
"""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from aiohttp import web

from app.api.cursor import CursorCodec
from app.api.snapshots import SessionLists
from app.api.sources import ProjectionReader, StateFiller
from app.api.tokens import TokenSigner
from app.metrics import ApiMetrics
from app.settings import ApiSettings, ProcessingSettings

if TYPE_CHECKING:
    from app.api.reconcile import Reconciler

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(slots=True)
class Deps:
    """What the API reads, built by the caller (`projector api`, tests, the bench).

    Other resources add their own fields here (e.g. the member directory's Cassandra reader);
    ``clock_ms`` is the one clock (token expiry, snapshot TTL), injected so tests can move it.
    """

    projections: ProjectionReader
    state: StateFiller | None = None
    clock_ms: Callable[[], int] = wall_clock_ms
    extra: dict[str, Any] = field(default_factory=dict)
    # GET /readyz's checks beyond the projection store, by name (app/api/health.py).
    readiness: dict[str, Callable[[], Awaitable[object]]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ApiContext:
    api: ApiSettings
    processing: ProcessingSettings  # the badge defaults (include_muted, badge_mode)
    stream_ticket_ttl_s: int  # gateway_ticket_ttl_s
    deps: Deps
    tokens: TokenSigner
    cursors: CursorCodec
    lists: SessionLists
    metrics: ApiMetrics = field(default_factory=ApiMetrics)  # this app's own registry
    reconciler: Reconciler | None = None  # reconcile on request (app/api/reconcile.py)


@dataclass(frozen=True, slots=True)
class Route:
    method: str
    path: str
    handler: Handler
    operation: Mapping[str, Any]  # the OpenAPI operation object
    public: bool = False  # served without a bearer token (only the API description is)


CONTEXT: Final = web.AppKey("projector_api_context", ApiContext)
USER: Final = web.RequestKey("projector_api_user", int)  # set by the auth middleware


class ApiError(Exception):
    """An error the client caused or must know about; rendered as JSON with its status."""

    def __init__(
        self, status: int, code: str, message: str, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = dict(headers or {})


def bad_request(message: str, code: str = "bad_request") -> ApiError:
    return ApiError(400, code, message)


def context(request: web.Request) -> ApiContext:
    return request.app[CONTEXT]


def current_user(request: web.Request) -> int:
    """The user the request's bearer token names (set by the auth middleware)."""
    try:
        return request[USER]
    except KeyError:  # a public route asked for a user: a programming error, not the client's
        raise RuntimeError("current_user() on a route without authentication") from None


def error_body(status: int, code: str, message: str) -> dict[str, Any]:
    return {"error": {"status": status, "code": code, "message": message}}


_DECIMAL: Final = re.compile(r"[0-9]{1,9}")  # ASCII digits only (int() also takes '٣', ' 3', '3_0')


def query(request: web.Request, allowed: frozenset[str]) -> dict[str, str]:
    """The query parameters as a dict; 400 for an unknown or repeated one. An empty value
    counts as absent (``?cursor=`` is the first page)."""
    params = request.rel_url.query
    out: dict[str, str] = {}
    for name in params:
        if name not in allowed:
            known = ", ".join(sorted(allowed)) or "none"
            raise bad_request(f"unknown query parameter {name!r} (known: {known})")
        values = params.getall(name)
        if len(values) > 1:
            raise bad_request(f"query parameter {name!r} given more than once")
        if values[0] != "":
            out[name] = values[0]
    return out


def int_param(params: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    text = params.get(name)
    if text is None:
        return default
    if not _DECIMAL.fullmatch(text) or not low <= int(text) <= high:
        raise bad_request(f"{name} must be an integer from {low} to {high}, got {text[:40]!r}")
    return int(text)


def or_empty(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A query parameter's schema that also admits the empty value: `query` reads ``?name=`` as
    absent, so the description must not call it invalid."""
    return {"anyOf": [dict(schema), {"type": "string", "maxLength": 0}]}
