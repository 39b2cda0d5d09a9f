"""The worker process assembled: the faust App, its tables and topics, the worker core over the
real stores, the mailbox agent, and the timers that drive the core's clock.

`create_app(settings)` builds it (the core first, then the intake that feeds it) and hands each
part only its section of the settings; `app/main.py` calls it for `faust -A app.main worker`,
`projector worker` calls it with its own Settings.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from typing import Any, Protocol

import faust
from aiohttp import web

from agents.batch_intake import raw_producer
from agents.mailbox import MailboxIntake, register_agent
from agents.reconcile import ReconcileIntake, register_reconcile
from app.build import build_info
from app.kafka.batches import BatchSender
from app.kafka.health import KafkaProbe
from app.kafka.reconcile import KafkaReconcileRequests
from app.metrics import WorkerMetrics
from app.runtime.app import COMMIT_INTERVAL_S, new_faust_app
from app.runtime.gc_tuning import GcMonitor, GcPolicy
from app.runtime.health import CHECK_BUDGET_S, worker_readiness
from app.runtime.outbox import KafkaOutbox
from app.runtime.state import WorkerState
from app.runtime.web import start_metrics_server
from app.settings import Settings, TopicSettings
from app.stores.redis_epoch import bump_epoch
from app.worker.arrivals import MissingLog
from app.worker.audit import AuditConfig, audit_tick
from app.worker.core import WorkerConfig, WorkerCore, wall_clock_ms
from app.worker.ports import StateTables
from app.worker.reconcile import ReconcileConfig, ReconcileRunner
from app.worker.repair import ProjectionRepairer, RepairConfig
from app.worker.retention import RetentionReconciles
from app.worker.retry import Backoff
from tables.durable.identity import InputMismatch
from tables.durable.tables import owned_elsewhere

log = logging.getLogger("projector.worker")

# The flush scheduler wakes at the next window's end, and at least this often (persists of
# partitions that flush nothing, a memory bound reached between batches).
MAX_FLUSH_SLEEP_S = 0.5
# Standby copies read their changelogs this often.
STANDBY_TAIL_S = 0.5
# Exit code of a worker whose checkpoint names another input (tables/durable/identity.py).
INPUT_MISMATCH_EXIT = 3


def run_worker(
    settings: Settings, worker_options: dict[str, Any], *, reconcile_requests: bool = True
) -> None:
    """Build the app and run faust's worker on it until it is stopped (SIGTERM/SIGINT); faust
    exits the process then. `reconcile_requests`: the reconcile-request topic exists (preflight),
    so the worker consumes it."""
    app, _ = create_app(settings, reconcile_requests=reconcile_requests)
    # Which build runs (pure Python or the mypyc-compiled one, setup.py), as --version says;
    # logged once every start-up check passed (a failed check is one line, alone).
    logging.getLogger("app.runtime.worker").info("starting %s", build_info().line())
    worker = faust.Worker(app, loglevel=settings.log.log_level.lower(), **worker_options)
    worker.execute_from_commandline()


def input_topic(app: faust.App, name: str, partitions: int) -> Any:
    """An input topic of raw records with the worker's partition count: mailbox-tail and the
    reconcile requests share it, so faust's assignor co-partitions them."""
    return app.topic(
        name,
        key_serializer="raw",
        value_serializer="raw",
        partitions=partitions,
        internal=False,
    )


def no_backlog() -> int:
    """The reconcile runner's backlog when the worker has none."""
    return 0


