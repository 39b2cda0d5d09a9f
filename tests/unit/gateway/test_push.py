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
    bad: object
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


# -- presence batches (app/gateway/service.py) ------------------------------------------------------


class FakePresence:
    def __init__(self) -> None:
        self.claims: list[list[int]] = []
        self.releases: list[list[int]] = []

    async def claim(self, user_ids: list[int]) -> bool:
        self.claims.append(sorted(user_ids))
        return True

    async def release(self, user_ids: list[int]) -> bool:
        self.releases.append(sorted(user_ids))
        return True


async def test_presence_is_written_in_batches_as_the_hub_has_it_at_write_time() -> None:
    from app.gateway.hub import FrameHub
    from app.gateway.service import Gateway

    hub, presence = FrameHub(), FakePresence()
    gateway = Gateway(hub, heartbeat_s=1.0, presence=presence)
    tabs = [hub.attach(1), hub.attach(1), hub.attach(2)]
    for conn in tabs:
        gateway.opened(conn.user_id)
    gone = hub.attach(3)
    gateway.opened(3)
    gateway.closed(3, hub.detach(gone))  # opened and closed within one batch: never claimed
    await gateway.write_presence()
    assert presence.claims == [[1, 2]] and presence.releases == [[3]]
    gateway.closed(1, hub.detach(tabs[0]))  # another tab of user 1 is still open
    await gateway.write_presence()
    assert presence.releases == [[3]]
    gateway.closed(1, hub.detach(tabs[1]))
    await gateway.write_presence()
    assert presence.releases == [[3], [1]]
    await gateway.stop()  # an instance that stops releases whom it still served
    assert presence.releases == [[3], [1], [2]]
