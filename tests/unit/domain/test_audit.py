"""The unread audit's pure core (app/domain/audit.py): which rows, the recount, the verdict."""

from __future__ import annotations

import random

import pytest

from app.domain import seqs
from app.domain.audit import (
    START_KEY_BITS,
    AuditPolicy,
    KeyRangeSampler,
    Repair,
    Sampler,
    audit_rate,
    audit_user,
    copy_row,
    counts,
    eligible,
    eligible_at_zero,
    key_number,
    keyed_draw,
    number_key,
    recount,
    round_budget,
    start_key,
)
from app.domain.badge import Badge, full_recompute
from app.domain.conversation import ConversationState
from app.domain.flush import Correction
from app.domain.projection_store import StoredRows
from app.domain.projector import Projector, UserState
from app.replay import Replayer, ReplayOptions
from tests.support.row_range import ListRange, key_of
from tests.support.strategies import BASE_TS, Builder

DAY = 86_400_000
A = "0a0a0a0a-0000-4000-8000-00000000000a"
B = "0b0b0b0b-0000-4000-8000-00000000000b"
C = "0c0c0c0c-0000-4000-8000-00000000000c"
USER = 7


def replayed(builder: Builder) -> Replayer:
    replayer = Replayer(ReplayOptions(), lambda frame: None)
    replayer.feed_many(builder.finish())
    replayer.finish()
    return replayer


def two_unread_rows() -> Replayer:
    """User 7: A has 3 unread (one mentions), B has 1 after a read, C has none (own message)."""
    s = Builder()
    for seq in (1, 2, 3):
        s.message(USER, A, seq, sender=9, mention=seq == 2)
    for seq in (1, 2):
        s.message(USER, B, seq, sender=9)
    s.read(USER, B, 1)
    s.message(USER, C, 1, sender=USER)
    return replayed(s)


def policy(rate: float = 1.0, idle_ms: int = DAY, max_rows: int = 1000) -> AuditPolicy:
    return AuditPolicy(sample_rate=rate, idle_ms=idle_ms, max_rows=max_rows)


def stored_as(user: UserState, **changes: object) -> StoredRows:
    """The store's copy as the last flush left it (in step with the state), then `changes`."""
    rows: dict[str, dict[str, object] | None] = {cid: r.as_row() for cid, r in user.rows.items()}
    fields: dict[str, object] = {
        "user_id": user.user_id,
        "rows": rows,
        "total_unread": user.badge.total_unread,
        "total_mention": user.badge.total_mention,
        "muted_unread": user.badge.muted_unread,
        "projection_mailbox_seq": user.flushed_seq,
    }
    fields.update(changes)
    return StoredRows(**fields)  # type: ignore[arg-type]


def recounted(user: UserState, projector: Projector, *conversation_ids: str) -> dict[str, ConversationState]:
    out = {}
    for cid in conversation_ids:
        copy = copy_row(user.rows[cid])
        recount(copy, projector.store, 200)
        out[cid] = copy
    return out


# -- which rows ----------------------------------------------------------------------------------


def test_eligible_rows_have_unread_are_exact_idle_and_fit_one_read() -> None:
    user = two_unread_rows().projector.users[USER]
    a, c = user.rows[A], user.rows[C]
    idle = a.changed_at + DAY
    assert a.changed_at > BASE_TS  # the event time of the row's last entry
    assert eligible(a, idle, policy()) and not eligible(a, idle - 1, policy())
    assert not eligible(c, idle, policy())  # nothing unread
    assert eligible(a, a.changed_at, policy(idle_ms=0))
    wide = copy_row(a)
    wide.head_seq = 201  # (0, 201]: one more than a bounded read covers
    assert not eligible(wide, idle, policy())
    inexact = copy_row(a)
    inexact.unread_exact = False
    assert not eligible(inexact, idle, policy())


