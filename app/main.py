"""The faust application: `faust -A app.main worker` or `projector worker`.

Everything is built from one `Settings` (the environment) at import: the app, its topics and
tables, the stores behind the worker core, the mailbox agent and the flush timer.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import faust

from app.settings import Settings
from app.worker.core import WorkerConfig, WorkerCore, wall_clock_ms
from tables.state import FaustStateTables, declare_tables

log = logging.getLogger("projector.worker")


class KafkaOutbox:
    """Frames and dead letters to their topics (raw bytes, keyed by user id)."""

    def __init__(self, dead_letter: Any, session_delta: Any, badge: Any) -> None:
        self.dead_letter = dead_letter
        self.session_delta = session_delta
        self.badge = badge

    async def dead_letters(self, letters: Sequence[tuple[bytes | None, bytes]]) -> None:
        for key, value in letters:
            await self.dead_letter.send(key=key, value=value)

    async def frames(
        self, session_deltas: Sequence[tuple[bytes, bytes]], badges: Sequence[tuple[bytes, bytes]]
    ) -> None:
        # Per user: SESSION_DELTA first, then BADGE_UPDATE (same key → same partition, in order).
        for (key, delta), (_, badge) in zip(session_deltas, badges, strict=True):
            await self.session_delta.send(key=key, value=delta)
            await self.badge.send(key=key, value=badge)


def create_app(settings: Settings) -> tuple[faust.App, dict[str, WorkerCore]]:
    app = faust.App(
        settings.app_id,
        broker=f"kafka://{settings.kafka_bootstrap}",
        store="rocksdb://",
        datadir=settings.data_dir,
        topic_partitions=settings.topic_partitions,
        topic_replication_factor=settings.topic_replication_factor,
        topic_disable_leader=True,
        key_serializer="raw",
        value_serializer="raw",
        web_enabled=settings.worker_web_port > 0,  # 0: no web server (several workers per host)
        web_host=settings.worker_web_host,
        web_port=max(settings.worker_web_port, 1),
        consumer_auto_offset_reset="earliest",
        broker_commit_interval=1.0,
    )
    mailbox = app.topic(
        settings.topic_mailbox_tail,
        key_serializer="raw",
        value_serializer="raw",
        partitions=settings.topic_partitions,
        internal=False,
    )

    def output(name: str) -> Any:
        return app.topic(name, key_serializer="raw", value_serializer="raw", internal=False)

    outbox = KafkaOutbox(
        output(settings.topic_dead_letter),
        output(settings.topic_session_delta),
        output(settings.topic_badge),
    )
    tables = FaustStateTables(declare_tables(app, settings.topic_partitions))
    core_ref: dict[str, WorkerCore] = {}

    from agents.mailbox import register_agent

    register_agent(app, mailbox, core_ref, tables)

    @app.on_rebalance_complete.connect  # type: ignore[arg-type]  # mode's signal stubs want sync
    async def on_rebalance_complete(sender: Any, **_: Any) -> None:
        assigned = [
            tp.partition for tp in app.assignor.assigned_actives() if tp.topic == settings.topic_mailbox_tail
        ]
        core_ref["core"].restore_assigned(sorted(assigned))

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]  # same
    async def on_revoked(sender: Any, revoked: Any, **_: Any) -> None:
        core_ref["core"].revoke([tp.partition for tp in revoked if tp.topic == settings.topic_mailbox_tail])

    tick_s = max(0.05, min(settings.projection_compaction_window_ms / 10_000, 0.5))

    @app.timer(interval=tick_s)  # type: ignore[untyped-decorator]  # faust's decorator is untyped
    async def flush_timer() -> None:
        core = core_ref.get("core")
        if core is not None:
            await core.flush_due(wall_clock_ms())

    core_ref["core"] = build_core(settings, tables, outbox)
    return app, core_ref


def build_core(settings: Settings, tables: FaustStateTables, outbox: KafkaOutbox) -> WorkerCore:
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
        message_store=CassandraMessageStore(session, settings.cassandra_keyspace),
        projection_store=RedisProjectionStore.from_settings(
            settings, settings.projection_namespace, count_writes=settings.projection_count_writes
        ),
        tables=tables,
        outbox=outbox,
        state_writer=UserConversationStateWriter(session, settings.cassandra_keyspace),
    )


settings = Settings.from_env()
app, core_ref = create_app(settings)
