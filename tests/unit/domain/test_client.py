"""The client rule (docs/contract.md §4, seed §5) and acceptance J-2: absolute frames, idempotent."""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.domain.client import (
    ApplyStatus,
    Badge,
    DeltaMerger,
    FrameError,
    SessionView,
)
from tests.support.frames import C1, C2, C3, USER, badge, delta, row


def unread_of(view: SessionView, conversation_id: str) -> object:
    held = view.row(conversation_id)
    assert held is not None
    return held["unread_count"]


# ---------------------------------------------------------------------------------- J-2


def test_j2_same_frame_delivered_100_times_keeps_the_absolute_value() -> None:
    view = SessionView(USER)
    frame = delta(7, 0, [row(C1, 5, mention=2)])
    results = [view.apply(frame) for _ in range(100)]
    assert unread_of(view, C1) == 5  # not 500
    held = view.row(C1)
    assert held is not None and held["mention_count"] == 2
    assert results[0].status is ApplyStatus.APPLIED and results[0].rows_applied == 1
    assert all(r.status is ApplyStatus.STALE and r.rows_applied == 0 for r in results[1:])
    assert sum(r.rows_applied for r in results) == 1


def test_j2_older_frame_applies_zero_times() -> None:
    view = SessionView(USER)
    older, newer = delta(3, 0, [row(C1, 9)]), delta(8, 3, [row(C1, 2)])
    assert view.apply(older).applied
    assert view.apply(newer).applied
    result = view.apply(older)
    assert result.status is ApplyStatus.STALE
    assert result.rows_applied == 0
    assert unread_of(view, C1) == 2
    assert view.version == 8


def test_older_frame_arriving_first_after_its_successor_is_stale_even_for_other_rows() -> None:
    view = SessionView(USER)
    view.apply(delta(3, 0, [row(C1, 1)]))
    view.apply(delta(5, 3, [row(C1, 4)]))
    # A replayed older frame that mentions a conversation we do not hold still applies 0 times.
    result = view.apply(delta(4, 3, [row(C2, 7)]))
    assert result.status is ApplyStatus.STALE
    assert view.row(C2) is None


def test_overwrite_never_adds_and_can_go_down() -> None:
    view = SessionView(USER)
    view.apply(delta(1, 0, [row(C1, 10)]))
    view.apply(delta(2, 1, [row(C1, 0)]))  # a read zeroes it: absolute, not "-10"
    assert unread_of(view, C1) == 0
    view.apply(delta(3, 2, [row(C1, 1)]))
    assert unread_of(view, C1) == 1


def test_row_copy_is_owned_by_the_view() -> None:
    view = SessionView(USER)
    frame = delta(1, 0, [row(C1, 3)])
    view.apply(frame)
    rows = frame["conversations"]
    assert isinstance(rows, list)
    rows[0]["unread_count"] = 99
    assert unread_of(view, C1) == 3


# ---------------------------------------------------------------------------------- gaps


def test_gap_triggers_repull_and_the_view_does_not_patch() -> None:
    view = SessionView(USER)
    view.apply(delta(2, 0, [row(C1, 1)]))
    result = view.apply(delta(9, 5, [row(C1, 4), row(C2, 1)]))  # frames (2, 5] were lost
    assert result.needs_repull
    assert result.status is ApplyStatus.GAP and result.rows_applied == 0
    assert unread_of(view, C1) == 1
    assert view.row(C2) is None
    assert view.version == 2
    # Until the caller re-pulls, later frames keep reporting the gap rather than patching.
    assert view.apply(delta(11, 9, [row(C1, 6)])).needs_repull
    # The caller re-pulls and loads the list as of version 9; patching continues from there.
    view.reset([row(C1, 4), row(C2, 1), row(C3, 0, listed=False)], 9)
    assert view.version == 9
    assert unread_of(view, C2) == 1
    assert view.apply(delta(9, 5, [row(C1, 4)])).status is ApplyStatus.STALE
    assert view.apply(delta(11, 9, [row(C1, 6)])).applied
    assert unread_of(view, C1) == 6


