"""Member directory routes (docs/contract.md §8, seed 004), same bearer authentication as the rest.

* ``POST /api/v1/chats/members/page`` — one keyset page of a group's roster.
* ``POST /api/v1/chats/members/by-user-ids`` — 1..50 members (active or not, marked), with
  statistics on request within a 2 s budget (dropped, never zeroed, when late).
* ``PUT`` / ``DELETE /api/v1/users/{user_id}/remark`` — set or clear the caller's own remark
  (备注) on a user; the presentation above hands the caller's remarks out (``remark``, with
  ``remarks_included``), so every client of that caller converges on the server's value.
* ``GET /api/v1/chats/{chat_session_uid}/messages/{conversation_seq}/readers`` — who of the
  active members has read up to that message, a page at a time (``limit``, ``page_ref``), within
  a 2 s budget (503 ``timeout``); 404 for a message the group does not have.

Page references are opaque (app/api/member_refs.py): signed like the session cursors and bound
to the caller, the group and the walk.

Access is checked on every call: 403 with code ``"2001"`` (the caller is not, or no longer, an
active member) or ``"2002"`` (the conversation is disabled). These two codes mean "drop your
cached roster" to clients and are produced nowhere else. Bad input is 400.

The service comes from ``deps.extra["members"]`` (a :class:`~app.members.server.MemberService`,
see :func:`build_member_service`); without it the routes answer 503.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable, Mapping
from decimal import Decimal
from typing import Any, Final

from aiohttp import web

from app.api.cursor import CursorError
from app.api.http import ApiContext, ApiError, Route, bad_request, context, current_user, or_empty, query
from app.api.member_refs import READERS_PURPOSE, MemberPageRef, MemberRefCodec
from app.domain.wire_ids import ID_SCHEMA, id_text
from app.members.model import BY_IDS_MAX, PAGE_LIMIT_DEFAULT, PAGE_LIMIT_MAX, BaseMember, parse_user_id
from app.members.remarks import REMARK_MAX_CHARS, REMARK_PATTERN, InvalidRemark, RemarkStore, check_remark
from app.members.server import (
    READERS_LIMIT_DEFAULT,
    READERS_LIMIT_MAX,
    MemberService,
    ReadersTimeout,
    UnknownMessage,
)
from app.members.source import MemberAccessDenied
from app.stores.cassandra_exec import StoreError

SERVICE_KEY: Final = "members"
_PAGE_FIELDS: Final = frozenset({"chat_session_uid", "page_ref", "limit", "active_only"})
_BY_IDS_FIELDS: Final = frozenset({"chat_session_uid", "user_ids", "include_stats"})
_PROFILE_FIELDS: Final = frozenset({"user_ids"})
_REMARK_FIELDS: Final = frozenset({"remark"})
PROFILES_BUDGET_S: Final = 2.0
_MAX_BODY: Final = 64 * 1024  # 50 ids and a uuid fit many times over
_SEQ_MAX: Final = 2**64 - 2


def build_member_service(session: Any, keyspace: str, stats_budget_ms: int) -> MemberService:
    """The production service: Cassandra reads, the configured statistics budget."""
    from app.stores.cassandra_members import CassandraMemberReader
    from app.stores.cassandra_profiles import CassandraProfileStore
    from app.stores.cassandra_remarks import CassandraRemarkStore

    return MemberService(
        CassandraMemberReader(session, keyspace),
        stats_budget_s=stats_budget_ms / 1000,
        profiles=CassandraProfileStore(session, keyspace),
        remarks=CassandraRemarkStore(session, keyspace),
    )


def _service(request: web.Request) -> MemberService:
    service = context(request).deps.extra.get(SERVICE_KEY)
    if not isinstance(service, MemberService):
        raise ApiError(503, "unavailable", "the member directory is not configured on this server")
    return service


def _denied(exc: MemberAccessDenied) -> ApiError:
    return ApiError(403, str(exc.code), str(exc))


async def _body(request: web.Request, allowed: frozenset[str]) -> dict[str, Any]:
    if request.content_length is not None and request.content_length > _MAX_BODY:
        raise ApiError(413, "too_large", f"request body over {_MAX_BODY} bytes")
    raw = bytearray()
    # read(n) may return less than n before the end (chunked bodies): read until EOF, bounded.
    while chunk := await request.content.read(_MAX_BODY + 1 - len(raw)):
        raw += chunk
        if len(raw) > _MAX_BODY:
            raise ApiError(413, "too_large", f"request body over {_MAX_BODY} bytes")

    try:
        # Numbers with a fraction or an exponent as exact decimals: JSON's 91.0 or 1e2 is an
        # integer (JSON Schema says so too, and the description's integers allow them), and a
        # float would round a u64 id above 2^53.
        body = json.loads(raw, parse_float=Decimal, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        raise bad_request("the body must be a JSON object") from None
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise bad_request(f"unknown field(s) {unknown} (known: {sorted(allowed)})")
    return body


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _integral(value: object) -> object:
    """A JSON number with an integral value (91, 91.0, 9.1e1) as an int; anything else as is."""
    if (
        isinstance(value, Decimal)
        and value.is_finite()
        and value.adjusted() < 21  # past u64 anyway: never expand 1e999999999 into an int
        and value == value.to_integral_value()
    ):
        return int(value)
    return value


def _group(body: Mapping[str, Any]) -> str:
    value = body.get("chat_session_uid")
    if not isinstance(value, str):
        raise bad_request("chat_session_uid (a UUID string) is required")
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise bad_request(f"chat_session_uid is not a UUID: {value[:64]!r}") from None


def _bool(body: Mapping[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise bad_request(f"{name} must be a boolean")
    return value


def _user_id(value: object, name: str) -> int:
    try:
        return parse_user_id(_integral(value))
    except ValueError:
        raise bad_request(f"{name} must be a user id (an integer in [0, 2^64))") from None


def _member_json(member: BaseMember) -> dict[str, Any]:
    # The u64 id as a decimal string: JavaScript cannot hold it as a number (docs/contract.md §9).
    return {**member.to_wire(), "user_id": id_text(member.user_id)}


def _ids(user_ids: Any) -> list[str]:
    return [id_text(u) for u in user_ids]


def _opt_id(user_id: int | None) -> str | None:
    return None if user_id is None else id_text(user_id)


def members_page(refs: MemberRefCodec) -> Any:
    async def handler(request: web.Request) -> web.Response:
        caller = current_user(request)
        body = await _body(request, _PAGE_FIELDS)
        group = _group(body)
        limit = _integral(body.get("limit", PAGE_LIMIT_DEFAULT))
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= PAGE_LIMIT_MAX:
            raise bad_request(f"limit must be an integer from 1 to {PAGE_LIMIT_MAX}")
        active_only = _bool(body, "active_only", False)
        after_user_id = None
        ref_text = body.get("page_ref")
        if ref_text is not None:
            if not isinstance(ref_text, str):
                raise bad_request("page_ref must be the string a previous page returned")
            try:
                after_user_id = refs.decode(
                    ref_text, account=caller, group=group, active_only=active_only
                ).after_user_id
            except CursorError as exc:
                raise bad_request(str(exc)) from None
        try:
            page = await _service(request).page(group, caller, after_user_id, limit, active_only)
        except MemberAccessDenied as exc:
            raise _denied(exc) from None
        next_ref = None
        if page.next_user_id is not None:
            next_ref = refs.encode(MemberPageRef(caller, group, page.next_user_id, active_only))
        return web.json_response(
            {
                "items": [_member_json(m) for m in page.items],
                "has_more": page.has_more,
                "next_page_ref": next_ref,
                "self_role": page.self_role,
                "capabilities": page.capabilities,
                "join_events": [
                    {
                        "event_ref": event.event_ref,
                        "joined_at_conversation_seq": event.joined_at,
                        "invitee_refs": _ids(event.invitees),
                    }
                    for event in page.join_events
                ],
            }
        )

    return handler


async def members_by_user_ids(request: web.Request) -> web.Response:
    caller = current_user(request)
    body = await _body(request, _BY_IDS_FIELDS)
    group = _group(body)
    ids = body.get("user_ids")
    if not isinstance(ids, list) or not 1 <= len(ids) <= BY_IDS_MAX:
        raise bad_request(f"user_ids must be a list of 1 to {BY_IDS_MAX} user ids")
    user_ids = [_user_id(u, "user_ids[]") for u in ids]
    include_stats = _bool(body, "include_stats", False)
    try:
        result = await _service(request).present(group, caller, user_ids, include_stats)
    except MemberAccessDenied as exc:
        raise _denied(exc) from None
    items = []
    for member in result.items:
        item = _member_json(member)
        if result.stats is not None:
            # Both or neither: a response without them means "unknown", never zero.
            counts = result.stats.get(member.user_id)
            if counts is not None:
                item["record_count"], item["mention_count"] = counts
        if result.remarks is not None:
            # The caller's own remark, null for none: with remarks_included the server's word
            # (a client clears what it had); without it, absent (a client keeps what it had).
            item["remark"] = result.remarks.get(member.user_id)
        items.append(item)
    return web.json_response(
        {
            "items": items,
            "missing_user_ids": _ids(result.missing_user_ids),
            "stats_included": result.stats is not None,
            "remarks_included": result.remarks is not None,
            "self_role": result.self_role,
        }
    )


def _remark_target(request: web.Request, caller: int) -> int:
    text = request.match_info["user_id"]
    try:
        target = parse_user_id(text)
    except ValueError:
        raise bad_request(
            f"user_id must be a user id (a decimal integer in [0, 2^64)), got {text[:32]!r}"
        ) from None
    if target == caller:
        raise bad_request("a remark is about another user: the caller cannot set one on itself")
    return target


def _remark_store(request: web.Request) -> RemarkStore:
    store = _service(request).remark_store
    if store is None:
        raise ApiError(503, "unavailable", "this server keeps no remarks")
    return store


async def _remark_from_body(request: web.Request) -> str:
    """PUT's remark: required, 1..64 characters without control characters after trimming."""
    body = await _body(request, _REMARK_FIELDS)
    if "remark" not in body:
        raise bad_request("remark (a string of 1 to 64 characters) is required; DELETE clears it")
    try:
        return check_remark(body["remark"])
    except InvalidRemark as exc:
        raise bad_request(str(exc), "invalid_remark") from None


