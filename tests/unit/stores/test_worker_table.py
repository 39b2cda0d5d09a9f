"""The worker's faust tables never write a partition's local store back in time (tables/state.py
`WorkerTable`): while the worker writes a partition, faust's changelog applier may be handed
records older than the worker's own latest commit there (fetched and buffered, applied at its
next flush of buffers); applied, they would put old rows back under newer ones."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from faust.types import TP

from app.kafka.batches import BatchSender
from app.metrics import WorkerMetrics, sample
from app.runtime.app import new_faust_app
from app.settings import Settings
from app.stores.memory_messages import InMemoryMessageStore
from app.stores.memory_projection import InMemoryProjectionStore
from app.stores.memory_tables import MemoryTables
from tables.state import FaustStateTables, LocalStoreGuard, declare_tables
from tests.support.clock import ManualClock
from tests.support.metrics import scrape
from tests.support.worker import RecordingOutbox, make_core


def changelog_event(topic: str, partition: int, offset: int, key: bytes, value: bytes | None) -> Any:
    """What faust's recovery hands `apply_changelog_batch`: an event and its message."""
    message = SimpleNamespace(
        tp=TP(topic, partition), topic=topic, partition=partition, offset=offset, key=key, value=value
    )
    return SimpleNamespace(message=message)


def worker_tables(tmp_path: Path) -> tuple[dict[str, Any], LocalStoreGuard]:
    settings = Settings.from_env({"PROJECTOR_DATA_DIR": str(tmp_path), "PROJECTOR_TOPIC_PARTITIONS": "2"})
    (tmp_path / settings.app_id).mkdir(parents=True, exist_ok=True)
    written = LocalStoreGuard()
    return declare_tables(new_faust_app(settings), settings.topic_partitions, written), written


def test_records_older_than_the_workers_own_commit_are_not_applied_and_others_are(tmp_path: Path) -> None:
    tables, written = worker_tables(tmp_path)
    rows = tables["rows"]
    topic = rows.changelog_topic.get_topic_name()
    store = rows.data
    # The worker's own commit (tables/state.FaustStateTables.commit): the newer value, and
    # faust's offset key at the commit's first changelog offset.
    store._db_for_partition(0).put(b"row", b"v2")
    store._db_for_partition(0).put(store.offset_key, b"40")
    written.since[("rows", 0)] = 40

    rows.apply_changelog_batch(
        [
            changelog_event(topic, 0, 30, b"row", b"v1"),  # its own older record, late
            changelog_event(topic, 0, 31, b"other", None),
            changelog_event(topic, 0, 40, b"row", b"v2"),  # the commit itself: harmless again
            changelog_event(topic, 1, 7, b"row", b"standby"),  # a partition it does not write
        ]
    )

    assert store._db_for_partition(0).get(b"row") == b"v2"
    assert store.persisted_offset(TP(topic, 0)) == 40  # never back to 31
    assert store._db_for_partition(1).get(b"row") == b"standby"
    assert store.persisted_offset(TP(topic, 1)) == 7
    assert written.dropped == 2


def applied_at_offset_12(table: Any, partition: int) -> bytes | None:
    """A changelog record at offset 12 of the table's partition offered to faust's applier:
    what the local store holds under its key afterwards."""
    topic = table.changelog_topic.get_topic_name()
    table.apply_changelog_batch([changelog_event(topic, partition, 12, b"key", b"from-the-changelog")])
    value: bytes | None = table.data._db_for_partition(partition).get(b"key")
    return value


def test_a_table_the_worker_never_committed_to_is_recovered_whole(tmp_path: Path) -> None:
    """Only the table's own commits count: the rows' offsets say nothing about the users'."""
    tables, written = worker_tables(tmp_path)
    written.since[("rows", 1)] = 500

    assert applied_at_offset_12(tables["users"], 1) == b"from-the-changelog"
    assert written.dropped == 0


def test_once_handed_over_a_partition_is_recovered_by_faust_again(tmp_path: Path) -> None:
    tables, written = worker_tables(tmp_path)
    written.since[("gates", 1)] = 90
    written.since[("rows", 1)] = 700
    written.since[("rows", 0)] = 300
    FaustStateTables(tables, BatchSender(lambda: None)).hand_over(1)

    assert applied_at_offset_12(tables["gates"], 1) == b"from-the-changelog"
    assert written.since == {("rows", 0): 300}


def test_the_four_tables_share_what_the_worker_writes(tmp_path: Path) -> None:
    tables, written = worker_tables(tmp_path)
    assert {id(table.local_guard) for table in tables.values()} == {id(written)}


