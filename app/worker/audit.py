"""The unread audit in the worker (docs/contract.md §3.4): each round (`audit_tick`) sweeps a share
of every owned partition's persisted rows, recounts the drawn ones from the MessageStore, and
judges and repairs each user under the core's flush lock (`judge_user`). Reads block, so they run
in a worker thread in short ticks (docs/decisions/0015-unread-audit-off-the-loop.md). A failing
read or write costs that row or user this round, never the worker."""

from __future__ import annotations

import asyncio
import logging
import random
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from app.domain.audit import (
    START_KEY_BITS,
    AuditPolicy,
    Draw,
    KeyRangeSampler,
    Repair,
    audit_rate,
    audit_user,
    copy_row,
    keyed_draw,
    recount,
    round_budget,
    start_key,
)
from app.domain.conversation import ConversationState
from app.domain.ports import MessageStore
from app.domain.residency import Residency

if TYPE_CHECKING:
    from app.settings import AuditSettings
    from app.worker.core import PartitionState, WorkerCore

log = logging.getLogger("projector.audit")

# Rows read from the persisted state per tick: short, the loop waits for it
# (docs/decisions/0015-unread-audit-off-the-loop.md).
_READ_SLICE = 100
# Rows recounted per hop to the worker thread (one range read each).
_RECOUNT_SLICE = 64


@dataclass(frozen=True, slots=True)
class AuditConfig:
    sample_rate: float
    interval_ms: int
    idle_ms: int
    max_rows: int
    zero_sample_rate: float = 0.0

    @classmethod
    def from_settings(cls, audit: AuditSettings) -> AuditConfig:
        return cls(
            sample_rate=audit.unread_audit_sample_rate,
            interval_ms=audit.unread_audit_interval_ms,
            idle_ms=audit.unread_audit_idle_ms,
            max_rows=audit.unread_audit_max_rows,
            zero_sample_rate=audit.unread_audit_zero_sample_rate,
        )

    @property
    def on(self) -> bool:
        return max(self.sample_rate, self.zero_sample_rate) > 0.0


@dataclass(slots=True)
class AuditReport:
    """What one round did (also logged)."""

    read: int = 0  # persisted rows the sweep read (decoded in the worker thread)
    eligible: int = 0  # of those, auditable: idle, exact, within one bounded read (rate > 0)
    sampled: int = 0  # of those, drawn (after the cap), not waiting for a flush
    audited: int = 0  # compared with their recount (unchanged since the copy, not waiting)
    drifted: int = 0  # the stored row or the state's counts differed from the recount
    corrected: int = 0  # drifted rows repaired: written in place, or handed to the next flush
    state_corrected: int = 0  # drifted rows whose state (not only the store) took the recount
    refused: int = 0  # drifted rows whose in-place correction the store refused (moved on)
    failed: int = 0  # sampled rows lost to a failing read or write
    not_judged: int = 0  # sampled rows of users whose stored version is ahead of this worker
    overlapped: bool = False  # another round of this core was still running: nothing done

    @property
    def drift_ratio(self) -> float | None:
        return self.drifted / self.audited if self.audited else None


# Cores with a round under way: a round that outlasts the interval is not joined by the next.
_running: weakref.WeakSet[WorkerCore] = weakref.WeakSet()
# Each owned partition's sweep, kept across rounds (a partition assigned again starts anew).
_sweeps: weakref.WeakKeyDictionary[PartitionState, KeyRangeSampler] = weakref.WeakKeyDictionary()


async def audit_tick(
    core: WorkerCore, config: AuditConfig, now_ms: int, *, rng: random.Random | None = None
) -> AuditReport:
    """One audit round over `core`'s partitions at `now_ms`; `rng` draws the sample (default: a
    fresh `random.Random()`). The drift ratio takes this round's share if it compared any row."""
    report = AuditReport()
    if not config.on:
        return report
    if core in _running:
        report.overlapped = True
        return report
    _running.add(core)
    try:
        await _round(core, config, now_ms, rng or random.Random(), report)
    except Exception:  # a bug in a round must not stop the worker that runs it
        log.exception("unread audit: round aborted")
    finally:
        _running.discard(core)
    stats = core.stats
    stats.audit_rounds += 1
    stats.audited_rows += report.audited
    stats.audit_drifted_rows += report.drifted
    stats.audit_corrected_rows += report.corrected
    ratio = report.drift_ratio
    if ratio is not None:
        stats.audit_drift_ratio = ratio
    log.log(
        logging.INFO if report.drifted or report.failed else logging.DEBUG,
        "unread audit: %d read, %d eligible, %d sampled, %d audited, %d drifted (%d in the state), "
        "%d corrected, %d refused, %d failed, %d not judged",
        report.read,
        report.eligible,
        report.sampled,
        report.audited,
        report.drifted,
        report.state_corrected,
        report.corrected,
        report.refused,
        report.failed,
        report.not_judged,
    )
    return report


