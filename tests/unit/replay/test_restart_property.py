"""Crash/replay property: stop the core anywhere, restart it from what the changelog tables hold
(the dirty set lost), re-deliver from an earlier offset, and nothing is lost or counted twice."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.domain.client import SessionView
from app.replay import Frame, Replayer, ReplayOptions, run_replay
from tests.support.strategies import Stream, streams


def crash_and_restart(
    lines: list[bytes], options: ReplayOptions, cut: int, rewind: int
) -> tuple[Any, list[Frame]]:
    frames: list[Frame] = []
    first = Replayer(options, frames.append)
    first.feed_many(lines[:cut])
    checkpoint = first.checkpoint()
    # The worker commits offsets only up to durable work, so it re-reads from an earlier offset.
    second = Replayer.restart(options, frames.append, checkpoint, first)
    second.feed_many(lines[max(0, cut - rewind) :])
    return second.finish(), frames


@settings(
    max_examples=150,
    deadline=None,  # whole streams per example: run time varies with the drawn stream size
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    stream=streams(),
    cut_share=st.floats(0, 1),
    rewind=st.integers(0, 30),
    window=st.sampled_from([0, 50, 5000]),
)
def test_restart_anywhere_gives_the_same_rows_and_badges(
    stream: Stream, cut_share: float, rewind: int, window: int
) -> None:
    lines = stream.lines()
    options = ReplayOptions(lanes=stream.lanes, window_ms=window)
    expected = run_replay(lines, options)
    result, frames = crash_and_restart(lines, options, int(len(lines) * cut_share), rewind)

    assert result.projections == expected.projections
    assert result.badges == expected.badges

    # A client applying every frame, before and after the crash, ends on the final rows.
    views: dict[int, SessionView] = {}
    for frame in frames:
        if frame["type"] == "SESSION_DELTA":
            view = views.setdefault(frame["user_id"], SessionView(frame["user_id"]))
            assert not view.apply(frame).needs_repull  # the version chain survives the restart
    for row in expected.projections:
        seen = views[row["user_id"]].row(row["conversation_id"])
        assert seen == row
