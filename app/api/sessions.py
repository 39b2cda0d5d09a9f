"""GET /v1/sessions: one page of the caller's conversation list (docs/contract.md §5)."""

from __future__ import annotations

from typing import Any, Final

import orjson
from aiohttp import web

from app.api.cursor import Cursor, CursorError
from app.api.http import ApiContext, Route, bad_request, context, current_user, int_param, or_empty, query
from app.domain.listing import Folder
from app.domain.wire_ids import ID_SCHEMA

DEFAULT_LIMIT: Final = 50
MAX_LIMIT: Final = 100
_PARAMS: Final = frozenset({"cursor", "limit", "folder"})
_FOLDERS: Final = {f.value: f for f in Folder}


async def list_sessions(request: web.Request) -> web.Response:
    ctx = context(request)
    user_id = current_user(request)
    params = query(request, _PARAMS)
    folder = _FOLDERS.get(params.get("folder", Folder.MAIN.value))
    if folder is None:
        raise bad_request(f"folder must be 'main' or 'archived', got {params['folder'][:40]!r}")
    limit = int_param(params, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
    cursor = None
    if "cursor" in params:
        try:
            cursor = ctx.cursors.decode(params["cursor"], user_id, folder)
        except CursorError as exc:
            raise bad_request(str(exc), code="bad_cursor") from None
    if cursor is None and ctx.reconciler is not None:
        # A first page without cursor is a login (a new device, a new session): the owning worker
        # reconciles the user, at most once per interval (docs/contract.md §10). Beside the page.
        ctx.reconciler.login(user_id, "login")
    page = await ctx.lists.page(user_id, folder, limit, cursor)
    snapshot = page.snapshot
    next_cursor = None
    if page.has_more:
        next_cursor = ctx.cursors.encode(
            Cursor(snapshot.revision, user_id, folder, page.last_position, snapshot.snapshot_id)
        )
    envelope = orjson.dumps(
        {
            "next_cursor": next_cursor,
            "snapshot_revision": snapshot.revision,
            "projection_complete": page.projection_complete,
            "projection_mailbox_seq": snapshot.version,
            "folder": folder.value,
            "filled_from_state": snapshot.filled_from_state,
            "truncated": snapshot.dropped > 0,
        }
    )
    # The rows are held as JSON already: splice them in instead of decoding and re-encoding.
    body = b'{"items":[' + b",".join(page.items) + b"]," + envelope[1:]
    return web.Response(body=body, content_type="application/json")


def routes(ctx: ApiContext) -> list[Route]:
    return [Route("GET", "/v1/sessions", list_sessions, OPERATION)]


OPERATION: Final[dict[str, Any]] = {
    "operationId": "listSessions",
    "summary": "One page of the caller's conversation list",
    "description": (
        "Order: pinned zone (pin_rank ASC, last_activity_id DESC, conversation_id ASC), then the "
        "normal zone (last_activity_id DESC, conversation_id ASC); a null activity sorts last. "
        "Archived conversations only under folder=archived (same order); deleted conversations "
        "(not revived) are absent. Pages come from a per-user snapshot: pass next_cursor to get "
        "the rows strictly after the previous page. When the cursor's snapshot revision is no "
        "longer live (a pin, unpin, archive, unarchive, leave or delete happened, or it expired), "
        "the answer is the first page of a new revision with projection_complete=false: restart "
        "the walk. New messages do not end a revision: merge SESSION_DELTA rows. An empty "
        "parameter counts as absent."
    ),
    "parameters": [
        {
            "name": "cursor",
            "in": "query",
            "required": False,
            "description": "next_cursor of the previous page (opaque; bound to the user and folder)",
            "schema": {"type": "string", "maxLength": 256},
        },
        {
            "name": "limit",
            "in": "query",
            "required": False,
            "schema": or_empty(
                {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": DEFAULT_LIMIT}
            ),
        },
        {
            "name": "folder",
            "in": "query",
            "required": False,
            "schema": or_empty({"type": "string", "enum": ["main", "archived"], "default": "main"}),
        },
    ],
    "responses": {
        "200": {
            "description": "A page",
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/SessionPage"}}},
            # A walk, as clients (and a stateful fuzzer) follow it.
            "links": {
                "NextPage": {
                    "operationId": "listSessions",
                    "parameters": {
                        "cursor": "$response.body#/next_cursor",
                        "folder": "$response.body#/folder",
                    },
                    "description": "The page after this one (next_cursor is null on the last page)",
                }
            },
        },
        "400": {"$ref": "#/components/responses/BadRequest"},
        "401": {"$ref": "#/components/responses/Unauthorized"},
        "503": {"$ref": "#/components/responses/Unavailable"},
    },
}

_SEQ = {"type": "integer", "minimum": 0}
_NULLABLE_SEQ = {"type": ["integer", "null"], "minimum": 0}

SCHEMAS: Final[dict[str, Any]] = {
    "SessionRow": {
        "type": "object",
        "description": (
            "A projection row (docs/contract.md §4). user_id is a decimal string (a u64 does not fit a "
            "JavaScript number); sequence numbers and counts are JSON integers."
        ),
        "properties": {
            "user_id": ID_SCHEMA,
            "conversation_id": {"type": "string", "format": "uuid"},
            "listed": {"type": "boolean"},
            "membership": {"type": "string", "enum": ["active", "left", "removed"]},
            "pinned": {"type": "boolean"},
            "pin_rank": {"type": ["integer", "null"], "minimum": 0, "maximum": 4294967295},
            "archived": {"type": "boolean"},
            "muted": {"type": "boolean"},
            "marked_unread": {
                "type": "boolean",
                "description": (
                    "Marked unread by the user (docs/contract.md §10): show it as unread; a read or "
                    "a delete_conversation clears it. Absent on rows written before it: false."
                ),
            },
            "last_activity_id": {"type": ["string", "null"], "pattern": "^[0-9a-f]{32}$"},
            "latest_conversation_seq": _NULLABLE_SEQ,
            "last_message_id": {"type": ["string", "null"]},
            "unread_count": _SEQ,
            "unread_exact": {"type": "boolean"},
            "mention_count": _SEQ,
            "mention_first_conversation_seq": _NULLABLE_SEQ,
            "read_conversation_seq": _SEQ,
            "hidden_before_conversation_seq": _SEQ,
            "deleted_before_conversation_seq": _SEQ,
            "joined_at_conversation_seq": _SEQ,
            "left_at_conversation_seq": _NULLABLE_SEQ,
            "projection_mailbox_seq": _SEQ,
        },
        "required": ["user_id", "conversation_id", "listed", "pin_rank", "archived", "last_activity_id"],
    },
    "SessionPage": {
        "type": "object",
        "properties": {
            "items": {"type": "array", "items": {"$ref": "#/components/schemas/SessionRow"}},
            "next_cursor": {
                "type": ["string", "null"],
                "description": "Pass as cursor for the next page; null on the last page",
            },
            "snapshot_revision": {"type": "integer", "minimum": 1},
            "projection_complete": {
                "type": "boolean",
                "description": "false: the cursor was stale; this is the first page of a new revision",
            },
            "projection_mailbox_seq": {
                "type": "integer",
                "minimum": 0,
                "description": "The store version the snapshot's rows are as of (SessionView.reset)",
            },
            "folder": {"type": "string", "enum": ["main", "archived"]},
            "filled_from_state": {
                "type": "boolean",
                "description": "Rows missing from the projection store were rebuilt from Cassandra state",
            },
            "truncated": {
                "type": "boolean",
                "description": "The user has more listed conversations than a snapshot holds",
            },
        },
        "required": [
            "items",
            "next_cursor",
            "snapshot_revision",
            "projection_complete",
            "projection_mailbox_seq",
            "folder",
            "filled_from_state",
            "truncated",
        ],
    },
}
