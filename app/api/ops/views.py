"""The operator console's HTTP side (issue 17): an aiohttp sub-application mounted at /ops/.

Pages and JSON, every route behind the operator credential (app/api/ops/auth.py): no token →
401 (the page answers 401 with a login form), a user token → 403, a failed Origin/CSRF check on
a POST → 403. Read-only unless a POST says otherwise:

  GET  /ops/                                   the console (static HTML + JS + vendored uPlot)
  GET  /ops/static/{file}                      its files
  POST /ops/login   /ops/logout                set / clear the session cookies (form: token)
  GET  /ops/api/whoami
  GET  /ops/api/user/{user_id}                 stored vs recomputed, frames, gate
  POST /ops/api/user/{user_id}/reconcile       the audit's correction path
  POST /ops/api/user/{user_id}/rebuild         every row from state, at the stored version
  GET  /ops/api/conversation/{conversation_id}?after_user_id=
  GET  /ops/api/fleet                          partitions, owners, lag, rebuilds, serving ns
  GET  /ops/api/series                         the charts' samples
  GET  /ops/api/dead-letters?limit=&partition=

Every response carries a strict Content-Security-Policy (scripts and styles from /ops/static
only, no framing) and ``Cache-Control: no-store``; the page renders every value with
``textContent`` (a dead letter's raw record is attacker-controlled text).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
import uuid
from importlib import resources
from typing import Any, Final

import orjson
from aiohttp import web

from app.api.http import ApiError, Handler
from app.metrics import OpsMetrics
from app.settings import OpsSettings, ProcessingSettings, Settings, TopicSettings

from . import inspector
from .auth import CSRF_COOKIE, SESSION_COOKIE, Denied, Gatekeeper, Operator, check_origin
from .fleet import Fleet, Sampler
from .ports import OpsDeps, TopicRecord

log = logging.getLogger("projector.ops")

OPERATOR: Final = web.RequestKey("projector_ops_operator", Operator)
STATIC_FILES: Final = {
    "console.js": "application/javascript",
    "console.css": "text/css",
    "vendor/uPlot.iife.min.js": "application/javascript",
    "vendor/uPlot.min.css": "text/css",
}
FRAMES_SHOWN: Final = 10
MEMBERS_PAGE: Final = 50
DEAD_LETTERS_MAX: Final = 200
_U64 = re.compile(r"(0|[1-9][0-9]{0,19})")
_CSP: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
_LOGIN_PAGE: Final = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Operator console: sign in</title></head>
<body><h1>Session projector: operator console</h1>
<p>{message}</p>
<form method="post" action="/ops/login">
<label>Operator token <input type="password" name="token" id="token" autocomplete="off" required></label>
<button type="submit" id="sign-in">Sign in</button>
</form>
<p>Mint one with <code>projector token --operator NAME</code> (PROJECTOR_OPS_SECRET).</p>
</body></html>
"""


class ConsoleState:
    def __init__(
        self,
        ops: OpsSettings,
        topics: TopicSettings,
        processing: ProcessingSettings,
        deps: OpsDeps,
        gate: Gatekeeper,
        metrics: OpsMetrics,
    ) -> None:
        self.ops = ops
        self.topics = topics
        self.processing = processing  # the rules a user's rebuild from state follows
        self.deps = deps
        self.gate = gate
        self.metrics = metrics
        self.fleet: Fleet | None = None
        self.sampler: Sampler | None = None


STATE: Final = web.AppKey("projector_ops_state", ConsoleState)


def build(
    settings: Settings, deps: OpsDeps, gate: Gatekeeper, metrics: OpsMetrics, fleet: Fleet
) -> web.Application:
    state = ConsoleState(settings.ops, settings.topics, settings.processing, deps, gate, metrics)
    state.fleet = fleet
    state.sampler = Sampler(fleet, settings.ops.ops_sample_interval_ms / 1000)
    app = web.Application(middlewares=[_headers, _guard])
    app[STATE] = state
    r = app.router
    r.add_get("/", page, allow_head=False)
    r.add_get("/static/{name:.+}", static, allow_head=False)
    r.add_post("/login", login)
    r.add_post("/logout", logout)
    r.add_get("/api/whoami", whoami, allow_head=False)
    r.add_get("/api/user/{user_id}", user_view, allow_head=False)
    r.add_post("/api/user/{user_id}/reconcile", reconcile)
    r.add_post("/api/user/{user_id}/rebuild", rebuild)
    r.add_get("/api/conversation/{conversation_id}", conversation_view, allow_head=False)
    r.add_get("/api/fleet", fleet_view, allow_head=False)
    r.add_get("/api/series", series_view, allow_head=False)
    r.add_get("/api/dead-letters", dead_letters_view, allow_head=False)
    app.cleanup_ctx.append(_sampling)
    return app