async def _round(
    core: WorkerCore, config: AuditConfig, now_ms: int, rng: random.Random, report: AuditReport
) -> None:
    limit = core.config.unread_precise_limit
    policy = AuditPolicy(config.sample_rate, config.idle_ms, config.max_rows, limit, config.zero_sample_rate)
    draw = keyed_draw(rng.getrandbits(128))
    for state in list(core.partitions.values()):
        room = policy.max_rows - report.sampled
        residency = state.processor.residency
        if room <= 0:
            break
        if residency is None or state.released:
            continue
        chosen = await sweep_round(state, residency, policy, now_ms, draw, rng, room, report)
        report.sampled += len(chosen)
        await _recount_and_judge(core, state, residency, chosen, limit, report)


async def sweep_round(
    state: PartitionState,
    residency: Residency,
    policy: AuditPolicy,
    now_ms: int,
    draw: Draw,
    rng: random.Random,
    room: int,
    report: AuditReport,
) -> list[ConversationState]:
    """This round's ticks of the partition's sweep (read in the worker thread), drawn rows copied."""
    sweep = _sweeps.get(state)
    if sweep is None:
        bounds = await asyncio.to_thread(residency.key_bounds)
        start = None if bounds is None else start_key(bounds, rng.getrandbits(START_KEY_BITS))
        sweep = _sweeps[state] = KeyRangeSampler(start)
    budget = round_budget(await asyncio.to_thread(residency.estimated_rows), policy)
    sweep.begin_round()
    drawn_rows: list[ConversationState] = []
    while budget > 0 and len(drawn_rows) < room and not state.released:
        tick = await asyncio.to_thread(
            sweep.tick, residency, min(_READ_SLICE, budget), now_ms, policy, draw, room - len(drawn_rows)
        )
        budget -= tick.read
        report.read += tick.read
        report.eligible += tick.eligible
        drawn_rows.extend(_live_copies(state, tick.chosen, policy, now_ms))
        if tick.swept or tick.read == 0:
            break
    return drawn_rows


def _live_copies(
    state: PartitionState, drawn_rows: Sequence[ConversationState], policy: AuditPolicy, now_ms: int
) -> list[ConversationState]:
    """On the loop: the rows to recount, as copies (the live row if in memory and still auditable,
    else the persisted copy); rows waiting for a flush are left out (their store copy lags)."""
    processor = state.processor
    chosen: list[ConversationState] = []
    for row in drawn_rows:
        if row.conversation_id in processor.dirty_rows(row.user_id):
            continue
        user = processor.users.get(row.user_id)
        live = user.rows.get(row.conversation_id) if user is not None else None
        if live is None:
            chosen.append(row)  # read for this round alone: nobody else holds it
        elif audit_rate(live, now_ms, policy) > 0.0:
            chosen.append(copy_row(live))
    return chosen


async def _recount_and_judge(
    core: WorkerCore,
    state: PartitionState,
    residency: Residency,
    chosen: Sequence[ConversationState],
    limit: int,
    report: AuditReport,
) -> None:
    # user_id -> conversation_id -> recounted copy
    recounted: dict[int, dict[str, ConversationState]] = {}
    for start in range(0, len(chosen), _RECOUNT_SLICE):
        copies = chosen[start : start + _RECOUNT_SLICE]
        done = await asyncio.to_thread(_recount_all, copies, core.message_store, limit)
        for row, ok in zip(copies, done, strict=True):
            if ok:
                recounted.setdefault(row.user_id, {})[row.conversation_id] = row
            else:
                report.failed += 1
    for user_id in sorted(recounted):
        if core.partitions.get(state.partition) is not state:  # handed to another worker since
            return
        await _bring_in(state, residency, user_id)
        await _judge(core, state, user_id, recounted[user_id], report)


async def _bring_in(state: PartitionState, residency: Residency, user_id: int) -> None:
    """The user and every row in memory before the verdict (read in the worker thread)."""
    user = state.processor.users.get(user_id)
    if user is not None and user.complete:
        return
    evictions = residency.evictions
    try:
        read = await asyncio.to_thread(residency.read_user, user_id)
    except Exception as exc:  # the verdict's own read tries again
        log.warning("unread audit: reading user %d failed: %s", user_id, exc)
        return
    if read is not None and not state.released:
        residency.attach(read, evictions)


def _recount_all(rows: Sequence[ConversationState], store: MessageStore, limit: int) -> list[bool]:
    """In the worker thread: recount each copy; False where the MessageStore read failed."""
    done: list[bool] = []
    for row in rows:
        try:
            recount(row, store, limit)
        except Exception as exc:  # the store's own error types differ per adapter
            log.warning("unread audit: recount of %d/%s failed: %s", row.user_id, row.conversation_id, exc)
            done.append(False)
        else:
            done.append(True)
    return done