async def _no_remark(request: web.Request) -> None:
    """DELETE's remark: none, and no body."""
    if request.can_read_body and await request.content.read(1):
        raise bad_request("DELETE takes no body")


async def _change_remark(
    request: web.Request, read_remark: Callable[[web.Request], Awaitable[str | None]]
) -> web.Response:
    """PUT and DELETE of the caller's remark on a user, checked in one order: the target (400 for
    a bad id or the caller itself), then the request's remark (``read_remark``; None clears),
    then the store (503 when this server keeps none or it fails). The answer is the remark the
    server now holds."""
    caller = current_user(request)
    target = _remark_target(request, caller)
    remark = await read_remark(request)
    store = _remark_store(request)
    try:
        if remark is None:
            await store.clear_remark(caller, target)
        else:
            await store.set_remark(caller, target, remark, context(request).deps.clock_ms())
    except StoreError as exc:
        raise ApiError(503, "unavailable", str(exc)) from None
    return web.json_response({"user_id": id_text(target), "remark": remark})


async def put_remark(request: web.Request) -> web.Response:
    """Set (or replace) the caller's remark on a user: 400 for a bad id, the caller itself, or a
    remark that is not 1..64 characters without control characters (after trimming)."""
    return await _change_remark(request, _remark_from_body)


