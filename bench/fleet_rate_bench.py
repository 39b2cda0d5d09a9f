"""The fleet's rate limit, measured (issue 32): N `projector api` processes on one projection store
(the local Redis), one user's requests spread round robin over them (as a balancer without
stickiness does), offered faster than the limit. Counts what got through (200) and what was
refused (429), and the rate that got through after the burst:

    through/s = (accepted - burst) / (time from the first request to the last)

With the bucket in the store (this checkout) that is the configured rate; with a bucket per
process it was N times it. Wall-clock numbers: a measurement, never a test.

    .venv/bin/python bench/fleet_rate_bench.py [--instances 3 --rate 100 --burst 10
                                                --requests 1000 --offered 300]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import subprocess
import sys
import time
import uuid
from pathlib import Path

import aiohttp
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.api.tokens import TokenSigner  # noqa: E402
from app.settings import Settings  # noqa: E402
from bench.api_bench import api_bases, drop_keyspace  # noqa: E402

USER = 777_000_002


async def main(args: argparse.Namespace) -> dict[str, object]:
    from app.cli.bootstrap import ensure_cassandra_schema

    secret = secrets.token_urlsafe(32)
    settings = Settings.from_env()
    keyspace = f"bench_rate_{uuid.uuid4().hex[:12]}"
    await asyncio.to_thread(ensure_cassandra_schema, settings.cassandra, keyspace=keyspace)
    env = {
        **os.environ,
        "PROJECTOR_CASSANDRA_KEYSPACE": keyspace,
        "PROJECTOR_API_SECRET": secret,
        "PROJECTOR_API_RATE_LIMIT_PER_S": str(args.rate),
        "PROJECTOR_API_RATE_LIMIT_BURST": str(args.burst),
        "PROJECTOR_PROJECTION_NAMESPACE": f"bench-rate-{uuid.uuid4().hex[:8]}",
        "PROJECTOR_API_FILL_FROM_STATE": "never",
        "PROJECTOR_LOG_LEVEL": "WARNING",
        "PROJECTOR_GATEWAY_ENABLED": "false",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "app", "api", "--host", "127.0.0.1", "--port", "0"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(args.instances)
    ]
    try:
        bases = await api_bases(procs)
        headers = {"Authorization": "Bearer " + TokenSigner(secret).mint(USER, int(time.time()) + 3600)}
        statuses: list[int] = []
        async with aiohttp.ClientSession() as http:

            async def one(i: int) -> None:
                async with http.get(f"{bases[i % len(bases)]}/v1/badge", headers=headers) as resp:
                    await resp.read()
                    statuses.append(resp.status)

            started = time.perf_counter()
            tasks = []
            for i in range(args.requests):  # paced at --offered requests/s
                delay = started + i / args.offered - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(one(i)))
            await asyncio.gather(*tasks)
            elapsed = time.perf_counter() - started
    finally:
        for api_proc in procs:
            api_proc.terminate()
            api_proc.wait(timeout=30)
        await asyncio.to_thread(drop_keyspace, settings, keyspace)
    accepted = statuses.count(200)
    return {
        "instances": args.instances,
        "rate_per_s": args.rate,
        "burst": args.burst,
        "requests": args.requests,
        "offered_per_s": args.offered,
        "accepted": accepted,
        "refused_429": statuses.count(429),
        "other": len(statuses) - accepted - statuses.count(429),
        "seconds": round(elapsed, 2),
        "through_per_s": round((accepted - args.burst) / elapsed, 1),
    }


def cli() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--instances", type=int, default=3)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--burst", type=int, default=10)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--offered", type=float, default=300.0, help="requests/s sent")
    report = asyncio.run(main(parser.parse_args()))
    print(orjson.dumps(report).decode())
    return 0


if __name__ == "__main__":
    sys.exit(cli())
