"""Minimal streams for discrepancies found between the core and the contract.

A test marked xfail(strict=True) documents a discrepancy the core still has (the reason says
which rule it breaks); when the core is fixed it XPASSes and the mark must go."""

from __future__ import annotations

import pytest

from app.replay import ReplayOptions, run_replay
from tests.property import invariants as inv
from tests.property.model import run_model
from tests.strategies import Builder

C = "0a0a0a0a-0000-4000-8000-000000000001"
D = "0b0b0b0b-0000-4000-8000-000000000002"


def _msg(seq: int, conv: str, cseq: int, ts: int) -> bytes:
    return (
        b'{"type":"message","mailbox_seq":%d,"lane":0,"ts":%d,"event_id":"e%d","user_id":1,'
        b'"conversation_id":"%s","conversation_seq":%d,"message_id":"m%d",'
        b'"activity_id":"%032x","sender_id":2,"created_at":%d,"counts_unread":true,"mention":false}'
        % (seq, ts, seq, conv.encode(), cseq, cseq, cseq, ts)
    )


@pytest.mark.xfail(
    strict=True,
    reason="contract conflict: contract-notes flush AFTER applying the entry that reaches the "
    "window, so a row with two entries at the same ts on both sides of that flush is written "
    "twice with span 0, above DESIGN §3.9's ceil(span/window)+1 = 1. Flushing BEFORE applying "
    "the first entry past the window would keep the bound with equal ts too.",
)
def test_two_entries_of_a_row_with_equal_ts_across_a_window_flush() -> None:
    lines = [
        _msg(1, D, 1, 1000),  # opens the window
        _msg(2, C, 1, 1010),  # reaches it: flush (D, C)
        _msg(3, C, 2, 1010),  # same ms, next window: C written again at the end
        b'{"type":"watermark","lane":0,"watermark":3,"ts":1010}',
    ]
    res = run_replay(lines, ReplayOptions(window_ms=10))
    inv.writes_bounded_by_window(res, run_model(lines), 10)


@pytest.mark.xfail(
    strict=True,
    reason="the core caps mailbox_seq / ts / watermark at 2^63-1 (int64) and dead-letters "
    "larger values; the contract bounds none of them (contract-notes: '>= 1' / '>= 0', ids "
    "are u64), so a u64 value like 2^63 is a valid entry",
)
@pytest.mark.parametrize("field", ["mailbox_seq", "ts", "watermark"])
def test_u64_seqs_above_int64_are_valid(field: str) -> None:
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


@pytest.mark.xfail(
    strict=True,
    reason="DESIGN §2: mailbox_dirty recomputes the row and 'the definition's value does not "
    "change'. A recall fanned out to the current members only (A had left) reaches the "
    "MessageStore through B; A's reconcile then drops m1 from A's count (2 -> 1), while without "
    "the reconcile A keeps 2: the row depends on reconcile timing under either reading of "
    "'recalled' (per the user's entries, or global).",
)
def test_reconcile_does_not_change_the_value_when_a_recall_missed_a_former_member() -> None:
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

    def row_of_a(res: object) -> dict[str, object]:
        (row,) = [r for r in res.projections if r["user_id"] == 1]  # type: ignore[attr-defined]
        return row

    plain = row_of_a(run_replay(lines(False), ReplayOptions()))
    reconciled = row_of_a(run_replay(lines(True), ReplayOptions()))
    assert reconciled["unread_count"] == plain["unread_count"]