async def _sampling(app: web.Application) -> Any:
    state = app[STATE]
    assert state.sampler is not None
    task = asyncio.create_task(state.sampler.run(), name="ops-console-sampler")
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _state(request: web.Request) -> ConsoleState:
    return request.app[STATE]


# -- middlewares --------------------------------------------------------------------------------


@web.middleware
async def _headers(request: web.Request, handler: Handler) -> web.StreamResponse:
    response = await handler(request)
    response.headers["Content-Security-Policy"] = _CSP
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["X-Content-Type-Options"] = "nosniff"
    # Not "no-referrer": with it Chromium sends `Origin: null` on the page's own form posts,
    # which the Origin check (rightly) refuses. same-origin leaks nothing to other sites.
    response.headers["Referrer-Policy"] = "same-origin"
    response.headers["Cache-Control"] = "no-store"
    return response


@web.middleware
async def _guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    state = _state(request)
    # The sign-in form posts to /ops/login: its refusals are the form again, not JSON.
    is_page = (request.method == "GET" and request.path == "/ops/") or request.path == "/ops/login"
    try:
        if request.path == "/ops/login":
            check_origin(request)  # login CSRF: no session yet, so Origin is the defence
            return await handler(request)
        operator = state.gate.authenticate(request, time.time())
        if request.method == "POST":
            state.gate.check_post(request, operator)
    except Denied as exc:
        if is_page:
            return _login_page(exc.message, exc.status)
        raise ApiError(
            exc.status, "unauthorized" if exc.status == 401 else "forbidden", exc.message
        ) from None
    request[OPERATOR] = operator
    return await handler(request)


def _login_page(message: str, status: int) -> web.Response:
    body = _LOGIN_PAGE.format(message=_escape(message))
    headers = {"WWW-Authenticate": 'Bearer realm="operator console"'} if status == 401 else None
    return web.Response(text=body, status=status, content_type="text/html", headers=headers)


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


# -- page, static, session --------------------------------------------------------------------------


def _asset(name: str) -> bytes:
    return resources.files("app.api.ops").joinpath("static", name).read_bytes()


async def page(request: web.Request) -> web.Response:
    return web.Response(body=_asset("index.html"), content_type="text/html", charset="utf-8")


async def static(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    kind = STATIC_FILES.get(name)
    if kind is None:
        raise ApiError(404, "not_found", "no such console file")
    return web.Response(body=_asset(name), content_type=kind, charset="utf-8" if "css" in kind else None)


async def login(request: web.Request) -> web.StreamResponse:
    state = _state(request)
    form = await request.post()
    token = form.get("token")
    if not isinstance(token, str) or not token.strip():
        return _login_page("an operator token is required", 401)
    token = token.strip()
    try:
        operator = state.gate.verify(token, time.time())
    except Denied as exc:
        return _login_page(exc.message, exc.status)
    secure = request.scheme == "https"
    response = web.Response(status=303, headers={"Location": "/ops/"})
    response.set_cookie(
        SESSION_COOKIE,
        token,
        path="/ops/",
        httponly=True,
        samesite="Strict",
        secure=secure,
        max_age=state.ops.ops_token_ttl_s,
    )
    response.set_cookie(
        CSRF_COOKIE,
        state.gate.operators.csrf_token(token),
        path="/ops/",
        httponly=False,
        samesite="Strict",
        secure=secure,
        max_age=state.ops.ops_token_ttl_s,
    )
    log.info("ops console: operator %s signed in", operator)
    return response


async def logout(request: web.Request) -> web.Response:
    response = web.json_response({"signed_out": True})
    response.del_cookie(SESSION_COOKIE, path="/ops/")
    response.del_cookie(CSRF_COOKIE, path="/ops/")
    return response


async def whoami(request: web.Request) -> web.Response:
    return _json({"operator": request[OPERATOR].name})


# -- user inspector -----------------------------------------------------------------------------------


def _user_id(request: web.Request) -> int:
    text = request.match_info["user_id"]
    if not _U64.fullmatch(text) or int(text) >= 1 << 64:
        raise ApiError(400, "bad_request", f"user id must be an integer in [0, 2^64), got {text[:40]!r}")
    return int(text)


async def user_view(request: web.Request) -> web.Response:
    state = _state(request)
    user_id = _user_id(request)
    snap = await inspector.snapshot(state.deps, state.processing, user_id)
    diff = inspector.compare(snap)
    stored = snap.stored
    out: dict[str, Any] = {
        "user_id": str(user_id),
        "version": stored.projection_mailbox_seq,
        "structure_version": stored.structure_version,
        "state_version": snap.state_version,
        "rows_stored": len(stored.rows),
        "rows_in_state": len(snap.fresh_rows),
        **diff,
    }
    out["frames"], out["gate"] = await asyncio.gather(_frames(state, user_id), _gate(state, user_id))
    return _json(out)


async def _frames(state: ConsoleState, user_id: int) -> dict[str, Any]:
    bus = state.deps.bus
    if bus is None:
        return {"error": "no Kafka adapter configured"}
    topics = state.topics
    try:
        deltas, badges = await asyncio.gather(
            bus.last_records(topics.topic_session_delta, str(user_id), FRAMES_SHOWN),
            bus.last_records(topics.topic_badge, str(user_id), FRAMES_SHOWN),
        )
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}
    return {
        "scan_records": state.ops.ops_scan_records,
        "session_delta": [_frame(r) for r in deltas],
        "badge": [_frame(r) for r in badges],
    }


