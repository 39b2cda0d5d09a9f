"""Query API benchmark: `projector api` (a subprocess, as deployed) against the local Redis.

One user with 5,000 conversations (pinned, archived, deleted and null-activity rows mixed in) is
written to a private projection namespace (the server also gets a private, bootstrapped
keyspace). Then, against 127.0.0.1 only, in bounded loops:

* warm page: cursor pages (limit 50) of a live snapshot: one HMGET of meta + a slice of held rows;
* cold first page: a page without cursor right after the user's projection changed (a one-row
  flush moves the version), so the server reloads the whole snapshot: HGETALL of 5,000 rows,
  the changed ones decoded and sorted in among the unchanged ones the held snapshot placed, the
  frozen record published, the page's rows converted to the served form;
* throughput: warm pages from `--concurrency` concurrent requests for `--seconds` (or at most
  `--max-requests`);
* adopted page (issue 32): a second `projector api` on the same store is given the cursor of
  each cold first page: it does not hold that snapshot, so it reads the fleet's frozen record
  and the user's rows and serves the next page from them (what a walk costs on the first page
  it meets another instance).

Server-side latency comes from the `Server-Timing: app;dur=<ms>` header every response carries
(handler time, no network or client), client-side latency is measured around each request.

    .venv/bin/python bench/api_bench.py [--warm 2000 --cold 200 --seconds 10 --concurrency 8]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import re
import secrets
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import redis.asyncio as redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.api.tokens import TokenSigner  # noqa: E402
from app.domain.badge import Badge  # noqa: E402
from app.domain.flush import UserFlush  # noqa: E402
from app.settings import Settings  # noqa: E402
from app.stores.redis_projection import RedisProjectionStore  # noqa: E402
from bench.harness import baseline_settings, percentile  # noqa: E402

USER = 777_000_001


def rows_for(user_id: int, count: int, seed: int = 1) -> list[dict[str, Any]]:
    rnd = random.Random(seed)
    rows = []
    for n in range(1, count + 1):
        kind = rnd.random()
        act = None if kind < 0.02 else f"{rnd.randrange(1, 1 << 60):032x}"
        pin = rnd.randrange(0, 10) if 0.02 <= kind < 0.04 else None
        rows.append(
            {
                "user_id": user_id,
                "conversation_id": str(uuid.UUID(int=rnd.getrandbits(128))),
                "listed": not 0.10 <= kind < 0.12,
                "membership": "active",
                "pinned": pin is not None,
                "pin_rank": pin,
                "archived": 0.04 <= kind < 0.10,
                "muted": False,
                "last_activity_id": act,
                "latest_conversation_seq": None if act is None else rnd.randrange(1, 10_000),
                "last_message_id": None if act is None else f"msg-{n}",
                "unread_count": rnd.randrange(0, 30),
                "unread_exact": True,
                "mention_count": 0,
                "mention_first_conversation_seq": None,
                "read_conversation_seq": 0,
                "hidden_before_conversation_seq": 0,
                "deleted_before_conversation_seq": 0,
                "joined_at_conversation_seq": 0,
                "left_at_conversation_seq": None,
                "projection_mailbox_seq": n,
            }
        )
    return rows


def batch(user_id: int, rows: list[dict[str, Any]], version: int) -> UserFlush:
    return UserFlush(user_id, rows, Badge(1, 0, 0), version, version - 1, 1, f"e{version}", version)


def cpu_ms(pid: int) -> float:
    """CPU time (user + system) the process has used so far: less sensitive than wall time to
    other jobs on a shared machine."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def drop_keyspace(settings: Settings, keyspace: str) -> None:
    from app.stores.cassandra_session import open_cluster

    cluster, session = open_cluster(settings.cassandra)
    try:
        session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=120)
    finally:
        cluster.shutdown()


