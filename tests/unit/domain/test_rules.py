"""The processing rules of docs/contract.md §3 on hand-built streams, through `run_replay`."""

from __future__ import annotations

from typing import Any, cast

from app.replay import ReplayOptions, run_replay
from tests.support.builders import CONV_A, CONV_B, StreamBuilder, rows_by_key

ME = 7
OTHER = 99


def final(stream: StreamBuilder, **options: Any) -> tuple[dict[tuple[int, str], dict[str, Any]], Any]:
    result = run_replay(stream.close(), ReplayOptions(lanes=stream.lanes, **options))
    return rows_by_key(result.projections), result


def test_j4_recalling_own_message_changes_own_unread_by_zero() -> None:
    s = StreamBuilder()
    s.message(ME, 1)
    s.message(ME, 2, sender=ME)
    s.recall(ME, 2, sender=ME)
    rows, _ = final(s)
    assert rows[(ME, CONV_A)]["unread_count"] == 1


def test_j4_recalling_anothers_counted_message_above_base_subtracts_one_never_below_zero() -> None:
    s = StreamBuilder()
    s.message(ME, 1)
    s.message(ME, 2)
    s.recall(ME, 2)
    s.recall(ME, 2)  # a second recall of the same target subtracts nothing
    rows, _ = final(s)
    assert rows[(ME, CONV_A)]["unread_count"] == 1
    s2 = StreamBuilder()
    s2.message(ME, 1)
    s2.read(ME, 1)
    s2.recall(ME, 1)  # at or below base: nothing to subtract, and never below zero
    rows2, _ = final(s2)
    assert rows2[(ME, CONV_A)]["unread_count"] == 0


def test_recall_before_its_message_never_counts_it() -> None:
    s = StreamBuilder()
    s.recall(ME, 2)
    s.message(ME, 1)
    s.message(ME, 2)
    rows, _ = final(s)
    row = rows[(ME, CONV_A)]
    assert row["unread_count"] == 1
    assert row["latest_conversation_seq"] == 2  # the head is the highest message, recalled or not


def test_fanout_out_of_order_and_read_below_latest() -> None:
    s = StreamBuilder()
    s.message(ME, 3, mention=True)
    s.message(ME, 1)
    s.read(ME, 2)
    s.message(ME, 2, mention=True)  # arrives after a read that covers it
    s.message(ME, 5)
    s.message(ME, 4)
    rows, _ = final(s)
    row = rows[(ME, CONV_A)]
    assert (row["unread_count"], row["mention_count"], row["mention_first_conversation_seq"]) == (3, 1, 3)
    assert row["latest_conversation_seq"] == 5
    assert row["last_message_id"] == f"m-{CONV_A[:4]}-5"


def test_duplicate_message_delivery_counts_once() -> None:
    s = StreamBuilder()
    s.message(ME, 1)
    s.message(ME, 1)  # the same message materialized twice (different mailbox_seq)
    s.lines.append(s.lines[-1])  # and the same entry delivered twice
    rows, result = final(s)
    assert rows[(ME, CONV_A)]["unread_count"] == 1
    assert result.stats["duplicates"] == 1


def test_cleared_and_deleted_stay_distinguishable() -> None:
    s = StreamBuilder()
    for seq in (1, 2, 3):
        s.message(ME, seq, conv=CONV_A)
        s.message(ME, seq, conv=CONV_B)
    s.entry("clear_history", ME, CONV_A, hidden_before_conversation_seq=3)
    s.entry("delete_conversation", ME, CONV_B, deleted_before_conversation_seq=3)
    rows, _ = final(s)
    cleared, deleted = rows[(ME, CONV_A)], rows[(ME, CONV_B)]
    assert cleared["listed"] is True and cleared["unread_count"] == 0
    assert cleared["hidden_before_conversation_seq"] == 3
    assert cleared["deleted_before_conversation_seq"] == 0
    assert deleted["listed"] is False and deleted["unread_count"] == 0
    assert deleted["deleted_before_conversation_seq"] == 3
    assert deleted["hidden_before_conversation_seq"] == 0


def test_deleted_conversation_revives_on_newer_message() -> None:
    s = StreamBuilder()
    s.message(ME, 1)
    s.entry("delete_conversation", ME, CONV_A, deleted_before_conversation_seq=1)
    s.message(ME, 2)
    rows, _ = final(s)
    row = rows[(ME, CONV_A)]
    assert row["listed"] is True
    assert row["unread_count"] == 1  # only what came after deleted_before


