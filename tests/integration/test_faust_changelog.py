"""faust + rocksdict: a table's state comes back from its changelog after the local store is lost.

A worker (subprocess, see faust_counter_app.py) counts "add" records into a RocksDB-backed table.
It is stopped, its data directory is deleted, and a second worker of the same app must report the
same counts without reprocessing a single "add": the only way back is the changelog topic.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from app.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

PARTITIONS = 2
ROOT = Path(__file__).resolve().parents[2]


class Worker:
    def __init__(self, config: dict[str, Any], log: Path) -> None:
        self.log = log
        self._log_file = log.open("ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.integration.faust_counter_app",
                "worker",
                "-l",
                "info",
                "--without-web",
            ],
            cwd=ROOT,
            env={**os.environ, "FAUST_COUNTER_CONFIG": json.dumps(config)},
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
        )

    def tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def wait_for(self, path: Path, timeout: float = 120) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if path.exists():
                result: dict[str, Any] = json.loads(path.read_text())
                return result
            if self.proc.poll() is not None:
                pytest.fail(f"faust worker exited ({self.proc.returncode}):\n{self.tail()}")
            time.sleep(0.25)
        pytest.fail(f"no {path.name} after {timeout}s; worker log:\n{self.tail()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # faust shuts down cleanly: commits, flushes
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log_file.close()


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for worker in started:
        worker.stop()


async def _send(bootstrap: str, topic: str, records: list[tuple[str, dict[str, Any], int | None]]) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for key, value, partition in records:
            await producer.send(
                topic, key=key.encode(), value=json.dumps(value).encode(), partition=partition
            )
        await producer.flush()
    finally:
        await producer.stop()


def _report(report_id: str) -> list[tuple[str, dict[str, Any], int | None]]:
    # One report record per partition: seen on all of them, every earlier "add" is applied.
    return [("report", {"op": "report", "id": report_id}, p) for p in range(PARTITIONS)]


async def test_table_state_recovers_from_changelog_after_local_store_loss(
    servers: Settings,
    make_topic: Callable[..., Awaitable[str]],
    unique_name: Callable[..., str],
    topics_to_delete: list[str],
    workers: list[Worker],
    tmp_path: Path,
) -> None:
    topic = await make_topic("counter-src", partitions=PARTITIONS)
    app_id = unique_name("counter-app")
    # faust declares (creates) its changelog topic itself, with the table's partition count.
    topics_to_delete.append(f"{app_id}-counts-changelog")
    datadir, reports = tmp_path / "data", tmp_path / "reports"
    reports.mkdir()
    config = {
        "app_id": app_id,
        "bootstrap": servers.kafka.kafka_bootstrap,
        "topic": topic,
        "partitions": PARTITIONS,
        "datadir": str(datadir),
        "reports": str(reports),
    }

    adds: list[tuple[str, dict[str, Any], int | None]] = [
        (f"user-{i % 7}", {"op": "add", "n": i}, None) for i in range(1, 64)
    ]
    expected: dict[str, int] = {}
    for key, value, _ in adds:
        expected[key] = expected.get(key, 0) + value["n"]

    await _send(servers.kafka.kafka_bootstrap, topic, adds + _report("first"))
    first = Worker(config, tmp_path / "worker-1.log")
    workers.append(first)
    report1 = first.wait_for(reports / "first.json")
    assert report1 == {"counts": expected, "adds_this_run": len(adds)}, first.tail()
    first.stop()
    assert first.proc.returncode == 0, first.tail()

    # Lose the local RocksDB store entirely.
    stores = list(datadir.rglob("*.db"))
    assert stores, f"no RocksDB store under {datadir}: {list(datadir.rglob('*'))}"
    shutil.rmtree(datadir)

    second = Worker(config, tmp_path / "worker-2.log")
    workers.append(second)
    await _send(servers.kafka.kafka_bootstrap, topic, _report("second"))
    report2 = second.wait_for(reports / "second.json")
    # Same counts, and not one "add" replayed from the source topic: recovered from the changelog.
    assert report2 == {"counts": expected, "adds_this_run": 0}, second.tail()
