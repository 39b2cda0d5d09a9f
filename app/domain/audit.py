"""The unread audit (issue 7): which rows to check, their unread recounted from the MessageStore,
and what a drifted row needs. Pure: the time, the random draw and the stored copy come in as
arguments; the only port read is the MessageStore (one bounded range read per audited row).

Which rows (`eligible`): unread > 0 and exact, no entry applied for `idle_ms` (event time of the
row's last entry), and an unread window (base, latest] that one bounded read covers
(`latest - base <= limit`). A row still changing is recomputed by its own next entries; an
inexact row shows the limit by definition (docs/contract.md §3.4); a wider exact row (counted from the
hand) cannot be checked by one bounded read. Rows at 0 unread (`eligible_at_zero`: exact, idle,
within one read) are audited too, at a rate of their own (`zero_sample_rate`): a row whose
counts drifted to 0 is exactly where a missed message hides.

How many, by key ranges (`KeyRangeSampler`): the worker never reads every row of a partition in a
round. A sweep walks the partition's persisted rows in key order, a bounded slice per tick,
from a random start key (so that restarts do not favour the low keys) and around; a round reads
`round_budget` rows (the highest rate's share of the partition), so that every row is read once
every 1/share rounds, and each row read is drawn with probability rate / share (a keyed hash of
the row per round). Per round each row is thus audited with probability equal to its rate, and a
round stops at `max_rows` rows drawn (the sweep resumes there next round: the cap slows the
sweep, it never skips rows).

`Sampler` is the former selection over every row (offer all, keep the `max_rows` lowest draws):
kept for the comparison in bench/audit_bench.py.

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
import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, Protocol

from app.domain import seqs
from app.domain.badge import badge_of, full_recompute
from app.domain.conversation import ConversationState
from app.domain.flush import Correction
from app.domain.ports import MessageStore
from app.domain.projection_store import StoredRows
from app.domain.projector import UserState
from app.domain.unread import UNREAD_PRECISE_LIMIT, recompute

# A uniform draw in [0, 1) per (user_id, conversation_id), fixed for one round.
Draw = Callable[[int, str], float]
# A row's key in the partition's persisted state: (user_id, conversation_id). The state's key
# order is this tuple's order (user ids numerically, then the canonical lower-case UUID string,
# whose order is its 16 bytes' order).
RowKey = tuple[int, str]
# (unread_count, unread_exact, mention_count, mention_first_conversation_seq)
Counts = tuple[int, bool, int, int | None]


class AuditFacts(Protocol):
    """What the selection reads of a row: a live `ConversationState`, or the `RowFacts` of a
    persisted record (`ConversationState.audit_facts`, without loading the row)."""

    @property
    def unread_count(self) -> int: ...

    @property
    def unread_exact(self) -> bool: ...

    @property
    def changed_at(self) -> int: ...

    @property
    def base(self) -> int: ...

    @property
    def latest(self) -> int: ...


@dataclass(frozen=True, slots=True)
class AuditPolicy:
    sample_rate: float  # share of the eligible rows (unread > 0) one round draws
    idle_ms: int  # a row is eligible once no entry changed it for this long
    max_rows: int  # at most this many rows recounted per round
    limit: int = UNREAD_PRECISE_LIMIT  # the bounded read's width (unread_precise_limit)
    zero_sample_rate: float = 0.0  # share of the rows at 0 unread one round draws

    def __post_init__(self) -> None:
        for name, rate in (("sample_rate", self.sample_rate), ("zero_sample_rate", self.zero_sample_rate)):
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"{name} must be in 0..1, got {rate}")
        if self.idle_ms < 0 or self.max_rows < 1 or self.limit < 1:
            raise ValueError("idle_ms must be >= 0, max_rows and limit >= 1")

    @property
    def read_share(self) -> float:
        """The share of the rows a round reads: the highest rate (0: the audit is off)."""
        return max(self.sample_rate, self.zero_sample_rate)


def eligible(row: AuditFacts, now_ms: int, policy: AuditPolicy) -> bool:
    return (
        row.unread_count > 0
        and row.unread_exact
        and now_ms - row.changed_at >= policy.idle_ms
        and row.latest - row.base <= policy.limit
    )


def eligible_at_zero(row: AuditFacts, now_ms: int, policy: AuditPolicy) -> bool:
    """A row at 0 unread that one bounded read recounts: exact, idle, (base, latest] <= limit."""
    return (
        row.unread_count == 0
        and row.unread_exact
        and now_ms - row.changed_at >= policy.idle_ms
        and row.latest - row.base <= policy.limit
    )


def audit_rate(row: AuditFacts, now_ms: int, policy: AuditPolicy) -> float:
    """The probability that one round audits this row: its kind's rate, 0 when not auditable."""
    if eligible(row, now_ms, policy):
        return policy.sample_rate
    if eligible_at_zero(row, now_ms, policy):
        return policy.zero_sample_rate
    return 0.0


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
        policy = self.policy
        if eligible(row, self.now_ms, policy):
            rate = policy.sample_rate
        elif policy.zero_sample_rate > 0.0 and eligible_at_zero(row, self.now_ms, policy):
            rate = policy.zero_sample_rate
        else:
            return
        self.eligible_rows += 1
        value = self.draw(row.user_id, row.conversation_id)
        if value >= rate:
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


