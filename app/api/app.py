"""``create_app(settings, deps)``: the aiohttp application of the query API.

Routes come from resource modules (:data:`RESOURCES`); each gives its routes with their OpenAPI
operations, and /openapi.json is built from that same list. Middlewares, outermost first:

1. errors: every failure becomes a JSON body ``{"error": {status, code, message}}``. Bad input
   is a 4xx raised on purpose (ApiError); a store that is down is 503; anything unexpected is
   logged and answered 500 without internals.
2. timing: ``Server-Timing: app;dur=<ms>, loop-cpu;dur=<ms>`` on every response (the bench reads server-side
   latency from it).
3. auth: a bearer token (app/api/tokens.py) on every route but the public description.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

from aiohttp import web

from app.api import badge, guard, health, members, ops, reconcile, sessions, stream, web_client
from app.api.cursor import CursorCodec
from app.api.http import (
    CONTEXT,
    USER,
    ApiContext,
    ApiError,
    Deps,
    Handler,
    Route,
    error_body,
)
from app.api.snapshots import SessionLists, SnapshotCache
from app.api.tokens import TokenError, TokenSigner
from app.metrics import metrics_handler
from app.settings import ApiSettings, Settings
from app.stores.cassandra_exec import StoreError
from app.stores.redis_projection import ProjectionStoreError

log = logging.getLogger(__name__)

# One entry per resource module: (routes(ctx), its OpenAPI component schemas).
RESOURCES: Final[tuple[tuple[Callable[[ApiContext], list[Route]], dict[str, Any]], ...]] = (
    (sessions.routes, sessions.SCHEMAS),
    (badge.routes, badge.SCHEMAS),
    (reconcile.routes, reconcile.SCHEMAS),  # POST /v1/reconcile; its topic comes in deps.extra, else 503
    (members.routes, members.SCHEMAS),  # its service comes in deps.extra["members"], else 503
    (health.routes, health.SCHEMAS),  # /livez, /readyz: public
    (stream.routes, stream.SCHEMAS),  # /v1/stream: its gateway comes in deps.extra["stream"], else 503
    (web_client.routes, {}),  # the browser client's static files (public)
)

OPENAPI_PATH: Final = "/openapi.json"
METRICS_PATH: Final = "/metrics"
SESSIONS_PATH: Final = "/v1/sessions"


class ApiConfigError(ValueError):
    """The settings cannot run an API (no secret, a named SDK build that is not there)."""


def check_config(api: ApiSettings) -> None:
    """Raise ApiConfigError when these settings cannot run an API: `projector api` asks before
    it connects to anything, `create_app` again."""
    if not api.api_secret:
        raise ApiConfigError(
            "PROJECTOR_API_SECRET is not set: the API signs tokens and cursors with it "
            "(at least 32 characters; e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    if api.api_web_sdk:  # a deployment that names the page's SDK build must get that build
        try:
            web_client.find_sdk(api.api_web_sdk)
        except web_client.WebSdkError as exc:
            raise ApiConfigError(str(exc)) from exc


def create_app(settings: Settings, deps: Deps) -> web.Application:
    api = settings.api
    check_config(api)
    cache = SnapshotCache(api.api_snapshot_cache_rows, api.api_snapshot_ttl_ms, deps.clock_ms)
    lists = SessionLists(
        deps.projections,
        cache,
        max_rows=api.api_snapshot_max_rows,
        state=deps.state,
        fill_mode=api.api_fill_from_state,
    )
    ctx = ApiContext(
        api=api,
        processing=settings.processing,
        stream_ticket_ttl_s=settings.gateway.gateway_ticket_ttl_s,
        deps=deps,
        tokens=TokenSigner(api.api_secret, previous=api.api_secret_previous),
        cursors=CursorCodec(api.api_secret, previous=api.api_secret_previous),
        lists=lists,
        reconciler=reconcile.Reconciler(
            deps.projections.fleet,
            deps.extra.get(reconcile.REQUESTS_KEY),
            settings.reconcile.reconcile_min_interval_s,
            deps.clock_ms,
            on_login=settings.reconcile.reconcile_on_login,
        ),
    )
    routes: list[Route] = []
    schemas: dict[str, Any] = {}
    for make_routes, resource_schemas in RESOURCES:
        routes.extend(make_routes(ctx))
        schemas.update(resource_schemas)
    description = openapi(routes, schemas)

    async def serve_description(request: web.Request) -> web.Response:
        return web.json_response(description)

    routes.append(Route("GET", OPENAPI_PATH, serve_description, _OPENAPI_OPERATION, public=True))
    description["paths"][OPENAPI_PATH] = {"get": dict(_OPENAPI_OPERATION, security=[])}
    # Prometheus scrapes without a token (like the description): counters and latencies only,
    # never a user id or a row. Described, so /openapi.json still names every served route.
    limiter = None
    if api.api_rate_limit_per_s > 0:
        limiter = guard.FleetRateLimiter(  # the fleet's bucket, in the projection store
            deps.projections.fleet,
            api.api_rate_limit_per_s,
            api.api_rate_limit_burst,
            deps.clock_ms,
            api.api_rate_limit_on_store_error,
        )

    def sync_metrics() -> None:
        ctx.metrics.sync(lists)
        if limiter is not None:
            ctx.metrics.sync_rate(limiter.limited, limiter.store_errors)
        if ctx.reconciler is not None:
            ctx.metrics.sync_reconcile(ctx.reconciler.counts)

    serve_metrics = metrics_handler(ctx.metrics.registry, sync_metrics)
    routes.append(Route("GET", METRICS_PATH, serve_metrics, _METRICS_OPERATION, public=True))
    description["paths"][METRICS_PATH] = {"get": dict(_METRICS_OPERATION, security=[])}

    public = frozenset(r.path for r in routes if r.public)
    app = web.Application(
        middlewares=[
            _observed,
            _retry_after,
            _errors,
            _timing,
            guard.size_limits(api),  # before auth: an oversized request is not even read
            _auth(ctx, public, limiter),
        ],
        client_max_size=api.api_max_body_bytes,
    )
    app[CONTEXT] = ctx
    stream.install(app, ctx)  # open streams end at shutdown (aiohttp waits for handlers)
    for route in routes:
        # No implicit HEAD: every served method is one the description names.
        if route.method == "GET":
            app.router.add_get(route.path, route.handler, allow_head=False)
        else:
            app.router.add_route(route.method, route.path, route.handler)
    # The operator console (issue 17): under /ops/, with its own credential (app/api/ops).
    ops.mount(app, settings, deps.extra.get(ops.OPS_KEY), ctx.metrics.registry)
    return app


# --------------------------------------------------------------------------------------------


_METHODS: Final = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


@web.middleware
async def _observed(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Outermost: every request counted and timed as answered (errors included), by route template."""
    started = time.perf_counter()
    code = 500
    try:
        response = await handler(request)
        code = response.status
        return response
    except web.HTTPException as exc:  # below 400 (redirects): _errors re-raises them
        code = exc.status
        raise
    finally:
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else "unmatched"
        method = request.method if request.method in _METHODS else "other"
        request.app[CONTEXT].metrics.observe_request(route, method, code, time.perf_counter() - started)