def test_a_records_audit_facts_are_its_rows_and_select_alike() -> None:
    """The sweep selects on a record's facts without loading the row: the same fields, the same
    verdict as the loaded row, in every record format."""
    user = two_unread_rows().projector.users[USER]
    now = max(r.changed_at for r in user.rows.values()) + DAY
    mixed = AuditPolicy(sample_rate=0.5, idle_ms=DAY, max_rows=10, zero_sample_rate=0.25)
    for row in user.rows.values():
        record = row.dump()
        facts = ConversationState.audit_facts(record)
        assert facts == (row.unread_count, row.unread_exact, row.changed_at, row.base, row.latest)
        assert audit_rate(facts, now, mixed) == audit_rate(row, now, mixed)
        for older in (record[:-1], record[:-2]):  # formats 3 and 2
            older = [4 - (len(record) - len(older)), *older[1:]]
            assert ConversationState.audit_facts(older) == facts
    with pytest.raises(ValueError):
        ConversationState.audit_facts([99, *user.rows[A].dump()[1:]])


def test_the_sampler_keeps_at_most_max_rows_with_the_lowest_draws() -> None:
    rows = []
    for n in range(50):
        row = ConversationState(n, A)
        row.unread_count, row.head_seq = 1, 1
        rows.append(row)
    draw = keyed_draw(12345)
    sampler = Sampler(policy(rate=0.5, idle_ms=0, max_rows=5), now_ms=0, draw=draw)
    for row in rows:
        sampler.offer(row)
    below = sorted((draw(r.user_id, A), r.user_id) for r in rows if draw(r.user_id, A) < 0.5)
    assert sampler.eligible_rows == 50 and sampler.drawn_rows == len(below) > 5
    assert [r.user_id for r in sampler.chosen()] == sorted(user for _, user in below[:5])


def test_rate_zero_draws_nothing_and_rate_one_everything_eligible() -> None:
    user = two_unread_rows().projector.users[USER]
    now = max(r.changed_at for r in user.rows.values()) + DAY
    for rate, want in ((0.0, []), (1.0, [A, B])):
        sampler = Sampler(policy(rate=rate), now, keyed_draw(1))
        for row in user.rows.values():
            sampler.offer(row)
        assert [r.conversation_id for r in sampler.chosen()] == want
        assert sampler.eligible_rows == 2


def test_keyed_draws_are_uniform_per_round_and_differ_between_rounds() -> None:
    first, again, other = keyed_draw(1), keyed_draw(1), keyed_draw(2)
    values = [first(u, A) for u in range(4000)]
    assert values == [again(u, A) for u in range(4000)]
    assert values != [other(u, A) for u in range(4000)]
    assert all(0.0 <= v < 1.0 for v in values)
    assert abs(sum(v < 0.25 for v in values) / 4000 - 0.25) < 0.03


def test_policy_bounds_are_checked() -> None:
    for bad in ({"sample_rate": 1.5}, {"sample_rate": -0.1}, {"max_rows": 0}, {"idle_ms": -1}):
        with pytest.raises(ValueError):
            AuditPolicy(**{"sample_rate": 0.1, "idle_ms": 0, "max_rows": 1, **bad})  # type: ignore[arg-type]


def test_rows_at_zero_are_auditable_at_a_rate_of_their_own() -> None:
    user = two_unread_rows().projector.users[USER]
    a, c = user.rows[A], user.rows[C]
    now = max(r.changed_at for r in user.rows.values()) + DAY
    both = AuditPolicy(sample_rate=0.25, idle_ms=DAY, max_rows=10, zero_sample_rate=0.0625)
    assert not eligible_at_zero(a, now, both) and eligible_at_zero(c, now, both)
    assert (audit_rate(a, now, both), audit_rate(c, now, both)) == (0.25, 0.0625)
    assert audit_rate(c, now - 1, both) == 0.0  # not idle
    inexact = copy_row(c)
    inexact.unread_exact = False
    assert audit_rate(inexact, now, both) == 0.0
    assert both.read_share == 0.25 and AuditPolicy(0.0, 0, 1, zero_sample_rate=0.5).read_share == 0.5
    with pytest.raises(ValueError):
        AuditPolicy(0.1, 0, 1, zero_sample_rate=1.5)
    # The former sampler takes them too (bench/audit_bench.py compares both).
    sampler = Sampler(AuditPolicy(1.0, DAY, 10, zero_sample_rate=1.0), now, keyed_draw(3))
    for row in user.rows.values():
        sampler.offer(row)
    assert [r.conversation_id for r in sampler.chosen()] == [A, B, C]