def _frame(record: TopicRecord) -> dict[str, Any]:
    try:
        value: Any = orjson.loads(record.value)
    except ValueError:
        value = record.value.decode("utf-8", "replace")
    if isinstance(value, dict) and isinstance(value.get("user_id"), int):
        value["user_id"] = str(value["user_id"])  # 64-bit ids travel as strings (docs/contract.md §9)
    return {
        "partition": record.partition,
        "offset": record.offset,
        "timestamp_ms": record.timestamp_ms,
        "frame": value,
    }


async def _gate(state: ConsoleState, user_id: int) -> dict[str, Any]:
    bus = state.deps.bus
    if bus is None or state.fleet is None:
        return {"partition": None, "error": "no Kafka adapter configured"}
    partition = bus.partition_of(user_id)
    view = await state.fleet.view()
    row: dict[str, Any] = next((p for p in view["partitions"] if p["partition"] == partition), {})
    return {
        "partition": partition,
        "hi": row.get("hi"),
        "lanes": row.get("lanes"),
        "pending": row.get("pending"),
        "owners": row.get("owners", []),
    }


async def reconcile(request: web.Request) -> web.Response:
    return await _action(request, inspector.RECONCILE)


async def rebuild(request: web.Request) -> web.Response:
    return await _action(request, inspector.REBUILD)


async def _action(request: web.Request, action: str) -> web.Response:
    state = _state(request)
    user_id = _user_id(request)
    operator = request[OPERATOR].name
    try:
        result = await inspector.run_action(state.deps, state.processing, user_id, action)
    except inspector.ActionRefused as exc:
        state.metrics.actions.labels(action, exc.code).inc()
        log.warning("ops %s of user %d by %s refused: %s", action, user_id, operator, exc.message)
        raise ApiError(exc.status, exc.code, exc.message) from None
    except Exception:
        state.metrics.actions.labels(action, "failed").inc()
        log.exception("ops %s of user %d by %s failed", action, user_id, operator)
        raise
    outcome = "written" if result["written"] else "clean"
    state.metrics.actions.labels(action, outcome).inc()
    state.metrics.corrected_rows.labels(action).inc(result["rows"])
    log.info("ops %s of user %d by %s: %s, %d rows", action, user_id, operator, outcome, result["rows"])
    return _json({"action": action, "user_id": str(user_id), "operator": operator, **result})


# -- conversation ------------------------------------------------------------------------------------