@web.middleware
async def _retry_after(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every 503 the API sends says when to come back (a store down, not ready, no member service)."""
    response = await handler(request)
    if response.status == 503 and "Retry-After" not in response.headers and not response.prepared:
        response.headers["Retry-After"] = str(health.RETRY_AFTER_S)
    return response


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        headers = dict(exc.headers)
        if exc.status == 401:
            headers["WWW-Authenticate"] = 'Bearer error="invalid_token"'
        return web.json_response(
            error_body(exc.status, exc.code, exc.message), status=exc.status, headers=headers
        )
    except web.HTTPException as exc:  # the router's 404/405, aiohttp's own 4xx
        if exc.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status, "http_error")
        return web.json_response(
            error_body(exc.status, code, exc.reason), status=exc.status, headers=_allow(exc)
        )
    except (ProjectionStoreError, StoreError) as exc:
        log.warning("%s %s: store unavailable: %s", request.method, request.path, exc)
        return web.json_response(
            error_body(503, "unavailable", "a backing store is unavailable; retry later"), status=503
        )
    except Exception:
        log.exception("%s %s failed", request.method, request.path)
        return web.json_response(error_body(500, "internal", "internal error"), status=500)


def _allow(exc: web.HTTPException) -> dict[str, str] | None:
    allow = exc.headers.get("Allow")
    return {"Allow": allow} if allow else None


@web.middleware
async def _timing(request: web.Request, handler: Handler) -> web.StreamResponse:
    started = time.perf_counter()
    cpu_started = time.thread_time()
    response = await handler(request)
    elapsed = time.perf_counter() - started
    # `loop-cpu`: the event loop thread's CPU during the request, its own when requests come one
    # at a time (the bench's cold pages): unlike `app`, not inflated by other processes' load.
    loop_cpu = time.thread_time() - cpu_started
    response.headers["Server-Timing"] = f"app;dur={elapsed * 1000:.3f}, loop-cpu;dur={loop_cpu * 1000:.3f}"
    if request.path == SESSIONS_PATH and response.status == 200:
        request.app[CONTEXT].metrics.page_latency.observe(elapsed)
    return response


def _auth(ctx: ApiContext, public: frozenset[str], limiter: guard.FleetRateLimiter | None) -> Any:
    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in public and not ops.is_console_path(request.path):
            user_id = request[USER] = _authenticate(ctx, request.headers.get("Authorization"))
            if limiter is not None:
                await guard.rate_limited(limiter, user_id)  # per user: after we know who it is
        return await handler(request)

    return auth


def _authenticate(ctx: ApiContext, header: str | None) -> int:
    if not header:
        raise ApiError(401, "unauthorized", "missing Authorization: Bearer <token>")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "unauthorized", "Authorization must be 'Bearer <token>'")
    try:
        return ctx.tokens.verify(token.strip(), ctx.deps.clock_ms() / 1000)
    except TokenError as exc:
        raise ApiError(401, "unauthorized", str(exc)) from None


# --------------------------------------------------------------------------------------------

_OPENAPI_OPERATION: Final[dict[str, Any]] = {
    "operationId": "getOpenApi",
    "summary": "This description (no token needed)",
    "responses": {"200": {"description": "OpenAPI 3.1 document", "content": {"application/json": {}}}},
}


_METRICS_OPERATION: Final[dict[str, Any]] = {
    "operationId": "getMetrics",
    "summary": "Prometheus metrics of this API process (no token needed): snapshot hits, loads, "
    "evictions, page latency, requests and their latency by route and status, process and build info",
    "responses": {
        "200": {
            "description": "Prometheus text exposition format 0.0.4",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        }
    },
}


def _error_response(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }


def openapi(routes: Sequence[Route], schemas: dict[str, Any]) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        operation = dict(route.operation)
        # What app/api/guard.py answers before any handler, on every route (429: those that
        # authenticate with the bearer middleware).
        responses = dict(operation.get("responses", {}))
        responses.setdefault("413", {"$ref": "#/components/responses/TooLarge"})
        responses.setdefault("431", {"$ref": "#/components/responses/HeadersTooLarge"})
        if not route.public:
            responses.setdefault("429", {"$ref": "#/components/responses/TooManyRequests"})
        operation["responses"] = responses
        paths.setdefault(route.path, {})[route.method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Session projector query API",
            "version": "1",
            "description": (
                "The caller's conversation list (paged from a per-user snapshot) and badge. Every "
                "route but this description, /metrics, /livez and /readyz needs "
                "`Authorization: Bearer <token>` "
                "(`projector token USER_ID` mints one). Errors are JSON: "
                "{error: {status, code, message}}; bad input is 400, never 500. 64-bit ids "
                "(user_id, sender_id, the member id lists) are decimal strings "
                "(format uint64): a JavaScript number cannot hold them exactly. Requests may name "
                "members by that string (or by a JSON integer)."
            ),
        },
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                # /v1/stream only: a short-lived ticket (POST /v1/stream/ticket) for EventSource.
                "streamTicket": {"type": "apiKey", "in": "query", "name": "access_token"},
            },
            "schemas": {
                **schemas,
                "Error": {
                    "type": "object",
                    "properties": {
                        "error": {
                            "type": "object",
                            "properties": {
                                "status": {"type": "integer"},
                                "code": {"type": "string"},
                                "message": {"type": "string"},
                            },
                            "required": ["status", "code", "message"],
                        }
                    },
                    "required": ["error"],
                },
            },
            "responses": {
                "BadRequest": _error_response(
                    "A parameter or the cursor is invalid (the message says which)"
                ),
                "Unauthorized": _error_response("Missing, invalid or expired bearer token"),
                "TooLarge": _error_response("The request body is over PROJECTOR_API_MAX_BODY_BYTES"),
                "HeadersTooLarge": _error_response(
                    "The request line and headers are over PROJECTOR_API_MAX_HEADER_BYTES together"
                ),
                "TooManyRequests": {
                    **_error_response("This user sent more than PROJECTOR_API_RATE_LIMIT_PER_S allows"),
                    "headers": {
                        "Retry-After": {
                            "description": "Seconds until the next request is accepted",
                            "schema": {"type": "integer", "minimum": 1},
                        }
                    },
                },
                "Unavailable": {
                    **_error_response("The projection store (or Cassandra) is unavailable"),
                    "headers": {
                        "Retry-After": {
                            "description": "Seconds to wait before retrying (every 503 has it)",
                            "schema": {"type": "integer"},
                        }
                    },
                },
            },
        },
    }