def create_app(settings: Settings, *, reconcile_requests: bool = True) -> tuple[faust.App, WorkerCore]:
    topics, worker = settings.topics, settings.worker
    os.makedirs(os.path.join(worker.data_dir, topics.app_id), exist_ok=True)
    app = new_faust_app(settings.kafka, topics, worker)
    mailbox = input_topic(app, topics.topic_mailbox_tail, topics.topic_partitions)
    sender = BatchSender(lambda: raw_producer(app))
    state = WorkerState(settings.kafka, topics, worker.data_dir)
    tables = state.tables
    metrics = WorkerMetrics() if worker.worker_metrics_port > 0 else None
    if metrics is not None:
        metrics.watch_durable(tables.stats)
    core = build_core(settings, tables, KafkaOutbox(sender, topics), metrics)

    intake = MailboxIntake(app, core, topics.topic_mailbox_tail)
    register_agent(app, mailbox, intake)
    # Reconcile on request (docs/contract.md §10): co-partitioned with mailbox-tail, so the
    # requests of a user reach the worker that owns the user's partition.
    reconciles: ReconcileIntake | None = None
    reconcile_backlog: Callable[[], int] = no_backlog
    if reconcile_requests:
        runner = ReconcileRunner(
            core,
            ReconcileConfig.from_settings(settings.reconcile, settings.processing),
            lambda partition: partition in intake.assigned,
            observe=metrics.observe_reconcile if metrics is not None else None,
        )
        requests_topic = input_topic(app, topics.topic_reconcile, topics.topic_partitions)
        reconciles = ReconcileIntake(app, runner, topics.topic_reconcile)
        register_reconcile(app, requests_topic, reconciles)
        reconcile_backlog = runner.queue.qsize

        @app.task  # type: ignore[untyped-decorator]  # faust's decorator is untyped
        async def reconcile_requests_task() -> None:
            """Handles the reconcile requests, one at a time (app/worker/reconcile.py)."""
            await runner.run()

    # The flush scheduler publishes what batches queue: the intake reads the next window while
    # the previous flush is written (WorkerCore.background_publish).
    core.background_publish = worker.worker_overlap_flushes
    core.commit_outside_state_lock = worker.worker_overlap_flushes
    core.visible_before_durable = worker.worker_visible_before_durable

    gc_policy = GcPolicy.from_settings(worker)
    gc_monitor = GcMonitor()
    gc_policy.apply()

    async def gc_summary() -> None:
        gc_monitor.log_summary("since the first assignment")

    app.before_consumer_stop.append(gc_summary)

    # A retention overrun bumps the projection epoch and, with the request topic, asks a reconcile
    # of each user of the partition (app/worker/retention.py).
    retention_sender = (
        KafkaReconcileRequests(settings.kafka, topics.topic_reconcile) if reconcile_requests else None
    )
    retention = RetentionReconciles(
        core,
        lambda mark, checkpoint_next: bump_epoch(_projection_store(core), mark, checkpoint_next),
        retention_sender,
        topics.topic_mailbox_tail,
        lambda partition: partition in intake.assigned,
        reconcile_backlog,
        input_end=state.input_end,
    )
    if metrics is not None:
        metrics.watch_retention(retention.counts)
    if retention_sender is not None:

        async def close_retention_sender() -> None:
            await retention_sender.aclose()

        app.before_consumer_stop.append(close_retention_sender)
    on_rebalance = RebalanceCompletion(
        app, intake, core, tables, state.input_start, topics, gc_policy, gc_monitor, retention.overrun
    )

    @app.on_rebalance_complete.connect  # type: ignore[arg-type]  # mode's signal stubs want sync
    async def on_rebalance_complete(sender: Any, **_: Any) -> None:
        await on_rebalance()

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]  # same
    async def on_revoked(sender: Any, revoked: Any, **_: Any) -> None:
        await intake.revoke([tp.partition for tp in revoked if tp.topic == topics.topic_mailbox_tail])

    if metrics is not None:
        runners: list[web.AppRunner] = []  # held for the worker's lifetime
        # /livez and /readyz ride on the metrics server (app/runtime/web.py: why one port).
        probe = KafkaProbe(settings.kafka, topics.app_id, request_timeout_s=CHECK_BUDGET_S)
        readiness = worker_readiness(
            topics.topic_mailbox_tail,
            app,
            intake,
            core,
            probe,
            redis_client=_store_client(core),
            cassandra_session=_cassandra_session(core),
        )

        @app.task  # type: ignore[untyped-decorator]  # faust's decorator is untyped
        async def serve_metrics() -> None:
            runners.append(await start_metrics_server(worker, metrics, lambda: metrics.sync(core), readiness))

        async def close_health() -> None:
            await probe.close()

        app.before_consumer_stop.append(close_health)

    missing = MissingLog()

    @app.task  # type: ignore[untyped-decorator]  # faust's decorator is untyped
    async def flush_scheduler() -> None:
        """Flushes at each window's end (the processors' deadlines), not on a coarse tick."""
        while True:
            now = wall_clock_ms()
            deadline = core.next_deadline()
            wait_ms = MAX_FLUSH_SLEEP_S * 1000 if deadline is None else max(0, deadline - now)
            # Until the open window ends, or a batch queued flushes (a window closed before one of
            # its entries, or the memory bound), whichever comes first.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(core.publish_wanted.wait(), min(wait_ms / 1000, MAX_FLUSH_SLEEP_S))
            core.publish_wanted.clear()
            try:
                # A failing store write does not raise: the core holds the flush and retries
                # it after its backoff (app/worker/retry.py).
                await core.flush_due(wall_clock_ms())
            except Exception:  # anything else (the changelog, the frames): retried next tick
                log.exception("flush failed (retried at the next deadline)")
                await asyncio.sleep(MAX_FLUSH_SLEEP_S)
            # Reading on while flushes are held (the changelog keeps them unflushed), up to a
            # bound on what they hold in memory; then no fetching until the store writes again.
            intake.hold(core.store_failing and core.held_rows() >= worker.worker_held_rows_max)
            missing.check(core)
            if metrics is not None:
                metrics.sync(core)

    @app.task  # type: ignore[untyped-decorator]  # faust's decorator is untyped
    async def standby_copies() -> None:
        """Tails the changelog of every standby partition with the recovery's reader."""
        while True:
            await asyncio.sleep(STANDBY_TAIL_S)
            try:
                await tables.tail_standbys()
            except Exception as exc:  # the changelog away: the copies catch up later
                log.warning("standby copies: catching up failed (%s: %s)", type(exc).__name__, exc)

    async def stop_state() -> None:
        await state.stop()

    app.before_consumer_stop.append(stop_state)

    @app.timer(interval=COMMIT_INTERVAL_S)  # type: ignore[untyped-decorator]  # same
    async def commit_timer() -> None:
        await intake.check_fetched()
        await intake.commit()
        if reconciles is not None:
            await reconciles.commit()

    repair = RepairConfig.from_settings(worker)
    if repair.interval_ms > 0:
        from app.stores.redis_restore import RedisRestoreTarget

        repairer = ProjectionRepairer(core, RedisRestoreTarget(_projection_store(core)), repair)

        @app.task  # type: ignore[untyped-decorator]  # faust's decorator is untyped
        async def projection_repair() -> None:
            """Finds a projection store that lost data and writes it again (app/worker/repair.py)."""
            await repairer.run()

    audit = AuditConfig.from_settings(settings.audit)

    @app.timer(interval=audit.interval_ms / 1000)  # type: ignore[untyped-decorator]  # same
    async def unread_audit() -> None:
        if core.store_failing:  # every read would fail: the round waits for the store
            return
        await audit_tick(core, audit, wall_clock_ms())

    return app, core


