"""The local 3-node Kafka KRaft cluster of the chaos tests (scripts/kafka_cluster.sh: RF 3,
min.insync.replicas=2, nodes 1..3 on 127.0.0.1:9191-9193), and what the tests do to it: start it
(when it is not up), find a partition's leader and in-sync replicas, SIGKILL a broker and start
it again exactly as it ran.

Not part of `make test`: the tests that use it are marked `chaos` (`make chaos-infra-check`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.paths import ROOT

HOST = "127.0.0.1"
NODES = (1, 2, 3)
BOOTSTRAP = ",".join(f"{HOST}:{9190 + n}" for n in NODES)


def port(node: int) -> int:
    return 9190 + node


def script(command: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(ROOT / "scripts/kafka_cluster.sh"), command],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def up() -> bool:
    """Start the cluster unless it serves already; True if this call started nodes."""
    done = script("up")
    if done.returncode != 0:
        raise AssertionError(f"scripts/kafka_cluster.sh up failed:\n{done.stdout}\n{done.stderr}")
    return "reused" not in done.stdout


def down() -> None:
    script("down")


def listening_pid(tcp_port: int) -> int:
    done = subprocess.run(
        ["python3", str(ROOT / "scripts/portowner.py"), str(tcp_port)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if done.returncode != 0 or not done.stdout.split():
        raise AssertionError(f"no process listens on {HOST}:{tcp_port}")
    return int(done.stdout.split()[0])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@dataclass
class KilledBroker:
    """A broker killed with SIGKILL, with its exact command line to start it again."""

    node: int
    argv: list[str]
    cwd: str

    def restart(self) -> None:
        """Start it again (detached, its pid file and log beside its server.properties, as
        scripts/kafka_cluster.sh does); it catches up from the other replicas."""
        node_dir = Path(self.argv[-1]).parent  # ... kafka.Kafka <node dir>/server.properties
        subprocess.run(
            [
                *("python3", str(ROOT / "scripts/daemon.py")),
                *(str(node_dir / "kafka.pid"), str(node_dir / "kafka.log"), "--", *self.argv),
            ],
            cwd=self.cwd,
            check=True,
            capture_output=True,
            timeout=60,
        )


def kill_broker(node: int, timeout: float = 60) -> KilledBroker:
    """SIGKILL broker `node` (whichever checkout started it); returns once it is gone."""
    pid = listening_pid(port(node))
    argv = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")]
    cwd = os.readlink(f"/proc/{pid}/cwd")
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while _alive(pid):
        if time.monotonic() > deadline:
            raise AssertionError(f"broker {node} (pid {pid}) still alive {timeout}s after SIGKILL")
        time.sleep(0.1)
    return KilledBroker(node, argv, cwd)


async def admin() -> Any:
    from aiokafka.admin import AIOKafkaAdminClient

    client = AIOKafkaAdminClient(bootstrap_servers=BOOTSTRAP, request_timeout_ms=10000)
    await client.start()
    return client


async def partition_state(topic: str, partition: int) -> tuple[int, list[int]]:
    """(leader node id, in-sync replica ids) of `topic`/`partition`, as the cluster says now
    (leader -1: none)."""
    client = await admin()
    try:
        described = await client.describe_topics([topic])
    finally:
        await client.close()
    for entry in described:
        if entry["topic"] == topic:
            for p in entry["partitions"]:
                if p["partition"] == partition:
                    return int(p["leader"]), sorted(int(r) for r in p["isr"])
    raise AssertionError(f"{topic}/{partition} is not in the metadata")


async def leader_of(topic: str, partition: int) -> int:
    leader, _ = await partition_state(topic, partition)
    return leader


async def wait_for(what: str, condition: Callable[[], Awaitable[bool]], timeout: float) -> None:
    """Poll `condition` (errors count as "not yet": brokers come and go here) until it holds."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            if await condition():
                return
        except Exception as exc:  # a broker restarting answers errors for a while
            last = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout}s (last error: {last!r})")
        await asyncio.sleep(0.5)


async def create_topic(name: str, partitions: int) -> None:
    from aiokafka.admin import NewTopic

    client = await admin()
    try:
        await client.create_topics([NewTopic(name, partitions, replication_factor=3)])
    finally:
        await client.close()


async def delete_topic(name: str) -> None:
    client = await admin()
    try:
        await client.delete_topics([name])
    finally:
        await client.close()


def quiet_kafka_logs() -> None:
    """aiokafka logs every lost connection at ERROR: expected here, noise in a failing test."""
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
