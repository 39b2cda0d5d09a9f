"""The operator kit for real (issue 15): a real Prometheus (Debian's, scripts/tools.d/prometheus.sh)
with a temporary config and data dir on a free port scrapes a real worker and the real
`projector api` while traffic flows; every query of the Grafana dashboard returns data through
Prometheus' HTTP API, both targets are up, and the alert rules load and evaluate without error.

The worker and the API run with PROJECTOR_LOG_FORMAT=json (and the API's access log on): every
line either process wrote, faust's own records included, is one JSON object."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import yaml

from app.api.tokens import TokenSigner
from app.metrics import WORKER_METRICS, names, sample
from tests.integration.stack import PROJECTOR, ROOT, Stack, free_port, scrape_until
from tests.support.api import SECRET
from tests.support.deploy_kit import ALERTS, API_JOB, WORKER_JOB, queries

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

SCRAPE_S = 1
# Grafana's $__rate_interval is at least four scrape intervals.
RATE_INTERVAL = f"{10 * SCRAPE_S}s"


class Process:
    """A subprocess with its stdout and stderr in files (read back when it has stopped)."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], tmp: Path) -> None:
        self.name = name
        self.out = tmp / f"{name}.out"
        self.err = tmp / f"{name}.err"
        with self.out.open("wb") as out, self.err.open("wb") as err:
            self.proc = subprocess.Popen(
                args, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err
            )

    def alive(self) -> None:
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.name} exited {self.proc.returncode}:\n{self.tail()}")

    def tail(self) -> str:
        text = self.out.read_text(errors="replace") + self.err.read_text(errors="replace")
        return "\n".join(text.splitlines()[-40:])

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


@pytest.fixture
def processes() -> Iterator[list[Process]]:
    started: list[Process] = []
    yield started
    for process in reversed(started):
        process.stop()


async def wait_http(
    url: str, ok: Callable[[int, str], bool], timeout: float, alive: Callable[[], None]
) -> str:
    deadline = time.monotonic() + timeout
    last = ""
    async with aiohttp.ClientSession() as http:
        while True:
            alive()
            try:
                async with http.get(url) as resp:
                    last = f"{resp.status} {await resp.text()}"
                    if ok(resp.status, last):
                        return last
            except aiohttp.ClientConnectionError:
                pass  # still starting
            if time.monotonic() > deadline:
                raise AssertionError(f"{url}: not ready after {timeout}s (last: {last[:500]})")
            await asyncio.sleep(0.5)


def prometheus_config(tmp: Path, worker_port: int, api_port: int) -> Path:
    rules = tmp / "alerts.yml"
    shutil.copy(ALERTS, rules)
    config = {
        "global": {"scrape_interval": f"{SCRAPE_S}s", "evaluation_interval": f"{SCRAPE_S}s"},
        "rule_files": [str(rules)],
        "scrape_configs": [
            {"job_name": WORKER_JOB, "static_configs": [{"targets": [f"127.0.0.1:{worker_port}"]}]},
            {"job_name": API_JOB, "static_configs": [{"targets": [f"127.0.0.1:{api_port}"]}]},
        ],
    }
    path = tmp / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


async def api_traffic(base: str) -> None:
    """Pages (a snapshot load, then a hit), badges, health probes, a 404 and a 401."""
    bearer = {"Authorization": "Bearer " + TokenSigner(SECRET).mint(5, int(time.time()) + 600)}
    async with aiohttp.ClientSession() as http:
        for path, headers, status in [
            ("/v1/sessions", bearer, 200),
            ("/v1/sessions", bearer, 200),
            ("/v1/badge", bearer, 200),
            ("/livez", {}, 200),
            ("/readyz", {}, 200),
            ("/v1/no-such-route", bearer, 404),
            ("/v1/badge", {}, 401),
        ]:
            async with http.get(base + path, headers=headers) as resp:
                assert resp.status == status, (path, resp.status, await resp.text())


async def query_until_data(prometheus: str, timeout: float, alive: Callable[[], None]) -> None:
    """Every dashboard query, through /api/v1/query, until each has returned data once."""
    waiting = dict(queries(RATE_INTERVAL))
    errors: dict[str, str] = {}
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as http:
        while waiting:
            alive()
            for where, expr in list(waiting.items()):
                async with http.get(f"{prometheus}/api/v1/query", params={"query": expr}) as resp:
                    body = await resp.json()
                if resp.status != 200 or body.get("status") != "success":
                    errors[where] = f"{resp.status}: {body.get('error')}"  # a bad query never heals
                    del waiting[where]
                elif body["data"]["result"]:
                    del waiting[where]
            if waiting and time.monotonic() > deadline:
                raise AssertionError(f"no data after {timeout}s for: {sorted(waiting)}")
            if waiting:
                await asyncio.sleep(1)
    assert not errors, errors