async def conversation_view(request: web.Request) -> web.Response:
    state = _state(request)
    text = request.match_info["conversation_id"]
    try:
        cid = str(uuid.UUID(text))
    except ValueError:
        raise ApiError(400, "bad_request", f"conversation id must be a UUID, got {text[:60]!r}") from None
    after_text = request.rel_url.query.get("after_user_id", "")
    after: int | None = None
    if after_text:
        if not _U64.fullmatch(after_text) or int(after_text) >= 1 << 64:
            raise ApiError(400, "bad_request", "after_user_id must be a u64")
        after = int(after_text)
    deps = state.deps
    heads = await asyncio.to_thread(deps.messages.heads, [cid])
    members = await deps.members.page(cid, after, MEMBERS_PAGE + 1, False)
    has_more = len(members) > MEMBERS_PAGE
    members = members[:MEMBERS_PAGE]
    ids = [m.user_id for m in members]
    reads, stored = await asyncio.gather(
        deps.members.read_seqs(cid, ids),
        asyncio.gather(*(deps.store.load_rows(uid, [cid]) for uid in ids)),
    )
    head = heads.get(cid)
    items = []
    for member, rows in zip(members, stored, strict=True):
        row = rows.rows.get(cid)
        items.append(
            {
                "user_id": str(member.user_id),
                "role": member.role,
                "state": member.state,
                "joined_at": member.joined_at,
                "left_at": member.left_at,
                "read_seq_state": reads.get(member.user_id),
                "stored": None
                if row is None
                else {
                    name: row.get(name)
                    for name in (
                        "unread_count",
                        "unread_exact",
                        "mention_count",
                        "read_conversation_seq",
                        "latest_conversation_seq",
                        "projection_mailbox_seq",
                    )
                },
                "user_version": rows.projection_mailbox_seq,
            }
        )
    return _json(
        {
            "conversation_id": cid,
            "head": None
            if head is None
            else {
                "latest_conversation_seq": head.latest_conversation_seq,
                "last_message_id": head.last_message_id,
                "last_activity_id": head.last_activity_id,
            },
            "members": items,
            "has_more": has_more,
            "next_after_user_id": items[-1]["user_id"] if has_more and items else None,
        }
    )


# -- fleet, charts, dead letters -------------------------------------------------------------------


async def fleet_view(request: web.Request) -> web.Response:
    state = _state(request)
    assert state.fleet is not None
    return _json(await state.fleet.view())


async def series_view(request: web.Request) -> web.Response:
    state = _state(request)
    assert state.sampler is not None
    if not state.sampler.samples:
        await state.sampler.sample()  # the first look right after start-up
    return _json({"interval_s": state.sampler.interval_s, **state.sampler.series()})


async def dead_letters_view(request: web.Request) -> web.Response:
    state = _state(request)
    q = request.rel_url.query
    limit = _small_int(q.get("limit", "50"), "limit", 1, DEAD_LETTERS_MAX)
    partition = None if not q.get("partition") else _small_int(q["partition"], "partition", 0, 100_000)
    bus = state.deps.bus
    if bus is None:
        raise ApiError(503, "unavailable", "no Kafka adapter configured")
    try:
        records = await bus.tail(state.topics.topic_dead_letter, limit, partition)
    except Exception as exc:  # Kafka away or the topic missing: the operator's answer, not a 500
        log.warning("ops console: reading the dead-letter topic failed: %s", exc)
        raise ApiError(
            503, "unavailable", f"the dead-letter topic cannot be read now: {type(exc).__name__}"
        ) from None
    return _json({"topic": state.topics.topic_dead_letter, "items": [_dead_letter(r) for r in records]})


def _dead_letter(record: TopicRecord) -> dict[str, Any]:
    raw = record.value.decode("utf-8", "replace")
    try:
        envelope = orjson.loads(record.value)
    except ValueError:
        envelope = None
    item: dict[str, Any] = {
        "dlt_partition": record.partition,
        "dlt_offset": record.offset,
        "timestamp_ms": record.timestamp_ms,
        "key": record.key,
        "raw": raw,
    }
    if isinstance(envelope, dict):
        item.update(
            reason=envelope.get("reason"),
            source_topic=envelope.get("topic"),
            source_partition=envelope.get("partition"),
            source_offset=envelope.get("offset"),
            record=envelope.get("value"),
            record_encoding=envelope.get("value_encoding"),
        )
    else:
        item["reason"] = "(not a dead-letter envelope)"
    return item


def _small_int(text: str, name: str, low: int, high: int) -> int:
    if not re.fullmatch(r"[0-9]{1,7}", text) or not low <= int(text) <= high:
        raise ApiError(400, "bad_request", f"{name} must be an integer from {low} to {high}")
    return int(text)


def _json(body: Any) -> web.Response:
    return web.Response(body=orjson.dumps(body), content_type="application/json")
