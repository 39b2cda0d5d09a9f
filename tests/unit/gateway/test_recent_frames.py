"""Resume on another instance (issue 32 item 2): every instance reads every frame, keeps the
frames of users it holds no log for (app/gateway/recent_frames.py), and seeds the log of a user
whose reconnect a load balancer sends to it. A property drives a fleet of hubs with reconnects
landing anywhere: the client never patches over a gap and ends with exactly the projector's list."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import event, given, settings
from hypothesis import strategies as st

from app.domain.client import ApplyStatus, SessionView
from app.domain.wire_ids import frame_from_client
from app.gateway.hub import REPULL, RESUMED, Connection, FrameHub
from app.gateway.recent_frames import RecentFrames, version_in
from tests.unit.gateway.test_hub import Clock, U, badge, delta, notice, parse, row


def fleet(size: int, capacity: int = 1 << 20, settle_s: float = 0.0) -> tuple[list[FrameHub], Clock]:
    clock = Clock()
    hubs = []
    for _ in range(size):
        recent = RecentFrames(capacity_bytes=capacity, settle_s=settle_s, clock=clock)
        recent.start()
        hubs.append(FrameHub(clock=clock, recent=recent))
    return hubs, clock


def send(hubs: list[FrameHub], frame: dict[str, Any]) -> None:
    """One frame off the topics, as each instance's frame source hands it on."""
    for hub in hubs:
        if hub.wants(frame["user_id"]):
            hub.publish(frame, expected_user=frame["user_id"])
        else:
            hub.hold(frame["user_id"], orjson.dumps(frame))


def names(conn: Connection) -> list[tuple[str, int]]:
    chunks = list(conn._queue)
    conn._queue.clear()
    conn._queued = 0
    return [(n, int(b["projection_mailbox_seq"])) for n, b, _ in parse(chunks)]


def test_a_reconnect_on_another_instance_resumes_with_the_missed_frames() -> None:
    (first, second, third), _ = fleet(3)
    hubs = [first, second, third]
    conn = first.attach(U)
    first.start(conn, 2, None)
    send(hubs, delta(4, 2, row("a", 1)))
    send(hubs, badge(4, 2, 1))
    assert names(conn) == [("SESSION_DELTA", 4), ("BADGE_UPDATE", 4)]
    first.detach(conn)
    send(hubs, delta(7, 4, row("b", 2)))
    send(hubs, notice(7))
    send(hubs, badge(7, 4, 3))
    # The balancer sends the reconnect to another instance, which never streamed this user.
    again = second.attach(U)
    start = second.start(again, 7, 4)
    assert (start.status, start.replayed) == (RESUMED, 3)
    assert names(again) == [("SESSION_DELTA", 7), ("MEMBER_NOTICE", 7), ("BADGE_UPDATE", 7)]
    assert second.counters.seeded == 1
    # Now the user's frames go to its log there, not to the held ones.
    send(hubs, delta(9, 7, row("a", 0)))
    assert names(again) == [("SESSION_DELTA", 9)]
    assert second.recent is not None and second.recent.users == 0
    assert third.recent is not None and third.recent.users == 1


def test_a_resume_from_before_the_first_held_deltas_prev_is_a_repull() -> None:
    hubs, _ = fleet(2)
    send(hubs, delta(4, 2, row("a", 1)))  # the hubs started after the flush of version 2
    send(hubs, delta(6, 4, row("a", 2)))
    conn = hubs[1].attach(U)
    start = hubs[1].start(conn, 6, 1)
    assert (start.status, start.reason) == (REPULL, "gap")
    resumed = hubs[0].attach(U)
    start = hubs[0].start(resumed, 6, 2)  # no frame lies between 4's prev and 4: all are held
    assert (start.status, start.replayed) == (RESUMED, 2)


def test_frames_read_in_the_first_moments_after_the_start_set_no_floor() -> None:
    """A flush's frames reach two topics in no fixed order: a SESSION_DELTA read right after the
    start may have a later badge that was written before it."""
    hubs, clock = fleet(1, settle_s=2.0)
    send(hubs, delta(4, 2, row("a", 1)))
    clock.now += 2.5
    send(hubs, delta(6, 4, row("a", 2)))
    send(hubs, delta(8, 6, row("a", 3)))
    hub = hubs[0]
    conn = hub.attach(U)
    assert hub.start(conn, 8, 2).status == REPULL  # 4 was read too early to vouch for 2 → 4
    again = hub.attach(U)
    start = hub.start(again, 8, 4)
    assert (start.status, start.replayed) == (RESUMED, 2)


def test_held_frames_are_bounded_and_an_eviction_raises_the_floor() -> None:
    one = len(orjson.dumps(delta(10, 8, row("a", 1)))) + 120
    hubs, _ = fleet(1, capacity=3 * one + 10)
    version = 2
    for n in range(6):
        send(hubs, delta(version + 2, version, row("a", n)))
        version += 2
    hub = hubs[0]
    assert hub.recent is not None and hub.recent.size <= hub.recent.capacity_bytes
    assert hub.recent.evicted == 3
    conn = hub.attach(U)
    assert hub.start(conn, version, 6).status == REPULL  # 8 was dropped
    again = hub.attach(U)
    start = hub.start(again, version, 8)  # held from 10 on, whose prev is 8
    assert (start.status, start.replayed) == (RESUMED, 3)


