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

from tests.integration.crash_stress import CrashPlan, CrashReport, run_crash_scenario, stack_overrides
from tests.integration.stack import WORKER_BUILD, Stack

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1500)]


PLANT_SITE = Path(__file__).resolve().parents[1] / "support" / "plant_site"


def ci_size_plan(seed: int) -> CrashPlan:
    return CrashPlan(
        users=40,
        conversations=30,
        messages=2000,
        rate=40.0,
        kills=8,
        workers=2,
        lose_data_at=frozenset({3, 6}),
        seed=seed,
        lane_lag_ms=1500,
        tail_kill=True,
    )


def caught(report: CrashReport, partitions: int) -> list[str]:
    """What of the CI test's checks fail on this run (empty: the run passes)."""
    failed = []
    if (report.mismatched_rows, report.mismatched_badges) != (0, 0):
        failed.append(f"{report.mismatched_rows} rows, {report.mismatched_badges} badges differ from replay")
    if report.model_difference:
        failed.append("model differs")
    if report.local_partitions_checked != partitions or report.local_table_differences:
        failed.append(f"{report.local_table_differences} local table records differ")
    return failed


@pytest.mark.parametrize("standbys", ["1", "0"], ids=["standby-copies", "no-standby-copies"])
async def test_random_sigkills_with_a_backlog_under_cpu_contention_lose_nothing(
    make_stack: Callable[..., Stack], tmp_path: Path, standbys: str
) -> None:
    """Two workers share the partitions and are killed in turn: every kill and every restart is
    a rebalance for both, so the windows where a batch could go missing come often; with
    standby copies (each worker tails the partitions it does not own, and a promotion reads to
    the end before its claim) and without. A random seed per run, printed (CRASH_SEED=n runs
    one again). Its power is measured by `make crash-power` (test_the_crash_test_catches_a_
    planted_loss below)."""
    seed = int(os.environ.get("CRASH_SEED") or random.randrange(1, 1_000_000))
    print(f"\ncrash run seed {seed} (CRASH_SEED={seed} runs it again), standby replicas {standbys}")
    overrides = {**stack_overrides(), "PROJECTOR_TABLE_STANDBY_REPLICAS": standbys}
    stack = make_stack("crash", partitions=4, lanes=3, **overrides)
    report = await run_crash_scenario(stack, tmp_path, ci_size_plan(seed))
    print("\n".join(report.timeline) + "\n" + report.line())
    assert report.kills >= 5 and report.data_lost >= 1 and report.kills_in_traffic >= 2
    assert caught(report, stack.settings.topics.topic_partitions) == [], f"seed {seed}: {report.line()}"


@pytest.mark.chaos
# Up to ~10 min a run on 2 shared cores: the module's 1,500 s ended a 10-run measurement at run 4.
@pytest.mark.timeout(900 * int(os.environ.get("CRASH_POWER_RUNS") or 10))
@pytest.mark.skipif(WORKER_BUILD != "pure", reason="plants patch the pure build's classes")
@pytest.mark.parametrize("plant", ["changelog-gaps", "waiting-dropped", "range-ahead"])
async def test_the_crash_test_catches_a_planted_loss(
    make_stack: Callable[..., Stack], tmp_path: Path, plant: str
) -> None:
    """The CI crash run's power: its worker is given a deliberately broken persist
    (tests/support/plant_site: a changelog missing some of a persist's rows; a persist without
    the entries waiting above the watermark; a checkpoint a range of entries ahead of its state), whose
    loss shows only through kills and hand-overs,
    and the run must fail in at least 9 of 10 seeds (CRASH_POWER_RUNS=n to change the count).
    Standby copies on, as deployed."""
    runs = int(os.environ.get("CRASH_POWER_RUNS") or 10)
    first = int(os.environ.get("CRASH_SEED") or random.randrange(1, 1_000_000))
    lines = []
    failing = 0
    for run in range(runs):
        seed = first + run
        overrides = {
            **stack_overrides(),
            "PROJECTOR_TABLE_STANDBY_REPLICAS": "1",
            "SESSION_PROJECTOR_PLANT": plant,
            "PYTHONPATH": os.pathsep.join([str(PLANT_SITE), os.environ.get("PYTHONPATH", "")]),
        }
        stack = make_stack(f"power{run}", partitions=4, lanes=3, **overrides)
        run_dir = tmp_path / f"run-{run}"
        run_dir.mkdir()
        try:
            report = await run_crash_scenario(stack, run_dir, ci_size_plan(seed))
        except AssertionError as exc:
            # The CI run fails this way too: the store never reached replay's versions (entries
            # the planted persist lost are never written), or a worker died.
            assert f"[plant] {plant} planted" in stack.log_tail(0, 100_000), "the plant did not take"
            failing += 1
            lines.append(f"seed {seed}: CAUGHT (the run failed: {str(exc).splitlines()[0][:200]})")
            await stack.cleanup()
            continue
        assert f"[plant] {plant} planted" in stack.log_tail(0, 100_000), "the plant did not take"
        found = caught(report, stack.settings.topics.topic_partitions)
        failing += bool(found)
        lines.append(f"seed {seed}: {'CAUGHT ' + '; '.join(found) if found else 'missed'} | {report.line()}")
        await stack.cleanup()
    print(f"\nplant {plant}: the CI crash run failed in {failing} of {runs} runs\n" + "\n".join(lines))
    assert failing * 10 >= runs * 9, f"plant {plant}: caught in {failing} of {runs}"


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