async def delete_remark(request: web.Request) -> web.Response:
    """Clear the caller's remark on a user (clearing none is fine: the answer is the same)."""
    return await _change_remark(request, _no_remark)


def message_readers(refs: MemberRefCodec) -> Any:
    async def handler(request: web.Request) -> web.Response:
        caller = current_user(request)
        params = query(request, frozenset({"basic_only", "limit", "page_ref"}))
        basic = params.get("basic_only", "false")
        if basic not in ("true", "false"):
            raise bad_request("basic_only must be true or false")
        limit_text = params.get("limit", str(READERS_LIMIT_DEFAULT))
        if (
            not limit_text.isascii()
            or not limit_text.isdigit()
            or not 1 <= int(limit_text) <= READERS_LIMIT_MAX
        ):
            raise bad_request(f"limit must be an integer from 1 to {READERS_LIMIT_MAX}")
        group = _group({"chat_session_uid": request.match_info["chat_session_uid"]})
        seq_text = request.match_info["conversation_seq"]
        if not seq_text.isascii() or not seq_text.isdigit() or not 1 <= int(seq_text) <= _SEQ_MAX:
            raise bad_request("conversation_seq must be a positive integer")
        after_user_id = None
        if "page_ref" in params:
            try:
                after_user_id = refs.decode(
                    params["page_ref"], account=caller, group=group, active_only=True
                ).after_user_id
            except CursorError as exc:
                raise bad_request(str(exc)) from None
        try:
            readers = await _service(request).readers(
                group, caller, int(seq_text), after_user_id=after_user_id, limit=int(limit_text)
            )
        except MemberAccessDenied as exc:
            raise _denied(exc) from None
        except UnknownMessage as exc:
            raise ApiError(404, "unknown_message", str(exc)) from None
        except ReadersTimeout as exc:
            raise ApiError(503, "timeout", str(exc)) from None
        next_ref = None
        if readers.next_user_id is not None:
            next_ref = refs.encode(MemberPageRef(caller, group, readers.next_user_id, True))
        out: dict[str, Any] = {
            "conversation_seq": readers.conversation_seq,
            "sender_id": _opt_id(readers.sender_id),
            "read_user_ids": _ids(m.user_id for m in readers.read),
            "unread_user_ids": _ids(m.user_id for m in readers.unread),
            "read_count": len(readers.read),
            "unread_count": len(readers.unread),
            "basic_only": basic == "true",
            "self_role": readers.self_role,
            "has_more": readers.has_more,
            "next_page_ref": next_ref,
        }
        if basic == "false":
            # The full projection adds what the server knows of each member (no profiles: those
            # come from the client's member store, which the UI subscribes to).
            for name, members in (("read", readers.read), ("unread", readers.unread)):
                out[name] = [
                    {
                        "user_id": id_text(m.user_id),
                        "role": m.role,
                        "read_conversation_seq": readers.read_seqs.get(m.user_id, 0),
                    }
                    for m in members
                ]
        return web.json_response(out)

    return handler