def json_lines(path: Path) -> list[dict[str, Any]]:
    out = []
    for number, line in enumerate(path.read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            raise AssertionError(f"{path.name}:{number} is not JSON: {line[:300]!r}") from None
        assert isinstance(record, dict), (path.name, number, record)
        assert {"ts", "level", "logger", "message", "service", "pid"} <= set(record), (
            path.name,
            number,
            record,
        )
        out.append(record)
    return out


async def test_prometheus_scrapes_worker_and_api_and_every_dashboard_query_has_data(
    make_stack: Callable[..., Stack], processes: list[Process], tmp_path: Path
) -> None:
    prometheus_bin = shutil.which("prometheus")
    assert prometheus_bin, "prometheus is missing: `make tools` (scripts/tools.d/prometheus.sh) installs it"
    worker_port, api_port, prometheus_port = free_port(), free_port(), free_port()
    while len({worker_port, api_port, prometheus_port}) < 3:
        api_port, prometheus_port = free_port(), free_port()
    stack = make_stack("opskit", PROJECTOR_WORKER_METRICS_PORT=str(worker_port), PROJECTOR_LOG_FORMAT="json")

    # The worker (its output in the stack's worker-0.log), the API, Prometheus.
    stack.start_worker()
    worker_alive = stack.alive()
    api_env = {
        **stack.env,
        "PROJECTOR_API_SECRET": SECRET,
        "PROJECTOR_API_ACCESS_LOG": "true",
        "PROJECTOR_LOG_FORMAT": "json",
    }
    api = Process("api", [*PROJECTOR, "api", "--port", str(api_port)], api_env, tmp_path)
    processes.append(api)
    data = tmp_path / "prometheus-data"
    prometheus = Process(
        "prometheus",
        [
            prometheus_bin,
            f"--config.file={prometheus_config(tmp_path, worker_port, api_port)}",
            f"--storage.tsdb.path={data}",
            f"--web.listen-address=127.0.0.1:{prometheus_port}",
            "--log.level=warn",
        ],
        dict(os.environ),
        tmp_path,
    )
    processes.append(prometheus)

    def alive() -> None:
        worker_alive()
        api.alive()
        prometheus.alive()

    prom = f"http://127.0.0.1:{prometheus_port}"
    api_base = f"http://127.0.0.1:{api_port}"
    await wait_http(f"{prom}/-/ready", lambda status, _: status == 200, 120, alive)
    await wait_http(f"{api_base}/readyz", lambda status, _: status == 200, 120, alive)
    worker_url = f"http://127.0.0.1:{worker_port}/metrics"
    await scrape_until(worker_url, lambda t: set(WORKER_METRICS) <= names(t), 240, alive)

    # Traffic: MessageStore rows and mailbox entries through the worker, a dead letter, API calls.
    stack.run(
        *("simulate", "--users", "20", "--conversations", "10", "--group-size", "6", "--messages", "300"),
        *("--rate", "0", "--lanes", "2", "--seed", "11", "--progress", "never"),
    )
    await stack.produce([b"{oops"])
    await scrape_until(
        worker_url,
        lambda t: (
            sample(t, "projector_entries_applied_total") > 0
            and sample(t, "projector_flush_latency_seconds_count") > 0
            and sample(t, "projector_dead_letters_total", [("reason", "not_json")]) > 0
        ),
        240,
        alive,
    )
    await api_traffic(api_base)

    # Both targets up in Prometheus, then every dashboard query has data.
    async def targets_up() -> bool:
        async with aiohttp.ClientSession() as http, http.get(f"{prom}/api/v1/targets") as resp:
            active = (await resp.json())["data"]["activeTargets"]
        return {t["labels"]["job"] for t in active if t["health"] == "up"} == {WORKER_JOB, API_JOB}

    deadline = time.monotonic() + 120
    while not await targets_up():
        alive()
        assert time.monotonic() < deadline, "Prometheus never scraped both targets"
        await asyncio.sleep(1)
    await query_until_data(prom, 180, alive)

    # The alert rules are loaded in the real server and evaluate without error.
    async def rule_states() -> list[dict[str, Any]]:
        async with aiohttp.ClientSession() as http, http.get(f"{prom}/api/v1/rules") as resp:
            groups = (await resp.json())["data"]["groups"]
        return [rule for group in groups for rule in group["rules"]]

    deadline = time.monotonic() + 60
    while any(rule["health"] == "unknown" for rule in await rule_states()):  # not yet evaluated
        assert time.monotonic() < deadline, "the alert rules were never evaluated"
        await asyncio.sleep(1)
    rules = await rule_states()
    assert len(rules) == ALERTS.read_text().count("- alert:")
    assert all(rule["health"] == "ok" for rule in rules), [(r["name"], r.get("lastError")) for r in rules]

    # JSON logs: every line of both processes, faust's records and the access log included.
    assert api.stop() == 0, api.tail()
    stack.stop_workers()
    worker_log = json_lines(stack.tmp / "worker-0.log")
    assert {r["service"] for r in worker_log} == {"worker"}
    assert any(r["logger"].startswith("faust") for r in worker_log)  # faust's own records
    assert any("dead letter" in r["message"] for r in worker_log)
    api_log = json_lines(api.out) + json_lines(api.err)
    assert {r["service"] for r in api_log} == {"api"}
    access = [r for r in api_log if r["logger"] == "aiohttp.access"]
    assert {r.get("response_status") for r in access} >= {200, 401, 404}
    assert any("listening on" in r["message"] for r in api_log)
