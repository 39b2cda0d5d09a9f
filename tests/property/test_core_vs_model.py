"""The processing core (run_replay) against the reference model, on generated streams.

`deadline=None` everywhere: one example runs a whole simulated history through both the core and
the model (tens to hundreds of entries, a thousand for the big rows), and the first examples pay
for imports and warm-up; the example counts keep the suite well under a minute per test.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.replay import ReplayOptions, run_replay
from tests.property import invariants as inv
from tests.property.model import run_model
from tests.support.strategies import Stream, deliver, scenarios, streams

# PROPERTY_SCALE=20 multiplies every example count (a long bug hunt; the default keeps CI fast)
SCALE = float(os.environ.get("PROPERTY_SCALE", "1"))


def n(examples: int) -> int:
    return max(1, int(examples * SCALE))


SETTINGS = settings(
    max_examples=n(300),
    deadline=None,  # see the module doc
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

options = st.fixed_dictionaries(
    {
        "window_ms": st.sampled_from((5000, 1, 20, 100)),
        "max_dirty_rows": st.sampled_from((100_000, 1, 3)),
        "include_muted": st.booleans(),
        "badge_mode": st.sampled_from(("messages", "conversations")),
        # docs/contract.md §10: the defaults (DMs, 5 a second), off, every conversation small,
        # and rates low enough that a user's burst of mentions and reads meets the bound
        "fast_lane_max_members": st.sampled_from((2, 0, 3, 1000)),
        "fast_lane_per_user_per_s": st.sampled_from((5, 0, 1, 2)),
    }
)


def fast(opts: dict[str, Any]) -> dict[str, int]:
    """The fast-lane options of `opts` (the replay's defaults when it has none)."""
    return {k: opts[k] for k in ("fast_lane_max_members", "fast_lane_per_user_per_s") if k in opts}


def replay(lines: list[bytes], lanes: int, **opts: Any) -> Any:
    return run_replay(lines, ReplayOptions(lanes=lanes, **opts))


def check_stream(stream: Stream, opts: dict[str, Any]) -> tuple[Any, Any]:
    lines = stream.lines()
    res = replay(lines, stream.lanes, **opts)
    model = run_model(lines, stream.lanes, opts["include_muted"], opts.get("badge_mode", "messages"))
    try:
        inv.check_all(
            res, model, opts["include_muted"], opts["window_ms"], opts["max_dirty_rows"], **fast(opts)
        )
    except AssertionError:
        # PROPERTY_DUMP=path: keep the failing input (replay it with `projector replay`)
        if os.environ.get("PROPERTY_DUMP"):
            path = Path(os.environ["PROPERTY_DUMP"])
            path.write_bytes(b"".join(lines))
            path.with_suffix(".json").write_text(json.dumps({"lanes": stream.lanes, **opts}))
        raise
    return res, model


@SETTINGS
@given(stream=streams(), opts=options)
def test_core_matches_model(stream: Stream, opts: dict[str, Any]) -> None:
    check_stream(stream, opts)


@settings(SETTINGS, max_examples=n(40))
@given(stream=streams(scenarios(big=True, max_steps=10), dups=False), opts=options)
def test_big_rows_match_model_or_are_inexact_beyond_200(stream: Stream, opts: dict[str, Any]) -> None:
    check_stream(stream, opts)


@SETTINGS
@given(stream=streams(full=True), opts=options)
def test_bad_lines_never_change_the_output_of_good_ones(stream: Stream, opts: dict[str, Any]) -> None:
    with_bad = replay(stream.lines(), stream.lanes, **opts)
    without = replay(stream.lines(bad=False), stream.lanes, **opts)
    assert with_bad.projections == without.projections
    assert with_bad.badges == without.badges
    assert with_bad.frames == without.frames  # bad lines are never applied: no clock, no dirt
    n_bad = sum(item[0] == "bad" for item in stream.items)
    assert with_bad.stats["dead_letters"] == without.stats["dead_letters"] + n_bad
    assert with_bad.stats["entries"] == without.stats["entries"] + n_bad
    for f in ("applied", "duplicates", "pending", "flushes", "projection_writes"):
        assert with_bad.stats[f] == without.stats[f], f


@SETTINGS
@given(stream=streams(full=True, bad=False), opts=options)
def test_duplicating_valid_entries_changes_nothing_but_the_duplicate_count(
    stream: Stream, opts: dict[str, Any]
) -> None:
    with_dups = replay(stream.lines(), stream.lanes, **opts)
    without = replay(stream.lines(dups=False), stream.lanes, **opts)
    n_dups = sum(item[0] == "dup" for item in stream.items)
    assert with_dups.projections == without.projections
    assert with_dups.badges == without.badges
    assert with_dups.frames == without.frames  # duplicates are dropped, never applied
    assert with_dups.stats == {
        **without.stats,
        "duplicates": without.stats["duplicates"] + n_dups,
        "entries": without.stats["entries"] + n_dups,
    }


@SETTINGS
@given(
    sc=scenarios(),
    seeds=st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)),
    opts=options,
)
def test_permuting_deliveries_across_lanes_keeps_rows_and_badges(
    sc: Any, seeds: tuple[int, int], opts: dict[str, Any]
) -> None:
    a = replay(deliver(sc, seeds[0], dup_rate=0.05).lines(), sc.lanes, **opts)
    b = replay(deliver(sc, seeds[1], bad_rate=0.05).lines(), sc.lanes, **opts)
    assert a.projections == b.projections  # row versions too: the last entry applied to the row
    assert a.badges == b.badges
    assert a.stats["applied"] == b.stats["applied"] == len(sc.entries)


