"""Issue 18, scenario "redis-loss": the projection store loses everything and the worker writes
it again by itself (automatic projection repair, issue 18 item 1).

A redis-server of the test's own that keeps nothing on disk (never the shared 6379): FLUSHALL
while the stream runs, then, after the stream, a SIGKILL and a restart that comes back empty with
a new run id (a failover to an empty replica). After each loss, with no command run, the store
must hold rows and badges equal to `projector replay` again; how long that took is measured.

Runs only where the repair exists (app/worker/repair.py, branch h/restore until it lands on
main): elsewhere it is skipped with that reason, and `make chaos` reports it as not yet run."""

from __future__ import annotations

import asyncio
import importlib.util
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.integration.chaos_flow import (
    Expected,
    Traffic,
    compare,
    one,
    replay,
    scrape,
    start_worker,
    traffic_task,
    wait_ready,
)
from tests.integration.stack import Stack, free_port
from tests.support.chaos_results import record, scale, scaled

pytestmark = [pytest.mark.integration, pytest.mark.timeout(2400)]

APPLIED = "projector_entries_applied_total"
RESTORES = "projector_projection_restores_total"


def _restore_missing() -> bool:
    return importlib.util.find_spec("app.worker.repair") is None


needs_restore = pytest.mark.skipif(
    _restore_missing(),
    reason="automatic projection repair (issue 18 item 1, branch h/restore) is not on this branch yet",
)


class VolatileRedis:
    """redis-server on a free port with no persistence at all: a restart comes back empty."""

    def __init__(self, directory: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise AssertionError("redis-server is missing: run `make services-up`")
        self.binary, self.directory, self.port = binary, directory, free_port()
        directory.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        with (self.directory / "redis.log").open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    *(self.binary, "--bind", "127.0.0.1", "--port", str(self.port)),
                    *("--dir", str(self.directory), "--save", "", "--appendonly", "no"),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(64).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            assert time.monotonic() < deadline, "redis-server did not answer"
            time.sleep(0.1)

    def flushall(self) -> None:
        import redis

        client = redis.Redis(host="127.0.0.1", port=self.port)
        try:
            client.flushall()
        finally:
            client.close()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)


async def _equal_within(stack: Stack, expected: Expected, timeout: float) -> float:
    """Seconds until the store equals replay (polled); fails after `timeout`."""
    started = time.monotonic()
    while True:
        stack.alive()()
        outcome = await compare(stack, expected)
        if outcome.equal:
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise AssertionError(f"the projection was not restored within {timeout}s: {outcome}")
        await asyncio.sleep(1)


async def run_redis_loss(
    unique_name: Callable[..., str], tmp: Path, traffic: Traffic, name: str
) -> dict[str, Any]:
    numbers: dict[str, Any] = {}
    redis_server = VolatileRedis(tmp / "redis")
    redis_server.start()
    stack: Stack | None = None
    try:
        stack = Stack(
            unique_name("redisloss"),
            tmp / "stack",
            partitions=4,
            lanes=2,
            PROJECTOR_REDIS_URL=redis_server.url,
        )
        stack.tmp.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(stack.run, "bootstrap")
        port = free_port()
        worker = start_worker(stack, 0, PROJECTOR_WORKER_METRICS_PORT=str(port))
        await wait_ready(stack)  # the FLUSHALL must fall inside the stream, not after it
        task, stream = traffic_task(stack, tmp, traffic)
        deadline = time.monotonic() + 600
        while one(await scrape(port), APPLIED) < 500:
            stack.alive()()
            assert time.monotonic() < deadline, stack.log_tail()
            await asyncio.sleep(0.5)
        numbers["applied_at_flushall"] = int(one(await scrape(port), APPLIED))
        redis_server.flushall()
        numbers["stream_still_running_at_flushall"] = not task.done()
        await task
        expected = replay(stack, stream, tmp)
        numbers["entries"] = expected.entries
        numbers["equal_after_stream_end_s"] = round(await _equal_within(stack, expected, 900), 1)
        # Second loss: the server itself dies and comes back empty; no entry follows.
        redis_server.kill()
        redis_server.start()
        numbers["equal_after_empty_restart_s"] = round(await _equal_within(stack, expected, 900), 1)
        text = await scrape(port)
        numbers["restores_counted"] = int(one(text, RESTORES))
        numbers["worker_exited"] = worker.poll() is not None
        outcome = await compare(stack, expected)
        numbers.update(mismatched_rows=outcome.mismatched_rows, mismatched_badges=outcome.mismatched_badges)
        record(name, **numbers)
        stack.alive()()
        assert numbers["restores_counted"] >= 2, numbers
        return numbers
    finally:
        if stack is not None:
            await stack.cleanup()
        redis_server.stop()


@needs_restore
async def test_redis_loss_small(unique_name: Callable[..., str], tmp_path: Path) -> None:
    traffic = Traffic(users=30, conversations=20, group_size=10, messages=400, rate=25.0, seed=9)
    print(await run_redis_loss(unique_name, tmp_path, traffic, "redis-loss-small"))


@needs_restore
@pytest.mark.chaos
async def test_full_size_redis_loss(unique_name: Callable[..., str], tmp_path: Path, chaos_seed: int) -> None:
    traffic = Traffic(
        users=200,
        conversations=150,
        group_size=20,
        messages=scaled(6000, 400),
        rate=40.0 * max(scale(), 0.5),
        seed=chaos_seed,
    )
    print(await run_redis_loss(unique_name, tmp_path, traffic, "redis-loss"))