def test_round_budget_is_the_read_share_of_the_rows() -> None:
    assert round_budget(40_000, policy(rate=0.005)) == 200
    assert round_budget(10, policy(rate=0.005)) == 1  # at least one row while the audit is on
    assert round_budget(10, policy(rate=0.0)) == 0 and round_budget(0, policy(rate=1.0)) == 0
    assert round_budget(1000, AuditPolicy(0.001, 0, 1, zero_sample_rate=0.01)) == 10


def test_start_keys_lie_between_the_bounds_and_round_trip_as_numbers() -> None:
    first, last = (5, "00000000-0000-4000-8000-000000000001"), (9, C)
    for key in (first, last, (2**64 - 1, "ffffffff-ffff-ffff-ffff-ffffffffffff")):
        assert number_key(key_number(key)) == key
    rnd = random.Random(5)
    users = set()
    for _ in range(2000):
        key = start_key((first, last), rnd.getrandbits(START_KEY_BITS))
        assert first <= key <= last
        users.add(key[0])
    assert users == {5, 6, 7, 8, 9}  # uniform over the key space: every user id between
    assert start_key((last, last), rnd.getrandbits(START_KEY_BITS)) == last


def idle_rows(count: int, unread: int = 0, users: int = 97) -> list[ConversationState]:
    rows = []
    for n in range(count):
        row = ConversationState(n % users, f"{n:08x}-0000-4000-8000-{n:012x}")
        row.unread_count = unread
        row.head_seq = unread
        rows.append(row)
    return rows


def test_a_tick_reads_at_most_its_limit_whatever_the_store_holds() -> None:
    store = ListRange(idle_rows(100_000, unread=1))
    sweep = KeyRangeSampler()
    sweep.begin_round()
    every = policy(rate=1.0, idle_ms=0, max_rows=10**6)
    for _ in range(30):
        tick = sweep.tick(store, 500, 0, every, keyed_draw(1))
        assert tick.read == 500 == len(tick.chosen) and not tick.swept
    assert sum(store.reads) == 30 * 500 and max(store.reads) == 500
    assert sweep.cursor == key_of(store.rows[30 * 500 - 1])


def test_a_round_goes_around_the_end_once_and_stops_where_it_began() -> None:
    store = ListRange(idle_rows(1000, unread=1))
    every = policy(rate=1.0, idle_ms=0, max_rows=10**6)
    sweep = KeyRangeSampler(start=store.keys[699])
    sweep.begin_round()
    read: list[tuple[int, str]] = []
    while True:
        tick = sweep.tick(store, 64, 0, every, keyed_draw(2))
        read += [key_of(row) for row in tick.chosen]
        if tick.swept:
            break
    assert read == store.keys[700:] + store.keys[:700]  # each row once, in sweep order
    assert sweep.sweeps == 1 and sweep.cursor == store.keys[699]


def test_the_cap_stops_the_sweep_on_the_last_row_drawn_and_the_next_round_goes_on_there() -> None:
    store = ListRange(idle_rows(1000, unread=1))
    every = policy(rate=1.0, idle_ms=0, max_rows=10**6)
    sweep = KeyRangeSampler()
    sweep.begin_round()
    tick = sweep.tick(store, 500, 0, every, keyed_draw(2), room=30)
    assert tick.read == 30 and len(tick.chosen) == 30 and sweep.cursor == store.keys[29]
    sweep.begin_round()
    tick = sweep.tick(store, 10, 0, every, keyed_draw(2))
    assert [key_of(row) for row in tick.chosen] == store.keys[30:40]