# -- sampling by key ranges -----------------------------------------------------------------------


class RowRange(Protocol):
    """One partition's persisted rows in key order, read-only (the worker's RocksDB store). Its
    reads block: the worker calls them in a worker thread, never on the event loop."""

    def rows_after(self, after: RowKey | None, limit: int) -> list[tuple[RowKey, list[Any]]]:
        """At most `limit` rows whose key is above `after` (None: from the first), in key order:
        each its key and its record (`ConversationState.dump()`'s form, not loaded)."""
        ...

    def key_bounds(self) -> tuple[RowKey, RowKey] | None:
        """The first and the last row key (None: no rows)."""
        ...

    def estimated_rows(self) -> int:
        """About how many rows there are (an estimate is enough: it sizes a round)."""
        ...


def round_budget(estimated_rows: int, policy: AuditPolicy) -> int:
    """Rows one round reads from a partition: its read share of the rows (at least one while the
    audit is on and the partition holds any), so that a row is read once every 1/share rounds."""
    share = policy.read_share
    if share <= 0.0 or estimated_rows <= 0:
        return 0
    return max(1, math.ceil(estimated_rows * share))


def drawn(key: RowKey, rate: float, policy: AuditPolicy, draw: Draw) -> bool:
    """Whether a row the sweep read, auditable at `rate`, is audited this round: with
    probability rate / share, so that, read once every 1/share rounds, it is audited at its rate
    per round on average."""
    return rate > 0.0 and draw(*key) < rate / policy.read_share


_UUID_SPACE = 1 << 128
# Bits of the random integer `start_key` takes (a row key is a 64-bit user id and a 128-bit UUID).
START_KEY_BITS = 192


def key_number(key: RowKey) -> int:
    """The key as one integer in the state's key order (user id, then the UUID's 128 bits)."""
    user_id, conversation_id = key
    return user_id * _UUID_SPACE + int(conversation_id.replace("-", ""), 16)


def number_key(number: int) -> RowKey:
    user_id, low = divmod(number, _UUID_SPACE)
    h = f"{low:032x}"
    return user_id, f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def start_key(bounds: tuple[RowKey, RowKey], pick: int) -> RowKey:
    """A key between the first and the last row key (inclusive), chosen by `pick` (a uniform
    random integer of START_KEY_BITS bits): uniform over the key space, not over the rows."""
    low, high = key_number(bounds[0]), key_number(bounds[1])
    return number_key(low + pick % (high - low + 1))


@dataclass(slots=True)
class Tick:
    """What one tick of a sweep read and drew."""

    read: int = 0  # rows read from the store
    eligible: int = 0  # of them, auditable (rate > 0)
    chosen: list[ConversationState] = field(default_factory=list)  # drawn (loaded), in key order
    swept: bool = False  # back where the round began: every row was read once this round