def test_leave_freezes_the_row_at_left_at_and_rejoin_starts_from_joined_at() -> None:
    s = StreamBuilder()
    for seq in (1, 2, 3, 4):
        s.message(ME, seq)
    s.entry("leave", ME, CONV_A, left_at_conversation_seq=2, reason="removed")
    rows, _ = final(s)
    row = rows[(ME, CONV_A)]
    assert row["membership"] == "removed"
    assert row["latest_conversation_seq"] == 2
    assert row["last_message_id"] == f"m-{CONV_A[:4]}-2"
    assert row["unread_count"] == 2
    assert row["listed"] is True
    s.entry("join", ME, CONV_A, joined_at_conversation_seq=3)
    rows, _ = final(s)
    row = rows[(ME, CONV_A)]
    assert (row["membership"], row["latest_conversation_seq"], row["unread_count"]) == ("active", 4, 1)
    assert row["left_at_conversation_seq"] is None


def test_badge_rules_archived_muted_and_left() -> None:
    s = StreamBuilder()
    convs = [f"0000000{i}-0000-4000-8000-000000000000" for i in range(4)]
    for conv in convs:
        s.message(ME, 1, conv=conv, mention=True)
    s.entry("archive", ME, convs[1])
    s.entry("mute", ME, convs[2])
    s.entry("leave", ME, convs[3], left_at_conversation_seq=1, reason="left")
    result = run_replay(s.close())
    (badge,) = result.badges
    assert badge["total_unread"] == 1  # active, not archived, not muted
    assert badge["total_mention"] == 3  # active conversations, muted included
    assert badge["muted_unread"] == 1
    muted = cast(list[Any], run_replay(s.lines, ReplayOptions(include_muted=True)).badges)[0]
    assert muted["total_unread"] == 2


def test_reconcile_recomputes_from_the_hand_when_it_covers_the_base() -> None:
    s = StreamBuilder()
    for seq in range(1, 302):
        s.message(ME, seq)
    s.entry("mailbox_dirty", ME, CONV_A)
    rows, _ = final(s)
    row = rows[(ME, CONV_A)]
    assert (row["unread_count"], row["unread_exact"]) == (301, True)  # the definition's value


def test_more_than_200_unread_beyond_the_hand_becomes_inexact_200_then_exact_after_a_read() -> None:
    s = StreamBuilder()
    s.entry("join", ME, CONV_A, joined_at_conversation_seq=300)
    for seq in range(1, 302):
        s.message(ME, seq)
        s.message(OTHER, seq)
    # joined_at moves down: the hand (pruned at the old base) no longer reaches the base, and
    # latest - base = 301 > 200: one bounded read cannot be exact.
    s.entry("join", ME, CONV_A, joined_at_conversation_seq=0)
    rows, _ = final(s)
    row = rows[(ME, CONV_A)]
    assert (row["unread_count"], row["unread_exact"]) == (200, False)
    s.message(ME, 302)  # new messages do not move an inexact row
    rows, _ = final(s)
    assert (rows[(ME, CONV_A)]["unread_count"], rows[(ME, CONV_A)]["unread_exact"]) == (200, False)
    s.read(ME, 250)  # latest - base = 52: one bounded MessageStore read is exact again
    rows, _ = final(s)
    row = rows[(ME, CONV_A)]
    assert (row["unread_count"], row["unread_exact"]) == (52, True)


def test_exact_beyond_200_while_the_hand_covers_it() -> None:
    s = StreamBuilder()
    for seq in range(1, 402):
        s.message(ME, seq)
    s.read(ME, 100)  # hand covers (100, 401]: exact, even though latest - base > 200
    rows, _ = final(s)
    assert (rows[(ME, CONV_A)]["unread_count"], rows[(ME, CONV_A)]["unread_exact"]) == (301, True)


def test_base_moving_down_recomputes_from_the_message_store() -> None:
    s = StreamBuilder()
    for seq in range(1, 11):
        s.message(ME, seq)
        s.message(OTHER, seq, sender=ME)
    s.entry("join", ME, CONV_A, joined_at_conversation_seq=8)
    s.recall(OTHER, 6, sender=99)  # a recall that reached another member only
    s.recall(ME, 8, sender=99)  # and one that reached this user, before the base moved down
    s.entry("join", ME, CONV_A, joined_at_conversation_seq=4)  # base moves down: hand pruned
    rows, _ = final(s)
    row = rows[(ME, CONV_A)]
    # (4, 10] re-read from the MessageStore for what this user received: 5, 6, 7, 9, 10 (8 was
    # recalled for this user; 6's recall never reached this user's mailbox)
    assert (row["unread_count"], row["unread_exact"]) == (5, True)