@settings(SETTINGS, max_examples=n(150))
@given(
    # small ts steps, zero included: entries of a row often share a ts across a window edge
    stream=streams(scenarios(ts_step=(0, 12), per_user_seq=False), full=True),
    window_ms=st.sampled_from((1, 7, 30, 100, 5000)),
    include_muted=st.booleans(),
    lane=st.tuples(st.sampled_from((2, 0, 1000)), st.sampled_from((5, 0, 1))),
)
def test_writes_bounded_by_window(
    stream: Stream, window_ms: int, include_muted: bool, lane: tuple[int, int]
) -> None:
    """ts non-decreasing in apply order (one mailbox_seq space, ts taken in that order) and no
    early (memory-bound) flush: writes per row <= ceil(span / window) + 1 + its fast flushes
    (docs/contract.md §10), fast-lane entries mixed in (mentions, reads, mark_unread, urgent and
    small conversations' messages), disordered and duplicated."""
    lines = stream.lines()
    opts = {"fast_lane_max_members": lane[0], "fast_lane_per_user_per_s": lane[1]}
    res = replay(lines, stream.lanes, window_ms=window_ms, include_muted=include_muted, **opts)
    model = run_model(lines, stream.lanes, include_muted)
    applied_ts = [e["ts"] for e in model.applied]
    assert applied_ts == sorted(applied_ts), "precondition: ts non-decreasing in apply order"
    inv.writes_bounded_by_window(res, model, window_ms, *lane)
    if lane[1] == 0:  # no fast lane: the bound of §3.9 alone
        assert res.stats["fast_flushes"] == 0


@settings(SETTINGS, max_examples=n(60))
@given(stream=streams(), opts=options)
def test_a_lane_that_never_reports_holds_everything_back(stream: Stream, opts: dict[str, Any]) -> None:
    """--lanes one more than the writers: hi stays 0, every valid entry is pending. (No bad
    lines: a marker with lane out of range for the writers would be valid for the extra lane.)"""
    lines = stream.lines(bad=False)
    lanes = stream.lanes + 1
    res = replay(lines, lanes, **opts)
    model = run_model(lines, lanes, opts["include_muted"], opts.get("badge_mode", "messages"))
    inv.check_all(res, model, opts["include_muted"], opts["window_ms"], opts["max_dirty_rows"], **fast(opts))
    assert res.stats["applied"] == 0 and res.frames == [] and res.projections == []


@SETTINGS
@given(
    stream=streams(),
    a=st.tuples(st.sampled_from((1, 20, 5000)), st.sampled_from((1, 3, 100_000))),
    b=st.tuples(st.sampled_from((1, 20, 5000)), st.sampled_from((1, 3, 100_000))),
)
def test_rows_do_not_depend_on_flush_timing(stream: Stream, a: tuple[int, int], b: tuple[int, int]) -> None:
    """docs/contract.md §4: a row (its version included) is a pure function of the applied entries,
    whatever the windows (J-6: a rebuild by replay is identical field by field)."""
    lines = stream.lines()
    ra = replay(lines, stream.lanes, window_ms=a[0], max_dirty_rows=a[1])
    rb = replay(lines, stream.lanes, window_ms=b[0], max_dirty_rows=b[1])
    assert ra.projections == rb.projections
    assert ra.badges == rb.badges
    keys = ("entries", "applied", "duplicates", "dead_letters", "pending")
    assert {k: ra.stats[k] for k in keys} == {k: rb.stats[k] for k in keys}
