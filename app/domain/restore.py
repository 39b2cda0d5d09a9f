"""The projection repair's decisions (issue 18; the I/O is app/worker/repair.py): what one
user needs when the projection store may have lost it, and the write that restores it.

A user's state knows its projection_mailbox_seq P (the last entry applied) and the version F of
its last flush (every client saw at most F: a flush is the only thing that publishes a version).
The store answers, for the user, the version it holds and how many rows:

* INTACT: version F and every row the flush at F left there. With P == F that is as many rows
  as the state has. With P > F (entries applied since F, not flushed yet) the rows made since F
  (never written by a flush: `writes` 0, version above F) are not in the store yet; every other
  row is, so the store holds exactly that many. Comparing P > F users with the state's whole
  row count took every user with a conversation begun since its last flush for a loss: a store
  seen for the first time while traffic flowed counted a restore it did not need (a CI failure).
* AHEAD: a version above F: a newer writer (another worker, during a hand-over) wrote it; left.
* RESTATE (P == F): every row and the badge written again AT F, over whatever the store holds
  (nothing, an older version, or some rows at F that a flush wrote into the emptied store), with
  correction frames restating F (app.domain.flush.Correction: `prev == version`, no step in the
  chain; a client overwrites what it holds at a version <= F). No version is invented, none
  reused for other contents: F's rows are exactly what the state holds at F. The badge is
  recomputed in full from the rows (a restore is a reconcile: the rows are the authority).
  When the store already held F (a flush wrote part of the user after the loss), the user's
  structure version moves: a reader that cached the part at F (the API's snapshot) sees the
  list changed and loads it again, a walk in progress restarts.
* REFLUSH (P > F): the state is past F (entries applied, not flushed yet): its rows as of F are
  not kept, so the user's next flush (within one window, at P, with ordinary frames) writes
  every row instead of the changed ones.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence

from app.domain.badge import full_recompute
from app.domain.conversation import ConversationState
from app.domain.flush import Correction, UserFlush
from app.domain.projector import UserState


class Need(enum.Enum):
    INTACT = "intact"
    AHEAD = "ahead"
    RESTATE = "restate"
    REFLUSH = "reflush"


def need(user: UserState, rows: Sequence[ConversationState], stored_version: int, stored_rows: int) -> Need:
    """What `user` (with these rows: all of its rows in the state) needs, given what the store
    holds."""
    flushed = user.flushed_seq
    if stored_version > flushed:
        return Need.AHEAD
    pending = user.projection_mailbox_seq > flushed
    if stored_version == flushed and flushed > 0:
        left = len(rows) if not pending else sum(1 for row in rows if row.writes or row.version <= flushed)
        if stored_rows == left:
            return Need.INTACT
    return Need.REFLUSH if pending else Need.RESTATE


def restatement(
    user: UserState, rows: Iterable[ConversationState], *, include_muted: bool
) -> tuple[UserFlush, Correction]:
    """The restore's write of `user` at its flushed version (all rows, the badge recomputed)
    and the correction frames that tell clients."""
    ordered = sorted(rows, key=lambda row: row.conversation_id)
    # The user's own preferences (docs/contract.md §10): `include_muted` is the deployment's
    # default, which the projector already gave every user without preferences.
    badge = full_recompute(ordered, user.include_muted, user.badge_mode)
    version = user.flushed_seq
    as_rows = [row.as_row() for row in ordered]
    batch = UserFlush(
        user_id=user.user_id,
        rows=as_rows,
        badge=badge,
        projection_mailbox_seq=version,
        prev_projection_mailbox_seq=version,
        structure_version=user.structure_version,
        driving_event_id=user.driving_event_id,
        driving_mailbox_seq=version,
    )
    return batch, Correction(user.user_id, version, as_rows, badge, user.driving_event_id)
