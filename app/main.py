"""The faust application: `faust -A app.main worker` or `projector worker`.

Everything is built from one `Settings` (the environment) at import: the app, its topics and
tables, the stores behind the worker core, the mailbox agent and the flush timer.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable, Sequence
from typing import Any

import faust
from aiohttp import web

from app.metrics import WorkerMetrics, metrics_handler
from app.settings import Settings
from app.worker.audit import AuditConfig, audit_tick
from app.worker.batch_intake import COMMIT_INTERVAL_S, new_faust_app
from app.worker.core import WorkerConfig, WorkerCore, wall_clock_ms
from app.worker.kafka_batches import BatchSender
from tables.state import FaustStateTables, declare_tables

log = logging.getLogger("projector.worker")


class KafkaOutbox:
    """Frames and dead letters to their topics (raw bytes, keyed by user id), in batches."""

    def __init__(self, sender: BatchSender, settings: Settings) -> None:
        self.sender = sender
        self.settings = settings

    async def dead_letters(self, letters: Sequence[tuple[bytes | None, bytes]]) -> None:
        keyed = [(key or b"", value) for key, value in letters]
        await self.sender.send_keyed(self.settings.topic_dead_letter, keyed)

    async def frames(
        self, session_deltas: Sequence[tuple[bytes, bytes]], badges: Sequence[tuple[bytes, bytes]]
    ) -> None:
        # Same key, same partition: each user's frames stay in version order on each topic.
        await self.sender.send_keyed(self.settings.topic_session_delta, session_deltas)
        await self.sender.send_keyed(self.settings.topic_badge, badges)


def create_app(settings: Settings) -> tuple[faust.App, dict[str, WorkerCore]]:
    os.makedirs(os.path.join(settings.data_dir, settings.app_id), exist_ok=True)
    app = new_faust_app(settings)
    mailbox = app.topic(
        settings.topic_mailbox_tail,
        key_serializer="raw",
        value_serializer="raw",
        partitions=settings.topic_partitions,
        internal=False,
    )

    sender = BatchSender(lambda: app.producer._ensure_producer())  # type: ignore[attr-defined]  # aiokafka driver
    outbox = KafkaOutbox(sender, settings)
    tables = FaustStateTables(declare_tables(app, settings.topic_partitions), sender)
    core_ref: dict[str, WorkerCore] = {}

    from agents.mailbox import MailboxIntake, register_agent

    intake = MailboxIntake(app, core_ref, settings.topic_mailbox_tail)
    register_agent(app, mailbox, intake)

    @app.on_rebalance_complete.connect  # type: ignore[arg-type]  # mode's signal stubs want sync
    async def on_rebalance_complete(sender: Any, **_: Any) -> None:
        assigned = [
            tp.partition for tp in app.assignor.assigned_actives() if tp.topic == settings.topic_mailbox_tail
        ]
        await intake.assign(assigned)

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]  # same
    async def on_revoked(sender: Any, revoked: Any, **_: Any) -> None:
        await intake.revoke([tp.partition for tp in revoked if tp.topic == settings.topic_mailbox_tail])

    metrics = WorkerMetrics() if settings.worker_metrics_port > 0 else None
    if metrics is not None:
        runners: list[web.AppRunner] = []  # held for the worker's lifetime

        @app.task  # type: ignore[untyped-decorator]  # faust's decorator is untyped
        async def serve_metrics() -> None:
            runners.append(await start_metrics_server(settings, metrics, core_ref))

    tick_s = max(0.05, min(settings.projection_compaction_window_ms / 10_000, 0.5))

    @app.timer(interval=tick_s)  # type: ignore[untyped-decorator]  # faust's decorator is untyped
    async def flush_timer() -> None:
        core = core_ref.get("core")
        if core is not None:
            await core.flush_due(wall_clock_ms())
            if metrics is not None:
                metrics.sync(core)

    @app.timer(interval=COMMIT_INTERVAL_S)  # type: ignore[untyped-decorator]  # same
    async def commit_timer() -> None:
        if "core" in core_ref:
            await intake.check_fetched()
            await intake.commit()

    audit = AuditConfig.from_settings(settings)

    @app.timer(interval=audit.interval_ms / 1000)  # type: ignore[untyped-decorator]  # same
    async def unread_audit() -> None:
        core = core_ref.get("core")
        if core is not None:
            await audit_tick(core, audit, wall_clock_ms())

    core_ref["core"] = build_core(settings, tables, outbox, metrics)
    return app, core_ref


async def start_metrics_server(
    settings: Settings, metrics: WorkerMetrics, core_ref: dict[str, WorkerCore]
) -> web.AppRunner:
    """GET /metrics on worker_web_host:worker_metrics_port (its own aiohttp server, not faust's)."""

    def sync() -> None:
        core = core_ref.get("core")
        if core is not None:
            metrics.sync(core)

    web_app = web.Application()
    web_app.router.add_get("/metrics", metrics_handler(metrics.registry, sync), allow_head=False)
    runner = web.AppRunner(web_app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, settings.worker_web_host, settings.worker_metrics_port).start()
    log.info("metrics on http://%s:%d/metrics", settings.worker_web_host, settings.worker_metrics_port)
    return runner


def build_core(
    settings: Settings, tables: FaustStateTables, outbox: KafkaOutbox, metrics: WorkerMetrics | None = None
) -> WorkerCore:
    from app.stores.cassandra_messages import CassandraMessageStore
    from app.stores.cassandra_session import open_cluster
    from app.stores.cassandra_state import UserConversationStateWriter
    from app.stores.redis_projection import RedisProjectionStore

    _, session = open_cluster(settings)
    config = WorkerConfig(
        lanes=settings.lanes,
        window_ms=settings.projection_compaction_window_ms,
        max_dirty_rows=settings.max_dirty_rows,
        include_muted=settings.include_muted,
        unread_precise_limit=settings.unread_precise_limit,
    )
    return WorkerCore(
        config,
        after_store_write=_kill_after(settings.fault_kill_after_store_writes),
        message_store=CassandraMessageStore(session, settings.cassandra_keyspace),
        # No namespace: the store follows {projection_namespace}:serving (a rebuild's --swap).
        projection_store=RedisProjectionStore.from_settings(
            settings, count_writes=settings.projection_count_writes
        ),
        tables=tables,
        outbox=outbox,
        state_writer=UserConversationStateWriter(session, settings.cassandra_keyspace),
        metrics=metrics,
    )


def _kill_after(writes: int) -> Callable[[], None] | None:
    """Fault injection: SIGKILL this process after the Nth store write (before the frames)."""
    if writes <= 0:
        return None
    count = 0

    def maybe_kill() -> None:
        nonlocal count
        count += 1
        if count >= writes:
            log.warning("fault injection: SIGKILL after store write %d, before its frames", count)
            os.kill(os.getpid(), signal.SIGKILL)

    return maybe_kill


settings = Settings.from_env()
app, core_ref = create_app(settings)
