"""`projector api`: serve the query API (app/api) on PROJECTOR_API_HOST:PROJECTOR_API_PORT.

Reads the Redis projection store (namespace PROJECTOR_PROJECTION_NAMESPACE) and Cassandra: the
member directory, and (unless PROJECTOR_API_FILL_FROM_STATE=never) UserConversationState +
MessageStore to fill rows the store lacks. Needs PROJECTOR_API_SECRET. Stops cleanly on
SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator
from typing import Any

from app.settings import Settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", help="listen address (default: PROJECTOR_API_HOST)")
    parser.add_argument(
        "--port", type=int, help="listen port, 0 = any free one (default: PROJECTOR_API_PORT)"
    )


def run(settings: Settings, args: argparse.Namespace) -> int:
    from app.api.app import ApiConfigError, check_config
    from app.logs import configure_logging

    try:  # before anything connects (Cassandra, the gateway's Kafka consumers): nothing to undo
        check_config(settings.api)
    except ApiConfigError as exc:
        print(f"projector api: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log, "api")  # PROJECTOR_LOG_FORMAT, PROJECTOR_LOG_LEVEL
    host = args.host or settings.api.api_host
    port = settings.api.api_port if args.port is None else args.port
    try:
        return asyncio.run(serve(settings, host, port))
    except Exception as exc:  # start-up failures (no secret, Cassandra down): one clear line
        print(f"projector api: {exc}", file=sys.stderr)
        return 1


@contextlib.asynccontextmanager
async def open_deps(settings: Settings) -> AsyncIterator[Any]:
    """The API's dependencies from the settings; closes what it opened."""
    from app.api.health import cassandra_check
    from app.api.http import Deps
    from app.api.members import SERVICE_KEY, build_member_service
    from app.api.sources import CassandraStateFiller, RedisProjectionReader
    from app.api.stream import STREAM_KEY
    from app.gateway.wiring import open_gateway
    from app.stores.cassandra_messages import CassandraMessageStore
    from app.stores.cassandra_session import open_cluster
    from app.stores.cassandra_state import UserConversationStateWriter
    from app.stores.redis_projection import RedisProjectionStore

    # Follows {ns}:serving. No retry budget: a request never waits out a failover, it gets a 503
    # (redis-py still follows MOVED/ASK/TRYAGAIN on a cluster).
    store = RedisProjectionStore.from_settings(settings.redis, retry_budget_s=0)
    cluster = None
    ops = None
    requests = None
    try:
        # Cassandra serves the member directory and the fill-in of rows the store lacks; it is
        # needed at start (a clear error now rather than 503s later).
        cluster, session = await asyncio.to_thread(open_cluster, settings.cassandra, require_keyspace=True)
        keyspace = settings.cassandra.cassandra_keyspace
        state = None
        if settings.api.api_fill_from_state != "never":
            state = CassandraStateFiller(
                UserConversationStateWriter(session, keyspace),
                CassandraMessageStore(session, keyspace),
                settings.processing.unread_precise_limit,
            )
        members = build_member_service(session, keyspace, settings.api.members_stats_budget_ms)
        extra: dict[str, Any] = {SERVICE_KEY: members}
        # Reconcile on login and on POST /v1/reconcile (docs/contract.md §10): requests to the
        # owning worker through topic reconcile-request.
        from app.api.reconcile import REQUESTS_KEY
        from app.kafka.reconcile import KafkaReconcileRequests

        requests = KafkaReconcileRequests(settings.kafka, settings.topics.topic_reconcile)
        extra[REQUESTS_KEY] = requests
        if settings.ops.ops_secret:  # the operator console (app/api/ops; Kafka through app/kafka/ops.py)
            from app.api.ops import OPS_KEY
            from app.kafka.ops import open_ops

            ops = extra[OPS_KEY] = open_ops(settings, session, store)
        # The live stream (issue 16): its Kafka consumer lives in app/gateway, injected here.
        async with open_gateway(settings, store.client) as gateway:
            readiness = {"cassandra": cassandra_check(session)}  # GET /readyz
            if gateway is not None:
                extra[STREAM_KEY] = gateway
                readiness["live_stream"] = gateway.ready
            yield Deps(
                projections=RedisProjectionReader(store), state=state, extra=extra, readiness=readiness
            )
    finally:
        if ops is not None:
            await ops.bus.aclose()
        if requests is not None:
            await requests.aclose()
        await store.aclose()
        if cluster is not None:
            cluster.shutdown()


async def serve(settings: Settings, host: str, port: int) -> int:
    from aiohttp import web

    from app.api import create_app
    from app.api.guard import RedactedAccessLogger, runner_args
    from app.logs import access_logger, announce
    from app.runtime.gc_tuning import GcPolicy

    async with open_deps(settings) as deps:
        app = create_app(settings, deps)
        # Start-up's objects frozen, a larger first threshold: cold pages' p99 (settings).
        GcPolicy(threshold=settings.api.api_gc_threshold, freeze=True).apply()
        # PROJECTOR_API_ACCESS_LOG: off by default, one log line per page would dominate the cost.
        # The request handler's settings are keyword arguments of AppRunner itself (it hands them
        # to every RequestHandler). Given as `handler_args=` (web.run_app's name), aiohttp failed to
        # build each handler with them and fell back to its defaults: a WARNING per connection,
        # its own access log on, its 8,190-byte line limit (issue 32).
        runner = web.AppRunner(
            app,
            access_log=access_logger(settings.api.api_access_log),
            access_log_class=RedactedAccessLogger,  # no query strings (tickets, cursors), no headers
            **runner_args(settings.api),  # aiohttp's parser limits above the API's 431
        )
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses  # (host, port, ...) per listening socket: port 0 resolved
        where = ", ".join(f"http://{addr[0]}:{addr[1]}" for addr in bound) or f"http://{host}:{port}"
        announce(settings.log, "api", f"projector api: listening on {where} (description at /openapi.json)")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            await runner.cleanup()
    return 0
