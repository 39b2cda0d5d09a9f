"""Issue 18: the query API under schemathesis (tests/integration/api_fuzz.py). The CI size runs
here (a few hundred requests); the full size (>= 5,000) runs with `make chaos-api`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.api_fuzz import ApiProcess, FuzzReport, project_two_users, run_api_fuzz
from tests.integration.stack import Stack
from tests.support.chaos_results import record

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]


async def _fuzz(
    make_stack: Callable[..., Stack], tmp_path: Path, examples: int, steps: int, seed: int, name: str = ""
) -> FuzzReport:
    stack = make_stack("apifuzz", partitions=2, lanes=2)
    a, b = await project_two_users(stack, tmp_path)
    api = ApiProcess(stack, tmp_path)
    try:
        await asyncio.to_thread(api.wait_ready)
        report = await asyncio.to_thread(run_api_fuzz, api.base, (a, b), examples, steps, seed)
        api.alive()
    finally:
        api.stop()
    print(report.line())
    print("\n".join(report.failures[:20]))
    if name:
        server_errors = sum(n for status, n in report.by_status.items() if status >= 500)
        record(
            name,
            requests=report.requests,
            stateful_steps=report.stateful_steps,
            operations=len(report.by_operation),
            statuses={str(k): v for k, v in sorted(report.by_status.items())},
            responses_5xx=server_errors,
            failures=len(report.failures),
            first_failures=report.failures[:3],
        )
    assert not report.failures, f"{len(report.failures)} failures, e.g.:\n" + "\n\n".join(report.failures[:5])
    log = api.log.read_text(errors="replace")
    assert "Traceback" not in log, log[-5000:]
    return report


async def test_every_operation_fuzzed_no_5xx_no_schema_violation_no_cross_user_read(
    make_stack: Callable[..., Stack], tmp_path: Path
) -> None:
    report = await _fuzz(make_stack, tmp_path, examples=12, steps=80, seed=1)
    assert report.requests >= 200 and len(report.by_operation) >= 14, report.line()


@pytest.mark.chaos
async def test_full_size_api_fuzz(make_stack: Callable[..., Stack], tmp_path: Path, chaos_seed: int) -> None:
    report = await _fuzz(make_stack, tmp_path, examples=450, steps=2400, seed=chaos_seed, name="api-fuzz")
    assert report.requests >= 5000, report.line()
