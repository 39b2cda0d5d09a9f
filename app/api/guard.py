"""What the query API refuses before any handler runs, and what it never writes to a log.

* Request size: headers over ``api_max_header_bytes`` (the request line and every header line
  together) are answered 431, a body over ``api_max_body_bytes`` (by its Content-Length; the
  handlers that read a body bound what they read as well) 413. aiohttp's own parser limits are
  raised above ours (:func:`runner_args`), so the answer is our clear JSON error, not its bare
  400; only a single line past ``PARSER_LINE_MAX`` still gets aiohttp's 400.
* Request rate: a token bucket per authenticated user in this process (``api_rate_limit_per_s``
  refill, ``api_rate_limit_burst`` capacity); an empty bucket is 429 with ``Retry-After``.
  Buckets live in this process only: N processes behind a balancer give a user up to N times
  the rate (README, "Security").
* The access log (``PROJECTOR_API_ACCESS_LOG``): method, path *without its query* (a stream
  ticket travels in ``?access_token=``, a cursor in ``?cursor=``), status, size and time; never
  a header (the bearer token).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Final

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import StreamResponse

from app.api.http import ApiError, Handler
from app.settings import Settings

# aiohttp's parser refuses a longer single line (request line or header) with a bare 400; ours
# (the total) is checked after parsing, so it must be below this to be the one that answers.
PARSER_LINE_MAX: Final = 2 * 1024 * 1024
PARSER_HEADERS_MAX: Final = 1024
# Buckets kept at most (the least recently used beyond it are dropped: a dropped bucket is full
# again, which only ever errs towards letting a request through).
BUCKETS_MAX: Final = 100_000


def runner_args(settings: Settings) -> dict[str, Any]:
    """Keyword arguments of ``web.AppRunner`` (and ``TestServer``), which passes them to every
    request handler: aiohttp's parser limits above the API's own. Not ``handler_args=``: the
    runner takes them as its own keywords (tests/integration/test_api_server_args.py)."""
    line = max(PARSER_LINE_MAX, settings.api_max_header_bytes + 1)
    return {"max_line_size": line, "max_field_size": line, "max_headers": PARSER_HEADERS_MAX}


def header_bytes(request: web.BaseRequest) -> int:
    """The size of the request line and the header lines as sent (near enough: ": " and CRLF)."""
    size = len(request.method) + len(request.raw_path) + 12
    for name, value in request.raw_headers:
        size += len(name) + len(value) + 4
    return size


def size_limits(settings: Settings) -> Any:
    max_headers = settings.api_max_header_bytes
    max_body = settings.api_max_body_bytes

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


class RateLimiter:
    """Token buckets per user: `rate` tokens a second up to `burst`; the clock (ms) is injected."""

    def __init__(self, rate: float, burst: int, clock_ms: Callable[[], int]) -> None:
        self.rate = rate
        self.burst = float(burst)
        self.clock_ms = clock_ms
        self.buckets: OrderedDict[int, tuple[float, int]] = OrderedDict()  # user -> (tokens, at ms)
        self.limited = 0

    def take(self, user_id: int) -> float:
        """0 when the request may go; else the seconds until the user's next token."""
        now = self.clock_ms()
        tokens, at = self.buckets.pop(user_id, (self.burst, now))
        tokens = min(self.burst, tokens + max(0, now - at) * self.rate / 1000)
        wait = 0.0
        if tokens >= 1:
            tokens -= 1
        else:
            wait = (1 - tokens) / self.rate
            self.limited += 1
        self.buckets[user_id] = (tokens, now)
        if len(self.buckets) > BUCKETS_MAX:
            self.buckets.popitem(last=False)
        return wait


def rate_limited(limiter: RateLimiter, user_id: int) -> None:
    """429 with Retry-After (whole seconds, at least 1) when the user's bucket is empty."""
    wait = limiter.take(user_id)
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