def test_reset_replaces_everything_held() -> None:
    view = SessionView(USER)
    view.apply(delta(1, 0, [row(C1, 1), row(C2, 2)]))
    view.reset([row(C2, 5)], 4, badge=Badge(5, 0, 0, 4))
    assert view.row(C1) is None
    assert unread_of(view, C2) == 5
    assert view.row_version(C2) == 4
    assert view.badge == Badge(5, 0, 0, 4)


def test_first_frame_chains_from_zero() -> None:
    view = SessionView(USER)
    assert view.apply(delta(5, 1, [row(C1, 1)])).needs_repull
    assert view.apply(delta(1, 0, [row(C1, 1)])).applied


def test_frame_for_another_user_is_ignored() -> None:
    view = SessionView(USER)
    result = view.apply(delta(1, 0, [row(C1, 1)], user_id=USER + 1))
    assert result.status is ApplyStatus.FOREIGN
    assert view.known() == {}
    assert view.version == 0


@pytest.mark.parametrize(
    "frame",
    [
        {"type": "SESSION_DELTA", "user_id": USER, "projection_mailbox_seq": 1},
        {**delta(1, 0, []), "projection_mailbox_seq": "1"},
        {**delta(1, 0, []), "projection_mailbox_seq": True},
        delta(1, 1, []),
        {**delta(1, 0, []), "conversations": {"x": 1}},
        {**delta(1, 0, []), "conversations": [{"unread_count": 1}]},
        {"type": "SESSION_UPSERT"},
    ],
)
def test_malformed_frames_raise_and_change_nothing(frame: dict[str, object]) -> None:
    view = SessionView(USER)
    with pytest.raises(FrameError):
        view.apply(frame)
    assert view.known() == {}
    assert view.version == 0


# ---------------------------------------------------------------------------------- listing


def test_unlisted_rows_stay_known_but_leave_the_list() -> None:
    view = SessionView(USER)
    view.apply(delta(1, 0, [row(C1, 2), row(C2, 0, listed=False)]))
    assert set(view.known()) == {C1, C2}
    assert [r["conversation_id"] for r in view.listed()] == [C1]
    # A newer message revives it: listed again, by overwrite.
    view.apply(delta(2, 1, [row(C2, 1, activity="f" * 32)]))
    assert [r["conversation_id"] for r in view.listed()] == [C2, C1]


def test_listed_is_in_list_order() -> None:
    view = SessionView(USER)
    c4 = "00000000-0000-4000-8000-000000000004"
    view.apply(
        delta(
            1,
            0,
            [
                row(C1, 0, activity="0" * 31 + "1"),
                row(C2, 0, activity="0" * 31 + "9"),
                row(C3, 0, activity="0" * 31 + "2", pin_rank=5),
                row(c4, 0, activity=None, pin_rank=5),
            ],
        )
    )
    assert [r["conversation_id"] for r in view.listed()] == [C3, c4, C2, C1]


# ---------------------------------------------------------------------------------- badge


def test_badge_is_an_absolute_overwrite_by_version() -> None:
    view = SessionView(USER)
    assert view.apply(badge(3, 0, 7, 1)).applied
    for _ in range(100):
        view.apply(badge(3, 0, 7, 1))
    assert view.badge == Badge(total_unread=7, total_mention=1, muted_unread=0, version=3)
    assert view.apply(badge(2, 0, 50)).status is ApplyStatus.STALE
    # A badge is complete on its own: a newer one applies even across lost badge frames.
    assert view.apply(badge(10, 8, 0)).applied
    assert view.badge is not None and view.badge.total_unread == 0


# ---------------------------------------------------------------------------------- merger


