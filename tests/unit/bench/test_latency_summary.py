"""The worker bench's latency summary: one line per phase over its repetitions (medians and
ranges), and issue 14's mark only on the phase its target is stated for."""

from __future__ import annotations

from typing import Any

from bench.worker_bench import issue14_goal, summarize_latencies

GOAL_PHASE = "0.5 x worker median entries/s"


def phase(
    contender: str, label: str, rate: float, p50: float, p99: float, kept_up: bool = True
) -> dict[str, Any]:
    return {
        "contender": contender,
        "window_ms": 100,
        "rate_entries_per_s": rate,
        "rate_chosen": label,
        "p50_ms": p50,
        "p90_ms": (p50 + p99) / 2,
        "p99_ms": p99,
        "kept_up": kept_up,
    }


def test_each_phase_is_summarized_over_its_runs_in_first_run_order() -> None:
    runs = [
        phase("worker", "fixed", 4000, 300, 600),
        phase("worker-base", "fixed", 4000, 250, 500),
        phase("worker", "fixed", 4000, 200, 350, kept_up=False),
        phase("worker-base", "fixed", 4000, 700, 900),
        phase("worker", "fixed", 4000, 500, 1100),
        phase("worker", "fixed", 2000, 100, 190),
    ]
    summary = summarize_latencies(runs)
    assert [(s["contender"], s["rate_entries_per_s"], s["runs"]) for s in summary] == [
        ("worker", 4000, 3),
        ("worker-base", 4000, 2),
        ("worker", 2000, 1),
    ]
    worker = summary[0]
    assert (worker["p50_ms"], worker["p50_ms_range"]) == (300, [200, 500])
    assert (worker["p99_ms"], worker["p99_ms_range"]) == (600, [350, 1100])
    assert worker["p90_ms"] == 450
    assert worker["kept_up_runs"] == 2
    assert summary[1]["p50_ms"] == 475  # the median of an even count: the mean of the middle two
    assert all(s["goal_met"] is None for s in summary)  # no phase at the target's rate


def test_the_goal_is_judged_on_the_medians_of_its_phase() -> None:
    lucky_once = [
        phase("worker", GOAL_PHASE, 7400, 110, 190),
        phase("worker", GOAL_PHASE, 7400, 400, 900),
        phase("worker", GOAL_PHASE, 7400, 350, 800),
    ]
    (line,) = summarize_latencies(lucky_once)
    assert line["goal_met"] is False  # one run inside the target does not meet it
    met = [phase("worker", GOAL_PHASE, 7400, 110, 190), phase("worker", GOAL_PHASE, 7400, 120, 200)]
    assert summarize_latencies(met)[0]["goal_met"] is True


def test_the_goal_applies_only_to_the_100_ms_window_at_half_the_worker() -> None:
    assert issue14_goal(phase("worker", GOAL_PHASE, 7400, 100, 150)) is True
    assert issue14_goal(phase("worker", GOAL_PHASE, 7400, 121, 150)) is False
    assert issue14_goal(phase("worker", GOAL_PHASE, 7400, 100, 201)) is False
    assert (
        issue14_goal(phase("worker", "0.5 x worker-lw median entries/s (window 100 ms)", 3300, 1, 1)) is None
    )
    assert issue14_goal(phase("worker", "fixed", 4000, 1, 1)) is None
    assert issue14_goal({**phase("worker", GOAL_PHASE, 7400, 1, 1), "window_ms": 250}) is None


def test_the_latency_phase_splits_the_fast_lanes_entries_from_the_windows() -> None:
    """Issue 33: the entries that ask for the fast lane (docs/contract.md §10) apart."""
    from bench.worker_bench import lane_split, takes_fast_lane

    message = {"type": "message", "mention": False}
    assert takes_fast_lane({**message, "member_count": 2}, 2)
    assert not takes_fast_lane({**message, "member_count": 3}, 2)
    assert not takes_fast_lane(message, 2)
    assert takes_fast_lane({**message, "mention": True}, 2)
    assert takes_fast_lane({**message, "urgent": True}, 2)
    assert takes_fast_lane({"type": "read"}, 2) and takes_fast_lane({"type": "mark_unread"}, 2)
    assert not takes_fast_lane({"type": "pin"}, 2)
    split = lane_split([(True, 10.0), (True, 30.0), (False, 5000.0)])
    assert split["fast_lane"] == {"entries": 2, "p50_ms": 30.0, "p99_ms": 30.0}
    assert split["window"] == {"entries": 1, "p50_ms": 5000.0, "p99_ms": 5000.0}
    assert lane_split([])["fast_lane"] == {"entries": 0}
