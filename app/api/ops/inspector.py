"""The user inspector and its two actions (issue 17).

**The recompute.** The console has no worker state: the fresh value of a user's rows is the
definition evaluated over durable state, exactly as a rebuild from state computes it —
`app.rebuild.rebuild_user` over UserConversationState + MessageStore heads, with unread by the
bounded MessageStore read (`app.domain.rebuild.row_from_state`). Called, not re-implemented. A
row's own ``projection_mailbox_seq`` is not knowable from state (`UNKNOWABLE_FROM_STATE`): it is
shown, never called a difference.

**Reconcile this user** is the unread audit's repair path (app/domain/audit.py → the store's
`correct`, app/worker/audit.py's frames): the rows whose stored copy differs from the recompute,
and the badge recomputed in full over what the store will then hold, written by ONE atomic script
only while the store still holds the version that was compared (a flush in between refuses it:
409, look again); then correction frames (``"correction": true``, version = prev = the stored
version) for the rows, and for the badge when it was off. Each row keeps its stored
``projection_mailbox_seq`` (a correction restates version V, it never moves a version).

**Rebuild this user from state** rewrites every row state knows the same way (all of them, not
only the differing ones) at the stored version, with correction frames for all of them and the
badge. A user with nothing stored is written as the rebuild writes one (`UserFlush` at the state
version through the ordinary newer-only write; no frames: a client pulls).

Both refuse (409) when state is ahead of the store (a state change the worker has not flushed
yet: its next flush brings it, and a correction at the older version would restate values that
version never had). Rows the store holds and state does not know are shown and left alone.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping
from typing import Any, Final

import orjson

from app.domain.badge import Badge, badge_of, from_rows
from app.domain.flush import Correction, UserFlush
from app.domain.projection_store import StoredProjection
from app.rebuild.diff import BADGE_FIELDS
from app.rebuild.from_state import UNKNOWABLE_FROM_STATE, rebuild_user
from app.settings import ProcessingSettings

from .ports import OpsDeps

log = logging.getLogger("projector.ops")

RECONCILE: Final = "reconcile"
REBUILD: Final = "rebuild"
ROW_FIELDS: Final = (
    "listed",
    "membership",
    "pinned",
    "pin_rank",
    "archived",
    "muted",
    "last_activity_id",
    "latest_conversation_seq",
    "last_message_id",
    "unread_count",
    "unread_exact",
    "mention_count",
    "mention_first_conversation_seq",
    "read_conversation_seq",
    "hidden_before_conversation_seq",
    "deleted_before_conversation_seq",
    "joined_at_conversation_seq",
    "left_at_conversation_seq",
    "projection_mailbox_seq",
)


class ActionRefused(Exception):
    """The action cannot run now (409) or has nothing to work on (404)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


@dataclasses.dataclass(frozen=True, slots=True)
class Snapshot:
    """The stored projection and the recompute of one user, read back to back."""

    stored: StoredProjection
    fresh: UserFlush | None  # None: state knows no conversation of this user

    @property
    def fresh_rows(self) -> dict[str, dict[str, Any]]:
        return {} if self.fresh is None else {str(r["conversation_id"]): r for r in self.fresh.rows}

    @property
    def state_version(self) -> int:
        return 0 if self.fresh is None else self.fresh.projection_mailbox_seq


async def snapshot(deps: OpsDeps, processing: ProcessingSettings, user_id: int) -> Snapshot:
    stored = await deps.store.load(user_id)
    fresh = await asyncio.to_thread(recompute, deps, processing, user_id)
    return Snapshot(stored, fresh)


def recompute(deps: OpsDeps, processing: ProcessingSettings, user_id: int) -> UserFlush | None:
    """The rebuild from state of one user (blocking Cassandra reads: in a worker thread)."""
    states = deps.state.load_user(user_id)
    heads = deps.messages.heads([str(s["conversation_id"]) for s in states]) if states else {}
    return rebuild_user(
        user_id,
        states,
        heads,
        deps.messages,
        limit=processing.unread_precise_limit,
        include_muted=processing.include_muted,
        badge_mode=processing.badge_mode,
    )


def compare(snap: Snapshot) -> dict[str, Any]:
    """Field by field: every conversation either side knows, and the badge."""
    stored_rows, fresh_rows = snap.stored.rows, snap.fresh_rows
    rows: list[dict[str, Any]] = []
    counts = {"same": 0, "drifted": 0, "missing_in_store": 0, "unknown_to_state": 0}
    for cid in sorted(stored_rows.keys() | fresh_rows.keys()):
        s, f = stored_rows.get(cid), fresh_rows.get(cid)
        fields = []
        differs = False
        for name in ROW_FIELDS:
            a = None if s is None else s.get(name)
            b = None if f is None else f.get(name)
            knowable = name not in UNKNOWABLE_FROM_STATE
            off = s is not None and f is not None and knowable and a != b
            differs = differs or off
            fields.append({"name": name, "stored": a, "recomputed": b, "differs": off, "knowable": knowable})
        if s is None:
            status = "missing_in_store"
        elif f is None:
            status = "unknown_to_state"
        else:
            status = "drifted" if differs else "same"
        counts[status] += 1
        rows.append({"conversation_id": cid, "status": status, "fields": fields})
    fresh_badge = snap.fresh.badge if snap.fresh is not None else Badge(0, 0, 0)
    badge = [
        {
            "name": name,
            "stored": getattr(snap.stored, name),
            "recomputed": getattr(fresh_badge, name),
            "differs": getattr(snap.stored, name) != getattr(fresh_badge, name),
        }
        for name in BADGE_FIELDS
    ]
    return {"rows": rows, "counts": counts, "badge": badge}


