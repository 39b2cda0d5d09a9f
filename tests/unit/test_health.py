"""Readiness checks (app/health.py) and the worker's /livez and /readyz (app/runtime/web.py):
cached, each within its budget, never blocking the loop, a change logged once."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from app.health import NotReady, Readiness, in_thread
from app.runtime.web import add_health_routes


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_outcomes_of_ok_known_states_failures_and_timeouts() -> None:
    async def ok() -> None:
        pass

    async def missing() -> None:
        raise NotReady("missing", "topic 'x' does not exist")

    async def refused() -> None:
        raise ConnectionRefusedError("refused")

    async def hangs() -> None:
        await asyncio.Event().wait()

    readiness = Readiness({"a": ok, "b": missing, "c": refused, "d": hangs}, budget_s=0.05)
    ready, results = await readiness.ready()
    assert not ready
    assert results == {"a": "ok", "b": "missing", "c": "unavailable", "d": "timeout"}
    assert (await Readiness({"a": ok}).ready()) == (True, {"a": "ok"})


async def test_a_round_is_cached_and_shared_by_concurrent_callers() -> None:
    calls = 0
    release = asyncio.Event()

    async def counted() -> None:
        nonlocal calls
        calls += 1
        await release.wait()

    clock = Clock()
    readiness = Readiness({"x": counted}, budget_s=5, max_age_s=1.0, clock=clock)
    waiting = [asyncio.create_task(readiness.results()) for _ in range(5)]
    await asyncio.sleep(0.01)
    release.set()
    assert [await task for task in waiting] == [{"x": "ok"}] * 5
    assert calls == 1  # five probes, one round
    clock.now += 0.5
    await readiness.results()
    assert calls == 1  # still fresh
    clock.now += 1.0
    await readiness.results()
    assert calls == 2


async def test_a_caller_that_gives_up_does_not_cancel_the_round_of_the_others() -> None:
    release = asyncio.Event()

    async def slow() -> None:
        await release.wait()

    readiness = Readiness({"x": slow}, budget_s=5)
    impatient = asyncio.create_task(readiness.results())
    patient = asyncio.create_task(readiness.results())
    await asyncio.sleep(0.01)
    impatient.cancel()
    release.set()
    assert await patient == {"x": "ok"}


async def test_a_blocking_driver_call_runs_beside_the_loop_within_its_budget() -> None:
    gate = threading.Event()

    async def blocking() -> None:
        await in_thread(gate.wait, 5)  # a driver call that blocks its thread

    readiness = Readiness({"db": blocking}, budget_s=0.2)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    task = asyncio.create_task(ticker())
    results = await readiness.results()
    still_blocked = not gate.is_set()  # the budget, not the thread, ended the wait
    task.cancel()
    gate.set()
    assert results == {"db": "timeout"} and still_blocked
    assert ticks >= 3  # the loop went on while the thread was blocked


async def test_only_a_change_of_outcome_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    up = True

    async def flaky() -> None:
        if not up:
            raise ConnectionError("down")

    clock = Clock()
    readiness = Readiness({"redis": flaky}, max_age_s=1.0, clock=clock)
    with caplog.at_level(logging.INFO, logger="projector.health"):
        for state in (True, True, False, False, False, True, True):
            up = state
            clock.now += 2
            await readiness.results()
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "readiness: redis is unavailable (ConnectionError: down)",
        "readiness: redis answers again",
    ]


async def test_worker_livez_and_readyz() -> None:
    up = True

    async def redis() -> None:
        if not up:
            raise ConnectionError("down")

    clock = Clock()
    app = web.Application()
    add_health_routes(app, Readiness({"redis": redis}, max_age_s=1.0, clock=clock))
    async with TestClient(TestServer(app)) as client:
        resp = await client.get("/readyz")
        assert resp.status == 200
        assert await resp.json() == {"status": "ready", "checks": {"redis": "ok"}}
        up = False
        clock.now += 2
        resp = await client.get("/readyz")
        assert resp.status == 503 and resp.headers["Retry-After"] == "5"
        assert await resp.json() == {
            "status": "not_ready",
            "failed": ["redis"],
            "checks": {"redis": "unavailable"},
        }
        resp = await client.get("/livez")  # not ready, still live
        assert resp.status == 200 and await resp.json() == {"status": "live"}
