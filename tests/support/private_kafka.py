"""A private single-node Kafka (KRaft, broker + controller) for the chaos scenarios that kill a
broker or poison the link to it (issue 18): the shared broker on 9092 serves everyone's tests and
is never touched. Same jars as the shared one (scripts/services.sh resolves them into
.local/kafka/lib), its own free ports and data dir.

`advertised` lets the broker name another address than the one it listens on: a Toxiproxy proxy
in front of it, so that every client connection (bootstrap AND the ones made from the metadata)
goes through the proxy.

    broker = PrivateKafka.start(tmp_path)            # broker.bootstrap == "127.0.0.1:<port>"
    broker.kill()                                    # SIGKILL
    broker.restart()                                 # same data, same ports
"""

from __future__ import annotations

import base64
import logging
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

from tests.integration.stack import free_port

ROOT = Path(__file__).resolve().parents[2]
LIB = ROOT / ".local" / "kafka" / "lib"

PROPERTIES = """\
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{controller}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}
advertised.listeners=PLAINTEXT://{advertised}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs={data}
auto.create.topics.enable=false
num.partitions=1
default.replication.factor=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
group.initial.rebalance.delay.ms=0
log.segment.bytes=67108864
num.network.threads=2
num.io.threads=2
num.recovery.threads.per.data.dir=1
"""


class PrivateKafka:
    def __init__(self, workdir: Path, port: int, controller: int, advertised: str) -> None:
        self.dir = workdir
        self.port = port
        self.controller = controller
        self.advertised = advertised
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @classmethod
    def start(
        cls, workdir: Path, *, port: int | None = None, advertised: str | None = None, timeout: float = 240
    ) -> PrivateKafka:
        if not any(LIB.glob("kafka_*.jar")):
            subprocess.run(["bash", str(ROOT / "scripts/services.sh"), "jars", "kafka"], check=True, cwd=ROOT)
        workdir.mkdir(parents=True, exist_ok=True)
        port = port or free_port()
        broker = cls(workdir, port, free_port(), advertised or f"127.0.0.1:{port}")
        (workdir / "server.properties").write_text(
            PROPERTIES.format(
                port=broker.port,
                controller=broker.controller,
                advertised=broker.advertised,
                data=workdir / "data",
            )
        )
        (workdir / "log4j.properties").write_text((ROOT / "scripts/kafka/log4j.properties").read_text())
        cluster_id = base64.urlsafe_b64encode(uuid.UUID(int=uuid.uuid4().int >> 1).bytes).decode().rstrip("=")
        with (workdir / "kafka.log").open("ab") as out:
            subprocess.run(
                [
                    *broker._jvm(),
                    "kafka.tools.StorageTool",
                    "format",
                    "-t",
                    cluster_id,
                    "-c",
                    str(workdir / "server.properties"),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                check=True,
                timeout=180,
            )
        broker.restart(timeout)
        return broker

    def _jvm(self) -> list[str]:
        return [
            *("java", "-Dprojector.service=kafka-private", "-Xms128m", "-Xmx384m", "-XX:+UseG1GC"),
            *("-Djava.awt.headless=true", f"-Dlog4j.configuration=file:{self.dir}/log4j.properties"),
            *(f"-Dkafka.logs.dir={self.dir}/logs", "-cp", f"{LIB}/*"),
        ]

    def restart(self, timeout: float = 240) -> None:
        """Start the broker (again, on the same data and ports) and wait until it serves."""
        with (self.dir / "kafka.log").open("ab") as out:
            self.proc = subprocess.Popen(
                [*self._jvm(), "kafka.Kafka", str(self.dir / "server.properties")],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.wait_serving(timeout)

    def wait_serving(self, timeout: float) -> None:
        import asyncio

        from aiokafka.admin import AIOKafkaAdminClient

        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)  # refused while it starts: expected

        async def serves() -> bool:
            admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=5000)
            try:
                await asyncio.wait_for(admin.start(), 8)
                found = await asyncio.wait_for(admin.describe_cluster(), 8)
                return bool(found.get("brokers")) and int(found.get("controller_id", -1)) >= 0
            except Exception:  # still starting: any error is "not yet"
                return False
            finally:
                await admin.close()

        deadline = time.monotonic() + timeout
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"private Kafka exited {self.proc.returncode}:\n{self.log_tail()}")
            # The advertised address may be a proxy that is not there yet: probe the port itself.
            if asyncio.run(serves()) if self.advertised == self.bootstrap else _port_open(self.port):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"private Kafka not serving after {timeout}s:\n{self.log_tail()}")
            time.sleep(1)

    def kill(self) -> None:
        """SIGKILL, no clean shutdown (what the scenario is about)."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=60)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log_tail(self, lines: int = 40) -> str:
        path = self.dir / "kafka.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


def _port_open(port: int) -> bool:
    import socket

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return True
    except OSError:
        return False