def test_merge_window_keeps_the_newest_row_per_conversation_and_never_sums() -> None:
    merger = DeltaMerger(150)
    assert merger.offer(delta(1, 0, [row(C1, 3), row(C2, 1)]), now_ms=1000) == []
    assert merger.offer(delta(2, 1, [row(C1, 5)]), now_ms=1050) == []
    assert merger.offer(delta(3, 2, [row(C3, 2)]), now_ms=1149) == []
    out = merger.poll(now_ms=1150)
    assert len(out) == 1
    merged = out[0]
    assert merged["projection_mailbox_seq"] == 3
    assert merged["prev_projection_mailbox_seq"] == 0
    assert merged["driving_event_id"] == "e3"
    rows = {r["conversation_id"]: r for r in cast("list[dict[str, object]]", merged["conversations"])}
    assert set(rows) == {C1, C2, C3}
    assert rows[C1]["unread_count"] == 5  # the newest row, not 3 + 5
    assert rows[C2]["unread_count"] == 1
    assert len(merger) == 0


def test_merge_keeps_the_newest_row_when_frames_arrive_out_of_order() -> None:
    merger = DeltaMerger()
    merger.offer(delta(2, 1, [row(C1, 5)]), now_ms=0)
    merger.offer(delta(1, 0, [row(C1, 3), row(C2, 1)]), now_ms=10)
    (merged,) = merger.flush()
    assert merged["prev_projection_mailbox_seq"] == 0
    assert merged["projection_mailbox_seq"] == 2
    rows = {r["conversation_id"]: r for r in cast("list[dict[str, object]]", merged["conversations"])}
    assert rows[C1]["unread_count"] == 5
    assert rows[C2]["unread_count"] == 1


def test_merge_never_bridges_a_gap() -> None:
    merger = DeltaMerger()
    merger.offer(delta(1, 0, [row(C1, 1)]), now_ms=0)
    merger.offer(delta(3, 2, [row(C1, 3)]), now_ms=1)  # frame (1, 2] is missing
    out = merger.flush()
    assert [(f["prev_projection_mailbox_seq"], f["projection_mailbox_seq"]) for f in out] == [
        (0, 1),
        (2, 3),
    ]
    view = SessionView(USER)
    assert view.apply(out[0]).applied
    assert view.apply(out[1]).needs_repull


def test_merge_fills_a_gap_when_the_missing_frame_arrives_in_the_window() -> None:
    merger = DeltaMerger()
    merger.offer(delta(1, 0, [row(C1, 1)]), now_ms=0)
    merger.offer(delta(3, 2, [row(C2, 3)]), now_ms=1)
    merger.offer(delta(2, 1, [row(C1, 2)]), now_ms=2)
    (merged,) = merger.flush()
    assert (merged["prev_projection_mailbox_seq"], merged["projection_mailbox_seq"]) == (0, 3)


def test_merge_drops_duplicates_and_keeps_the_newest_badge() -> None:
    merger = DeltaMerger()
    frame = delta(1, 0, [row(C1, 4)])
    for t in range(100):
        merger.offer(frame, now_ms=t)
    merger.offer(badge(1, 0, 4), now_ms=100)
    merger.offer(badge(2, 1, 9), now_ms=101)
    merger.offer(badge(1, 0, 4), now_ms=102)
    out = merger.poll(now_ms=150)
    assert [f["type"] for f in out] == ["SESSION_DELTA", "BADGE_UPDATE"]
    assert out[0]["conversations"] == frame["conversations"]
    assert out[1]["total_unread"] == 9


def test_merge_window_is_per_user_and_opens_at_the_first_frame() -> None:
    merger = DeltaMerger(100)
    merger.offer(delta(1, 0, [row(C1, 1)]), now_ms=0)
    other = delta(1, 0, [row(C1, 1)], user_id=USER + 1)
    assert merger.offer(other, now_ms=60) == []
    out = merger.poll(now_ms=100)
    assert [f["user_id"] for f in out] == [USER]
    assert [f["user_id"] for f in merger.poll(now_ms=160)] == [USER + 1]


@pytest.mark.parametrize("window", [0, 99, 201, 1000])
def test_merge_window_must_be_100_to_200_ms(window: int) -> None:
    with pytest.raises(ValueError, match="100-200"):
        DeltaMerger(window)