def test_rows_read_are_drawn_at_their_rate_over_the_read_share() -> None:
    """Unread rows at 0.5 and rows at 0 at 0.125, read at share 0.5: an unread row read is
    always drawn, a row at 0 a quarter of the time."""
    rows = idle_rows(4000, unread=1) + [
        ConversationState(10_000 + n, f"{n:08x}-0000-4000-8000-{n:012x}") for n in range(4000)
    ]
    store = ListRange(rows)
    mixed = AuditPolicy(sample_rate=0.5, idle_ms=0, max_rows=10**6, zero_sample_rate=0.125)
    sweep = KeyRangeSampler()
    sweep.begin_round()
    tick = sweep.tick(store, 10_000, 0, mixed, keyed_draw(9))
    assert tick.read == tick.eligible == 8000 and tick.swept
    with_unread = sum(1 for row in tick.chosen if row.unread_count)
    at_zero = len(tick.chosen) - with_unread
    assert with_unread == 4000 and abs(at_zero / 4000 - 0.25) < 0.03


# -- the recount ---------------------------------------------------------------------------------


def test_a_correct_row_recounts_to_itself_and_a_drifted_one_to_the_definition() -> None:
    replayer = two_unread_rows()
    user = replayer.projector.users[USER]
    a = user.rows[A]
    assert counts(a) == (3, True, 1, 2)
    copy = copy_row(a)
    recount(copy, replayer.store, 200)
    assert counts(copy) == counts(a)
    # Drift: wrong counts AND a hand that agrees with them (so the hand cannot give it away).
    a.unread_count, a.mention_count, a.mention_first = 9, 0, None
    a.counting = seqs.add(a.counting, 4)
    a.mentioning = None
    drifted = copy_row(a)
    recount(drifted, replayer.store, 200)
    assert counts(drifted) == (3, True, 1, 2)
    assert counts(a) == (9, True, 0, None)  # the live row is never touched by a recount


def test_the_recount_counts_only_what_this_user_received_and_its_own_recalls() -> None:
    s = Builder()
    s.message(USER, A, 1, sender=9)
    s.message(8, A, 2, sender=9)  # in the store, never in user 7's mailbox
    s.message(USER, A, 3, sender=9)
    s.recall(8, A, 1, sender=9)  # reached user 8 only (user 7 had left, say)
    replayer = replayed(s)
    row = replayer.projector.users[USER].rows[A]
    assert counts(row) == (2, True, 0, None)  # the definition: seqs 1 and 3
    copy = copy_row(row)
    recount(copy, replayer.store, 200)
    assert counts(copy) == (2, True, 0, None)


# -- the verdict ---------------------------------------------------------------------------------


def test_in_step_user_with_a_drifted_stored_row_gets_an_in_place_correction() -> None:
    replayer = two_unread_rows()
    user = replayer.projector.users[USER]
    truth = user.rows[A].as_row()
    stored = stored_as(user, rows={A: {**truth, "unread_count": 8}, B: user.rows[B].as_row()})
    verdict = audit_user(user, recounted(user, replayer.projector, A, B), stored, include_muted=False)
    assert verdict.repair is Repair.CORRECT
    assert verdict.audited == (A, B) and verdict.drifted == (A,) and verdict.state_drifted == ()
    want = Correction(USER, user.flushed_seq, [truth], user.badge, user.driving_event_id)
    assert verdict.correction == want
    assert not verdict.stored_badge_drifted


def test_a_missing_stored_row_and_a_wrong_stored_badge_are_drift_too() -> None:
    replayer = two_unread_rows()
    user = replayer.projector.users[USER]
    stored = stored_as(user, rows={A: None}, total_unread=99)
    verdict = audit_user(user, recounted(user, replayer.projector, A), stored, include_muted=False)
    assert verdict.repair is Repair.CORRECT and verdict.drifted == (A,) and verdict.stored_badge_drifted
    assert verdict.correction is not None and verdict.correction.badge == Badge(4, 1, 0)
    # Only the badge off: a correction without rows.
    verdict = audit_user(
        user, recounted(user, replayer.projector, A), stored_as(user, total_mention=5), include_muted=False
    )
    assert verdict.repair is Repair.CORRECT and verdict.drifted == ()
    assert verdict.correction is not None and verdict.correction.rows == []


