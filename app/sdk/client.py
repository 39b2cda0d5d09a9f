"""HTTP client of the query API, with the page walk that restarts when the server says so."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import aiohttp
import orjson

from app.domain.wire_ids import row_from_client


class ClientError(Exception):
    """The API answered with an error (status, code and message from its JSON body)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


MAX_RETRY_AFTER_S = 30.0


class _Busy(Exception):
    """A 429/503 with Retry-After: try again after `after_s`."""

    def __init__(self, error: ClientError, after_s: float) -> None:
        super().__init__(str(error))
        self.error = error
        self.after_s = after_s


def _retry_after_s(value: str | None) -> float | None:
    """Retry-After in seconds (the API sends delta-seconds; an HTTP date is not waited for)."""
    if value is None or not value.strip().isdigit():
        return None
    return min(float(value.strip()), MAX_RETRY_AFTER_S)


class TooManyRestarts(RuntimeError):
    """The list's structure kept changing during the walk more often than allowed."""


@dataclass(frozen=True, slots=True)
class Page:
    items: list[dict[str, Any]]
    next_cursor: str | None
    snapshot_revision: int
    projection_complete: bool
    projection_mailbox_seq: int
    filled_from_state: bool
    restarted: bool  # this page starts the walk over: drop what the walk collected before it


@dataclass(slots=True)
class Walk:
    """A whole folder, walked page by page within one snapshot revision."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    snapshot_revision: int = 0
    projection_mailbox_seq: int = 0
    restarts: int = 0
    pages: int = 0


@dataclass(frozen=True, slots=True)
class ReconcileAnswer:
    """POST /v1/reconcile's answer (docs/contract.md §10, "Reconcile on request")."""

    accepted: bool  # 202: the owning worker reconciles the user (frames say what changed)
    retry_after_s: int | None  # not accepted: a reconcile was asked within the interval; ask then
    min_interval_s: int | None  # accepted: the next one may be asked this many seconds from now


class SessionsClient:
    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        session: aiohttp.ClientSession | None = None,
        busy_retries: int = 5,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        # 429 (this user's rate limit) and 503 (not ready) say when to come back: the client waits
        # that long (at most MAX_RETRY_AFTER_S) and asks again, this many times per request.
        self.busy_retries = busy_retries
        self._headers = {"Authorization": f"Bearer {token}"}
        self._session = session
        self._owns_session = session is None

    @property
    def headers(self) -> dict[str, str]:
        """The authentication headers of every request (the live stream sends them too)."""
        return dict(self._headers)

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        return self._session

    async def __aenter__(self) -> SessionsClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._owns_session and self._session is not None:
            await self._session.close()
            self._session = None

    async def _get(self, path: str, params: dict[str, str]) -> dict[str, Any]:
        for attempt in itertools.count():
            try:
                return await self._get_once(path, params)
            except _Busy as busy:
                if attempt >= self.busy_retries:
                    raise busy.error from None
                await asyncio.sleep(busy.after_s)
        raise AssertionError("unreachable")

    async def _get_once(self, path: str, params: dict[str, str]) -> dict[str, Any]:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        async with self._session.get(self.base_url + path, params=params, headers=self._headers) as resp:
            text = await resp.read()
            try:
                body = orjson.loads(text)
            except orjson.JSONDecodeError:  # a proxy's HTML error page, a truncated body
                raise ClientError(
                    resp.status, "invalid_response", text[:200].decode(errors="replace")
                ) from None
            if resp.status != 200 or not isinstance(body, dict):
                error = body.get("error", {}) if isinstance(body, dict) else {}
                code, message = str(error.get("code", "?")), str(error.get("message", body))
                failure = ClientError(resp.status, code, message)
                after = _retry_after_s(resp.headers.get("Retry-After"))
                if resp.status in (429, 503) and after is not None:
                    raise _Busy(failure, after)
                raise failure
            return body

    async def page(self, folder: str = "main", limit: int = 50, cursor: str | None = None) -> Page:
        params = {"folder": folder, "limit": str(limit)}
        if cursor is not None:
            params["cursor"] = cursor
        body = await self._get("/v1/sessions", params)
        return Page(
            # Rows carry user_id as a decimal string (docs/contract.md §9); Python holds it as an int.
            items=[row_from_client(row) for row in body["items"]],
            next_cursor=body["next_cursor"],
            snapshot_revision=body["snapshot_revision"],
            projection_complete=body["projection_complete"],
            projection_mailbox_seq=body["projection_mailbox_seq"],
            filled_from_state=body["filled_from_state"],
            restarted=not body["projection_complete"],
        )

    async def badge(self) -> dict[str, Any]:
        return await self._get("/v1/badge", {})

    async def reconcile(self) -> ReconcileAnswer:
        """Ask for a reconcile of the caller ("fix my count"): 202 → accepted; 429
        reconcile_too_soon → not accepted, with the seconds to wait (not retried: the interval is
        minutes). Any other error raises ClientError (a 503 is retried after its Retry-After)."""
        for attempt in itertools.count():
            async with self.session.post(self.base_url + "/v1/reconcile", headers=self._headers) as resp:
                text = await resp.read()
                try:
                    body = orjson.loads(text)
                except orjson.JSONDecodeError:
                    raise ClientError(
                        resp.status, "invalid_response", text[:200].decode(errors="replace")
                    ) from None
                if resp.status == 202 and isinstance(body, dict):
                    return ReconcileAnswer(True, None, int(body["min_interval_s"]))
                error = body.get("error", {}) if isinstance(body, dict) else {}
                code, message = str(error.get("code", "?")), str(error.get("message", body))
                raw_after = resp.headers.get("Retry-After", "")
                if resp.status == 429 and code == "reconcile_too_soon" and raw_after.strip().isdigit():
                    return ReconcileAnswer(False, int(raw_after), None)
                after = _retry_after_s(raw_after)
                if resp.status in (429, 503) and after is not None and attempt < self.busy_retries:
                    await asyncio.sleep(after)
                    continue
                raise ClientError(resp.status, code, message)
        raise AssertionError("unreachable")

    async def pages(
        self, folder: str = "main", limit: int = 50, max_restarts: int = 3
    ) -> AsyncIterator[Page]:
        """Every page of the folder. When the server answers a cursor with
        ``projection_complete = false`` (the list's structure changed, or the snapshot expired),
        that answer is already the first page of a new revision: it is yielded with
        ``restarted = True`` and the walk goes on from it. More than ``max_restarts`` restarts
        raise TooManyRestarts (a list being reshuffled faster than it can be read)."""
        cursor: str | None = None
        restarts = 0
        while True:
            page = await self.page(folder, limit, cursor)
            if page.restarted:
                restarts += 1
                if restarts > max_restarts:
                    raise TooManyRestarts(
                        f"the {folder} list changed structure {restarts} times during one walk"
                    )
            yield page
            cursor = page.next_cursor
            if cursor is None:
                return

    async def walk(self, folder: str = "main", limit: int = 50, max_restarts: int = 3) -> Walk:
        walk = Walk()
        async for page in self.pages(folder, limit, max_restarts):
            if page.restarted:
                walk.rows.clear()
                walk.restarts += 1
            walk.rows.extend(page.items)
            walk.snapshot_revision = page.snapshot_revision
            walk.projection_mailbox_seq = page.projection_mailbox_seq
            walk.pages += 1
        return walk
