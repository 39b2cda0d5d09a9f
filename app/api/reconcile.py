"""Reconcile on request (docs/contract.md §10): ``POST /v1/reconcile`` and the login trigger.

A login (the first page of a walk, i.e. ``GET /v1/sessions`` without cursor, and the live
stream's hello) and ``POST /v1/reconcile`` ask the worker that owns the caller for a reconcile
(app/worker/reconcile.py): first one atomic claim of the user's reconcile slot in the projection
store (``SET NX PX`` under the user's hash tag, app/stores/redis_fleet.py), so the fleet asks at
most once per user per ``PROJECTOR_RECONCILE_MIN_INTERVAL_S`` and projection epoch (a retention
overrun bumps the epoch, app/domain/retention.py: a slot of an earlier epoch is free, and the
request so let through is counted as trigger "epoch"; the epoch is read at most every
`EPOCH_REFRESH_MS`); then a request record on topic
reconcile-request, keyed by the user (the port :class:`ReconcileRequests`; the Kafka adapter is
app/kafka/reconcile.py, injected as ``deps.extra[REQUESTS_KEY]``).

``POST``: 202 once the record is acknowledged by Kafka (the worker does it within its next
loop turn: it is not awaited), 429 with ``Retry-After`` within the interval, 503 when the request
cannot be sent (the slot is given back). A login never waits nor fails for it: the claim and the
send run beside the page (a task), and only the counters say how they went.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections import Counter
from collections.abc import Callable
from typing import Any, Final, Protocol

import orjson
from aiohttp import web

from app.api.fleet import FleetState
from app.api.http import ApiContext, ApiError, Route, bad_request, context, current_user, query
from app.domain.reconcile import ReconcileRequest, Trigger, retry_after_s
from app.domain.wire_ids import ID_SCHEMA, id_text

log = logging.getLogger(__name__)

REQUESTS_KEY: Final = "reconcile_requests"  # deps.extra: the ReconcileRequests adapter
PATH: Final = "/v1/reconcile"
# Outcomes counted per trigger (projector_api_reconcile_requests_total{trigger, outcome}).
ACCEPTED: Final = "accepted"  # slot claimed, request sent
LIMITED: Final = "limited"  # within the interval: nothing sent (POST: 429)
FAILED: Final = "failed"  # the store or Kafka failed (POST: 503)
UNAVAILABLE: Final = "unavailable"  # no request topic configured (POST: 503)
# Login tasks in flight at most; beyond it a login asks nothing (counted as failed).
MAX_LOGIN_TASKS: Final = 1000
# The projection epoch is read again once the last read is this old (ms): a login within this
# long after a retention overrun may still claim in the old epoch (its reconcile then reads the
# state the overrun left anyway, being after it).
EPOCH_REFRESH_MS: Final = 5_000


class ReconcileRequests(Protocol):
    async def send(self, request: ReconcileRequest) -> None:
        """Hand the request to the owner's topic; returns once it is acknowledged."""
        ...