def test_a_user_whose_held_frames_all_left_is_not_held_and_nothing_is_claimed() -> None:
    small = len(orjson.dumps(delta(4, 2, row("a", 1)))) + 130
    hubs, _ = fleet(1, capacity=small)
    send(hubs, delta(4, 2, row("a", 1)))
    send(hubs, delta(4, 2, row("a", 1), user=5))  # pushes U's frame out
    hub = hubs[0]
    assert hub.recent is not None and hub.recent.users == 1
    conn = hub.attach(U)
    assert hub.start(conn, 4, 2).status == REPULL


def test_held_frames_wait_for_the_start_and_stay_off_when_disabled() -> None:
    clock = Clock()
    recent = RecentFrames(capacity_bytes=1 << 20, clock=clock)
    recent.hold(U, orjson.dumps(delta(4, 2)))  # the frame source is not at the end yet
    assert recent.users == 0
    off = RecentFrames(capacity_bytes=0, clock=clock)
    off.start()
    off.hold(U, orjson.dumps(delta(4, 2)))
    assert off.users == 0 and off.size == 0


def test_a_malformed_held_frame_is_counted_and_skipped_at_the_seed() -> None:
    hubs, _ = fleet(1)
    hub = hubs[0]
    hub.hold(U, b"{not json")
    hub.hold(U, orjson.dumps(delta(4, 2, row("a", 1), user=5)))  # under another user's key
    send(hubs, delta(6, 4, row("a", 2)))
    send(hubs, delta(8, 6, row("a", 3)))
    conn = hub.attach(U)
    start = hub.start(conn, 8, 6)
    assert (start.status, start.replayed) == (RESUMED, 1)
    assert hub.counters.malformed == 2


def test_the_version_is_found_without_decoding() -> None:
    assert version_in(orjson.dumps(delta(123456789012, 4))) == 123456789012
    assert version_in(b'{"type":"SESSION_DELTA"}') is None
    assert version_in(b'{"projection_mailbox_seq":"7"}') is None


# -- the property: a fleet, reconnects landing anywhere -----------------------------------------


@st.composite
def fleet_scenarios(draw: st.DrawFn) -> tuple[list[tuple[str, int]], int, int, list[int]]:
    """Steps as in test_hub's property (flush n conversations / drop and come back k flushes
    later); the held-frames capacity in frames; which instance each (re)connect lands on."""
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
    size = draw(st.integers(1, 3))
    landings = draw(st.lists(st.integers(0, size - 1), min_size=31, max_size=31))
    return steps, draw(st.integers(0, 8)), size, landings


@settings(max_examples=300)
@given(fleet_scenarios())
def test_a_client_whose_reconnects_land_on_any_instance_never_patches_over_a_gap(
    scenario: tuple[list[tuple[str, int]], int, int, list[int]],
) -> None:
    steps, capacity_frames, size, landings = scenario
    one = len(orjson.dumps(delta(10**6, 10**6 - 3, row("c0", 10**6), row("c1", 1), row("c2", 1)))) + 120
    hubs, _ = fleet(size, capacity=capacity_frames * one)
    truth: dict[str, dict[str, Any]] = {}
    version = 0
    view = SessionView(U)
    resumed_elsewhere = 0

    def connect(last: int | None) -> tuple[FrameHub, Connection]:
        nonlocal resumed_elsewhere
        hub = hubs[landings.pop()]
        conn = hub.attach(U)
        start = hub.start(conn, version, last)
        if start.status != RESUMED:
            view.reset(truth.values(), version)
        elif start.replayed:
            resumed_elsewhere += 1
        return hub, conn

    def consume(conn: Connection) -> None:
        chunks = list(conn._queue)
        conn._queue.clear()
        conn._queued = 0
        for name, body, _ in parse(chunks):
            if name == "SESSION_DELTA":
                result = view.apply(frame_from_client(body))
                assert result.status is not ApplyStatus.GAP, "a gap was let through"

    hub, conn = connect(None)
    away: int | None = None
    for kind, n in steps:
        if kind == "flush":
            prev, version = version, version + 1 + n
            rows = []
            for i in range(n):
                conv = f"c{(version + i) % 4}"
                truth[conv] = row(conv, version)
                rows.append(truth[conv])
            send(hubs, delta(version, prev, *rows))
            if away is None:
                consume(conn)
            else:
                away -= 1
                if away <= 0:
                    hub, conn = connect(view.version)
                    consume(conn)
                    away = None
        elif away is None:
            consume(conn)
            hub.detach(conn)
            away = n
            if n == 0:
                hub, conn = connect(view.version)
                consume(conn)
                away = None
    if away is not None:
        hub, conn = connect(view.version)
    consume(conn)
    assert view.version == version
    assert view.known() == truth
    event(f"resumed with frames: {min(resumed_elsewhere, 3)}")