async def _judge(
    core: WorkerCore,
    state: PartitionState,
    user_id: int,
    rows: dict[str, ConversationState],
    report: AuditReport,
) -> None:
    # `complete`: the user's rows not in memory are read in first (the badge uses every row).
    judged = await judge_user(core, state, user_id, rows, "unread audit", complete=True)
    report.audited += judged.audited
    report.drifted += judged.drifted
    report.state_corrected += judged.state_corrected
    report.corrected += judged.corrected
    report.refused += judged.refused
    report.failed += judged.failed
    report.not_judged += judged.not_judged


@dataclass(slots=True)
class Judgement:
    """What `judge_user` found and did for one user."""

    audited: int = 0  # rows compared
    drifted: int = 0  # of them, the stored row or the state's counts differed
    state_corrected: int = 0  # of them, the state's counts took the recount
    corrected: int = 0  # drifted rows repaired (in place, by the next flush, or in the state)
    refused: int = 0  # drifted rows whose in-place correction the store refused (it moved on)
    failed: int = 0  # rows lost to a failing read or write
    not_judged: int = 0  # rows of a user whose stored version is ahead of this worker
    repair: Repair | None = None  # None: nothing judged (the user left the partition, a failure)
    written: tuple[dict[str, Any], ...] = ()  # rows a correction wrote in place
    stored: dict[str, dict[str, object] | None] = field(default_factory=dict)  # as read, by conversation
    badge_corrected: bool = False  # the stored badge was off and was corrected in place


async def judge_user(
    core: WorkerCore,
    state: PartitionState,
    user_id: int,
    rows: dict[str, ConversationState],
    what: str,
    *,
    complete: bool = False,
) -> Judgement:
    """Judge one user's recounted rows against the state and the stored projection and repair
    (app/domain/audit.audit_user), under the core's flush lock. Shared by the audit and reconcile."""
    processor = state.processor
    store = core.projection_store
    judged = Judgement()
    async with core.flush_lock:
        if state.released:  # handed to another worker since the copies were taken
            return judged
        try:
            stored = await store.load_rows(user_id, sorted(rows))
        except Exception as exc:  # Redis down or unreadable data: this user waits for a later round
            log.warning("%s: reading user %d failed: %s", what, user_id, exc)
            judged.failed += len(rows)
            return judged
        judged.stored = dict(stored.rows)
        if complete:
            # Evicted rows (the hot set's bound) are read back: the verdict sees every row.
            user = processor.projector.user(user_id)
            if user is not None:
                processor.projector.complete(user)
        else:
            user = processor.users.get(user_id)
        if user is None:
            return judged
        # Judged after the read: an entry applied meanwhile made its row dirty (skipped).
        verdict = audit_user(
            user,
            rows,
            stored,
            include_muted=core.config.include_muted,
            dirty=processor.dirty_rows(user_id),
        )
        judged.repair = verdict.repair
        if verdict.repair is Repair.NOT_JUDGED:
            judged.not_judged += len(rows)
            return judged
        judged.audited += len(verdict.audited)
        judged.drifted += len(verdict.drifted)
        judged.state_corrected += len(verdict.state_drifted)
        correction = verdict.correction
        if verdict.state_drifted or verdict.state_badge_drifted:
            processor.touch([(user_id, cid) for cid in verdict.state_drifted], [user_id], core.clock())
            if verdict.repair is Repair.CORRECT:
                # The corrected state is persisted before the store shows it.
                try:
                    await core.persist(state)
                except Exception as exc:
                    log.warning("%s: persisting user %d's correction failed: %s", what, user_id, exc)
                    judged.failed += len(verdict.drifted)
                    return judged
        if verdict.repair is Repair.CORRECT and correction is not None:
            try:
                (written,) = await store.correct([correction])
            except Exception as exc:
                log.warning("%s: correcting user %d failed: %s", what, user_id, exc)
                judged.failed += len(verdict.drifted)
                return judged
            if not written:  # the store moved on since the read: a later round looks again
                judged.refused += len(verdict.drifted)
                return judged
            judged.written = tuple(correction.rows)
            judged.badge_corrected = verdict.stored_badge_drifted
            key = str(user_id).encode()
            deltas = [(key, orjson.dumps(correction.session_delta()))] if correction.rows else []
            badges = [(key, orjson.dumps(correction.badge_update()))] if verdict.stored_badge_drifted else []
            if deltas or badges:
                await core.outbox.frames(deltas, badges)
                core.stats.frames += len(deltas) + len(badges)
        elif verdict.repair in (Repair.REFLUSH_ROWS, Repair.REFLUSH_USER):
            processor.mark_dirty(user_id, verdict.reflush, core.clock())
        # Repaired: in place, handed to the next flush, or (state alone drifted) in the state.
        judged.corrected += len(verdict.drifted)
    return judged
