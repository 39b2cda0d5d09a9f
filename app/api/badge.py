"""GET /v1/badge: the caller's app-icon totals from the projection store's meta (docs/contract.md §3.8),
with the folder totals and the badge preferences they are in (§10)."""

from __future__ import annotations

from typing import Any, Final

from aiohttp import web

from app.api.http import ApiContext, Route, context, current_user, query
from app.domain.badge import Badge, badge_fields, badge_of, from_rows


async def read_badge(ctx: ApiContext, user_id: int) -> tuple[Badge, int]:
    """The user's badge and the store version it is as of (also the live stream's hello)."""
    meta = await ctx.deps.projections.meta(user_id)  # one HMGET
    badge = badge_of(meta)
    filler = ctx.lists.state
    if meta.version == 0 and filler is not None:
        # Nothing stored for the user (projection lost, or not flushed yet): a login pull's rows
        # come from UserConversationState (the fill-in). That pull is a reconcile (seed §3.4):
        # its badge is the full recompute over those rows, not the zeros of an absent meta.
        # The version stays 0: the rows are as of no flush, and any frame supersedes them.
        # The user's badge preferences are kept with the projection only (README: what state
        # cannot know): the deployment's defaults apply here.
        rows = await filler.rows(user_id, ())
        badge = from_rows(rows, ctx.processing.include_muted, ctx.processing.badge_mode)
    return badge, meta.version


async def get_badge(request: web.Request) -> web.Response:
    ctx = context(request)
    user_id = current_user(request)
    query(request, frozenset())  # no parameters: an unexpected one is a client bug worth a 400
    badge, version = await read_badge(ctx, user_id)
    return web.json_response(badge_fields(badge, version))


def routes(ctx: ApiContext) -> list[Route]:
    return [Route("GET", "/v1/badge", get_badge, OPERATION)]


OPERATION: Final[dict[str, Any]] = {
    "operationId": "getBadge",
    "summary": "The caller's badge totals",
    "description": (
        "As last flushed to the projection store; BADGE_UPDATE frames carry newer ones. When the "
        "store holds nothing for the caller and rows are filled from state, the full recompute "
        "over those rows (projection_mailbox_seq 0)."
    ),
    "responses": {
        "200": {
            "description": "The badge",
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Badge"}}},
        },
        "400": {"$ref": "#/components/responses/BadRequest"},
        "401": {"$ref": "#/components/responses/Unauthorized"},
        "503": {"$ref": "#/components/responses/Unavailable"},
    },
}

_COUNT = {"type": "integer"}

SCHEMAS: Final[dict[str, Any]] = {
    "Badge": {
        "type": "object",
        "properties": {
            "total_unread": _COUNT,
            "total_mention": _COUNT,
            "muted_unread": _COUNT,
            "archived_unread": {**_COUNT, "description": "The archived folder's unread (§10)"},
            "archived_mention": {**_COUNT, "description": "The archived folder's mentions (§10)"},
            "badge_mode": {
                "type": "string",
                "enum": ["messages", "conversations"],
                "description": "messages: sums of counts; conversations: rows with a count > 0",
            },
            "include_muted": {"type": "boolean"},
            "projection_mailbox_seq": {"type": "integer", "minimum": 0},
        },
        "required": [
            "total_unread",
            "total_mention",
            "muted_unread",
            "archived_unread",
            "archived_mention",
            "badge_mode",
            "include_muted",
            "projection_mailbox_seq",
        ],
    }
}