def test_a_record_faust_dropped_unapplied_keeps_the_persisted_offset_below_it_until_a_recovery(
    tmp_path: Path,
) -> None:
    """faust emptied its changelog queue (a `flow_control.resume()` at the end of a recovery)
    while it held a standby's records: fetched, never applied, and the records after them were.
    The persisted offset stays below the hole, whatever is applied after, until the partition
    was recovered as active (reading from there)."""
    tables, guard = worker_tables(tmp_path)
    rows = tables["rows"]
    topic = rows.changelog_topic.get_topic_name()
    store = rows.data
    tp = TP(topic, 1)
    rows.apply_changelog_batch(
        [changelog_event(topic, 1, offset, b"k%d" % offset, b"v") for offset in range(10)]
    )
    assert store.persisted_offset(tp) == 9

    rows.changelog_records_dropped(1, 10)  # the queue held 10..12 when faust cleared it
    rows.changelog_records_dropped(1, 11)
    assert store.persisted_offset(tp) == 9
    rows.apply_changelog_batch(
        [changelog_event(topic, 1, offset, b"k%d" % offset, b"v") for offset in (13, 14)]
    )
    assert store.persisted_offset(tp) == 9  # a recovery from here reads 10..12 again
    assert guard.holes == {("rows", 1): 10}

    FaustStateTables(tables, BatchSender(lambda: None)).recovered([1])
    rows.apply_changelog_batch([changelog_event(topic, 1, 15, b"k15", b"v")])
    assert store.persisted_offset(tp) == 15
    assert guard.holes == {}


def test_a_drop_below_what_was_applied_moves_the_persisted_offset_back(tmp_path: Path) -> None:
    tables, guard = worker_tables(tmp_path)
    users = tables["users"]
    topic = users.changelog_topic.get_topic_name()
    users.apply_changelog_batch([changelog_event(topic, 0, offset, b"u", b"v") for offset in range(30)])
    users.changelog_records_dropped(0, 4)  # the revocation's clear dropped an older fetch
    assert users.data.persisted_offset(TP(topic, 0)) == 3
    assert guard.holes_seen == 1


def test_a_drop_in_a_partition_nothing_was_applied_to_yet_leaves_it_read_from_the_start(
    tmp_path: Path,
) -> None:
    """A standby reads from the start into faust's buffer (applied only at 1,000 records or a
    rebalance): a record cleared from the queue after them must not make the next recovery
    begin at the hole, past every record still unapplied below it."""
    tables, guard = worker_tables(tmp_path)
    rows = tables["rows"]
    topic = rows.changelog_topic.get_topic_name()
    rows.changelog_records_dropped(3, 94)
    assert rows.data.persisted_offset(TP(topic, 3)) is None
    # faust's buffer is first in, first out: once a record after the hole is applied, every
    # record it took before the hole was applied with or before it.
    rows.apply_changelog_batch([changelog_event(topic, 3, offset, b"k", b"v") for offset in (0, 93, 95)])
    assert rows.data.persisted_offset(TP(topic, 3)) == 93  # below the hole, whatever comes
    assert guard.holes == {("rows", 3): 94}


def test_records_and_the_offset_below_a_hole_reach_the_disk_in_one_write(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """A SIGKILL may land between any two writes. faust's apply writes the records, then puts
    the persisted offset at the highest one; lowered below a hole only after that, a kill in
    between left the offset past the hole on disk and the next start never read it again. Here
    no write happens but one per partition, holding the records and the offset already below
    the hole (faust's separate offset put is never called)."""
    tables, guard = worker_tables(tmp_path)
    rows = tables["rows"]
    topic = rows.changelog_topic.get_topic_name()
    store = rows.data
    db = store._db_for_partition(1)
    rows.apply_changelog_batch(
        [changelog_event(topic, 1, offset, b"k%d" % offset, b"v") for offset in range(5)]
    )
    rows.changelog_records_dropped(1, 5)  # 5..6 cleared from faust's queue, never applied
    writes: list[Any] = []
    real_write = type(db).write
    monkeypatch.setattr(store, "set_persisted_offset", lambda *_: writes.append("separate offset put"))

    def counted_write(self: Any, batch: Any) -> None:
        writes.append(batch.len())
        real_write(self, batch)

    monkeypatch.setattr(type(db), "write", counted_write)

    rows.apply_changelog_batch(
        [changelog_event(topic, 1, offset, b"k%d" % offset, b"v") for offset in (7, 8)]
    )

    assert writes == [3]  # two records and the offset key, in one write batch
    assert store.persisted_offset(TP(topic, 1)) == 4  # the next recovery reads 5.. again
    assert db.get(b"k8") == b"v"
    assert guard.holes == {("rows", 1): 5}


def test_what_the_guard_refuses_and_notes_is_counted_in_the_workers_metrics(tmp_path: Path) -> None:
    """Both are handled (nothing lost); the counters show an operator how often."""
    tables, guard = worker_tables(tmp_path)
    rows, users = tables["rows"], tables["users"]
    metrics = WorkerMetrics()
    metrics.watch_local_stores(FaustStateTables(tables, BatchSender(lambda: None)).guard)
    core = make_core(
        2, MemoryTables(), InMemoryMessageStore(), InMemoryProjectionStore(), RecordingOutbox(), ManualClock()
    )

    def counted() -> tuple[float | None, float | None]:
        text = scrape(metrics, core)
        return (
            sample(text, "projector_changelog_records_refused_total"),
            sample(text, "projector_changelog_queue_clears_total"),
        )

    assert counted() == (0, 0)
    guard.since[("rows", 0)] = 40
    topic = rows.changelog_topic.get_topic_name()
    rows.apply_changelog_batch([changelog_event(topic, 0, offset, b"row", b"old") for offset in (30, 31, 41)])
    users.changelog_records_dropped(0, 4)
    assert counted() == (2, 1)
    users.changelog_records_dropped(1, 9)
    assert counted() == (2, 2)