async def user_profiles(request: web.Request) -> web.Response:
    """Public profiles of 1..50 users (names, avatars): the member store's ProfileSource."""
    current_user(request)
    body = await _body(request, _PROFILE_FIELDS)
    ids = body.get("user_ids")
    if not isinstance(ids, list) or not 1 <= len(ids) <= BY_IDS_MAX:
        raise bad_request(f"user_ids must be a list of 1 to {BY_IDS_MAX} user ids")
    user_ids = list(dict.fromkeys(_user_id(u, "user_ids[]") for u in ids))
    source = _service(request).profile_source
    if source is None:
        raise ApiError(503, "unavailable", "this server has no profile source")
    try:
        found = await asyncio.wait_for(source.profiles(user_ids), PROFILES_BUDGET_S)
    except TimeoutError:
        raise ApiError(503, "timeout", f"profiles not read within {PROFILES_BUDGET_S:.0f}s") from None
    except StoreError as exc:
        raise ApiError(503, "unavailable", str(exc)) from None
    return web.json_response(
        {
            "items": [
                {
                    "user_id": id_text(u),
                    "display_name": found[u].display_name,
                    "avatar_url": found[u].avatar_url,
                }
                for u in user_ids
                if u in found
            ],
            # No profile (or none loaded): the client marks that profile as failed.
            "missing_user_ids": _ids(u for u in user_ids if u not in found),
        }
    )


