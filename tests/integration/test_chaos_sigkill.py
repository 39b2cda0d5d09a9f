"""Issue 18, `make chaos` scenario "sigkill": 20 worker SIGKILLs at random moments during a
1,000,000-entry stream, two workers sharing the partitions and killed one at a time (a kill and
a restart are each a rebalance for both); twice the killed worker's data dir is lost too. Checked:
projections, badges and the folded session-delta frames equal `projector replay` of the exact
stream produced; 0 unread counts lost, 0 counted twice.

The CI size of the same run is tests/integration/test_crash_safety.py (8 kills, ~20,000 records)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.crash_stress import CrashPlan, run_crash_scenario, stack_overrides
from tests.integration.stack import Stack
from tests.support.chaos_results import record, scale, scaled

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.timeout(7200)]


async def test_twenty_sigkills_during_a_million_entries(
    make_stack: Callable[..., Stack], tmp_path: Path, chaos_seed: int
) -> None:
    stack = make_stack("chaoskill", partitions=6, lanes=3, **stack_overrides())
    plan = CrashPlan(
        users=300,
        conversations=400,
        group_size=20,
        messages=scaled(110_000, 500),
        rate=150.0 * max(scale(), 0.2),  # ~1,400 entries/s for ~12 minutes: the kills fall inside the stream
        kills=scaled(20, 3),
        workers=2,
        lose_data_at=frozenset({5, 15}),
        # The shared 2-core machine is contended already; spinning cores for half an hour
        # would slow everyone's runs without adding a fault the kills do not cause.
        busy_loops=0,
        after_ready_s=(1.0, 12.0),
        down_s=(1.0, 5.0),
        seed=chaos_seed,
        catch_up_s=2400.0,
        check_frames=True,
        restart_crashed=True,
        ready_timeout_s=900.0,
    )
    report = await run_crash_scenario(stack, tmp_path, plan)
    print("\n".join(report.timeline) + "\n" + report.line())
    stream = tmp_path / f"crash-stream-{plan.seed}.jsonl"
    entries = sum(
        1 for line in stream.read_bytes().splitlines() if b'"watermark"' not in line and line.strip()
    )
    record(
        "sigkill",
        entries=entries,
        records=report.records,
        kills=report.kills,
        data_dirs_lost=report.data_lost,
        workers=plan.workers,
        users=report.users,
        rows=report.rows,
        mismatched_rows=report.mismatched_rows,
        mismatched_badges=report.mismatched_badges,
        lost=report.lost_unread,
        double_counted=report.double_counted,
        frames=report.frames,
        frame_users_equal=report.frame_users_equal,
        frame_users_gap=report.frame_users_gap,
        frame_users_wrong=report.frame_users_wrong,
        unplanned_worker_exits=report.crashes,
        exit_reasons=sorted(set(report.crash_lines)),
        batches_refused=report.gaps_refused,
        local_partitions_checked=report.local_partitions_checked,
        local_table_records_differing=report.local_table_differences,
        peak_rss_mib=round(report.peak_rss_kib / 1024, 1),
        catch_up_s=round(report.catch_up_s, 1),
        duration_s=round(report.elapsed_s, 1),
        scale=scale(),
    )
    assert report.kills == plan.kills and entries >= scale() * 1_000_000, report.line()
    assert (report.mismatched_rows, report.mismatched_badges) == (0, 0), report.line()
    assert (report.lost_unread, report.double_counted) == (0, 0), report.line()
    assert report.frame_users_wrong == 0, f"{report.frame_users_wrong} users' frames differ silently"
    assert report.local_table_differences == 0, report.line()
    assert report.crashes == 0, f"{report.crashes} workers exited by themselves: {set(report.crash_lines)}"
