"""The member API as the client store sees it: a port, its errors, and the HTTP adapter.

Errors are classified here, once, so the store never guesses: :class:`MemberAccessDenied`
(codes 2001/2002, the only "drop the cache" answers), :class:`MemberRequestError` (a request
the server refused for another reason, e.g. 400), :class:`MemberUnavailable` (network, 5xx,
timeouts: keep the list and retry later).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from app.members.model import (
    ACCESS_CODES,
    MemberPage,
    PresentationResult,
    Profile,
    ReadReceiptsPage,
    parse_user_id,
)


class MemberSourceError(Exception):
    """Root of the member read contract's failures."""


class MemberAccessDenied(MemberSourceError):
    """2001 (caller not, or no longer, an active member) or 2002 (conversation disabled)."""

    def __init__(self, code: int, message: str = "") -> None:
        if code not in ACCESS_CODES:
            raise ValueError(f"not an access code: {code}")
        self.code = code
        super().__init__(f"member access denied ({code}){': ' + message if message else ''}")


class MemberRequestError(MemberSourceError):
    """The server refused the request for a reason that says nothing about membership."""

    def __init__(self, status: int, code: int | None, message: str) -> None:
        self.status = status
        self.code = code
        super().__init__(f"member request refused: HTTP {status} code={code} {message}".rstrip())


class MemberUnavailable(MemberSourceError):
    """Network failure, timeout or server error: transient, the cached list stays."""


class TraversalLimitExceeded(MemberSourceError):
    """A traversal reached its page limit; the pages read so far are kept, not trusted whole."""


class MemberSource(Protocol):
    """What the store needs from the server (group = ``chat_session_uid``)."""

    async def page(self, group: str, page_ref: str | None, limit: int, active_only: bool) -> MemberPage:
        """One roster page; ``page_ref`` = the previous page's opaque ``next_ref`` (None: first)."""
        ...

    async def by_user_ids(
        self, group: str, user_ids: Sequence[int], include_stats: bool
    ) -> PresentationResult: ...


class ProfileSource(Protocol):
    """Public profiles in batches (names, avatars); a missing id = that profile failed."""

    async def profiles(self, user_ids: Sequence[int]) -> dict[int, Profile]: ...


class HttpMemberSource:
    """:class:`MemberSource` over the projector API (``aiohttp`` client, bearer token)."""

    def __init__(self, base_url: str, token: str, session: Any, *, timeout_s: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.session = session  # an aiohttp.ClientSession the caller owns
        self.timeout_s = timeout_s

    async def page(self, group: str, page_ref: str | None, limit: int, active_only: bool) -> MemberPage:
        body: dict[str, Any] = {"chat_session_uid": group, "limit": limit, "active_only": active_only}
        if page_ref is not None:
            body["page_ref"] = page_ref
        answer = await self._post("/api/v1/chats/members/page", body)
        try:
            return MemberPage.from_wire(answer)
        except (ValueError, TypeError) as exc:
            raise MemberUnavailable(f"malformed page answer: {exc}") from None

    async def by_user_ids(
        self, group: str, user_ids: Sequence[int], include_stats: bool
    ) -> PresentationResult:
        body = {"chat_session_uid": group, "user_ids": list(user_ids), "include_stats": include_stats}
        answer = await self._post("/api/v1/chats/members/by-user-ids", body)
        try:
            return PresentationResult.from_wire(answer)
        except (ValueError, TypeError) as exc:
            raise MemberUnavailable(f"malformed by-user-ids answer: {exc}") from None

    async def set_remark(self, user_id: int, remark: str) -> str | None:
        """Set the caller's own remark on ``user_id``; the server's stored (trimmed) text. A
        remark the server refuses (empty, too long, control characters) is a
        :class:`MemberRequestError` (400)."""
        answer = await self._request("PUT", f"/api/v1/users/{user_id}/remark", {"remark": remark})
        stored = answer.get("remark")
        return stored if isinstance(stored, str) else None

    async def clear_remark(self, user_id: int) -> None:
        """Clear the caller's own remark on ``user_id`` (none to clear is fine)."""
        await self._request("DELETE", f"/api/v1/users/{user_id}/remark", None)

    async def read_receipts(
        self,
        group: str,
        conversation_seq: int,
        *,
        basic_only: bool = True,
        limit: int | None = None,
        page_ref: str | None = None,
    ) -> ReadReceiptsPage:
        """One page of who has read message ``conversation_seq`` (404 unknown message: a
        :class:`MemberRequestError`; over the server's budget: :class:`MemberUnavailable`)."""
        from urllib.parse import quote, urlencode

        params: dict[str, str] = {"basic_only": "true" if basic_only else "false"}
        if limit is not None:
            params["limit"] = str(limit)
        if page_ref is not None:
            params["page_ref"] = page_ref
        path = (
            f"/api/v1/chats/{quote(group, safe='')}/messages/{conversation_seq}/readers?{urlencode(params)}"
        )
        answer = await self._request("GET", path, None)
        try:
            return ReadReceiptsPage.from_wire(answer)
        except (ValueError, TypeError, AttributeError) as exc:
            raise MemberUnavailable(f"malformed readers answer: {exc}") from None

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self._request("POST", path, body)

    async def _request(self, method: str, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
        import aiohttp

        headers = {"Authorization": f"Bearer {self.token}"}
        try:
            async with self.session.request(
                method,
                self.base_url + path,
                json=body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            ) as response:
                status = response.status
                try:
                    payload = await response.json(content_type=None)
                except ValueError:
                    payload = None
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise MemberUnavailable(f"{path}: {type(exc).__name__}: {exc}") from None
        if status == 200 and isinstance(payload, dict):
            return payload
        raise classify_error(status, payload)


class HttpProfileSource:
    """:class:`ProfileSource` over the projector API (``POST /api/v1/users/profiles``, 1..50 ids,
    served from Cassandra's ``member_profiles``). A user the server has no profile for is left
    out (that profile failed: the store keeps the old avatar); a failed call raises, and the
    store marks the whole batch as failed."""

    def __init__(self, base_url: str, token: str, session: Any, *, timeout_s: float = 10.0) -> None:
        self._http = HttpMemberSource(base_url, token, session, timeout_s=timeout_s)

    async def profiles(self, user_ids: Sequence[int]) -> dict[int, Profile]:
        answer = await self._http._post("/api/v1/users/profiles", {"user_ids": [str(u) for u in user_ids]})
        out: dict[int, Profile] = {}
        try:
            for item in answer.get("items") or ():
                name, avatar = item.get("display_name"), item.get("avatar_url")
                out[parse_user_id(item.get("user_id"))] = Profile(
                    display_name=name if isinstance(name, str) else None,
                    avatar_url=avatar if isinstance(avatar, str) else None,
                )
        except (ValueError, TypeError, AttributeError) as exc:
            raise MemberUnavailable(f"malformed profiles answer: {exc}") from None
        return out


def classify_error(status: int, payload: Any) -> MemberSourceError:
    """The one place an HTTP answer becomes a member error (the store acts on the class)."""
    error = payload.get("error") if isinstance(payload, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    message = str(error.get("message", "")) if isinstance(error, dict) else ""
    # The API renders codes as strings ("2001"); accept the number too.
    if isinstance(code, str) and code.isascii() and code.isdigit():
        code = int(code)
    if isinstance(code, int) and not isinstance(code, bool) and code in ACCESS_CODES:
        return MemberAccessDenied(code, message)
    if status >= 500 or status in (408, 429):
        return MemberUnavailable(f"HTTP {status} {message}".rstrip())
    return MemberRequestError(status, code if isinstance(code, int) else None, message)
