"""Hand-made streams for the hard corners of docs/contract.md §3.4-§3.7, core against model and against the
hand-computed values. Each stream is small enough to read."""

from __future__ import annotations

from typing import Any, cast

import pytest

from app.replay import ReplayOptions, run_replay
from tests.property import invariants as inv
from tests.property.model import U64, run_model
from tests.support.strategies import Builder, dumps, marker_line

C = "0a0a0a0a-0000-4000-8000-000000000001"
A, B, S = 1, 2, 3  # two readers and a sender


def check(lines: list[bytes], lanes: int = 1, **opts: Any) -> tuple[Any, Any]:
    o = ReplayOptions(lanes=lanes, **opts)
    res = run_replay(lines, o)
    model = run_model(lines, lanes, o.include_muted)
    inv.check_all(res, model, o.include_muted, o.window_ms, o.max_dirty_rows)
    return res, model


def core_row(res: Any, user: int = A, conv: str = C) -> dict[str, Any]:
    (row,) = [r for r in res.projections if (r["user_id"], r["conversation_id"]) == (user, conv)]
    return cast(dict[str, Any], row)


def counts(row: dict[str, Any]) -> tuple[Any, ...]:
    return (
        row["unread_count"],
        row["unread_exact"],
        row["mention_count"],
        row["mention_first_conversation_seq"],
    )


def test_message_store_knows_the_message_first_then_the_users_entry_brings_the_mention() -> None:
    b = Builder()
    b.message(B, C, 5, S, mention=False)  # the MessageStore has m5 (no mention for B)
    b.message(A, C, 6, S)
    b.add("mailbox_dirty", A, C)  # recompute over (0, 6] sees m5 from the store
    b.message(A, C, 5, S, mention=True)  # A's own entry for m5: it mentions A
    res, _ = check(b.finish())
    assert counts(core_row(res)) == (2, True, 1, 5)


def test_recompute_before_the_join_arrives_then_join_moves_base() -> None:
    b = Builder()
    for s in range(1, 6):
        b.message(B, C, s, S)  # the store has m1..m5 through B
    b.message(A, C, 6, S)  # A joined at 5 but its join entry comes later
    b.add("mailbox_dirty", A, C)
    b.add("join", A, C, joined_at_conversation_seq=5)
    res, _ = check(b.finish())
    assert counts(core_row(res)) == (1, True, 0, None)


def test_message_after_a_read_covering_it_and_after_its_own_recall() -> None:
    b = Builder()
    b.message(A, C, 3, S)
    b.read(A, C, 2)
    b.message(A, C, 2, S)  # covered by the read
    b.recall(A, C, 4, S, mention=True)
    b.message(A, C, 4, S, mention=True)  # recalled before it came
    b.message(A, C, 1, S)
    res, _ = check(b.finish())
    row = core_row(res)
    assert counts(row) == (1, True, 0, None)
    assert (row["latest_conversation_seq"], row["last_message_id"]) == (4, "m4")


def test_mention_first_moves_on_recall_and_read() -> None:
    b = Builder()
    for s in range(1, 7):
        b.message(A, C, s, S, mention=s in (2, 4, 6))
    b.recall(A, C, 2, S, mention=True)
    res, _ = check(b.finish())
    assert counts(core_row(res)) == (5, True, 2, 4)
    b.read(A, C, 4)
    res, _ = check(b.finish())
    assert counts(core_row(res)) == (2, True, 1, 6)


def test_own_and_non_counting_messages_never_count_even_when_mentioning() -> None:
    b = Builder()
    b.message(A, C, 1, A, mention=True)
    b.message(A, C, 2, S, counts_unread=False, mention=True)
    b.message(A, C, 3, S, mention=True)
    b.recall(A, C, 1, A, mention=True)  # J-4: own message
    b.recall(A, C, 2, S, counts_unread=False, mention=True)
    res, _ = check(b.finish())
    assert counts(core_row(res)) == (1, True, 1, 3)


def test_leave_below_head_moves_head_down_and_rejoin_restores_it() -> None:
    b = Builder()
    for s in (1, 2, 3, 6):  # m6 was sent after A rejoined at 5, and overtook A's leave
        b.message(A, C, s, S)
    b.add("leave", A, C, left_at_conversation_seq=3, reason="left")
    res, _ = check(b.finish())
    row = core_row(res)
    assert (row["latest_conversation_seq"], row["last_message_id"], row["unread_count"]) == (
        3,
        "m3",
        3,
    )
    b.add("join", A, C, joined_at_conversation_seq=5)
    res, _ = check(b.finish())
    row = core_row(res)
    assert (row["latest_conversation_seq"], row["last_message_id"], row["unread_count"]) == (
        6,
        "m6",
        1,
    )


def test_leave_with_no_received_message_at_or_below_left_at() -> None:
    b = Builder()
    for s in range(1, 5):
        b.message(B, C, s, S)  # the store has m1..m4, A never received them
    b.message(A, C, 6, S)
    b.add("leave", A, C, left_at_conversation_seq=4, reason="removed")
    res, _ = check(b.finish())
    row = core_row(res)
    assert (row["latest_conversation_seq"], row["last_message_id"], row["listed"]) == (
        None,
        None,
        True,
    )
    assert counts(row) == (0, True, 0, None)


