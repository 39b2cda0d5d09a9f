"""A worker whose projection store goes away for longer than its retry budget (issue 15: "a
worker never dies on a transient store failure"): Redis behind Toxiproxy (tests/support/toxiproxy.py),
the proxy disabled mid-stream for several budgets, then enabled again. The worker keeps running,
its failed flushes stay queued and are written once Redis is back, and the projection ends equal
to replay."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from app.settings import Settings
from tests.integration.stack import Stack, assert_final_equals_replay, simulated
from tests.support.toxiproxy import Proxy, Toxiproxy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


async def test_a_store_outage_longer_than_the_retry_budget_is_ridden_out(
    make_stack: Callable[..., Stack], tmp_path: Path, settings: Settings
) -> None:
    with Toxiproxy.start(tmp_path) as toxi:
        proxy = toxi.proxy("redis", "127.0.0.1:6379")
        stack = make_stack(
            "outage",
            partitions=1,
            lanes=1,
            PROJECTOR_REDIS_URL=f"redis://{proxy.address}/0",
            PROJECTOR_REDIS_RETRY_BUDGET_MS="500",
        )
        try:
            await _outage_run(stack, toxi, proxy, tmp_path)
        finally:  # the stack's clean-up talks to Redis directly, after the proxy is gone
            stack.settings = stack.settings.replace(redis_url=settings.redis.redis_url)


async def _outage_run(stack: Stack, toxi: Toxiproxy, proxy: Proxy, tmp_path: Path) -> None:
    stack.start_worker()
    # A worker checks its servers before it starts (Redis down then: one line and exit 1, issue
    # 15); the outage begins once it runs.
    started = time.monotonic() + 180
    while "[^Worker]: Ready" not in stack.log_tail(0, 100_000):
        stack.alive()()
        assert time.monotonic() < started, f"the worker did not start:\n{stack.log_tail()}"
        await asyncio.sleep(0.3)
    toxi.disable(proxy)  # Redis is gone before the stream comes
    # The whole stream arrives during the outage: the worker reads, applies and persists all of
    # it (its offsets reach the end) while every flush fails, each after a whole retry budget.
    _, expected = await asyncio.to_thread(simulated, stack, tmp_path, 150, 81, "0")
    ends = await stack.end_offsets()
    deadline = time.monotonic() + 300
    while await stack.group_offsets() != ends:
        stack.alive()()
        assert time.monotonic() < deadline, "the worker did not read everything during the outage"
        await asyncio.sleep(0.5)
    # A failed streak logs its first failure only (later ones are debug lines): with the fast lane
    # that line may already be there before the reading ends, from a direct message's flush.
    while "flush failed" not in stack.log_tail(0, 100_000):
        stack.alive()()
        assert time.monotonic() < deadline, f"the worker never met the outage:\n{stack.log_tail()}"
        await asyncio.sleep(0.3)
    toxi.enable(proxy)
    # Every flush failed, so every row's final state is in a queued flush, none in a later one.
    await stack.wait_for_versions(expected["versions"], timeout=180, alive=stack.alive())
    await assert_final_equals_replay(stack, expected)
    stack.alive()()  # never died
