"""Issue 18: garbage at scale on mailbox-tail through a real worker. The CI size runs here (a few
thousand fuzzed records); the full size (100,000) runs with `make chaos-garbage`
(tests/integration/garbage_run.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.garbage_run import GarbagePlan, run_garbage_scenario, stack_overrides
from tests.integration.stack import Stack
from tests.support.chaos_results import record

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


async def test_fuzzed_records_are_dead_lettered_and_the_valid_ones_project_as_replay(
    make_stack: Callable[..., Stack], tmp_path: Path
) -> None:
    stack = make_stack("garbage", partitions=2, lanes=2, **stack_overrides())
    report = await run_garbage_scenario(stack, tmp_path, GarbagePlan(garbage=3000))
    print(report.line())
    assert report.dead_letters >= report.garbage
    assert (report.mismatched_rows, report.mismatched_badges) == (0, 0), report.line()


@pytest.mark.chaos
async def test_full_size_garbage_run(
    make_stack: Callable[..., Stack], tmp_path: Path, chaos_seed: int
) -> None:
    """100,000 fuzzed records (a few hundred over the size bound, 1 MiB strings) in a stream of
    ~40,000 valid ones, 4 partitions, 3 lanes."""
    stack = make_stack("garbagefull", partitions=4, lanes=3, **stack_overrides())
    plan = GarbagePlan(
        garbage=100_000,
        huge_share=0.002,
        users=200,
        conversations=60,
        group_size=50,
        messages=2000,
        seed=chaos_seed,
        catch_up_s=900.0,
    )
    report = await run_garbage_scenario(stack, tmp_path, plan)
    print(report.line())
    record(
        "garbage",
        garbage_records=report.garbage,
        valid_records=report.valid_records,
        dead_letters=report.dead_letters,
        mismatched_rows=report.mismatched_rows,
        mismatched_badges=report.mismatched_badges,
        dead_letters_by_reason=report.by_kind or {},
        garbage_by_family=report.by_family or {},
        duration_s=round(report.elapsed_s, 1),
    )
    assert (report.mismatched_rows, report.mismatched_badges) == (0, 0), report.line()
