"""FrameHub (app/gateway/hub.py): delivery, resume by the prev rule, bounded buffers, heartbeats,
and a property: whatever the disconnects, evictions and resume points, a client that follows the
hub's word (resumed / repull) ends with exactly the projector's list and never patches over a gap."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.domain.client import ApplyStatus, SessionView
from app.domain.wire_ids import frame_from_client
from app.gateway.hub import (
    FRESH,
    HEARTBEAT_EVENT,
    REPULL,
    RESUMED,
    Connection,
    FrameHub,
    TooManyConnections,
)
from app.sdk.sse import SseParser

U = 11982011376358104761  # a JS-unsafe u64


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def row(conv: str, unread: int) -> dict[str, Any]:
    return {"user_id": U, "conversation_id": conv, "unread_count": unread, "listed": True}


def delta(version: int, prev: int, *rows: dict[str, Any], user: int = U) -> dict[str, Any]:
    return {
        "type": "SESSION_DELTA",
        "user_id": user,
        "projection_mailbox_seq": version,
        "prev_projection_mailbox_seq": prev,
        "driving_event_id": "e",
        "driving_mailbox_seq": version,
        "conversations": list(rows),
    }


def badge(version: int, prev: int, unread: int) -> dict[str, Any]:
    return {
        "type": "BADGE_UPDATE",
        "user_id": U,
        "total_unread": unread,
        "total_mention": 0,
        "muted_unread": 0,
        "projection_mailbox_seq": version,
        "prev_projection_mailbox_seq": prev,
    }


def notice(version: int, kind: int = 24) -> dict[str, Any]:
    return {
        "type": "MEMBER_NOTICE",
        "user_id": U,
        "conversation_id": "c1",
        "kind": kind,
        "conversation_seq": 3,
        "projection_mailbox_seq": version,
    }


def parse(chunks: list[bytes]) -> list[tuple[str, dict[str, Any], str]]:
    parser = SseParser()
    return [(e.event, orjson.loads(e.data), e.last_event_id) for e in parser.feed(b"".join(chunks))]


async def drain(conn: Connection) -> list[tuple[str, dict[str, Any], str]]:
    return parse(await conn.take())


def make_hub(**options: Any) -> tuple[FrameHub, Clock]:
    clock = Clock()
    return FrameHub(clock=clock, **options), clock


async def test_frames_go_to_every_live_connection_of_their_user_only() -> None:
    hub, _ = make_hub()
    assert hub.publish(delta(2, 1, row("a", 1))) == 0 and not hub.wants(U)  # nobody connected
    tab1, tab2, other = hub.attach(U), hub.attach(U), hub.attach(7)
    for conn in (tab1, tab2):
        assert hub.start(conn, 2, None).status == FRESH
    hub.start(other, 0, None)
    assert hub.publish(delta(5, 2, row("a", 3))) == 2
    for conn in (tab1, tab2):
        [(name, body, event_id)] = await drain(conn)
        assert name == "SESSION_DELTA" and event_id == "5"
        # Ids go out as exact decimal strings (docs/contract.md §9), rows included.
        assert body["user_id"] == "11982011376358104761"
        assert body["conversations"][0]["user_id"] == "11982011376358104761"
        assert frame_from_client(body) == delta(5, 2, row("a", 3))
    assert other.queued_bytes == 0


async def test_badges_and_notices_carry_no_event_id_and_stale_chain_steps_are_not_sent() -> None:
    hub, _ = make_hub()
    conn = hub.attach(U)
    hub.start(conn, 10, None)
    hub.publish(delta(9, 4, row("a", 1)))  # older than the store read: the pull supersedes it
    hub.publish(badge(12, 10, 4))
    hub.publish(notice(12))
    events = await drain(conn)
    assert [(n, i) for n, _, i in events] == [("BADGE_UPDATE", ""), ("MEMBER_NOTICE", "")]
    assert hub.counters.stale_skipped == 1


async def test_frames_between_attach_and_start_are_not_lost() -> None:
    hub, _ = make_hub()
    conn = hub.attach(U)
    hub.publish(delta(6, 5, row("a", 1)))  # arrives while the store version is being read
    hub.publish(notice(6))
    start = hub.start(conn, 5, None)
    assert (start.status, start.replayed) == (FRESH, 2)
    assert [n for n, _, _ in await drain(conn)] == ["SESSION_DELTA", "MEMBER_NOTICE"]


async def test_a_short_disconnect_resumes_with_the_missed_frames_in_order() -> None:
    hub, _ = make_hub()
    conn = hub.attach(U)
    hub.start(conn, 5, None)
    hub.publish(delta(6, 5, row("a", 1)))
    hub.publish(badge(6, 5, 1))
    assert len(await drain(conn)) == 2
    assert hub.detach(conn) is True
    # While away: two flushes and a member notice; the log keeps them for the resume window.
    hub.publish(delta(8, 6, row("b", 2)))
    hub.publish(notice(8, 27))
    hub.publish(badge(8, 6, 3))
    hub.publish(delta(9, 8, row("a", 0)))
    again = hub.attach(U)
    start = hub.start(again, 9, last_event_id=6)
    assert (start.status, start.position, start.replayed) == (RESUMED, 6, 4)
    events = await drain(again)
    assert [(n, i) for n, _, i in events] == [
        ("SESSION_DELTA", "8"),
        ("MEMBER_NOTICE", "8"),
        ("BADGE_UPDATE", "8"),
        ("SESSION_DELTA", "9"),
    ]


@pytest.mark.parametrize(
    ("last_event_id", "reason"),
    [(7, "gap"), (2, "gap"), (12, "ahead")],
    ids=["not-in-the-chain", "before-the-log", "ahead-of-the-store"],
)
async def test_a_resume_the_log_cannot_prove_says_repull(last_event_id: int, reason: str) -> None:
    hub, _ = make_hub()
    conn = hub.attach(U)
    hub.start(conn, 5, None)  # the log covers versions above 5
    hub.publish(delta(6, 5, row("a", 1)))
    hub.publish(delta(9, 6, row("a", 2)))
    hub.detach(conn)
    again = hub.attach(U)
    start = hub.start(again, 9, last_event_id)
    assert (start.status, start.reason, start.position) == (REPULL, reason, 9)


async def test_resume_without_a_log_is_only_for_a_client_that_missed_nothing() -> None:
    hub, _ = make_hub()  # another instance, or after a restart: no log for the user
    conn = hub.attach(U)
    assert hub.start(conn, 9, last_event_id=9).status == RESUMED
    hub.detach(conn)
    fresh, _ = make_hub()
    conn = fresh.attach(U)
    assert fresh.start(conn, 9, last_event_id=8).status == REPULL


async def test_an_evicted_frame_makes_an_older_resume_a_repull() -> None:
    hub, _ = make_hub(resume_frames=2)
    conn = hub.attach(U)
    hub.start(conn, 1, None)
    for v in range(2, 6):
        hub.publish(delta(v, v - 1, row("a", v)))
    hub.detach(conn)
    assert hub.start(hub.attach(U), 5, last_event_id=2).status == REPULL  # 3 was evicted
    assert hub.start(hub.attach(U), 5, last_event_id=3).status == RESUMED  # 4, 5 are held


async def test_a_slow_client_overflows_its_bounded_buffer_and_is_told_to_repull() -> None:
    hub, _ = make_hub(buffer_bytes=4096)
    conn = hub.attach(U)
    hub.start(conn, 0, None)
    big = [row(f"c{i}", i) for i in range(20)]
    v = 0
    while not conn.overflowed:
        hub.publish(delta(v + 1, v, *big))
        v += 1
        assert conn.queued_bytes <= 4096
    assert conn.queued_bytes == 0 and hub.counters.overflows == 1
    assert await conn.take() == []  # the route then sends `repull` and closes
    hub.publish(delta(v + 1, v, *big))
    assert conn.queued_bytes == 0  # nothing more is queued on it


async def test_heartbeats_fill_silences_only() -> None:
    hub, clock = make_hub()
    quiet, busy = hub.attach(U), hub.attach(7)
    hub.start(quiet, 0, None)
    hub.start(busy, 0, None)
    clock.now += 10
    hub.publish(delta(1, 0, row("a", 1), user=7))
    assert hub.beat(10.0) == 1
    assert await quiet.take() == [HEARTBEAT_EVENT]
    assert [n for n, _, _ in await drain(busy)] == ["SESSION_DELTA"]


async def test_logs_of_departed_users_expire_and_are_bounded() -> None:
    hub, clock = make_hub(resume_window_s=60, resume_users=2)
    for user in (1, 2, 3):
        conn = hub.attach(user)
        hub.start(conn, 0, None)
        hub.detach(conn)
        clock.now += 1
    assert not hub.wants(1) and hub.wants(2) and hub.wants(3)  # the oldest went over the bound
    clock.now += 58
    assert hub.sweep() == 1 and not hub.wants(2) and hub.wants(3)
    conn = hub.attach(3)  # back in time: its log is live again and never expires while connected
    clock.now += 1000
    assert hub.sweep() == 0 and hub.wants(3)
    hub.detach(conn)


async def test_malformed_frames_are_counted_and_dropped() -> None:
    hub, _ = make_hub()
    hub.start(hub.attach(U), 0, None)
    bad: list[dict[str, Any]] = [
        {"type": "NOPE", "user_id": U},
        {**delta(5, 5), "user_id": U},  # prev not below version
        {**delta(5, 4), "user_id": -1},
        {**delta(5, 4), "conversations": None},
        {**badge(5, 4, 1), "correction": True},  # a correction must restate its version
        {**notice(5), "kind": "24"},
    ]
    for frame in bad:
        assert hub.publish(frame) == 0
    assert hub.publish(delta(6, 5), expected_user=8) == 0  # under another user's key
    assert hub.counters.malformed == len(bad) + 1


async def test_the_process_holds_a_bounded_number_of_streams() -> None:
    hub, _ = make_hub(max_connections=2)
    hub.attach(1)
    conn = hub.attach(2)
    with pytest.raises(TooManyConnections):
        hub.attach(3)
    hub.detach(conn)
    hub.attach(3)


# -- the property ------------------------------------------------------------------------------


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[tuple[str, int]], int]:
    """Steps: ("flush", n) = the projector flushes n conversations; ("drop", k) = the client's
    connection drops and it reconnects k flushes later (k=0: at once)."""
    steps = draw(
        st.lists(
            st.one_of(
                st.tuples(st.just("flush"), st.integers(1, 3)),
                st.tuples(st.just("drop"), st.integers(0, 4)),
            ),
            min_size=1,
            max_size=30,
        )
    )
    return steps, draw(st.integers(0, 5))


@settings(max_examples=300)
@given(scenarios())
def test_a_client_following_the_hub_never_patches_over_a_gap_and_ends_exact(
    scenario: tuple[list[tuple[str, int]], int],
) -> None:
    steps, resume_frames = scenario
    hub, _ = make_hub(resume_frames=resume_frames)
    truth: dict[str, dict[str, Any]] = {}
    version = 0
    view = SessionView(U)
    pulls = 0

    def pull() -> None:
        nonlocal pulls
        pulls += 1
        view.reset(truth.values(), version)

    def connect(last: int | None) -> Connection:
        conn = hub.attach(U)
        start = hub.start(conn, version, last)  # the store holds `version` (written before frames)
        if start.status != RESUMED:
            pull()
        return conn

    def consume(conn: Connection) -> None:
        chunks = conn._queue.copy()  # what the connection would write, in order
        conn._queue.clear()
        conn._queued = 0
        for name, body, _ in parse(list(chunks)):
            if name == "SESSION_DELTA":
                result = view.apply(frame_from_client(body))
                assert result.status is not ApplyStatus.GAP, "the hub let a gap through"

    conn = connect(None)
    pending_drop: int | None = None
    for kind, n in steps:
        if kind == "flush":
            prev, version = version, version + 1 + n  # versions skip, as mailbox seqs do
            rows = []
            for i in range(n):
                conv = f"c{(version + i) % 4}"
                truth[conv] = row(conv, version)
                rows.append(truth[conv])
            hub.publish(delta(version, prev, *rows))
            if pending_drop is None:
                consume(conn)
            else:
                pending_drop -= 1
                if pending_drop <= 0:
                    conn = connect(view.version)
                    consume(conn)
                    pending_drop = None
        else:
            if pending_drop is None:
                consume(conn)
                hub.detach(conn)
                pending_drop = n
                if n == 0:
                    conn = connect(view.version)
                    consume(conn)
                    pending_drop = None
    if pending_drop is not None:
        conn = connect(view.version)
    consume(conn)
    assert view.version == version
    assert view.known() == truth