def routes(ctx: ApiContext) -> list[Route]:
    return [
        Route(
            "POST",
            "/api/v1/chats/members/page",
            members_page(MemberRefCodec(ctx.api.api_secret, ctx.api.api_secret_previous)),
            PAGE_OPERATION,
        ),
        Route("POST", "/api/v1/chats/members/by-user-ids", members_by_user_ids, BY_IDS_OPERATION),
        Route(
            "GET",
            "/api/v1/chats/{chat_session_uid}/messages/{conversation_seq}/readers",
            message_readers(
                MemberRefCodec(ctx.api.api_secret, ctx.api.api_secret_previous, purpose=READERS_PURPOSE)
            ),
            READERS_OPERATION,
        ),
        Route("POST", "/api/v1/users/profiles", user_profiles, PROFILES_OPERATION),
        Route("PUT", "/api/v1/users/{user_id}/remark", put_remark, PUT_REMARK_OPERATION),
        Route("DELETE", "/api/v1/users/{user_id}/remark", delete_remark, DELETE_REMARK_OPERATION),
    ]


_ERRORS: Final[dict[str, Any]] = {
    "400": {"$ref": "#/components/responses/BadRequest"},
    "401": {"$ref": "#/components/responses/Unauthorized"},
    "403": {
        "description": (
            'Access denied: code "2001" = the caller is not (or no longer) an active member, '
            '"2002" = the conversation is disabled. Only these two mean "drop the cached roster".'
        ),
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    },
    "503": {"$ref": "#/components/responses/Unavailable"},
}
# Requests may name a member by a decimal string (what responses carry) or, for older clients, a
# JSON integer; responses always carry strings (ID_SCHEMA).
_UID: Final = {
    "oneOf": [{"type": "integer", "minimum": 0, "maximum": 2**64 - 1}, ID_SCHEMA],
    "description": "A u64 user id: preferably the decimal string responses carry",
}
_NULLABLE_ID: Final = {**ID_SCHEMA, "type": ["string", "null"]}


def _json_body(ref: str) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": {"$ref": ref}}}}


def _ok(ref: str) -> dict[str, Any]:
    return {"description": "OK", "content": {"application/json": {"schema": {"$ref": ref}}}}


PAGE_OPERATION: Final[dict[str, Any]] = {
    "operationId": "membersPage",
    "summary": "One keyset page of a group's members, ascending user_id",
    "description": (
        "Pass next_page_ref as page_ref for the next page: an opaque reference signed by this API "
        "and bound to the caller, the group and active_only (400 otherwise). Every page re-checks "
        "access and carries the caller's self_role, the capabilities the group's settings give "
        "that role, and the page's join events (merge them across pages by event_ref, their "
        "invitees by memberRef). A traversal is not a snapshot: verify members missing from it "
        "with by-user-ids."
    ),
    "requestBody": _json_body("#/components/schemas/MembersPageRequest"),
    "responses": {
        "200": {
            **_ok("#/components/schemas/MembersPage"),
            "links": {
                "NextPage": {
                    "operationId": "membersPage",
                    "requestBody": {
                        "chat_session_uid": "$request.body#/chat_session_uid",
                        "page_ref": "$response.body#/next_page_ref",
                    },
                    "description": "The page after this one (next_page_ref is null at the end)",
                },
                "Readers": {
                    "operationId": "messageReaders",
                    "parameters": {"chat_session_uid": "$request.body#/chat_session_uid"},
                    "description": "Who of this group has read a message",
                },
            },
        },
        **_ERRORS,
    },
}
BY_IDS_OPERATION: Final[dict[str, Any]] = {
    "operationId": "membersByUserIds",
    "summary": "1-50 members by id (active or not), optionally with statistics",
    "description": (
        "With include_stats, record_count and mention_count are added when they are ready within "
        "2 s; otherwise both are absent and stats_included is false (identities always come)."
    ),
    "requestBody": _json_body("#/components/schemas/MembersByUserIdsRequest"),
    "responses": {"200": _ok("#/components/schemas/MembersByUserIds"), **_ERRORS},
}
READERS_OPERATION: Final[dict[str, Any]] = {
    "operationId": "messageReaders",
    "summary": "Which active members have read up to a message, and which have not",
    "parameters": [
        {
            "name": "chat_session_uid",
            "in": "path",
            "required": True,
            "schema": {"type": "string", "format": "uuid"},
        },
        {
            "name": "conversation_seq",
            "in": "path",
            "required": True,
            "schema": {"type": "integer", "minimum": 1, "maximum": _SEQ_MAX},
        },
        {"name": "basic_only", "in": "query", "required": False, "schema": or_empty({"type": "boolean"})},
        {
            "name": "limit",
            "in": "query",
            "required": False,
            "description": "Active members examined per page",
            "schema": {"type": "integer", "minimum": 1, "maximum": READERS_LIMIT_MAX, "default": 100},
        },
        {
            "name": "page_ref",
            "in": "query",
            "required": False,
            "description": "next_page_ref of the previous page (opaque, bound to caller and group)",
            "schema": {"type": "string"},
        },
    ],
    "responses": {
        "200": _ok("#/components/schemas/MessageReaders"),
        **_ERRORS,
        "404": {
            "description": 'No such message in this group (code "unknown_message")',
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
        },
        "503": {
            "description": "Not configured, or the read facts did not come within the 2 s budget "
            '(code "timeout"): retry',
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
        },
    },
}

