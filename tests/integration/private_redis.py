"""A redis-server of a test's own (never the shared one on 6379, which other tests use): started,
SIGKILLed and started again on the same port and data directory. Append-only with an fsync per
write, so what it acknowledged before a kill is there after the restart (a projection store
that lost data would not be a store outage but a lost projection: `persistent=False`, a server
that keeps nothing on disk, so a restart comes back empty with a new run id, as a failover to an
empty replica does; tests/integration/test_projection_restore.py)."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from tests.integration.stack import free_port


class PrivateRedis:
    def __init__(self, directory: Path, *, persistent: bool = True) -> None:
        binary = shutil.which("redis-server")
        if binary is None:  # never a skip: `make services-up` installs it (scripts/services.sh)
            raise AssertionError("redis-server is missing: run `make services-up`")
        self.binary = binary
        self.directory = directory
        self.persistent = persistent
        self.directory.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 30.0) -> None:
        log = (self.directory / "redis.log").open("ab")
        self.proc = subprocess.Popen(
            [
                self.binary,
                *("--bind", "127.0.0.1", "--port", str(self.port), "--dir", str(self.directory)),
                *("--save", "", "--appendonly", "yes" if self.persistent else "no"),
                *(("--appendfsync", "always") if self.persistent else ()),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
        deadline = time.monotonic() + timeout
        while not self._answers():
            if self.proc.poll() is not None:
                raise AssertionError(f"redis-server exited {self.proc.returncode}: {self.log_tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"redis-server on {self.port} did not answer in {timeout}s")
            time.sleep(0.05)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: connections refused from now on, until `start`."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log_tail(self, lines: int = 20) -> str:
        path = self.directory / "redis.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False