class AssignedActives(Protocol):
    def assigned_actives(self) -> Iterable[Any]: ...  # faust TPs: .topic, .partition


class AssigningApp(Protocol):
    @property
    def assignor(self) -> AssignedActives: ...


class PartitionIntake(Protocol):
    async def assign(self, partitions: Sequence[int]) -> None: ...


class PlacedCore(Protocol):
    def expected_offset(self, partition: int) -> int | None: ...

    def retention_overrun(self, partition: int, log_start: int) -> None: ...


class StandbyTables(Protocol):
    def keep_standbys(self, partitions: Collection[int]) -> None: ...


class RebalanceCompletion:
    """faust's `on_rebalance_complete`: the mailbox partitions assigned to this worker are
    claimed and restored by the intake (tables/durable: caught up with their changelog, checked
    against the live input, claimed), a retention overrun is handled, the standby copies follow
    every other partition, and what the restore read moves out of the collector's reach.

    A checkpoint of another input (`InputMismatch`) ends the worker: one line, exit code 3."""

    def __init__(
        self,
        app: AssigningApp,
        intake: PartitionIntake,
        core: PlacedCore,
        tables: StandbyTables,
        input_start: Callable[[int], Awaitable[int]],
        topics: TopicSettings,
        gc_policy: GcPolicy,
        gc_monitor: GcMonitor,
        on_overrun: Callable[[int, int], Awaitable[None]] | None = None,
        exit_process: Callable[[int], None] = os._exit,
    ) -> None:
        self.app = app
        self.intake = intake
        self.core = core
        self.tables = tables
        self.input_start = input_start
        self.topic = topics.topic_mailbox_tail
        self.partitions = topics.topic_partitions
        self.standbys = topics.table_standby_replicas > 0
        self.gc_policy = gc_policy
        self.gc_monitor = gc_monitor
        self.on_overrun = on_overrun  # (partition, the checkpoint's next offset), after the core's
        self.exit_process = exit_process

    async def __call__(self) -> list[int]:
        """The partitions restored."""
        actives = self.app.assignor.assigned_actives()
        assigned = sorted(tp.partition for tp in actives if tp.topic == self.topic)
        try:
            await self.intake.assign(assigned)
        except InputMismatch as exc:
            log.critical("%s", exc)
            logging.shutdown()
            self.exit_process(INPUT_MISMATCH_EXIT)
            return []
        for partition in assigned:
            expected = self.core.expected_offset(partition)
            if expected is None:
                continue
            log_start = await self.input_start(partition)
            if log_start > expected:
                self.core.retention_overrun(partition, log_start)
                if self.on_overrun is not None:
                    await self.on_overrun(partition, expected)
        self.tables.keep_standbys(owned_elsewhere(self.partitions, assigned) if self.standbys else ())
        # What the restore read is long-lived: out of the collector's reach from now on.
        self.gc_policy.settle("assignment")
        self.gc_monitor.install()
        return assigned


