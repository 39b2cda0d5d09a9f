"""What the query API refuses before any handler runs, and what it never writes to a log.

* Request size: headers over ``api_max_header_bytes`` (the request line and every header line
  together) are answered 431, a body over ``api_max_body_bytes`` (by its Content-Length; the
  handlers that read a body bound what they read as well) 413. aiohttp's own parser limits are
  raised above ours (:func:`runner_args`), so the answer is our clear JSON error, not its bare
  400; only a single line past ``PARSER_LINE_MAX`` still gets aiohttp's 400.
* Request rate: a token bucket per authenticated user (``api_rate_limit_per_s`` refill,
  ``api_rate_limit_burst`` capacity); an empty bucket is 429 with ``Retry-After``. The bucket is
  the fleet's, in the projection store (:class:`FleetRateLimiter`): N processes behind a balancer
  enforce the configured rate together, not N times it (issue 32). A store that cannot answer
  fails open or closed (``api_rate_limit_on_store_error``), counted.
* The access log (``PROJECTOR_API_ACCESS_LOG``): method, path *without its query* (a stream
  ticket travels in ``?access_token=``, a cursor in ``?cursor=``), status, size and time; never
  a header (the bearer token).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any, Final

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import StreamResponse

from app.api.fleet import FleetState, RateLimiter
from app.api.http import ApiError, Handler
from app.settings import ApiSettings
from app.stores.redis_projection import ProjectionStoreError

__all__ = ["FleetRateLimiter", "RateLimiter", "RedactedAccessLogger", "rate_limited", "runner_args"]

log = logging.getLogger(__name__)

# aiohttp's parser refuses a longer single line (request line or header) with a bare 400; ours
# (the total) is checked after parsing, so it must be below this to be the one that answers.
PARSER_LINE_MAX: Final = 2 * 1024 * 1024
PARSER_HEADERS_MAX: Final = 1024


def runner_args(api: ApiSettings) -> dict[str, Any]:
    """Keyword arguments of ``web.AppRunner`` (and ``TestServer``), which passes them to every
    request handler: aiohttp's parser limits above the API's own. Not ``handler_args=``: the
    runner takes them as its own keywords (tests/integration/test_api_server_args.py)."""
    line = max(PARSER_LINE_MAX, api.api_max_header_bytes + 1)
    return {"max_line_size": line, "max_field_size": line, "max_headers": PARSER_HEADERS_MAX}


def header_bytes(request: web.BaseRequest) -> int:
    """The size of the request line and the header lines as sent (near enough: ": " and CRLF)."""
    size = len(request.method) + len(request.raw_path) + 12
    for name, value in request.raw_headers:
        size += len(name) + len(value) + 4
    return size


def size_limits(api: ApiSettings) -> Any:
    max_headers = api.api_max_header_bytes
    max_body = api.api_max_body_bytes

    @web.middleware
    async def limits(request: web.Request, handler: Handler) -> web.StreamResponse:
        if header_bytes(request) > max_headers:
            raise ApiError(
                431, "headers_too_large", f"request line and headers over {max_headers} bytes together"
            )
        if request.content_length is not None and request.content_length > max_body:
            raise ApiError(413, "too_large", f"request body over {max_body} bytes")
        return await handler(request)

    return limits


class FleetRateLimiter:
    """The per-user token bucket of the whole fleet (issue 32): one atomic step in the projection
    store per request (app/stores/redis_fleet.py), so N instances enforce the configured rate,
    not N times it. When the store cannot answer, ``on_store_error`` decides: ``open`` lets the
    request through, ``closed`` answers 503; either way it is counted (``store_errors``)."""

    def __init__(
        self, fleet: FleetState, rate: float, burst: int, clock_ms: Callable[[], int], on_store_error: str
    ) -> None:
        self.fleet = fleet
        self.rate = rate
        self.burst = float(burst)
        self.clock_ms = clock_ms
        self.fail_open = on_store_error == "open"
        self.limited = 0
        self.store_errors = 0

    async def take(self, user_id: int) -> float:
        """0 when the request may go; else the seconds until the user's next token."""
        try:
            wait_ms = await self.fleet.take_token(user_id, self.burst, self.rate, self.clock_ms())
        except ProjectionStoreError as exc:
            self.store_errors += 1
            if self.fail_open:
                log.warning("rate limit not checked (store unavailable; failing open): %s", exc)
                return 0.0
            raise ApiError(
                503,
                "unavailable",
                "the rate limit cannot be checked (store unavailable); retry later",
                headers={"Retry-After": "1"},
            ) from None
        if wait_ms > 0:
            self.limited += 1
        return wait_ms / 1000


async def rate_limited(limiter: FleetRateLimiter, user_id: int) -> None:
    """429 with Retry-After (whole seconds, at least 1) when the user's bucket is empty."""
    wait = await limiter.take(user_id)
    if wait > 0:
        raise ApiError(
            429,
            "rate_limited",
            f"more than {limiter.rate:g} requests/s (burst {limiter.burst:g}) from this user; "
            "retry after the Retry-After seconds",
            headers={"Retry-After": str(max(1, math.ceil(wait)))},
        )


class RedactedAccessLogger(AbstractAccessLogger):
    """One line per request with no query string and no header: what a log may keep."""

    def log(self, request: BaseRequest, response: StreamResponse, time: float) -> None:
        self.logger.info(
            "%s %s %d %d %.6f",
            request.method,
            request.path,
            response.status,
            response.body_length,
            time,
            extra={
                "remote_address": request.remote,
                "request_method": request.method,
                "request_path": request.path,
                "response_status": response.status,
                "response_size": response.body_length,
                "request_time": round(time, 6),
            },
        )

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(20)  # INFO