def test_watermark_gate_holds_entries_above_min_over_lanes_j3() -> None:
    s = StreamBuilder(lanes=2)
    s.message(ME, 1, lane=0)  # seq 1 (lane 0)
    retry = s.message(ME, 2, lane=1)  # seq 2: lane 1 retries it; delivered late
    held = s.lines.pop()
    s.message(ME, 3, lane=0)  # seq 3
    s.marker(0, 3)
    s.marker(1, 1)  # lane 1 has only written up to 1: hi = 1
    partial = run_replay(list(s.lines), ReplayOptions(lanes=2))
    assert partial.stats["applied"] == 1 and partial.stats["pending"] == 1
    assert cast(list[Any], partial.projections)[0]["unread_count"] == 1
    s.lines.append(held)
    s.marker(1, retry + 1)
    result = run_replay(s.lines, ReplayOptions(lanes=2))
    assert result.stats["applied"] == 3 and result.stats["pending"] == 0
    assert cast(list[Any], result.projections)[0]["unread_count"] == 3  # the late entry counted exactly once


def test_no_marker_no_application() -> None:
    s = StreamBuilder()
    s.message(ME, 1)
    result = run_replay(s.lines)
    assert result.stats == {**result.stats, "applied": 0, "pending": 1, "entries": 1}
    assert result.projections == []


def test_bad_lines_are_dead_letters_and_change_nothing() -> None:
    s = StreamBuilder()
    s.message(ME, 1)
    good = run_replay(s.close())
    bad = [
        b"not json",
        b'{"type":"nope","mailbox_seq":9}',
        b'{"type":"read","mailbox_seq":9,"lane":0,"ts":1,"event_id":"e","user_id":7,'
        b'"conversation_id":"not-a-uuid","read_conversation_seq":1}',
        b'{"type":"read","mailbox_seq":true,"lane":0,"ts":1,"event_id":"e","user_id":7,'
        b'"conversation_id":"0a0a0a0a-0000-4000-8000-00000000000a","read_conversation_seq":1}',
        b'{"type":"read","mailbox_seq":9,"lane":5,"ts":1,"event_id":"e","user_id":7,'
        b'"conversation_id":"0a0a0a0a-0000-4000-8000-00000000000a","read_conversation_seq":1}',
        b'{"type":"read","mailbox_seq":9,"lane":0,"ts":1,"event_id":"e","user_id":18446744073709551616,'
        b'"conversation_id":"0a0a0a0a-0000-4000-8000-00000000000a","read_conversation_seq":1}',
    ]
    mixed = run_replay(bad[:3] + s.lines + bad[3:])
    assert mixed.stats["dead_letters"] == len(bad)
    assert mixed.projections == good.projections and mixed.badges == good.badges


def test_j1_compression_through_replay() -> None:
    """J-1 scaled down: 50 members, 200 messages at 20 msg/s (span ~10 s), 1 s window."""
    s = StreamBuilder(lanes=2, ts_step=0)
    members = range(1, 51)
    for seq in range(1, 201):
        s.ts += 50
        for member in members:
            s.message(member, seq, sender=1 + seq % 50, lane=member % 2)
        s.marker(0)
        s.marker(1)
    result = run_replay(s.close(), ReplayOptions(lanes=2, window_ms=1000))
    span_ms = 199 * 50
    bound = -(-span_ms // 1000) + 1
    assert result.stats["max_writes_per_user_conversation"] <= bound
    assert result.stats["compression_ratio"] >= 200 / bound


def test_max_dirty_rows_flushes_early() -> None:
    s = StreamBuilder()
    for user in range(1, 6):
        s.message(user, 1)
    result = run_replay(s.close(), ReplayOptions(max_dirty_rows=2))
    assert result.stats["flushes"] == 2  # after the 3rd dirty row, then the closing flush
    assert result.stats["projection_writes"] == 5


def test_frames_versions_chain_per_user() -> None:
    s = StreamBuilder(ts_step=3000)
    for seq in range(1, 6):
        s.message(ME, seq)
    result = run_replay(s.close(), ReplayOptions(window_ms=5000))
    deltas = [f for f in result.frames if f["type"] == "SESSION_DELTA"]
    badges = [f for f in result.frames if f["type"] == "BADGE_UPDATE"]
    assert len(deltas) == len(badges) >= 2
    previous = 0
    for frame in deltas:
        assert frame["prev_projection_mailbox_seq"] == previous
        assert frame["driving_mailbox_seq"] == frame["projection_mailbox_seq"] > previous
        previous = frame["projection_mailbox_seq"]
