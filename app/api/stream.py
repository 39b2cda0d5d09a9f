"""GET /v1/stream: the caller's frames as Server-Sent Events (issue 16; docs/gateway.md).

Events, in order on one connection:

* ``hello`` (first; SSE id = the position the stream continues from): the badge and the store's
  ``projection_mailbox_seq`` as of the connect, and ``status``: ``fresh`` (no Last-Event-ID:
  pull the list now, then apply the frames that follow), ``resumed`` (the frames after your
  Last-Event-ID follow, replayed first), or ``repull`` (they cannot be replayed, ``reason``
  says why: pull the list, then apply the frames that follow).
* ``SESSION_DELTA`` (SSE id = its projection_mailbox_seq, except audit corrections),
  ``BADGE_UPDATE``, ``MEMBER_NOTICE``: the frames of the caller as they come off the topics, ids
  as decimal strings. Apply them with the client rule (app/domain/client.py).
* ``heartbeat`` when nothing else was sent for a beat.
* ``repull`` then the end of the stream: this client read too slowly and its buffer overflowed.

Authentication: ``Authorization: Bearer <token>`` (SDKs), or ``?access_token=<ticket>`` where
the ticket comes from ``POST /v1/stream/ticket`` (browsers: EventSource cannot send headers).
A ticket only opens streams and expires in ``gateway_ticket_ttl_s``: what a URL may leak into
a proxy log or history is worth little and soon nothing. Resume: ``Last-Event-ID`` (what
EventSource sends when it reconnects by itself), or ``?last_event_id=`` for a client that
reconnects on its own; the header wins (it is newer than the URL).

The gateway comes in ``deps.extra["stream"]`` (an :class:`app.gateway.service.Gateway`, fed
from Kafka by an adapter outside app/api); without one the routes answer 503.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping
from typing import Any, Final

import orjson
from aiohttp import web

from app.api.badge import read_badge
from app.api.http import ApiContext, ApiError, Route, bad_request, context, current_user, or_empty, query
from app.api.tokens import TokenError, TokenSigner
from app.domain.badge import badge_fields
from app.domain.wire_ids import U64_MAX, U64_PATTERN, id_text
from app.gateway.hub import REPULL, TooManyConnections, encode_event
from app.gateway.service import Gateway

log = logging.getLogger("projector.api.stream")

STREAM_KEY: Final = "stream"
STREAM_PATH: Final = "/v1/stream"
TICKET_PATH: Final = "/v1/stream/ticket"
TICKET_PURPOSE: Final = "stream-ticket"
_PARAMS: Final = frozenset({"access_token", "last_event_id"})
_DECIMAL: Final = re.compile(r"0|[1-9][0-9]{0,19}")
# What EventSource waits before reconnecting by itself (the `retry:` field).
RECONNECT_MS: Final = 2000
_HEADERS: Final = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-store",
    "X-Accel-Buffering": "no",  # a buffering reverse proxy would hold the events back
    "Referrer-Policy": "no-referrer",
}


def gateway_of(ctx: ApiContext) -> Gateway | None:
    found = ctx.deps.extra.get(STREAM_KEY)
    return found if isinstance(found, Gateway) else None


def _gateway(request: web.Request) -> Gateway:
    found = gateway_of(context(request))
    if found is None:
        raise ApiError(503, "unavailable", "the live stream is not enabled on this server")
    return found


def _tickets(ctx: ApiContext) -> TokenSigner:
    return TokenSigner(ctx.api.api_secret, TICKET_PURPOSE, previous=ctx.api.api_secret_previous)


def _authenticate(request: web.Request, params: Mapping[str, str]) -> int:
    ctx = context(request)
    header = request.headers.get("Authorization")
    ticket = params.get("access_token")
    now_s = ctx.deps.clock_ms() / 1000
    users: list[int] = []
    try:
        if ticket:
            users.append(_tickets(ctx).verify(ticket, now_s))
        if header:
            scheme, _, token = header.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise ApiError(401, "unauthorized", "Authorization must be 'Bearer <token>'")
            users.append(ctx.tokens.verify(token.strip(), now_s))
    except TokenError as exc:
        raise ApiError(401, "unauthorized", str(exc)) from None
    if not users:
        raise ApiError(
            401, "unauthorized", "missing Authorization: Bearer <token> (or ?access_token=<ticket>)"
        )
    # Either credential opens the stream (the description's two security alternatives); both
    # may come (a client with a header behind a URL it was given), and must then both be valid
    # and name the same user: one identity per stream, never a choice between two.
    if len(set(users)) > 1:
        raise ApiError(401, "unauthorized", "Authorization and access_token name different users")
    return users[0]


def _last_event_id(request: web.Request, params: Mapping[str, str]) -> int | None:
    """Where to resume: the Last-Event-ID header wins, else ?last_event_id=; empty means none.
    Each one sent is checked, the one that loses too: a request with a bad parameter is refused
    whatever else it carries (the API fuzz found ?last_event_id=<garbage> accepted beside a
    valid header)."""
    header = _event_id(request.headers.get("Last-Event-ID"), "Last-Event-ID")
    param = _event_id(params.get("last_event_id"), "last_event_id")
    return header if header is not None else param


def _event_id(text: str | None, name: str) -> int | None:
    if text is None or text == "":
        return None
    if not _DECIMAL.fullmatch(text) or int(text) > U64_MAX:
        raise bad_request(f"{name} must be a projection_mailbox_seq (decimal), got {text[:40]!r}")
    return int(text)


async def create_ticket(request: web.Request) -> web.Response:
    ctx = context(request)
    user_id = current_user(request)
    query(request, frozenset())
    _gateway(request)
    ttl = ctx.stream_ticket_ttl_s
    expires = ctx.deps.clock_ms() // 1000 + ttl
    ticket = _tickets(ctx).mint(user_id, expires)
    return web.json_response(
        {"ticket": ticket, "expires_in": ttl, "user_id": id_text(user_id)},
        headers={"Cache-Control": "no-store"},
    )


async def stream(request: web.Request) -> web.StreamResponse:
    ctx = context(request)
    params = query(request, _PARAMS)
    user_id = _authenticate(request, params)  # first: without a credential nothing else is said
    last_event_id = _last_event_id(request, params)
    gateway = _gateway(request)
    partition = gateway.misdirected(user_id)
    if partition is not None:
        raise ApiError(
            421,
            "misdirected",
            f"this instance does not serve partition {partition} of the frame topics (the "
            "caller's); connect to the instance that does",
        )
    hub = gateway.hub
    try:
        conn = hub.attach(user_id)
    except TooManyConnections as exc:
        return web.json_response(
            {"error": {"status": 503, "code": "busy", "message": str(exc)}},
            status=503,
            headers={"Retry-After": "5"},
        )
    response: web.StreamResponse | None = None
    last = False
    try:
        # Read after attach: every frame newer than this version is logged for the connection.
        async with gateway.starting:
            badge, version = await read_badge(ctx, user_id)
        start = hub.start(conn, version, last_event_id)
        response = web.StreamResponse(status=200, headers=_HEADERS)
        await response.prepare(request)
        gateway.opened(user_id)
        hello = {
            "type": "hello",
            "user_id": id_text(user_id),
            "status": start.status,
            "reason": start.reason,
            "resumed_from": last_event_id,
            "projection_mailbox_seq": version,
            "badge": badge_fields(badge, version),
            "replayed": start.replayed,
            "heartbeat_ms": round(gateway.heartbeat_s * 1000),
        }
        first = b"retry: %d\n\n" % RECONNECT_MS + encode_event("hello", orjson.dumps(hello), start.position)
        await _write(response, first, gateway.heartbeat_s)
        if ctx.reconciler is not None:
            # The stream's hello is a login too (docs/contract.md §10): corrections, if any,
            # reach this very stream as correction frames.
            ctx.reconciler.login(user_id, "stream")
        while True:
            chunks = await conn.take()
            if not chunks:
                if conn.overflowed:
                    # The client fell behind by more than its buffer: what it missed is gone
                    # from here, so it must re-pull; then it reconnects.
                    reason = orjson.dumps({"type": REPULL, "reason": "slow"})
                    await _write(response, encode_event(REPULL, reason), gateway.heartbeat_s)
                break
            await _write(response, b"".join(chunks), gateway.heartbeat_s)
    except (ConnectionError, TimeoutError, asyncio.CancelledError) as exc:
        # The client went away (or stopped reading for a whole beat): nothing to answer.
        log.debug("stream of user %d ended: %r", user_id, exc)
        if isinstance(exc, asyncio.CancelledError):
            raise
    finally:
        last = hub.detach(conn)
        if response is not None and response.prepared:
            gateway.closed(user_id, last)
    if response is None:  # the client left before the stream began
        raise ApiError(503, "unavailable", "the stream could not start")
    return response


async def _write(response: web.StreamResponse, data: bytes, timeout_s: float) -> None:
    # A client that takes nothing for a whole beat (its socket and ours full) is cut off: its
    # buffer is bounded by the hub, and what is on the wire by this timeout.
    async with asyncio.timeout(max(timeout_s, 1.0)):  # a timer, not a task per write (wait_for)
        await response.write(data)


def install(app: web.Application, ctx: ApiContext) -> None:
    """Close every stream when the server shuts down (aiohttp waits for open handlers)."""
    gateway = gateway_of(ctx)
    if gateway is None:
        return

    async def close_streams(_: web.Application) -> None:
        gateway.hub.close_all()

    app.on_shutdown.append(close_streams)


def routes(ctx: ApiContext) -> list[Route]:
    gateway = gateway_of(ctx)
    if gateway is not None:
        from app.metrics.gateway import register

        register(ctx.metrics.registry, gateway)
    return [
        # Public to the bearer middleware: the handler authenticates (header or ticket).
        Route("GET", STREAM_PATH, stream, STREAM_OPERATION, public=True),
        Route("POST", TICKET_PATH, create_ticket, TICKET_OPERATION),
    ]


STREAM_OPERATION: Final[dict[str, Any]] = {
    "operationId": "stream",
    "summary": "The caller's live frames as Server-Sent Events",
    "description": (
        "Events: hello (first: badge, projection_mailbox_seq, status fresh|resumed|repull), then "
        "SESSION_DELTA (SSE id = projection_mailbox_seq), BADGE_UPDATE and MEMBER_NOTICE as they "
        "come off the topics (ids as decimal strings), heartbeat when idle, and repull followed by "
        "the end of the stream when the client read too slowly. Resume with Last-Event-ID (or "
        "last_event_id) = the last projection_mailbox_seq applied: the missed frames are replayed "
        "when this instance still holds them and they chain from it, otherwise hello says repull. "
        "Apply frames with the client rule (absolute rows, versions, prev gap -> re-pull). "
        "docs/gateway.md"
    ),
    "security": [{"bearer": []}, {"streamTicket": []}],
    "parameters": [
        {
            "name": "access_token",
            "in": "query",
            "required": False,
            "description": "A ticket from POST /v1/stream/ticket (EventSource cannot send headers)",
            "schema": {"type": "string", "maxLength": 512},
        },
        {
            "name": "last_event_id",
            "in": "query",
            "required": False,
            "description": "Resume after this projection_mailbox_seq (the Last-Event-ID header wins)",
            "schema": or_empty({"type": "string", "pattern": U64_PATTERN}),
        },
        {
            "name": "Last-Event-ID",
            "in": "header",
            "required": False,
            "schema": or_empty({"type": "string", "pattern": U64_PATTERN}),
        },
    ],
    "responses": {
        "200": {
            "description": "An endless text/event-stream (see the description)",
            # The schema of one event (the stream is a sequence of them; OpenAPI 3.2 calls this
            # itemSchema, fuzzers read it from `schema`).
            "content": {"text/event-stream": {"schema": {"$ref": "#/components/schemas/StreamEvent"}}},
        },
        "400": {"$ref": "#/components/responses/BadRequest"},
        "401": {"$ref": "#/components/responses/Unauthorized"},
        "421": {
            "description": "This instance does not read the partition of the caller's frames",
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
        },
        "503": {"$ref": "#/components/responses/Unavailable"},
    },
}

TICKET_OPERATION: Final[dict[str, Any]] = {
    "operationId": "createStreamTicket",
    "summary": "A short-lived ticket that opens the caller's /v1/stream (for browsers)",
    "description": (
        "EventSource cannot send an Authorization header: pass the ticket as "
        "/v1/stream?access_token=<ticket>. It opens streams only (never a bearer token) and "
        "expires after gateway_ticket_ttl_s (default 60 s); get a new one to reconnect later."
    ),
    "responses": {
        "200": {
            "description": "The ticket",
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/StreamTicket"}}},
            "links": {
                "OpenStream": {
                    "operationId": "stream",
                    "parameters": {"access_token": "$response.body#/ticket"},
                    "description": "Open the caller's stream with the ticket (EventSource)",
                }
            },
        },
        "401": {"$ref": "#/components/responses/Unauthorized"},
        "503": {"$ref": "#/components/responses/Unavailable"},
    },
}

SCHEMAS: Final[dict[str, Any]] = {
    "StreamEvent": {
        "type": "object",
        "description": "One server-sent event: its data is one JSON object (ids as decimal strings)",
        "properties": {
            "event": {
                "type": "string",
                "enum": ["hello", "SESSION_DELTA", "BADGE_UPDATE", "MEMBER_NOTICE", "heartbeat", "repull"],
            },
            "data": {"type": "string", "contentMediaType": "application/json"},
            "id": {"type": "string", "pattern": U64_PATTERN},
            "retry": {"type": "integer", "minimum": 0},
        },
        "required": ["event", "data"],
    },
    "StreamTicket": {
        "type": "object",
        "properties": {
            "ticket": {"type": "string"},
            "expires_in": {"type": "integer", "description": "seconds"},
            "user_id": {"type": "string", "format": "uint64"},
        },
        "required": ["ticket", "expires_in", "user_id"],
    },
}