async def api_bases(procs: list[subprocess.Popen[str]]) -> list[str]:
    """Each started `projector api`'s base URL, from the line it prints once it listens."""
    bases = []
    for api_proc in procs:
        assert api_proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(api_proc.stdout.readline), timeout=60)
        match = re.search(r"http://127\.0\.0\.1:\d+", line)
        if match is None:
            raise RuntimeError(f"projector api did not start: {line!r}")
        bases.append(match[0])
    return bases


def summary(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50_ms": round(statistics.median(values), 3),
        "p99_ms": round(percentile(values, 0.99), 3),
        "max_ms": round(max(values), 3),
    }


@dataclass(frozen=True)
class Reply:
    """One page response: its body, the server's own time and loop CPU for it (`Server-Timing`:
    `loop-cpu` is not inflated by other jobs on a shared machine), and the client's wall time."""

    body: dict[str, Any]
    server_ms: float
    wall_ms: float
    loop_cpu_ms: float


async def get(http: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> Reply:
    started = time.perf_counter()
    async with http.get(url, headers=headers) as resp:
        body = await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{url}: {resp.status} {body[:200]!r}")
        timing = resp.headers["Server-Timing"]
        server = float(re.search(r"app;dur=([0-9.]+)", timing)[1])  # type: ignore[index]
        loop_cpu = re.search(r"loop-cpu;dur=([0-9.]+)", timing)
    return Reply(
        orjson.loads(body),
        server,
        (time.perf_counter() - started) * 1000,
        float(loop_cpu[1]) if loop_cpu else math.nan,
    )


async def main(args: argparse.Namespace, settings_env: dict[str, str] | None = None) -> dict[str, Any]:
    secret = secrets.token_urlsafe(32)
    namespace = f"bench-api-{uuid.uuid4().hex[:8]}"
    settings = Settings.from_env()
    client = redis.Redis.from_url(settings.redis.redis_url)
    store = RedisProjectionStore(client, namespace)
    rows = rows_for(USER, args.conversations)
    version = 1
    await store.write([batch(USER, rows, version)])
    # Other users the instance holds snapshots of, as a busy instance does (the heap its
    # collector walks): each first page read once below.
    others = [USER + n for n in range(1, args.held_users + 1)]
    for other_user in others:
        await store.write([batch(other_user, rows_for(other_user, args.conversations, seed=other_user), 1)])
    # `projector api` needs a bootstrapped keyspace (the member directory's tables): a private one.
    from app.cli.bootstrap import ensure_cassandra_schema

    keyspace = f"bench_api_{uuid.uuid4().hex[:12]}"
    await asyncio.to_thread(ensure_cassandra_schema, settings.cassandra, keyspace=keyspace)
    env = {
        **os.environ,
        "PROJECTOR_CASSANDRA_KEYSPACE": keyspace,
        "PROJECTOR_API_SECRET": secret,
        "PROJECTOR_API_RATE_LIMIT_PER_S": "0",  # one user at full speed is what is measured
        "PROJECTOR_PROJECTION_NAMESPACE": namespace,
        "PROJECTOR_API_FILL_FROM_STATE": "never",
        "PROJECTOR_LOG_LEVEL": "WARNING",
        "PROJECTOR_GATEWAY_ENABLED": "false",  # pages only (bench/gateway_bench.py times the stream)
        # A login asks for a reconcile at most once per user per interval: not a page's steady
        # cost (bench/reconcile_bench.py times a reconcile), and the bench has no topics for it.
        "PROJECTOR_RECONCILE_ON_LOGIN": "false",
        **(settings_env or {}),
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "app", "api", "--host", "127.0.0.1", "--port", "0"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    proc = procs[0]
    try:
        base, other = await api_bases(procs)
        headers = {"Authorization": "Bearer " + TokenSigner(secret).mint(USER, int(time.time()) + 3600)}
        url = f"{base}/v1/sessions?limit={args.limit}"
        connector = aiohttp.TCPConnector(limit=args.concurrency)
        async with aiohttp.ClientSession(connector=connector) as http:
            for other_user in others:
                token = TokenSigner(secret).mint(other_user, int(time.time()) + 3600)
                await get(http, url, {"Authorization": "Bearer " + token})
            # One full walk: the cursors every warm request below reuses (all of one revision).
            cursors: list[str] = []
            body = (await get(http, url, headers)).body
            while body["next_cursor"]:
                cursors.append(body["next_cursor"])
                body = (await get(http, f"{url}&cursor={body['next_cursor']}", headers)).body
            revision = body["snapshot_revision"]

            warm_server: list[float] = []
            warm_client: list[float] = []
            cpu_before = cpu_ms(proc.pid)
            for i in range(args.warm):
                reply = await get(http, f"{url}&cursor={cursors[i % len(cursors)]}", headers)
                body, server, wall = reply.body, reply.server_ms, reply.wall_ms
                assert body["snapshot_revision"] == revision and body["projection_complete"]
                warm_server.append(server)
                warm_client.append(wall)

            warm_cpu = (cpu_ms(proc.pid) - cpu_before) / args.warm
            cold_server: list[float] = []
            cold_client: list[float] = []
            cold_loop_cpu: list[float] = []
            adopted_server: list[float] = []
            adopted_client: list[float] = []
            cpu_before = cpu_ms(proc.pid)
            for _ in range(args.cold):
                version += 1
                changed = dict(
                    rows[version % len(rows)], unread_count=version % 50, projection_mailbox_seq=version
                )
                await store.write([batch(USER, [changed], version)])
                reply = await get(http, url, headers)
                body, server, wall = reply.body, reply.server_ms, reply.wall_ms
                assert body["projection_mailbox_seq"] == version  # really reloaded
                cold_loop_cpu.append(reply.loop_cpu_ms)
                cold_server.append(server)
                cold_client.append(wall)
                # The next page of that walk on the other instance: an adoption.
                next_url = f"{other}/v1/sessions?limit={args.limit}&cursor={body['next_cursor']}"
                reply = await get(http, next_url, headers)
                page2, server, wall = reply.body, reply.server_ms, reply.wall_ms
                assert (
                    page2["projection_complete"] and page2["snapshot_revision"] == body["snapshot_revision"]
                )
                adopted_server.append(server)
                adopted_client.append(wall)

            cold_cpu = (cpu_ms(proc.pid) - cpu_before) / args.cold
            # Throughput: a fresh snapshot's cursors, then a bounded loop of warm pages.
            cursors = []
            body = (await get(http, url, headers)).body
            while body["next_cursor"]:
                cursors.append(body["next_cursor"])
                body = (await get(http, f"{url}&cursor={body['next_cursor']}", headers)).body
            done = 0
            deadline = time.perf_counter() + args.seconds

            async def worker(offset: int) -> None:
                nonlocal done
                i = offset
                while time.perf_counter() < deadline and done < args.max_requests:
                    async with http.get(f"{url}&cursor={cursors[i % len(cursors)]}", headers=headers) as resp:
                        await resp.read()
                        assert resp.status == 200
                    done += 1
                    i += 1

            started = time.perf_counter()
            cpu_before = cpu_ms(proc.pid)
            await asyncio.gather(*(worker(k * 7) for k in range(args.concurrency)))
            elapsed = time.perf_counter() - started
            throughput_cpu_s = (cpu_ms(proc.pid) - cpu_before) / 1000
    finally:
        for api_proc in procs:
            api_proc.terminate()
            api_proc.wait(timeout=30)
        await store.delete_all()
        await client.aclose()
        await asyncio.to_thread(drop_keyspace, settings, keyspace)
    listed = sum(1 for r in rows if r["listed"])
    return {
        "conversations": args.conversations,
        "listed": listed,
        "limit": args.limit,
        "warm_page": {
            "server": summary(warm_server),
            "client": summary(warm_client),
            "server_cpu_ms_per_request": round(warm_cpu, 3),
        },
        "cold_first_page": {
            "server": summary(cold_server),
            "client": summary(cold_client),
            "server_cpu_ms_per_request": round(cold_cpu, 3),
            "server_loop_cpu": summary(cold_loop_cpu),
        },
        "adopted_page": {"server": summary(adopted_server), "client": summary(adopted_client)},
        "throughput": {
            "requests": done,
            "seconds": round(elapsed, 2),
            "requests_per_s": round(done / elapsed, 1),
            "requests_per_server_cpu_s": round(done / throughput_cpu_s, 1) if throughput_cpu_s else None,
            "concurrency": args.concurrency,
        },
    }


def cli() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--conversations", type=int, default=5000)
    parser.add_argument("--limit", type=int, default=50)
    parser.add_argument("--warm", type=int, default=2000, help="warm page requests timed one by one")
    parser.add_argument("--cold", type=int, default=200, help="cold first pages (each after a store write)")
    parser.add_argument("--seconds", type=float, default=10.0, help="throughput phase bound")
    parser.add_argument("--max-requests", type=int, default=200_000, help="throughput phase bound")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument(
        "--held-users", type=int, default=40, help="other 5,000-row users whose snapshots the API holds"
    )
    parser.add_argument("--report", default=str(ROOT / "bench" / "out" / "api_report.json"))
    parser.add_argument(
        "--baseline",
        default="PROJECTOR_API_GC_THRESHOLD=0",
        help="API settings (K=V,...) of a baseline run side by side (cold pages); '' skips it",
    )
    args = parser.parse_args()
    report = asyncio.run(main(args))
    if args.baseline:
        setting = baseline_settings(args.baseline)
        report["baseline"] = {"settings": setting, **asyncio.run(main(args, setting))}
    Path(args.report).parent.mkdir(parents=True, exist_ok=True)
    Path(args.report).write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    print_report(report)
    print(f"report: {args.report}")
    return 0


def print_report(report: dict[str, Any]) -> None:
    w, c, t = report["warm_page"], report["cold_first_page"], report["throughput"]
    a = {**report["adopted_page"], "server_cpu_ms_per_request": float("nan")}
    print(f"query API, one user with {report['conversations']} conversations, limit {report['limit']}")
    print(
        f"{'':18}{'server p50':>12}{'server p99':>12}{'client p50':>12}{'client p99':>12}{'server CPU':>12}"
    )
    for name, part in (("warm page", w), ("cold first page", c), ("adopted page", a)):
        s, cl, cpu = part["server"], part["client"], part["server_cpu_ms_per_request"]
        print(
            f"{name:18}{s['p50_ms']:>10.3f}ms{s['p99_ms']:>10.3f}ms"
            f"{cl['p50_ms']:>10.3f}ms{cl['p99_ms']:>10.3f}ms{cpu:>10.3f}ms"
        )
    rate = f"{t['requests_per_s']} requests/s, {t['requests_per_server_cpu_s']} per server CPU second"
    print(f"warm pages: {rate} ({t['requests']} in {t['seconds']} s, {t['concurrency']} concurrent)")
    cpu = c["server_loop_cpu"]
    print(f"cold first page, server loop CPU: p50 {cpu['p50_ms']:.3f} ms, p99 {cpu['p99_ms']:.3f} ms")
    base = report.get("baseline")
    if base:
        label = ",".join(f"{k}={v}" for k, v in base["settings"].items())
        b = base["cold_first_page"]
        print(f"baseline, run after it ({label}):")
        for what, mine, theirs in (
            ("cold server", c["server"], b["server"]),
            ("cold loop CPU", cpu, b["server_loop_cpu"]),
        ):
            print(
                f"  {what:14s} p50 {theirs['p50_ms']:.3f} ms, p99 {theirs['p99_ms']:.3f} ms;"
                f" this run / baseline: p50 {mine['p50_ms'] / theirs['p50_ms']:.3f},"
                f" p99 {mine['p99_ms'] / theirs['p99_ms']:.3f}"
            )


if __name__ == "__main__":
    sys.exit(cli())