def test_a_drifted_state_takes_the_recount_and_its_badge_is_recomputed() -> None:
    replayer = two_unread_rows()
    user = replayer.projector.users[USER]
    a = user.rows[A]
    stored = stored_as(user)  # the store agrees with the truth...
    a.unread_count = 5  # ...the state drifted (and so did its badge, by deltas)
    user.badge = Badge(6, 1, 0)
    verdict = audit_user(user, recounted(user, replayer.projector, A), stored, include_muted=False)
    assert verdict.state_drifted == (A,) and verdict.state_badge_drifted
    assert a.unread_count == 3 and user.badge == Badge(4, 1, 0)
    # The stored copy equalled the truth: nothing to write for the row, nor for the badge.
    assert verdict.drifted == (A,) and verdict.repair is Repair.NONE


def test_pending_flush_and_lost_write_and_store_ahead() -> None:
    replayer = two_unread_rows()
    projector = replayer.projector
    user = projector.users[USER]
    wrong = {**user.rows[A].as_row(), "unread_count": 0}
    # A flush is pending for the user (another conversation changed): the drifted row joins it.
    user.projection_mailbox_seq += 1
    stored = stored_as(user, rows={A: wrong})
    verdict = audit_user(user, recounted(user, projector, A), stored, include_muted=False)
    assert verdict.repair is Repair.REFLUSH_ROWS and verdict.reflush == (A,)
    user.projection_mailbox_seq -= 1
    # The store lost a write (older version than the state flushed): every row again.
    stored = stored_as(user, rows={A: wrong}, projection_mailbox_seq=user.flushed_seq - 1)
    verdict = audit_user(user, recounted(user, projector, A), stored, include_muted=False)
    assert verdict.repair is Repair.REFLUSH_USER and verdict.reflush == (A, B, C)
    # The store is ahead of this worker: not judged, nothing changed.
    stored = stored_as(user, rows={A: wrong}, projection_mailbox_seq=user.flushed_seq + 1)
    verdict = audit_user(user, recounted(user, projector, A), stored, include_muted=False)
    assert verdict.repair is Repair.NOT_JUDGED and verdict.audited == ()


def test_rows_that_changed_since_the_copy_or_wait_for_a_flush_are_not_judged() -> None:
    replayer = two_unread_rows()
    user = replayer.projector.users[USER]
    copies = recounted(user, replayer.projector, A, B)
    user.rows[A].version += 1  # an entry applied after the copy was made
    stored = stored_as(user, rows={A: None, B: None})
    verdict = audit_user(user, copies, stored, include_muted=False, dirty={B})
    assert verdict.audited == () and verdict.repair is Repair.NONE


def test_correction_frames_restate_the_version() -> None:
    fix = Correction(USER, 10, [{"conversation_id": A, "unread_count": 1}], Badge(1, 0, 0), "ev-10")
    delta, badge = fix.session_delta(), fix.badge_update()
    assert delta["projection_mailbox_seq"] == delta["prev_projection_mailbox_seq"] == 10
    assert delta["correction"] is True and delta["conversations"] == fix.rows
    assert badge["correction"] is True and badge["total_unread"] == 1
    assert badge["projection_mailbox_seq"] == badge["prev_projection_mailbox_seq"] == 10


def test_full_recompute_is_what_a_correction_carries() -> None:
    replayer = two_unread_rows()
    user = replayer.projector.users[USER]
    rnd = random.Random(3)
    for row in user.rows.values():
        row.unread_count = rnd.randint(0, 50)  # drift everywhere, badge untouched
    stored = stored_as(user)
    verdict = audit_user(user, recounted(user, replayer.projector, A, B, C), stored, include_muted=False)
    assert user.badge == full_recompute(user.rows.values(), False) == Badge(4, 1, 0)
    assert verdict.state_drifted == (A, B, C)