# ---------------------------------------------------------------------------------- property

CONVERSATIONS = [C1, C2, C3]


@st.composite
def frame_chains(draw: st.DrawFn) -> list[dict[str, object]]:
    """A user's SESSION_DELTA frames in emission order, versions increasing and chained."""
    count = draw(st.integers(1, 8))
    steps = draw(st.lists(st.integers(1, 5), min_size=count, max_size=count))
    frames: list[dict[str, object]] = []
    prev = 0
    for step in steps:
        version = prev + step
        touched = draw(st.lists(st.sampled_from(CONVERSATIONS), min_size=1, unique=True))
        rows = [row(c, draw(st.integers(0, 300)), listed=draw(st.booleans())) for c in sorted(touched)]
        frames.append(delta(version, prev, rows))
        prev = version
    return frames


def state_after(frames: list[dict[str, object]], upto: int) -> dict[str, Mapping[str, object]]:
    """The list as the server holds it after the frames with version <= upto (the truth)."""
    rows: dict[str, Mapping[str, object]] = {}
    for frame in frames:
        if cast(int, frame["projection_mailbox_seq"]) <= upto:
            for r in cast("list[dict[str, object]]", frame["conversations"]):
                rows[cast(str, r["conversation_id"])] = r
    return rows


@st.composite
def deliveries(draw: st.DrawFn) -> tuple[list[dict[str, object]], list[int]]:
    """A chain and a delivery order: every frame at least once, duplicated and reordered."""
    frames = draw(frame_chains())
    extra = draw(st.lists(st.integers(0, len(frames) - 1), max_size=3 * len(frames)))
    order = draw(st.permutations(list(range(len(frames))) + extra))
    return frames, order


@settings(max_examples=300)
@given(deliveries())
def test_any_interleaving_gives_the_final_state_or_a_repull(
    case: tuple[list[dict[str, object]], list[int]],
) -> None:
    frames, order = case
    versions = [0] + [cast(int, f["projection_mailbox_seq"]) for f in frames]
    final = state_after(frames, versions[-1])
    view = SessionView(USER)
    repull = False
    for index in order:
        result = view.apply(frames[index])
        repull = repull or result.needs_repull
        # Never a torn or summed list: the view is always one the server actually had.
        assert view.version in versions
        assert view.known() == state_after(frames, view.version)
    assert repull or view.known() == final


@settings(max_examples=300)
@given(deliveries())
def test_a_caller_that_repulls_on_gaps_always_converges(
    case: tuple[list[dict[str, object]], list[int]],
) -> None:
    frames, order = case
    view = SessionView(USER)
    newest_sent = 0
    for index in order:
        frame = frames[index]
        newest_sent = max(newest_sent, cast(int, frame["projection_mailbox_seq"]))
        if view.apply(frame).needs_repull:
            # The server has at least everything it has pushed so far.
            view.reset(state_after(frames, newest_sent).values(), newest_sent)
    last = frames[-1]["projection_mailbox_seq"]
    assert view.version == last
    assert view.known() == state_after(frames, last)


@settings(max_examples=300)
@given(deliveries(), st.lists(st.integers(0, 120), min_size=40, max_size=40))
def test_merging_then_applying_gives_the_final_state_or_a_repull(
    case: tuple[list[dict[str, object]], list[int]], gaps_ms: list[int]
) -> None:
    frames, order = case
    merger = DeltaMerger(150)
    view = SessionView(USER)
    repull = False
    now = 0
    out: list[dict[str, object]] = []
    for i, index in enumerate(order):
        now = now + gaps_ms[i % len(gaps_ms)]
        out.extend(merger.offer(frames[index], now))
    out.extend(merger.flush())
    for frame in out:
        repull = repull or view.apply(frame).needs_repull
        assert view.known() == state_after(frames, view.version)
    assert repull or view.known() == state_after(frames, cast(int, frames[-1]["projection_mailbox_seq"]))