class KeyRangeSampler:
    """One partition's sweep over its persisted rows in key order (see the module doc).

    `cursor`: the last key read (None: before the first). A round (`begin_round`) goes on from
    the cursor, tick by tick, around the end of the key space, and never past where it began,
    so no row is read twice in a round. State lives across rounds (one sampler per partition)."""

    def __init__(self, start: RowKey | None = None) -> None:
        self.cursor: RowKey | None = start
        self.sweeps = 0  # times the sweep passed the end of the key space
        self._origin: RowKey | None = start
        self._wrapped = False

    def begin_round(self) -> None:
        self._origin = self.cursor
        self._wrapped = False

    def tick(
        self,
        rows: RowRange,
        limit: int,
        now_ms: int,
        policy: AuditPolicy,
        draw: Draw,
        room: int | None = None,
    ) -> Tick:
        """Read at most `limit` rows after the cursor and draw among them; stop early once
        `room` rows are drawn (the cursor stays on the last row read: the next round goes on from
        there, nothing is skipped) or the round is back where it began."""
        tick = Tick()
        origin = self._origin
        while tick.read < limit and not tick.swept and (room is None or len(tick.chosen) < room):
            wanted = limit - tick.read
            batch = rows.rows_after(self.cursor, wanted)
            ended = len(batch) < wanted  # the end of the key space
            if self._wrapped and origin is not None:
                kept = [item for item in batch if item[0] <= origin]
                ended = ended or len(kept) < len(batch)
                batch = kept
            for key, record in batch:
                tick.read += 1
                self.cursor = key
                rate = audit_rate(ConversationState.audit_facts(record), now_ms, policy)
                if rate > 0.0:
                    tick.eligible += 1
                    if drawn(key, rate, policy, draw):
                        tick.chosen.append(ConversationState.load(record, *key))
                        if room is not None and len(tick.chosen) >= room:
                            return tick
            if not ended:
                continue
            if self._wrapped or origin is None:
                tick.swept = True  # from the origin round to it again
                if origin is None:
                    self.cursor = None
                    self.sweeps += 1
            else:
                self._wrapped = True
                self.cursor = None
                self.sweeps += 1
        return tick


# -- the recount ------------------------------------------------------------------------------


def copy_row(row: ConversationState) -> ConversationState:
    """An independent copy (bitmaps included): the recount runs on it, away from the live row."""
    return row.copy()


def recount(row: ConversationState, store: MessageStore, limit: int, *, lost_entries: bool = False) -> None:
    """Recount `row` (a copy: it is changed in place) from the MessageStore.

    The hand over (base, latest] is emptied and refilled by the bounded range read of `recompute`
    (messages this user received, recalls that reached this user); above `latest` the hand is
    kept (a former member's messages past `left_at`), and `floor` stays honest: complete above
    `latest` only if it was before.

    `lost_entries` (a reconcile after a retention overrun, app/domain/retention.py): entries of
    this user may have been deleted unread, so "received" cannot be told from the state: every
    message the store holds in (base, latest] is taken as received first (one more bounded read),
    as a rebuild from state takes the store (`recompute(received_only=False)`)."""
    base, latest = row.base, row.latest
    if lost_entries and base < latest <= base + limit:
        for message in store.range(row.conversation_id, base, latest):
            row.received = seqs.add(row.received, message.conversation_seq)
    if latest > base:
        row.counting = seqs.remove_range(row.counting, base + 1, latest + 1)
        row.mentioning = seqs.remove_range(row.mentioning, base + 1, latest + 1)
        row.floor = max(row.floor, latest)
    recompute(row, store, limit)


def counts(row: ConversationState) -> Counts:
    return (row.unread_count, row.unread_exact, row.mention_count, row.mention_first)


def adopt(live: ConversationState, recounted: ConversationState) -> None:
    """The live row takes the recount's counts and the hand behind them (and what it took as
    received: a recount only ever adds to the copy's, and the copy is of the same version)."""
    live.received = recounted.received
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
    badge_off = badge_of(stored) != user.badge
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
