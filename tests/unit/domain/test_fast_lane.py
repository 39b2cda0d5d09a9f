"""The fast lane (docs/contract.md §10): which applied entries flush their user at once, the
per-user rate, and that the window goes on for everyone else. Replay on entry ts (the worker's
rule on event time); the model's schedule checks the same streams in tests/property."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.domain.decoding import decode_records
from app.domain.entries import DeadLetter, MessageEntry, decode_record
from app.domain.fast_lane import FastLaneLimiter
from app.replay import ReplayOptions, run_replay
from tests.property import invariants as inv
from tests.property.model import run_model
from tests.support.strategies import Builder

DM = "00000000-0000-4000-8000-00000000000d"
GROUP = "00000000-0000-4000-8000-00000000000a"


def deltas(res: Any) -> list[tuple[int, int]]:
    """(user, version) of every SESSION_DELTA, in order."""
    return [(f["user_id"], f["projection_mailbox_seq"]) for f in res.frames if f["type"] == "SESSION_DELTA"]


def replay(b: Builder, **opts: Any) -> Any:
    return run_replay(b.finish(), ReplayOptions(window_ms=5000, **opts))


def test_a_direct_message_flushes_its_user_at_once_and_a_group_message_waits() -> None:
    b = Builder()
    b.message(1, GROUP, 1, 9, member_count=50)  # waits for the window
    b.message(2, GROUP, 1, 9, member_count=50)
    dm = b.message(1, DM, 1, 3, member_count=2)  # user 1 flushes now: both its rows
    res = replay(b)
    assert deltas(res)[0] == (1, dm["mailbox_seq"])
    first = next(f for f in res.frames if f["type"] == "SESSION_DELTA")
    assert [r["conversation_id"] for r in first["conversations"]] == sorted([GROUP, DM])
    assert deltas(res)[1:] == [(2, 2)]  # user 2 at the end (the window)
    assert res.stats["fast_flushes"] == 1 and res.stats["fast_writes"] == 2
    assert res.stats["flushes"] == 2


@pytest.mark.parametrize(
    ("fields", "fast"),
    [
        ({"mention": True}, True),
        ({"urgent": True}, True),
        ({"urgent": False}, False),
        ({"member_count": 2}, True),
        ({"member_count": 3}, False),
        ({}, False),  # no member_count: not known to be small
    ],
)
def test_which_messages_take_the_fast_lane(fields: dict[str, Any], fast: bool) -> None:
    b = Builder()
    b.message(1, GROUP, 1, 9, **fields)
    b.message(2, GROUP, 1, 9)
    res = replay(b)
    assert res.stats["fast_flushes"] == int(fast)
    assert deltas(res) == [(1, 1), (2, 2)]  # the same frames: fast or at the end
    assert res.stats["flushes"] == (2 if fast else 1)


@pytest.mark.parametrize("kind", ["read", "mark_unread"])
def test_a_read_and_a_mark_unread_take_the_fast_lane(kind: str) -> None:
    b = Builder()
    b.message(1, GROUP, 1, 9)
    if kind == "read":
        b.read(1, GROUP, 1)
    else:
        b.add("mark_unread", 1, GROUP)
    b.message(1, GROUP, 2, 9)
    res = replay(b)
    assert deltas(res) == [(1, 2), (1, 3)]
    assert res.stats["fast_flushes"] == 1


def test_the_rate_bound_sends_the_rest_to_the_window_and_a_second_later_it_is_fast_again() -> None:
    b = Builder()  # ts steps by 10 ms
    for seq in range(1, 9):
        b.message(1, DM, seq, 3, member_count=2)
    b.ts += 1000 - 10 * 8 + 10 * 2  # the 3rd DM's time + 1,000 ms, minus the next add's 10 ms
    late = b.message(1, DM, 9, 3, member_count=2)
    res = replay(b, fast_lane_per_user_per_s=2)
    # DMs 1 and 2 fast; 3..8 wait (2 in the last second); DM 9 is 1,000 ms after the second
    # fast flush: fast again, carrying 3..8 with it.
    assert deltas(res) == [(1, 1), (1, 2), (1, late["mailbox_seq"])]
    assert res.stats["fast_flushes"] == 3


def test_a_rate_of_zero_turns_the_fast_lane_off() -> None:
    b = Builder()
    b.message(1, DM, 1, 3, member_count=2, mention=True, urgent=True)
    b.read(1, DM, 1)
    res = replay(b, fast_lane_per_user_per_s=0)
    assert deltas(res) == [(1, 2)] and res.stats["fast_flushes"] == 0


def test_a_fast_flush_leaves_the_window_of_the_others_alone() -> None:
    b = Builder()
    b.message(2, GROUP, 1, 9)  # opens the window at its ts
    b.message(1, DM, 1, 3, member_count=2)  # fast: user 1 alone
    b.ts += 5000 - 20  # the next entry is exactly one window after the first
    b.message(1, GROUP, 1, 9)  # the window ends before it: user 2 flushes
    res = replay(b)
    assert deltas(res) == [(1, 2), (2, 1), (1, 3)]


def test_the_limiter_counts_a_sliding_second_on_the_highest_clock() -> None:
    limiter = FastLaneLimiter(2)
    assert limiter.admit(7, 1000) and limiter.admit(7, 1500)
    assert not limiter.admit(7, 1999)
    assert not limiter.admit(7, 900)  # time stepping back is the highest clock (1,999): refused
    assert limiter.admit(7, 2000)  # 1,000 ms after the first
    assert not limiter.admit(7, 2000)
    assert limiter.admit(8, 2000)  # per user


def test_the_limiter_forgets_users_idle_for_a_second() -> None:
    limiter = FastLaneLimiter(1)
    for user in range(5000):
        assert limiter.admit(user, 10 * user)
    # Only users of the last second (and up to twice the last pruned size) stay tracked.
    assert limiter.tracked_users <= 2 * 1024 + 100
    assert not limiter.admit(4999, 49_990)


@settings(max_examples=200, deadline=None)  # a few hundred entries per example
@given(
    gaps=st.lists(st.sampled_from((0, 1, 100, 333, 999, 1000, 1001)), min_size=1, max_size=40),
    users=st.lists(st.integers(1, 3), min_size=1, max_size=40),
    per_s=st.sampled_from((1, 2, 3)),
    window_ms=st.sampled_from((50, 700, 5000)),
)
def test_storms_of_direct_messages_at_the_rate_edges_match_the_model(
    gaps: list[int], users: list[int], per_s: int, window_ms: int
) -> None:
    """Gaps of exactly 1,000 ms and just under or over it: the sliding second's edges."""
    b = Builder()
    for i, gap in enumerate(gaps):
        b.ts += gap - 10
        user = users[i % len(users)]
        b.message(user, DM, i + 1, 99, member_count=2)
        if i % 7 == 3:
            b.message(user, GROUP, i + 1, 99)  # group traffic in between
    lines = b.finish()
    res = run_replay(lines, ReplayOptions(window_ms=window_ms, fast_lane_per_user_per_s=per_s))
    model = run_model(lines)
    inv.check_all(res, model, False, window_ms, 100_000, 2, per_s)
    inv.writes_bounded_by_window(res, model, window_ms, 2, per_s)