PROFILES_OPERATION: Final[dict[str, Any]] = {
    "operationId": "userProfiles",
    "summary": "Public profiles (display name, avatar) of 1-50 users",
    "description": (
        "From the member_profiles table (loaded with `projector profiles load`). Users without a "
        "profile are listed in missing_user_ids."
    ),
    "requestBody": _json_body("#/components/schemas/UserProfilesRequest"),
    "responses": {"200": _ok("#/components/schemas/UserProfiles"), **_ERRORS},
}

_REMARK_PATH_ID: Final = {
    "name": "user_id",
    "in": "path",
    "required": True,
    "description": "The user the remark is about (a u64 as a decimal string; not the caller)",
    "schema": ID_SCHEMA,
}
PUT_REMARK_OPERATION: Final[dict[str, Any]] = {
    "operationId": "putRemark",
    "summary": "Set the caller's own remark (备注) on a user",
    "description": (
        f"Private to the caller: only the caller's presentations (by-user-ids) carry it. The text "
        f"is trimmed, then must be 1-{REMARK_MAX_CHARS} characters without control characters or "
        'line breaks (400 code "invalid_remark" otherwise); an empty remark is refused, DELETE '
        "clears. 400 for the caller's own id."
    ),
    "parameters": [_REMARK_PATH_ID],
    "requestBody": _json_body("#/components/schemas/RemarkRequest"),
    "responses": {"200": _ok("#/components/schemas/Remark"), **_ERRORS},
}
DELETE_REMARK_OPERATION: Final[dict[str, Any]] = {
    "operationId": "deleteRemark",
    "summary": "Clear the caller's own remark on a user (none to clear is not an error)",
    "parameters": [_REMARK_PATH_ID],
    "responses": {"200": _ok("#/components/schemas/Remark"), **_ERRORS},
}

_MEMBER: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "user_id": ID_SCHEMA,
        "role": {"type": "string", "enum": ["owner", "admin", "member"]},
        "state": {"type": "string", "enum": ["active", "left", "removed"]},
        "active": {"type": "boolean"},
        "joined_at_conversation_seq": {"type": ["integer", "null"]},
        "left_at_conversation_seq": {"type": ["integer", "null"]},
        "record_count": {"type": "integer", "minimum": 0},
        "mention_count": {"type": "integer", "minimum": 0},
        "remark": {
            "type": ["string", "null"],
            "maxLength": REMARK_MAX_CHARS,
            "description": "by-user-ids with remarks_included only: the CALLER's remark on this "
            "member (null: none)",
        },
    },
    "required": ["user_id", "role", "state", "active"],
}

_READER: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "user_id": ID_SCHEMA,
        "role": {"type": "string", "enum": ["owner", "admin", "member"]},
        "read_conversation_seq": {"type": "integer", "minimum": 0},
    },
    "required": ["user_id", "role", "read_conversation_seq"],
}

