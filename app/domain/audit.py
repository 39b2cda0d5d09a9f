"""The unread audit (issue 7): which rows to check, their unread recounted from the MessageStore,
and what a drifted row needs. Pure: the time, the random draw and the stored copy come in as
arguments; the only port read is the MessageStore (one bounded range read per audited row).

Which rows (`eligible`): unread > 0 and exact, no entry applied for `idle_ms` (event time of the
row's last entry), and an unread window (base, latest] that one bounded read covers
(`latest - base <= limit`). A row still changing is recomputed by its own next entries; an
inexact row shows the limit by definition (docs/contract.md §3.4); a wider exact row (counted from the
hand) cannot be checked by one bounded read.

How many (`Sampler`): each round draws every eligible row with probability `sample_rate` (a
keyed hash of the row per round: the same rows whatever order they are scanned in) and keeps at
most `max_rows`, those with the lowest draws, so the cap never favours the users scanned first.

The recount (`recount`): a copy of the row whose hand is emptied over (base, latest] and refilled
by one MessageStore range read, over the messages this user received and the recalls that
reached this user — the definition (docs/contract.md §3.4), so a correct row recounts to
itself and nothing the incremental path accumulated survives in the recount.

The verdict for one user (`audit_user`), from the projection store's copy (version Vs, badge, the
sampled rows) and the worker's state (flushed version Vf, applied version Va):

* Vs > Vf: the store is ahead of this worker (another writer): not judged.
* state counts != recount: the state drifted; it takes the recount, and the badge is
  recomputed in full.
* stored row != the state's row: the store drifted.
* the repair: Va == Vf == Vs (nothing pending, store in step) → a correction in place at Vs
  (rows and badge) with correction frames; Va > Vf (a flush is pending anyway) → the drifted
  rows join that flush; Vs < Vf (the store lost a write) → every row of the user is flushed
  again, at a version newer than the store's.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from enum import Enum

from app.domain import seqs
from app.domain.badge import Badge, full_recompute
from app.domain.conversation import ConversationState
from app.domain.flush import Correction
from app.domain.ports import MessageStore
from app.domain.projection_store import StoredRows
from app.domain.projector import UserState
from app.domain.unread import UNREAD_PRECISE_LIMIT, recompute

# A uniform draw in [0, 1) per (user_id, conversation_id), fixed for one round.
Draw = Callable[[int, str], float]
# (unread_count, unread_exact, mention_count, mention_first_conversation_seq)
Counts = tuple[int, bool, int, int | None]


@dataclass(frozen=True, slots=True)
class AuditPolicy:
    sample_rate: float  # share of the eligible rows one round draws (0 = the audit is off)
    idle_ms: int  # a row is eligible once no entry changed it for this long
    max_rows: int  # at most this many rows read per round
    limit: int = UNREAD_PRECISE_LIMIT  # the bounded read's width (unread_precise_limit)

    def __post_init__(self) -> None:
        if not 0.0 <= self.sample_rate <= 1.0:
            raise ValueError(f"sample_rate must be in 0..1, got {self.sample_rate}")
        if self.idle_ms < 0 or self.max_rows < 1 or self.limit < 1:
            raise ValueError("idle_ms must be >= 0, max_rows and limit >= 1")


def eligible(row: ConversationState, now_ms: int, policy: AuditPolicy) -> bool:
    return (
        row.unread_count > 0
        and row.unread_exact
        and now_ms - row.changed_at >= policy.idle_ms
        and row.latest - row.base <= policy.limit
    )


def keyed_draw(salt: int) -> Draw:
    """The draw of one round: BLAKE2b of the row's key under a per-round salt (128 bits). Keyed
    by the row, not by call order, so the rows a round picks do not depend on the scan order."""
    key = (salt % (1 << 128)).to_bytes(16, "big")

    def draw(user_id: int, conversation_id: str) -> float:
        digest = hashlib.blake2b(f"{user_id}/{conversation_id}".encode(), digest_size=8, key=key).digest()
        return int.from_bytes(digest, "big") / 2**64

    return draw


class Sampler:
    """One round's sample: offer every row (any order); `chosen()` gives the rows to audit.

    Memory stays O(max_rows) however many rows are offered (a bounded max-heap of the draws)."""

    def __init__(self, policy: AuditPolicy, now_ms: int, draw: Draw) -> None:
        self.policy = policy
        self.now_ms = now_ms
        self.draw = draw
        self.eligible_rows = 0
        self.drawn_rows = 0  # drawn below the rate (before the cap)
        # (-draw, -arrival, row): the root is the highest draw kept; arrival breaks ties, so
        # rows themselves are never compared.
        self._heap: list[tuple[float, int, ConversationState]] = []

    def offer(self, row: ConversationState) -> None:
        if not eligible(row, self.now_ms, self.policy):
            return
        self.eligible_rows += 1
        value = self.draw(row.user_id, row.conversation_id)
        if value >= self.policy.sample_rate:
            return
        self.drawn_rows += 1
        item = (-value, -self.drawn_rows, row)
        if len(self._heap) < self.policy.max_rows:
            heapq.heappush(self._heap, item)
        elif item[:2] > self._heap[0][:2]:  # a lower draw than the highest kept
            heapq.heapreplace(self._heap, item)

    def chosen(self) -> list[ConversationState]:
        """The sampled rows, by (user_id, conversation_id)."""
        return sorted((row for _, _, row in self._heap), key=lambda r: (r.user_id, r.conversation_id))


# -- the recount ------------------------------------------------------------------------------


def copy_row(row: ConversationState) -> ConversationState:
    """An independent copy (bitmaps included): the recount runs on it, away from the live row."""
    return row.copy()


def recount(row: ConversationState, store: MessageStore, limit: int) -> None:
    """Recount `row` (a copy: it is changed in place) from the MessageStore.

    The hand over (base, latest] is emptied and refilled by the bounded range read of `recompute`
    (messages this user received, recalls that reached this user); above `latest` the hand is
    kept (a former member's messages past `left_at`), and `floor` stays honest: complete above
    `latest` only if it was before."""
    base, latest = row.base, row.latest
    if latest > base:
        row.counting = seqs.remove_range(row.counting, base + 1, latest + 1)
        row.mentioning = seqs.remove_range(row.mentioning, base + 1, latest + 1)
        row.floor = max(row.floor, latest)
    recompute(row, store, limit)


def counts(row: ConversationState) -> Counts:
    return (row.unread_count, row.unread_exact, row.mention_count, row.mention_first)


def adopt(live: ConversationState, recounted: ConversationState) -> None:
    """The live row takes the recount's counts and the hand behind them."""
    live.counting = recounted.counting
    live.mentioning = recounted.mentioning
    live.floor = recounted.floor
    live.unread_count = recounted.unread_count
    live.unread_exact = recounted.unread_exact
    live.mention_count = recounted.mention_count
    live.mention_first = recounted.mention_first


# -- the verdict ------------------------------------------------------------------------------


class Repair(Enum):
    NONE = "none"  # nothing drifted
    CORRECT = "correct"  # in place at the stored version, with correction frames
    REFLUSH_ROWS = "reflush_rows"  # a flush is pending for the user: the drifted rows join it
    REFLUSH_USER = "reflush_user"  # the store lost a write: every row of the user again
    NOT_JUDGED = "not_judged"  # the store is ahead of this worker's state


@dataclass(frozen=True, slots=True)
class UserAudit:
    user_id: int
    repair: Repair
    audited: tuple[str, ...] = ()  # conversations compared
    drifted: tuple[str, ...] = ()  # of those, the stored row or the state's counts differed
    # (a correction carries, and REFLUSH_ROWS re-flushes, those whose stored row differed)
    state_drifted: tuple[str, ...] = ()  # of those, the state's counts (now corrected)
    state_badge_drifted: bool = False  # the state's badge was not the sum of its rows (now is)
    stored_badge_drifted: bool = False
    correction: Correction | None = None
    reflush: tuple[str, ...] = ()  # rows to mark dirty (REFLUSH_*)


def stored_badge(stored: StoredRows) -> Badge:
    return Badge(
        stored.total_unread,
        stored.total_mention,
        stored.muted_unread,
        stored.archived_unread,
        stored.archived_mention,
        stored.badge_mode,
        stored.include_muted,
    )


def audit_user(
    user: UserState,
    recounted: Mapping[str, ConversationState],
    stored: StoredRows,
    *,
    include_muted: bool,
    dirty: Collection[str] = (),
) -> UserAudit:
    """Judge one user's sampled rows (recounted copies) against the state and the store; correct
    the state where it drifted (rows, badge); say how the store is to be repaired.

    A row is judged only if it is unchanged since its copy was recounted (same version) and not
    waiting for a flush (`dirty`): otherwise its stored copy is legitimately behind."""
    stored_version = stored.projection_mailbox_seq
    if stored_version > user.flushed_seq:
        return UserAudit(user.user_id, Repair.NOT_JUDGED)
    audited: list[str] = []
    drifted: list[str] = []
    state_drifted: list[str] = []
    stale: list[str] = []  # stored copy != the (corrected) state's row: the store needs it
    for conversation_id in sorted(recounted):
        live = user.rows.get(conversation_id)
        fresh = recounted[conversation_id]
        if live is None or conversation_id in dirty or live.version != fresh.version:
            continue
        audited.append(conversation_id)
        moved = counts(live) != counts(fresh)
        if moved:
            adopt(live, fresh)
            state_drifted.append(conversation_id)
        off = stored.rows.get(conversation_id) != live.as_row()
        if off:
            stale.append(conversation_id)
        if moved or off:
            drifted.append(conversation_id)
    # In the user's own preferences (docs/contract.md §10); `include_muted` is the deployment's
    # default, which the projector has already given every user without preferences.
    full = full_recompute(user.rows.values(), user.include_muted, user.badge_mode)
    judged = UserAudit(
        user.user_id,
        Repair.NONE,
        audited=tuple(audited),
        drifted=tuple(drifted),
        state_drifted=tuple(state_drifted),
        state_badge_drifted=user.badge != full,
    )
    user.badge = full
    if stored_version < user.flushed_seq:
        return replace(judged, repair=Repair.REFLUSH_USER, reflush=tuple(sorted(user.rows)))
    if user.projection_mailbox_seq > user.flushed_seq:
        # The user's next flush is due anyway (its window is open): it carries the drifted rows
        # and the full badge, at a newer version than any client holds.
        return replace(judged, repair=Repair.REFLUSH_ROWS if stale else Repair.NONE, reflush=tuple(stale))
    badge_off = stored_badge(stored) != user.badge
    if not stale and not badge_off:
        return judged  # a state that drifted alone: the store (and the clients) had it right
    correction = Correction(
        user_id=user.user_id,
        version=stored_version,
        rows=[user.rows[cid].as_row() for cid in stale],
        badge=user.badge,
        driving_event_id=user.driving_event_id,
    )
    return replace(judged, repair=Repair.CORRECT, stored_badge_drifted=badge_off, correction=correction)
