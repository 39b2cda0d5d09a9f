"""HAProxy in front of several `projector api` processes (issue 32): what a deployment without
sticky routing looks like. Debian's haproxy is installed by scripts/tools.d/haproxy.sh (`make
tools`, which `make test` runs); a test starts its own on free ports with a configuration of its
own, round robin over the API processes, each request balanced on its own (no
`prefer-last-server`), failed connections re-dispatched to another server.

    with Balancer.start(tmp_path, ports, spare=spare_port) as lb:
        lb.url                      # http://127.0.0.1:<port>
        lb.enable_spare()           # the spare server joins the rotation (an instance added)
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

import pytest

from tests.integration.stack import free_port

HINT = "haproxy is installed by `make tools` (scripts/tools.d/haproxy.sh; `make test` runs it)"

CONFIG = """
global
    maxconn 512
    stats socket {socket} mode 600 level admin

defaults
    mode http
    timeout connect 2s
    timeout client 60s
    timeout server 60s
    timeout check 1s
    retries 3
    option redispatch 1
    retry-on conn-failure empty-response response-timeout

frontend api
    bind 127.0.0.1:{port}
    default_backend apis

backend apis
    balance roundrobin
    option httpchk GET /livez
    default-server inter 300ms fall 1 rise 1
{servers}
"""


class Balancer:
    def __init__(self, proc: subprocess.Popen[bytes], port: int, socket_path: Path, log: Path) -> None:
        self.proc = proc
        self.url = f"http://127.0.0.1:{port}"
        self.socket_path = socket_path
        self.log = log

    @classmethod
    def start(
        cls, workdir: Path, ports: list[int], spare: int | None = None, timeout: float = 30
    ) -> Balancer:
        binary = shutil.which("haproxy")
        if binary is None:
            pytest.fail(f"haproxy is not installed; {HINT}", pytrace=False)
        port = free_port()
        socket_path = workdir / "haproxy.sock"
        servers = [f"    server api{n} 127.0.0.1:{p} check" for n, p in enumerate(ports)]
        if spare is not None:
            servers.append(f"    server spare 127.0.0.1:{spare} check disabled")
        config = workdir / "haproxy.cfg"
        config.write_text(CONFIG.format(socket=socket_path, port=port, servers="\n".join(servers)))
        check = subprocess.run([binary, "-c", "-f", str(config)], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
        log = workdir / "haproxy.log"
        with log.open("ab") as out:
            proc = subprocess.Popen(
                [binary, "-db", "-f", str(config)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        lb = cls(proc, port, socket_path, log)
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                pytest.fail(f"haproxy exited {proc.returncode}: {log.read_text()[-2000:]}", pytrace=False)
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"haproxy did not listen on {port}") from None
                time.sleep(0.05)
        return lb

    def command(self, line: str) -> str:
        """One command on haproxy's runtime API (the admin socket)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(str(self.socket_path))
            sock.sendall(line.encode() + b"\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def enable_spare(self) -> None:
        self.command("enable server apis/spare")
        self.command("enable health apis/spare")

    def servers_up(self) -> dict[str, str]:
        """Server name -> its operational state as haproxy sees it (from `show stat`)."""
        lines = self.command("show stat").splitlines()
        header = lines[0].lstrip("# ").split(",")
        out = {}
        for line in lines[1:]:
            fields = dict(zip(header, line.split(","), strict=False))
            if fields.get("pxname") == "apis" and fields.get("svname") not in ("FRONTEND", "BACKEND"):
                out[fields["svname"]] = fields.get("status", "")
        return out

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> Balancer:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