def build_core(
    settings: Settings, tables: StateTables, outbox: KafkaOutbox, metrics: WorkerMetrics | None = None
) -> WorkerCore:
    from app.stores.cassandra_messages import CassandraMessageStore
    from app.stores.cassandra_session import open_cluster
    from app.stores.cassandra_state import UserConversationStateWriter
    from app.stores.redis_projection import RedisProjectionStore

    cassandra, redis, worker = settings.cassandra, settings.redis, settings.worker
    _, session = open_cluster(cassandra)
    return WorkerCore(
        WorkerConfig.from_settings(settings.processing, worker),
        after_store_write=_kill_after(worker.fault_kill_after_store_writes),
        message_store=CassandraMessageStore(session, cassandra.cassandra_keyspace),
        # No namespace: the store follows {projection_namespace}:serving (a rebuild's --swap).
        projection_store=RedisProjectionStore.from_settings(
            redis, count_writes=redis.projection_count_writes
        ),
        tables=tables,
        outbox=outbox,
        state_writer=UserConversationStateWriter(
            session, cassandra.cassandra_keyspace, batch_partitions=cassandra.cassandra_batch_partitions
        ),
        metrics=metrics,
        # A failing store write holds the flush and retries it: the worker never dies of it.
        store_backoff=Backoff(max_delay_ms=worker.worker_store_retry_max_ms),
    )


def _store_client(core: WorkerCore) -> Any:
    """The projection store's Redis client (the readiness check pings it)."""
    return _projection_store(core).client


def _projection_store(core: WorkerCore) -> Any:
    from app.stores.redis_projection import RedisProjectionStore

    store = core.projection_store
    assert isinstance(store, RedisProjectionStore)  # build_core made it
    return store


def _cassandra_session(core: WorkerCore) -> Any:
    from app.stores.cassandra_messages import CassandraMessageStore

    store = core.message_store
    assert isinstance(store, CassandraMessageStore)  # build_core made it
    return store.session


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