SCHEMAS: Final[dict[str, Any]] = {
    "Member": _MEMBER,
    "MembersPageRequest": {
        "type": "object",
        "properties": {
            "chat_session_uid": {"type": "string", "format": "uuid"},
            "page_ref": {
                "type": ["string", "null"],
                "description": "next_page_ref of the previous page (absent or null: the first page)",
            },
            "limit": {"type": "integer", "minimum": 1, "maximum": PAGE_LIMIT_MAX, "default": 50},
            "active_only": {"type": "boolean", "default": False},
        },
        "required": ["chat_session_uid"],
        "additionalProperties": False,
    },
    "MembersPage": {
        "type": "object",
        "properties": {
            "items": {"type": "array", "items": {"$ref": "#/components/schemas/Member"}},
            "has_more": {"type": "boolean"},
            "next_page_ref": {
                "type": ["string", "null"],
                "description": "Pass as page_ref for the next page (opaque); null at the end",
            },
            "self_role": {"type": "string"},
            "capabilities": {
                "type": "object",
                "description": "From the group's settings and self_role (never from a cached role)",
                "additionalProperties": {"type": "boolean"},
            },
            "join_events": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "event_ref": {"type": "string"},
                        "joined_at_conversation_seq": {"type": "integer"},
                        "invitee_refs": {"type": "array", "items": ID_SCHEMA},
                    },
                    "required": ["event_ref", "joined_at_conversation_seq", "invitee_refs"],
                },
            },
        },
        "required": ["items", "has_more", "next_page_ref", "self_role", "capabilities", "join_events"],
    },
    "MembersByUserIdsRequest": {
        "type": "object",
        "properties": {
            "chat_session_uid": {"type": "string", "format": "uuid"},
            "user_ids": {"type": "array", "items": _UID, "minItems": 1, "maxItems": BY_IDS_MAX},
            "include_stats": {"type": "boolean", "default": False},
        },
        "required": ["chat_session_uid", "user_ids"],
        "additionalProperties": False,
    },
    "MembersByUserIds": {
        "type": "object",
        "properties": {
            "items": {"type": "array", "items": {"$ref": "#/components/schemas/Member"}},
            "missing_user_ids": {"type": "array", "items": ID_SCHEMA},
            "stats_included": {"type": "boolean"},
            "remarks_included": {
                "type": "boolean",
                "description": "true: every item has remark (the caller's, null for none); false: "
                "remarks were not read (late or failed) and items have none: keep the known ones",
            },
            "self_role": {"type": "string"},
        },
        "required": ["items", "missing_user_ids", "stats_included", "remarks_included", "self_role"],
    },
    "RemarkRequest": {
        "type": "object",
        "properties": {
            "remark": {
                "type": "string",
                "minLength": 1,
                # Trimmed, then 1-64 characters without control characters: exactly what the
                # pattern admits (no maxLength: white space around does not count).
                "pattern": REMARK_PATTERN,
            }
        },
        "required": ["remark"],
        "additionalProperties": False,
    },
    "Remark": {
        "type": "object",
        "properties": {"user_id": ID_SCHEMA, "remark": {"type": ["string", "null"]}},
        "required": ["user_id", "remark"],
    },
    "UserProfilesRequest": {
        "type": "object",
        "properties": {"user_ids": {"type": "array", "items": _UID, "minItems": 1, "maxItems": BY_IDS_MAX}},
        "required": ["user_ids"],
        "additionalProperties": False,
    },
    "UserProfiles": {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "user_id": ID_SCHEMA,
                        "display_name": {"type": ["string", "null"]},
                        "avatar_url": {"type": ["string", "null"]},
                    },
                    "required": ["user_id", "display_name", "avatar_url"],
                },
            },
            "missing_user_ids": {"type": "array", "items": ID_SCHEMA},
        },
        "required": ["items", "missing_user_ids"],
    },
    "MessageReaders": {
        "type": "object",
        "properties": {
            "conversation_seq": {"type": "integer"},
            "sender_id": _NULLABLE_ID,
            "read_user_ids": {"type": "array", "items": ID_SCHEMA},
            "unread_user_ids": {"type": "array", "items": ID_SCHEMA},
            "read": {"type": "array", "items": _READER, "description": "Unless basic_only"},
            "unread": {"type": "array", "items": _READER, "description": "Unless basic_only"},
            "read_count": {"type": "integer"},
            "unread_count": {"type": "integer"},
            "basic_only": {"type": "boolean"},
            "self_role": {"type": "string"},
            "has_more": {"type": "boolean"},
            "next_page_ref": {"type": ["string", "null"]},
        },
        "required": ["conversation_seq", "read_user_ids", "unread_user_ids", "basic_only", "has_more"],
    },
}