def test_delete_conversation_without_head_and_revival() -> None:
    b = Builder()
    b.add("delete_conversation", A, C, deleted_before_conversation_seq=5)
    res, _ = check(b.finish())
    assert core_row(res)["listed"] is False
    b.message(A, C, 5, S)
    res, _ = check(b.finish())
    assert core_row(res)["listed"] is False
    b.message(A, C, 7, S)
    res, _ = check(b.finish())
    row = core_row(res)
    assert row["listed"] is True and counts(row) == (1, True, 0, None)


def _big(b: Builder, n: int = 300, user: int = A) -> None:
    for s in range(1, n + 1):
        b.message(user, C, s, S, mention=s % 50 == 0)


def _inexact(b: Builder) -> None:
    """A row the core can only recompute from the MessageStore with latest - base = 300: the
    messages at or below joined_at = 280 are outside the hand, then a (late) join moves joined_at
    down to 0 below them."""
    b.add("join", A, C, joined_at_conversation_seq=280)
    _big(b)
    b.add("join", A, C, joined_at_conversation_seq=0)


def test_reconcile_of_a_big_row_keeps_the_definition() -> None:
    b = Builder()
    _big(b)
    b.add("mailbox_dirty", A, C)  # the hand covers (0, 300]: the value does not change
    res, _ = check(b.finish())
    assert counts(core_row(res)) == (300, True, 6, 50)


@pytest.mark.parametrize(
    ("after", "want"),
    [
        # (entry after the row became inexact, expected counts)
        ({"type": "read", "read_conversation_seq": 250}, (50, True, 1, 300)),
        ({"type": "clear_history", "hidden_before_conversation_seq": 150}, (150, True, 3, 200)),
        ({"type": "leave", "left_at_conversation_seq": 150, "reason": "left"}, (150, True, 3, 50)),
        # gap 250: stays inexact (200) or becomes exact; check_all judges an exact value
        ({"type": "read", "read_conversation_seq": 50}, None),
        ({"type": "read", "read_conversation_seq": 300}, (0, True, 0, None)),
    ],
)
def test_inexact_row_becomes_exact_when_the_gap_closes(
    after: dict[str, Any], want: tuple[Any, ...] | None
) -> None:
    b = Builder()
    _inexact(b)
    res, _ = check(b.finish())
    assert counts(core_row(res))[:2] == (200, False)
    fields = {k: v for k, v in after.items() if k != "type"}
    b.add(after["type"], A, C, **fields)
    res, _ = check(b.finish())
    got = counts(core_row(res))
    if want is None:
        assert got[:2] == (200, False) or got[:2] == (250, True)
    else:
        assert got == want


def test_inexact_row_ignores_new_messages_and_recalls() -> None:
    b = Builder()
    _inexact(b)
    b.message(A, C, 301, S)
    b.recall(A, C, 299, S)
    res, _ = check(b.finish())
    assert counts(core_row(res))[:2] == (200, False)
    assert core_row(res)["latest_conversation_seq"] == 301


def test_a_retried_low_seq_entry_is_not_lost() -> None:  # J-3
    b = Builder(lanes=2)
    e1 = b.message(A, C, 1, S, lane=0)
    e2 = b.message(A, C, 2, S, lane=0)
    e3 = b.message(A, C, 3, S, lane=1)
    lines = [
        dumps(e1),
        dumps(e3),
        marker_line(1, 3),
        marker_line(0, 1),  # lane 0 cannot pass 2: it is being retried
        dumps(e2),
        marker_line(0, 3),
    ]
    res, _ = check(lines, lanes=2)
    assert counts(core_row(res)) == (3, True, 0, None)
    assert res.stats["applied"] == 3 and res.stats["duplicates"] == 0


def test_entries_at_or_below_a_lying_watermark_apply_at_once_and_lower_ones_are_duplicates() -> None:
    b = Builder()
    e = [b.message(A, C, s, S) for s in (1, 2, 3)]
    lines = [marker_line(0, 10), dumps(e[1]), dumps(e[0]), dumps(e[2])]
    res, _ = check(lines)
    assert res.stats["duplicates"] == 1 and res.stats["applied"] == 2


def test_bad_line_with_the_same_user_and_seq_does_not_shadow_the_good_one() -> None:
    b = Builder()
    good = b.message(A, C, 1, S)
    bad = {**good, "counts_unread": "yes"}
    res, _ = check([dumps(bad), *b.finish()])
    assert res.stats["applied"] == 1 and res.stats["dead_letters"] == 1
    assert counts(core_row(res)) == (1, True, 0, None)


def test_extreme_ids_and_upper_case_uuid() -> None:
    b = Builder()
    top = U64 - 1
    b.message(top, C.upper(), 1, U64 - 2)
    b.message(top, C, 2, top)
    b.add("pin", top, C.upper(), pin_rank=(1 << 32) - 1)
    res, _ = check(b.finish())
    (row,) = res.projections
    assert (row["user_id"], row["conversation_id"], row["pin_rank"]) == (top, C, (1 << 32) - 1)
    assert counts(row) == (1, True, 0, None)


def test_same_mailbox_seq_in_two_users_is_not_a_duplicate_and_waiting_duplicate_is() -> None:
    b = Builder(lanes=2)
    e1 = b.message(A, C, 1, S, lane=1)
    e2 = {**e1, "user_id": B}
    lines = [dumps(e1), dumps(e2), dumps(e1), marker_line(0, 5), marker_line(1, 5)]
    res, _ = check(lines, lanes=2)
    assert (res.stats["applied"], res.stats["duplicates"]) == (2, 1)
