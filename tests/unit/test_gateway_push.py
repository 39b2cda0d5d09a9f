"""The offline push window (app/gateway/push.py): newest badge per user, one record per user per
window, online users skipped, ids as strings, revoked partitions forgotten."""

from __future__ import annotations

from typing import Any

import orjson

from app.gateway.push import PushCoalescer, push_record

U = 11982011376358104761


def badge(user: int, version: int, unread: int, **extra: Any) -> dict[str, Any]:
    return {
        "type": "BADGE_UPDATE",
        "user_id": user,
        "total_unread": unread,
        "total_mention": 0,
        "muted_unread": 0,
        "projection_mailbox_seq": version,
        "prev_projection_mailbox_seq": version - 1,
        **extra,
    }


def test_the_record_is_shaped_for_apns_and_fcm_with_the_id_as_a_string() -> None:
    assert push_record(U, 9, 4) == {
        "user_id": "11982011376358104761",
        "projection_mailbox_seq": 9,
        "apns": {"aps": {"badge": 4}},
        "fcm": {"notification_count": 4},
    }


def test_one_record_per_user_per_window_with_the_newest_badge() -> None:
    window = PushCoalescer()
    for version, unread in ((3, 1), (7, 2), (5, 9), (8, 3)):  # 5 arrives late: older, ignored
        assert window.offer(badge(U, version, unread), partition=0)
    assert window.offer(badge(42, 2, 1), partition=1)
    assert window.offer(badge(7, 4, 6), partition=1)
    records, skipped = window.take(online={7})
    assert skipped == 1 and len(window) == 0
    got = {key: orjson.loads(value) for key, value in records}
    assert got == {b"42": push_record(42, 2, 1), str(U).encode(): push_record(U, 8, 3)}
    assert window.take(online=set()) == ([], 0)  # the next window starts empty


def test_corrections_and_malformed_frames_are_not_pushed() -> None:
    window = PushCoalescer()
    assert window.offer(badge(1, 5, 2, correction=True), 0)  # valid, but restates version 5
    for bad in (
        None,
        [],
        {"type": "SESSION_DELTA"},
        badge(1, 5, -1),
        badge(True, 5, 1),
        {**badge(1, 5, 1), "projection_mailbox_seq": "5"},
    ):
        assert not window.offer(bad, 0)
    assert window.take(set()) == ([], 0)


def test_a_revoked_partition_is_left_to_its_next_owner() -> None:
    window = PushCoalescer()
    window.offer(badge(1, 5, 2), partition=0)
    window.offer(badge(2, 5, 2), partition=3)
    window.forget_partitions([3])
    records, _ = window.take(set())
    assert [key for key, _ in records] == [b"1"]
