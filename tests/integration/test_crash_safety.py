"""Issue 11: no SIGKILL, however timed, loses a range of entries. A worker is killed at random
moments while traffic keeps arriving (a backlog builds while it is down), under CPU contention,
with its data dir kept and lost; the end state equals `projector replay` of the exact stream.

The CI size runs here; the full size runs with `make chaos-crash` (tests/integration/crash_stress.py)."""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.crash_stress import CrashPlan, run_crash_scenario, stack_overrides
from tests.integration.stack import Stack

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1500)]


@pytest.mark.parametrize("standbys", ["1", "0"], ids=["standby-copies", "no-standby-copies"])
async def test_random_sigkills_with_a_backlog_under_cpu_contention_lose_nothing(
    make_stack: Callable[..., Stack], tmp_path: Path, standbys: str
) -> None:
    """Two workers share the partitions and are killed in turn: every kill and every restart is
    a rebalance for both, so the windows where a batch could go missing come often; with
    standby copies (each worker tails the partitions it does not own, and a promotion reads to
    the end before its claim) and without. A random seed per run, printed (CRASH_SEED=n runs
    one again). (Measured: with the cause of issue 11 put back and the offset rule off, this run
    found lost rows in 1 of 3 runs; a single worker killed 5 times found nothing in 4.)"""
    seed = int(os.environ.get("CRASH_SEED") or random.randrange(1, 1_000_000))
    print(f"\ncrash run seed {seed} (CRASH_SEED={seed} runs it again), standby replicas {standbys}")
    overrides = {**stack_overrides(), "PROJECTOR_TABLE_STANDBY_REPLICAS": standbys}
    stack = make_stack("crash", partitions=4, lanes=3, **overrides)
    plan = CrashPlan(
        users=40,
        conversations=30,
        messages=2000,
        rate=40.0,
        kills=8,
        workers=2,
        lose_data_at=frozenset({3, 6}),
        seed=seed,
    )
    report = await run_crash_scenario(stack, tmp_path, plan)
    print("\n".join(report.timeline) + "\n" + report.line())
    assert report.kills >= 5 and report.data_lost >= 1
    assert (report.mismatched_rows, report.mismatched_badges) == (0, 0), f"seed {seed}: {report.line()}"
    assert report.model_difference == "", f"seed {seed}: {report.line()}"
    assert report.local_partitions_checked == stack.settings.topic_partitions, report.line()
    assert report.local_table_differences == 0, report.line()


@pytest.mark.chaos
async def test_full_size_crash_run(make_stack: Callable[..., Stack], tmp_path: Path, chaos_seed: int) -> None:
    """Issue 11's scenario at full size: ~24,000 records (60 users, 80 conversations, noise
    included) over ~110 s, 6 kills, one with the data dir lost, two busy loops.
    `make chaos-crash CHAOS_RUNS=20` runs it 20 times in a row, one seed each."""
    stack = make_stack("crashfull", partitions=4, lanes=3, **stack_overrides())
    plan = CrashPlan(
        users=60,
        conversations=80,
        group_size=20,
        messages=2400,
        rate=22.0,
        kills=6,
        lose_data_at=frozenset({3}),
        seed=chaos_seed,
    )
    report = await run_crash_scenario(stack, tmp_path, plan)
    print("\n".join(report.timeline) + "\n" + report.line())
    assert (report.mismatched_rows, report.mismatched_badges) == (0, 0), report.line()
    assert report.local_table_differences == 0, report.line()
