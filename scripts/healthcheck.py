#!/usr/bin/env python3
"""Wait until a local server answers a real request.

    healthcheck.py kafka|cassandra|redis HOST:PORT [--wait S] [--pid PID] [--quiet]

A TCP connect alone is not health: Kafka accepts connections before its controller has elected
itself, Cassandra opens 9042 a moment before its system keyspaces answer. So each check makes one
protocol-level call (Kafka metadata via aiokafka's admin client, a CQL query via cassandra-driver,
PING). Runs with the project's .venv python; exits 0 when healthy, 1 with a reason when the wait
runs out. Polling happens here, in one process, so the drivers are imported once.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import sys
import time


def tcp_open(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped by init) still answers kill(0): look at its state.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def check_kafka(host: str, port: int) -> str | None:
    from aiokafka.admin import AIOKafkaAdminClient

    async def probe() -> str | None:
        admin = AIOKafkaAdminClient(bootstrap_servers=f"{host}:{port}", request_timeout_ms=5000)
        try:
            await asyncio.wait_for(admin.start(), timeout=8)
            cluster = await asyncio.wait_for(admin.describe_cluster(), timeout=8)
            if not cluster.get("brokers"):
                return "metadata has no brokers yet"
            return None
        finally:
            await admin.close()

    return asyncio.run(probe())


def check_cassandra(host: str, port: int) -> str | None:
    from cassandra.cluster import Cluster

    cluster = Cluster([host], port=port, connect_timeout=5, protocol_version=5)
    try:
        session = cluster.connect()
        row = session.execute("SELECT release_version FROM system.local", timeout=5).one()
        return None if row is not None else "system.local is empty"
    finally:
        cluster.shutdown()


def check_redis(host: str, port: int) -> str | None:
    import redis

    client = redis.Redis(host=host, port=port, socket_timeout=3, socket_connect_timeout=3)
    try:
        return None if client.ping() else "PING did not answer PONG"
    finally:
        client.close()


CHECKS = {"kafka": check_kafka, "cassandra": check_cassandra, "redis": check_redis}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("service", choices=sorted(CHECKS))
    parser.add_argument("address", help="HOST:PORT")
    parser.add_argument("--wait", type=float, default=0.0, help="keep trying this many seconds")
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--pid", type=int, help="give up early if this process exits (it crashed)")
    args = parser.parse_args()
    host, _, port_text = args.address.rpartition(":")
    port = int(port_text)
    # The drivers log every refused connection at WARNING/ERROR while a server boots: noise here.
    logging.basicConfig(level=logging.CRITICAL)
    deadline = time.monotonic() + args.wait
    reason = "not tried"
    while True:
        if args.pid is not None and not pid_alive(args.pid):
            if not args.quiet:
                print(f"{args.service}: process {args.pid} exited while starting", file=sys.stderr)
            return 1
        if not tcp_open(host, port):
            reason = f"nothing accepts connections on {host}:{port}"
        else:
            try:
                failure = CHECKS[args.service](host, port)
            except Exception as exc:  # any driver error just means "not healthy yet"
                failure = f"{type(exc).__name__}: {exc}"
            if failure is None:
                return 0
            reason = failure
        if time.monotonic() >= deadline:
            if not args.quiet:
                print(f"{args.service} on {host}:{port} is not healthy: {reason}", file=sys.stderr)
            return 1
        time.sleep(1.0)


if __name__ == "__main__":
    sys.exit(main())