class Reconciler:
    """The API's side: the fleet-wide bound, the request, the counts."""

    def __init__(
        self,
        fleet: FleetState,
        requests: ReconcileRequests | None,
        interval_s: int,
        clock_ms: Callable[[], int],
        *,
        on_login: bool = True,
    ) -> None:
        self.fleet = fleet
        self.requests = requests
        self.interval_ms = interval_s * 1000
        self.clock_ms = clock_ms
        self.on_login = on_login
        self.counts: Counter[tuple[str, str]] = Counter()  # (trigger, outcome) -> requests
        self._tasks: set[asyncio.Task[Any]] = set()
        self._epoch = 0
        self._epoch_read_at_ms: int | None = None

    async def epoch(self, now_ms: int) -> int:
        """The projection epoch, read again when the last read is `EPOCH_REFRESH_MS` old; a read
        that fails keeps the last one (the slot then behaves as before the bump)."""
        read_at = self._epoch_read_at_ms
        if read_at is None or now_ms - read_at >= EPOCH_REFRESH_MS or now_ms < read_at:
            try:
                self._epoch = await self.fleet.projection_epoch()
            except Exception as exc:
                log.warning("reconcile: reading the projection epoch failed: %s", exc)
            self._epoch_read_at_ms = now_ms
        return self._epoch

    async def ask(self, user_id: int, trigger: Trigger) -> int:
        """0: accepted and sent; else the ms until the user may ask again. Raises what the store
        or the request topic raised (counted as failed; the slot given back)."""
        if self.requests is None:
            self.counts[(trigger, UNAVAILABLE)] += 1
            raise ApiError(
                503,
                "unavailable",
                "reconcile requests are not configured on this instance",
                {"Retry-After": "30"},
            )
        token = secrets.token_hex(8)
        now = self.clock_ms()
        epoch = await self.epoch(now)
        try:
            left = await self.fleet.claim_reconcile(user_id, token, self.interval_ms, now, epoch)
        except Exception:
            self.counts[(trigger, FAILED)] += 1
            raise
        if left > 0:
            self.counts[(trigger, LIMITED)] += 1
            return left
        if left < 0:  # the slot of an earlier epoch: the epoch let this one through
            trigger = "epoch"
        try:
            await self.requests.send(ReconcileRequest(user_id, now, trigger))
        except Exception:
            self.counts[(trigger, FAILED)] += 1
            try:
                await self.fleet.release_reconcile(user_id, token, epoch)
            except Exception as exc:  # the slot then expires with its interval
                log.warning("reconcile: giving user %d's slot back failed: %s", user_id, exc)
            raise
        self.counts[(trigger, ACCEPTED)] += 1
        return 0

    def login(self, user_id: int, trigger: Trigger) -> None:
        """A login: ask beside the request that logged in (never delays nor fails it)."""
        if not self.on_login or self.requests is None:
            return
        if len(self._tasks) >= MAX_LOGIN_TASKS:
            self.counts[(trigger, FAILED)] += 1
            return
        task = asyncio.get_running_loop().create_task(self._login(user_id, trigger))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _login(self, user_id: int, trigger: Trigger) -> None:
        try:
            await self.ask(user_id, trigger)
        except Exception as exc:  # counted in ask; a login goes on without its reconcile
            log.warning("reconcile on login of user %d not asked: %s: %s", user_id, type(exc).__name__, exc)

    async def drain(self) -> None:
        """Wait for the login tasks in flight (tests; a clean stop)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


def reconciler(ctx: ApiContext) -> Reconciler:
    found = ctx.reconciler
    if found is None:  # create_app always makes one
        raise RuntimeError("the API context has no reconciler")
    return found


async def post_reconcile(request: web.Request) -> web.Response:
    ctx = context(request)
    user_id = current_user(request)
    query(request, frozenset())
    body = await request.read()
    if body.strip():
        try:
            parsed = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise bad_request("the body must be empty or the JSON object {}") from None
        if parsed != {}:
            raise bad_request("POST /v1/reconcile takes no parameters: send no body or {}")
    found = reconciler(ctx)
    try:
        left = await found.ask(user_id, "request")
    except ApiError:
        raise
    except Exception as exc:
        log.warning("POST /v1/reconcile for user %d: %s: %s", user_id, type(exc).__name__, exc)
        raise ApiError(
            503, "unavailable", "the reconcile request could not be sent; retry later", {"Retry-After": "5"}
        ) from None
    if left > 0:
        wait = retry_after_s(left)
        raise ApiError(
            429,
            "reconcile_too_soon",
            f"a reconcile of this user was asked less than {found.interval_ms // 1000} s ago "
            f"(PROJECTOR_RECONCILE_MIN_INTERVAL_S); retry after {wait} s",
            {"Retry-After": str(wait)},
        )
    return web.json_response(
        {"accepted": True, "user_id": id_text(user_id), "min_interval_s": found.interval_ms // 1000},
        status=202,
    )


def routes(ctx: ApiContext) -> list[Route]:
    return [Route("POST", PATH, post_reconcile, OPERATION)]


OPERATION: Final[dict[str, Any]] = {
    "operationId": "reconcile",
    "summary": 'Ask for a reconcile of the caller\'s rows and badge ("fix my count")',
    "description": (
        "The worker that owns the caller recomputes every row from its state and the MessageStore, "
        "corrects in place the stored rows that differ and fills the missing ones (correction "
        "frames: SESSION_DELTA/BADGE_UPDATE with correction=true, at the stored version), and "
        "recomputes the badge in full (docs/contract.md §10). 202 means the request was handed to "
        "that worker (it runs within moments; the frames say what changed, nothing when nothing "
        "drifted). At most one per user per PROJECTOR_RECONCILE_MIN_INTERVAL_S across the fleet "
        "(a login, i.e. a first page without cursor or the live stream's hello, also takes the "
        "slot): within it, 429 with Retry-After. No parameters; the body is empty or {}."
    ),
    "requestBody": {
        "required": False,
        "content": {"application/json": {"schema": {"type": "object", "maxProperties": 0}}},
    },
    "responses": {
        "202": {
            "description": "Accepted: the owning worker reconciles the caller",
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ReconcileAccepted"}}},
        },
        "400": {"$ref": "#/components/responses/BadRequest"},
        "401": {"$ref": "#/components/responses/Unauthorized"},
        "429": {
            "description": (
                "A reconcile of this user was asked within the interval (code reconcile_too_soon), "
                "or the per-user rate limit (code rate_limited)"
            ),
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
            "headers": {
                "Retry-After": {
                    "description": "Seconds until a reconcile may be asked again",
                    "schema": {"type": "integer", "minimum": 1},
                }
            },
        },
        "503": {"$ref": "#/components/responses/Unavailable"},
    },
}

SCHEMAS: Final[dict[str, Any]] = {
    "ReconcileAccepted": {
        "type": "object",
        "properties": {
            "accepted": {"type": "boolean", "const": True},
            "user_id": ID_SCHEMA,
            "min_interval_s": {
                "type": "integer",
                "minimum": 1,
                "description": "The next reconcile of this user may be asked this many seconds from now",
            },
        },
        "required": ["accepted", "user_id", "min_interval_s"],
    }
}
