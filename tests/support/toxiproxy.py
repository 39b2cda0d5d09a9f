"""Toxiproxy for the fault tests (issue 18): a toxiproxy-server of our own on a free port, and its
HTTP API to put proxies between a client and a real server and make their links slow, stalled or
reset ("toxics"). The binaries are built by scripts/tools.d/toxiproxy.sh (`make tools`, which
`make test` runs) into .local/bin.

    with Toxiproxy.start(tmp_path) as toxi:
        proxy = toxi.proxy("redis", "127.0.0.1:6379")      # listens on proxy.host:proxy.port
        toxi.add_toxic(proxy, "latency", {"latency": 200, "jitter": 0})
        toxi.add_toxic(proxy, "reset_peer", {"timeout": 0}, stream="upstream")
        toxi.remove_toxic(proxy, "latency_downstream")
        toxi.disable(proxy) / toxi.enable(proxy)            # connection refused / back

Toxic types and their attributes (toxiproxy's own): latency {latency, jitter} (ms), bandwidth
{rate} (KB/s), slow_close {delay}, timeout {timeout} (stall, then close; 0 = stall for ever),
reset_peer {timeout}, slicer {average_size, size_variation, delay}, limit_data {bytes}.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, cast

import pytest

from tests.integration.stack import free_port
from tests.support.paths import ROOT

BIN = ROOT / ".local" / "bin"
HINT = "toxiproxy is built by `make tools` (scripts/tools.d/toxiproxy.sh; `make test` runs it)"


@dataclass(frozen=True)
class Proxy:
    name: str
    host: str
    port: int
    upstream: str

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


class ToxiproxyError(RuntimeError):
    """The toxiproxy API answered an error (the message is its own)."""


class Toxiproxy:
    """One toxiproxy-server process (127.0.0.1, a free port) and its API."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.proc = proc
        self.api = f"http://127.0.0.1:{port}"
        self.log = log

    @classmethod
    def start(cls, workdir: Path, timeout: float = 30) -> Toxiproxy:
        server = BIN / "toxiproxy-server"
        if not server.exists():
            pytest.fail(f"{server} is missing; {HINT}", pytrace=False)
        port = free_port()
        log = workdir / "toxiproxy.log"
        with log.open("ab") as out:
            proc = subprocess.Popen(
                [str(server), "-host", "127.0.0.1", "-port", str(port)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        toxi = cls(proc, port, log)
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"toxiproxy-server exited {proc.returncode}:\n{toxi.log_tail()}")
            try:
                toxi.version()
                return toxi
            except (OSError, ToxiproxyError):
                if time.monotonic() > deadline:
                    toxi.close()
                    raise AssertionError(f"toxiproxy-server not answering after {timeout}s") from None
                time.sleep(0.1)

    def __enter__(self) -> Toxiproxy:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log_tail(self, lines: int = 30) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    # -- the HTTP API -----------------------------------------------------------------------------

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.api + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raise ToxiproxyError(
                f"{method} {path}: {exc.code} {exc.read().decode(errors='replace')}"
            ) from None
        return json.loads(raw) if raw.strip() else None

    def version(self) -> str:
        request = urllib.request.Request(self.api + "/version")
        with urllib.request.urlopen(request, timeout=5) as response:
            return cast(bytes, response.read()).decode().strip()

    def proxy(self, name: str, upstream: str, listen: str = "127.0.0.1:0") -> Proxy:
        """A new proxy to `upstream` (HOST:PORT); port 0 lets toxiproxy pick the listen port."""
        made = self._call("POST", "/proxies", {"name": name, "listen": listen, "upstream": upstream})
        host, _, port = str(made["listen"]).rpartition(":")
        return Proxy(name, host.strip("[]") or "127.0.0.1", int(port), upstream)

    def delete(self, proxy: Proxy) -> None:
        self._call("DELETE", f"/proxies/{proxy.name}")

    def disable(self, proxy: Proxy) -> None:
        """Close its connections and refuse new ones (a server gone)."""
        self._call("POST", f"/proxies/{proxy.name}", {"enabled": False})

    def enable(self, proxy: Proxy) -> None:
        self._call("POST", f"/proxies/{proxy.name}", {"enabled": True})

    def add_toxic(
        self,
        proxy: Proxy,
        kind: str,
        attributes: dict[str, int],
        *,
        stream: str = "downstream",
        toxicity: float = 1.0,
        name: str | None = None,
    ) -> str:
        """Add a toxic (`kind` as toxiproxy names them); returns its name (default
        ``{kind}_{stream}``). `stream`: downstream = server -> client, upstream = client -> server."""
        body = {
            "name": name or f"{kind}_{stream}",
            "type": kind,
            "stream": stream,
            "toxicity": toxicity,
            "attributes": attributes,
        }
        made = self._call("POST", f"/proxies/{proxy.name}/toxics", body)
        return str(made["name"])

    def remove_toxic(self, proxy: Proxy, name: str) -> None:
        self._call("DELETE", f"/proxies/{proxy.name}/toxics/{name}")

    def toxics(self, proxy: Proxy) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self._call("GET", f"/proxies/{proxy.name}/toxics")
        return found

    def reset(self) -> None:
        """Every proxy enabled again, every toxic removed."""
        self._call("POST", "/reset")