# -- the wire fields (docs/contract.md §2, §10) -------------------------------------------------


def _message(**extra: Any) -> bytes:
    b = Builder()
    e = b.message(1, DM, 1, 3)
    return msgspec.json.encode({**e, **extra})


@pytest.mark.parametrize("value", [True, False])
def test_urgent_decodes_as_a_bool(value: bool) -> None:
    entry = decode_record(_message(urgent=value), 1)
    assert isinstance(entry, MessageEntry) and entry.urgent is value
    assert decode_records([_message(urgent=value)], 1) == [entry]


def test_member_count_decodes_and_both_fields_are_optional() -> None:
    entry = decode_record(_message(member_count=2, urgent=True), 1)
    assert isinstance(entry, MessageEntry) and entry.member_count == 2 and entry.urgent is True
    assert decode_records([_message(member_count=2, urgent=True)], 1) == [entry]
    plain = decode_record(_message(), 1)
    assert isinstance(plain, MessageEntry)
    assert plain.urgent is msgspec.UNSET and plain.member_count is msgspec.UNSET
    # re-encoded (the pending buffer) they stay out
    assert b"urgent" not in msgspec.json.encode(plain)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("urgent", None),
        ("urgent", 1),
        ("urgent", "true"),
        ("member_count", None),
        ("member_count", -1),
        ("member_count", 2**32),
        ("member_count", 2.0),
        ("member_count", True),
        ("member_count", "2"),
    ],
)
def test_bad_fast_lane_fields_are_dead_letters_naming_the_field(field: str, value: Any) -> None:
    raw = _message(**{field: value})
    for letter in (decode_record(raw, 1), decode_records([raw], 1)[0]):
        assert isinstance(letter, DeadLetter), letter
        assert letter.kind == "schema" and f"$.{field}" in letter.reason, letter.reason
