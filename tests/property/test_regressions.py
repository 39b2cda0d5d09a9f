"""Minimal streams for discrepancies found between the core and the contract.

A test marked xfail(strict=True) documents a discrepancy the core still has (the reason says
which rule it breaks); when the core is fixed it XPASSes and the mark must go. The tests without
a mark are discrepancies that were found and fixed (core and contract choices, 07:56)."""

from __future__ import annotations

import pytest

from app.replay import ReplayOptions, ReplayResult, run_replay
from tests.property import invariants as inv
from tests.property.model import run_model
from tests.support.strategies import Builder, dumps

C = "0a0a0a0a-0000-4000-8000-000000000001"
D = "0b0b0b0b-0000-4000-8000-000000000002"


def _msg(seq: int, conv: str, cseq: int, ts: int) -> bytes:
    return (
        b'{"type":"message","mailbox_seq":%d,"lane":0,"ts":%d,"event_id":"e%d","user_id":1,'
        b'"conversation_id":"%s","conversation_seq":%d,"message_id":"m%d",'
        b'"activity_id":"%032x","sender_id":2,"created_at":%d,"counts_unread":true,"mention":false}'
        % (seq, ts, seq, conv.encode(), cseq, cseq, cseq, ts)
    )


def test_two_entries_of_a_row_with_equal_ts_across_a_window_flush() -> None:
    """Was: flushing AFTER applying the entry that reaches the window wrote a row whose two
    entries share a ts on both sides of the flush twice (span 0, docs/contract.md §3.9 allows 1).
    Now the window closes BEFORE the first entry past it."""
    lines = [
        _msg(1, D, 1, 1000),  # opens the window
        _msg(2, C, 1, 1010),  # reaches it: flush (D, C)
        _msg(3, C, 2, 1010),  # same ms, next window: C written again at the end
        b'{"type":"watermark","lane":0,"watermark":3,"ts":1010}',
    ]
    res = run_replay(lines, ReplayOptions(window_ms=10))
    inv.writes_bounded_by_window(res, run_model(lines), 10)


@pytest.mark.parametrize("field", ["mailbox_seq", "ts", "watermark"])
def test_u64_seqs_above_int64_are_valid(field: str) -> None:
    """Was: mailbox_seq / ts / watermark capped at 2^63-1 (int64) and dead-lettered above."""
    big = 1 << 63
    seq, ts, w = (big, 5, big) if field == "mailbox_seq" else (1, 5, 1)
    if field == "ts":
        ts = big
    lines = [_msg(seq, C, 1, ts), b'{"type":"watermark","lane":0,"watermark":%d,"ts":0}' % w]
    if field == "watermark":
        lines[1] = b'{"type":"watermark","lane":0,"watermark":%d,"ts":0}' % big
    res = run_replay(lines, ReplayOptions())
    assert run_model(lines).stats["dead_letters"] == 0
    assert res.stats["dead_letters"] == 0 and res.stats["applied"] == 1


def test_reconcile_does_not_change_the_value_when_a_recall_missed_a_former_member() -> None:
    """Was: a recall fanned out to the current members only (A had left) reached the
    MessageStore through B; A's mailbox_dirty then dropped m1 from A's count (2 -> 1) while
    without it A kept 2 (docs/contract.md §2: a reconcile does not change the definition's value)."""

    def lines(with_dirty: bool) -> list[bytes]:
        b = Builder()
        a, other, sender = 1, 2, 3
        for user in (a, other):
            b.message(user, C, 1, sender)
            b.message(user, C, 2, sender)
        b.add("leave", a, C, left_at_conversation_seq=2, reason="left")
        b.recall(other, C, 1, sender)  # the recall reaches the members of the moment only
        if with_dirty:
            b.add("mailbox_dirty", a, C)
        return b.finish()

    def row_of_a(res: ReplayResult) -> dict[str, object]:
        (row,) = [r for r in res.projections if r["user_id"] == 1]
        return row

    plain = row_of_a(run_replay(lines(False), ReplayOptions()))
    reconciled = row_of_a(run_replay(lines(True), ReplayOptions()))
    assert reconciled["unread_count"] == plain["unread_count"]


@pytest.mark.parametrize(
    ("patch", "valid"),
    [
        ({"mailbox_seq": (1 << 64) - 1}, True),
        ({"mailbox_seq": 1 << 64}, False),
        ({"conversation_seq": (1 << 64) - 2}, True),
        ({"conversation_seq": (1 << 64) - 1}, False),
        ({"created_at": (1 << 64) - 1}, True),
    ],
)
def test_int_upper_bounds(patch: dict[str, int], valid: bool) -> None:
    b = Builder()
    e = b.message(1, C, 1, 2)
    e.update(patch)
    lines = [dumps(e), b'{"type":"watermark","lane":0,"watermark":%d,"ts":0}' % ((1 << 64) - 1)]
    res = run_replay(lines, ReplayOptions())
    model = run_model(lines)
    assert model.stats["dead_letters"] == (0 if valid else 1)
    assert res.stats == {**res.stats, **model.stats}
    inv.check_all(res, model, False, 5000, 100_000)


def test_stale_join_below_unreceived_messages() -> None:
    """Was: a stale join moved joined_at down (3 -> 0) below messages A never received (m1..m3
    reached the MessageStore through B only); the recompute read them from the store and counted
    4, the definition over A's applied entries (docs/contract.md §3.6) is 1. Fixed 09:15: the store read
    adds no message and no recall the user never received."""
    a, other, sender = 1, 2, 3
    b = Builder()
    for s in (1, 2, 3):
        b.message(other, C, s, sender)
    b.add("join", a, C, joined_at_conversation_seq=3)
    b.message(a, C, 4, sender)
    b.add("join", a, C, joined_at_conversation_seq=0)  # a late, stale join
    lines = b.finish()
    res = run_replay(lines, ReplayOptions())
    model = run_model(lines)
    assert model.rows[(a, C)]["unread_count"] == 1
    inv.rows_equal_model(res, model)


def test_recall_at_or_below_base_then_base_moves_down() -> None:
    """Was (core bug): a recall whose target was at or below base when applied was forgotten;
    after a join moved joined_at down, the message arriving later counted (1, definition 0).
    Found by test_big_rows_... Fixed 09:15: recalls are kept below the base."""
    a, sender = 1, 3
    b = Builder()
    b.add("join", a, C, joined_at_conversation_seq=5)
    b.recall(a, C, 3, sender)  # target 3 <= base 5 when applied
    b.add("join", a, C, joined_at_conversation_seq=0)  # base 0: m3 would count...
    b.message(a, C, 3, sender)  # ...but it was recalled before it came
    lines = b.finish()
    res = run_replay(lines, ReplayOptions())
    model = run_model(lines)
    assert model.rows[(a, C)]["unread_count"] == 0
    inv.check_all(res, model, False, 5000, 100_000)
