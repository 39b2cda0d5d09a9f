"""A table recovery that completes after a newer rebalance began restores nothing
(agents/batch_intake.ProjectorApp.recovery_is_current).

faust's `on_recovery_completed(generation)` sends `on_rebalance_complete` before it checks that
its generation is still the consumer's, and by then the assignor may hold the newer assignment.
A CI crash run restored such partitions from a data dir that had just been lost (no recovery of
the newer generation had read it): no gate, no waiting entries, and the entries waiting at the
committed offset were never applied (two rows one message short)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from app.runtime.app import new_faust_app
from app.settings import Settings


def test_only_the_recovery_of_the_current_unrevoked_generation_is_current(tmp_path: Path) -> None:
    app = new_faust_app(Settings.from_env({"PROJECTOR_DATA_DIR": str(tmp_path)}))
    recovery = app.tables.recovery  # type: ignore[attr-defined]  # TableManager's
    seen: list[tuple[int, bool]] = []

    async def completed(generation_id: int = 0) -> None:  # faust's, sending the signal
        seen.append((generation_id, app.recovery_is_current))

    recovery.on_recovery_completed = completed
    app.track_recoveries()

    async def run() -> None:
        app.consumer_generation_id = 1
        await recovery.on_recovery_completed(1)  # the first assignment's
        app.on_rebalance_start()  # generation 1 revoked: a rebalance began
        await recovery.on_recovery_completed(1)  # generation 1's recovery finishing late
        app.consumer_generation_id = 2  # generation 2 assigned
        await recovery.on_recovery_completed(1)  # still generation 1's
        await recovery.on_recovery_completed(2)
        app.on_rebalance_start()
        app.consumer_generation_id = 3
        await recovery.on_recovery_completed(2)

    asyncio.run(run())
    assert seen == [(1, True), (1, False), (1, False), (2, True), (2, False)]
    assert app.recovering_generation is None  # only while one completes


def test_records_faust_clears_from_its_changelog_queue_are_noted_by_their_table(tmp_path: Path) -> None:
    """`flow_control.resume()` empties faust's changelog queue: each table hears which of its
    records went unapplied (tables/state.WorkerTable keeps its persisted offset below them)."""
    from types import SimpleNamespace

    from tables.state import LocalStoreGuard, declare_tables

    app = new_faust_app(Settings.from_env({"PROJECTOR_DATA_DIR": str(tmp_path)}))
    (tmp_path / app.conf.id).mkdir(parents=True, exist_ok=True)
    guard = LocalStoreGuard()
    tables = declare_tables(app, 2, guard)
    app.track_recoveries()
    queue = app.tables.changelog_queue  # type: ignore[attr-defined]  # TableManager's
    topic = tables["pending"].changelog_topic.get_topic_name()
    for offset in (7, 5, 9):
        queue._queue.append(SimpleNamespace(message=SimpleNamespace(topic=topic, partition=1, offset=offset)))
    queue._queue.append(object())  # anything else faust may queue is left alone

    app.flow_control.resume()

    assert queue.empty()
    assert guard.holes == {("pending", 1): 5}