# -- actions ----------------------------------------------------------------------------------


def correction_for(snap: Snapshot, action: str, include_muted: bool) -> tuple[Correction, bool]:
    """The correction an action writes, and whether the stored badge was off."""
    stored = snap.stored
    fresh = snap.fresh_rows
    rows: list[dict[str, Any]] = []
    for cid in sorted(fresh):
        row = dict(fresh[cid])
        held = stored.rows.get(cid)
        if held is not None:
            # A correction restates version V: each row keeps its own stored version.
            row["projection_mailbox_seq"] = held.get("projection_mailbox_seq")
            if action == RECONCILE and _same(held, row):
                continue
        rows.append(row)
    after = {**stored.rows, **{str(r["conversation_id"]): r for r in rows}}
    # In the preferences the stored badge is in (a user's own badge_preferences, docs/contract.md
    # §10); nothing stored: the deployment's defaults.
    if stored.projection_mailbox_seq:
        badge = from_rows(after.values(), stored.include_muted, stored.badge_mode)
    else:
        badge = from_rows(after.values(), include_muted)
    correction = Correction(
        user_id=stored.user_id,
        version=stored.projection_mailbox_seq,
        rows=rows,
        badge=badge,
        driving_event_id=f"ops-{action}",
    )
    return correction, badge != badge_of(stored)


def _same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return all(a.get(name) == b.get(name) for name in ROW_FIELDS if name not in UNKNOWABLE_FROM_STATE)


async def run_action(
    deps: OpsDeps, processing: ProcessingSettings, user_id: int, action: str
) -> dict[str, Any]:
    """Reconcile or rebuild one user; the result says what was written and which frames went out."""
    snap = await snapshot(deps, processing, user_id)
    stored = snap.stored
    if snap.fresh is None:
        raise ActionRefused(
            404, "unknown_to_state", f"UserConversationState knows no conversation of {user_id}"
        )
    if snap.state_version > stored.projection_mailbox_seq and stored.projection_mailbox_seq:
        raise ActionRefused(
            409,
            "flush_pending",
            f"state is at version {snap.state_version}, the store at {stored.projection_mailbox_seq}: "
            "the worker has not flushed this user's latest change yet; look again after its next flush",
        )
    if stored.projection_mailbox_seq == 0:
        if action == RECONCILE:
            raise ActionRefused(
                409, "nothing_stored", "the store holds nothing for this user: rebuild it from state"
            )
        (before,) = await deps.store.write([snap.fresh])
        if before is None:
            raise ActionRefused(409, "store_moved", "a flush wrote this user meanwhile; look again")
        return {
            "written": True,
            "mode": "write",
            "version": snap.fresh.projection_mailbox_seq,
            "rows": len(snap.fresh.rows),
            "frames": {"session_delta": 0, "badge": 0},
        }
    correction, badge_off = correction_for(snap, action, processing.include_muted)
    if action == RECONCILE and not correction.rows and not badge_off:
        return {
            "written": False,
            "mode": "clean",
            "version": stored.projection_mailbox_seq,
            "rows": 0,
            "frames": {"session_delta": 0, "badge": 0},
        }
    (written,) = await deps.store.correct([correction])
    if not written:
        raise ActionRefused(
            409, "store_moved", "the store moved on since it was compared (a flush wrote a newer version)"
        )
    key = str(user_id)
    deltas = [orjson.dumps(correction.session_delta())] if correction.rows else []
    badges = [orjson.dumps(correction.badge_update())] if badge_off or action == REBUILD else []
    published = False
    if deps.bus is not None and (deltas or badges):
        await deps.bus.publish_frames(user_id, deltas, badges)
        published = True
    log.info(
        "ops %s of user %s: %d rows corrected at version %d, badge %s, frames %s",
        action,
        key,
        len(correction.rows),
        correction.version,
        "corrected" if badge_off else "unchanged",
        "published" if published else "none",
    )
    return {
        "written": True,
        "mode": "correct",
        "version": correction.version,
        "rows": len(correction.rows),
        "conversations": [str(r["conversation_id"]) for r in correction.rows],
        "badge_corrected": badge_off,
        "frames": {
            "session_delta": len(deltas) if published else 0,
            "badge": len(badges) if published else 0,
        },
    }
