"""The mix bench's pure parts: the traffic it paces (group fan-out, direct messages and mentions
through it, only to the followed fast members), the latency rule (the first applied frame whose
version covers the entry) and J-1 over the group rows (window writes apart from the fast ones)."""

from __future__ import annotations

import collections
import math

import orjson

from bench.mix_bench import Shape, Traffic, backlog_lines, entry_latencies, j1_figures
from bench.worker_bench import takes_fast_lane


def test_one_second_of_traffic_has_the_shape_asked_for() -> None:
    shape = Shape(groups=3, group_size=10, group_rate=20, fast_per_group=4, sample_per_group=2, dm_rate=5)
    traffic = Traffic(shape)
    entries = traffic.due(1000)
    kinds = collections.Counter(kind for _, kind, _ in entries)
    assert kinds["group"] + kinds["mention"] == 3 * 20 * 10  # every message to every member
    assert kinds["dm"] == 2 * 5  # the sender's entry and the recipient's
    assert kinds["mention"] == 3  # every 20th message of each group mentions one member
    fast = set(traffic.fast_users)
    sample = set(traffic.sample_users)
    for user, kind, entry in entries:
        assert takes_fast_lane(entry, 2) == (kind in ("dm", "mention"))
        if kind != "group":
            assert user in fast and user not in sample
            assert entry["counts_unread"] == (user != entry["sender_id"])
        if kind == "mention":
            assert entry["sender_id"] != user
        if kind == "dm":
            assert entry["member_count"] == 2
    assert traffic.due(1000) == []  # nothing given twice
    assert len(traffic.due(2000)) == len(entries)


def test_the_group_only_stream_is_the_same_group_traffic_without_the_fast_lane() -> None:
    shape = Shape(groups=2, group_size=5, fast_per_group=2, sample_per_group=1, dm_rate=10)
    mixed = [orjson.loads(line) for line in backlog_lines(Traffic(shape), 2)]
    plain = [orjson.loads(line) for line in backlog_lines(Traffic(shape, dms=False, mentions=False), 2)]
    assert not any(takes_fast_lane(e, 2) for e in plain if e["type"] == "message")
    group_of = {e["conversation_id"] for e in plain}
    assert [(e["user_id"], e["conversation_seq"]) for e in mixed if e.get("member_count") == 5] == [
        (e["user_id"], e["conversation_seq"]) for e in plain if e["type"] == "message"
    ]
    assert all(e["conversation_id"] in group_of for e in mixed if e.get("member_count") == 5)
    seqs = [e["mailbox_seq"] for e in mixed]
    assert seqs == list(range(1, len(mixed) + 1))


def test_an_entry_ends_at_the_first_applied_frame_covering_it() -> None:
    ms = 1_000_000  # ns
    tracked = {7: [(10, 0, "dm"), (12, 5 * ms, "group"), (20, 6 * ms, "mention")], 8: [(3, 0, "group")]}
    applied = {7: [(11, 40 * ms), (15, 90 * ms)], 8: []}
    frames = {7: [(11, 30), (15, 80)]}
    to_sdk, to_frame, hop, missing = entry_latencies(tracked, applied, frames)
    assert to_sdk == {"dm": [40.0], "group": [85.0]}
    assert to_frame == {"dm": [30.0], "group": [75.0]}
    assert hop == {"dm": [10.0], "group": [10.0]}
    assert missing == 2  # seq 20 of user 7 and seq 3 of user 8: no applied frame covers them


def test_j1_counts_window_writes_apart_from_the_fast_lanes() -> None:
    rows = {(1, "g"): 100, (2, "g"): 100}
    frames = [
        (1, 5, ["g"]),  # the set-up's write: not counted
        (1, 50, ["g", "dm"]),  # a fast flush (50 is a fast-lane entry of user 1): writes g too
        (1, 60, ["g"]),
        (2, 61, ["g"]),
        (1, 90, ["g"]),
        (2, 91, ["g"]),
    ]
    j1 = j1_figures(frames, rows, {1: {50}}, after_seq=10, span_s=9.5, window_ms=5000)
    assert j1["bound"] == math.ceil(9.5 / 5) + 1 == 3
    assert j1["max_window_writes_per_row"] == 2
    assert j1["max_writes_per_row"] == 3 and j1["fast_writes"] == 1
    assert j1["compression_ratio_window_writes"] == 200 / 4
    assert j1["compression_ratio_all_writes"] == 200 / 5
    assert j1["passed"]
    more = [*frames, (2, 95, ["g"]), (2, 99, ["g"])]
    assert not j1_figures(more, rows, {1: {50}}, after_seq=10, span_s=9.5, window_ms=5000)["passed"]
