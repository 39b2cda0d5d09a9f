"""The worker's `StateTables` port (app/worker/ports.py): one suite, every implementation.

- ``memory``: app/stores/memory_tables.MemoryTables (the rebuild's tables, the unit tests');
- ``faust``: tables/state.FaustStateTables over the worker's real faust tables (the App built as
  the worker builds it, app/runtime/app.py, with the RocksDB store in a temporary directory and
  its changelog topics on the real Kafka; started so the table manager assigns and opens every
  partition). Integration: `make test-fast` leaves it out.

What the worker relies on: every write names its partition and a snapshot of a partition holds
exactly what was written there (partitions isolated); a key written again holds the last value;
a deleted pending entry is gone; `republish` and `commit` change no state. With a changelog
(faust): `commit` hands the writes since the last commit to the changelog topics, `republish`
queues everything the partition holds for it, and a store lost with its machine comes back from
the changelog as it was.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from app.settings import Settings
from app.stores.memory_tables import MemoryTables
from app.worker.ports import PartitionSnapshot, StateTables

pytestmark = pytest.mark.timeout(300)

PARTITIONS = 2
TABLE_NAMES = ("rows", "users", "gates", "pending")
CONV_A = "0a0a0a0a-0000-4000-8000-00000000000a"
CONV_B = "0b0b0b0b-0000-4000-8000-00000000000b"
BIG_USER = 2**64 - 1
# Starting a worker's App (group join, assignment, table recovery) takes seconds; on a loaded
# CI machine much longer. Generous: waiting on events, never on time.
START_TIMEOUT_S = 180.0


def normalized(snapshot: PartitionSnapshot) -> PartitionSnapshot:
    """Snapshots list records in no promised order."""
    return PartitionSnapshot(
        sorted(snapshot.rows), sorted(snapshot.users), snapshot.gate, sorted(snapshot.pending)
    )


EMPTY = PartitionSnapshot([], [], None, [])


class FaustTables:
    """The worker's faust App with only its tables, started in this event loop."""

    def __init__(self, settings: Settings) -> None:
        # Imported here: the memory runs must not need faust's import cost (or faust at all).
        from app.kafka.batches import BatchSender
        from app.runtime.app import new_faust_app
        from tables.state import FaustStateTables, declare_tables

        os.makedirs(os.path.join(settings.data_dir, settings.app_id), exist_ok=True)
        self.settings = settings
        self.app = new_faust_app(settings)
        self.faust_tables = declare_tables(self.app, settings.topic_partitions)
        # As the worker wires it (app/runtime/worker.create_app): the aiokafka producer, late-bound.
        self.sender = BatchSender(lambda: self.app.producer._ensure_producer())  # type: ignore[attr-defined]
        self.tables = FaustStateTables(self.faust_tables, self.sender)

    def changelog_topics(self) -> dict[str, str]:
        return {name: table.changelog_topic.get_topic_name() for name, table in self.faust_tables.items()}

    async def start(self) -> None:
        """Start the App and wait until it holds every partition of every table, recovered
        from the changelog. The first assignment may cover less (a changelog topic faust has just
        created missing from the metadata, a member of a previous run still leaving the group):
        the consumer rebalances again until this member has them all."""
        from faust.types import TP

        wanted = {
            TP(topic, partition)
            for topic in self.changelog_topics().values()
            for partition in range(self.settings.topic_partitions)
        }
        rebalanced = asyncio.Event()

        @self.app.on_rebalance_complete.connect  # type: ignore[arg-type]  # mode's stubs want sync
        async def on_rebalance_complete(sender: Any, **_: Any) -> None:
            rebalanced.set()  # sent once the assigned partitions are recovered

        async def all_assigned() -> None:
            while True:
                await rebalanced.wait()
                rebalanced.clear()
                if wanted <= self.app.assignor.assigned_actives():
                    return

        try:
            await self.app.start()
            await asyncio.wait_for(all_assigned(), START_TIMEOUT_S)
            recovery = self.app.tables.recovery  # type: ignore[attr-defined]  # TableManager's
            await asyncio.wait_for(recovery.completed.wait(), START_TIMEOUT_S)
        except BaseException:
            await self.stop()  # a started consumer thread would outlive the test's event loop
            raise

    def new_tables(self) -> StateTables:
        """Another adapter over the same faust tables (a new process would build one)."""
        from tables.state import FaustStateTables

        return FaustStateTables(self.faust_tables, self.sender)

    async def delivered(self) -> None:
        """Wait until what the producer was handed is on the broker (the worker's offset commit
        does this before it commits)."""
        await self.app.producer.flush()

    async def stop(self) -> None:
        await self.app.stop()


async def read_changelog(settings: Settings, topic: str, partition: int) -> dict[bytes, bytes]:
    """The changelog partition compacted by hand: the latest value per key, tombstones removed
    (what a recovery from it restores)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        latest: dict[bytes, bytes | None] = {}
        while await consumer.position(tp) < end:
            fetched = await consumer.getmany(tp, timeout_ms=1000)
            for record in fetched.get(tp, []):
                latest[record.key] = record.value
    finally:
        await consumer.stop()
    return {key: value for key, value in latest.items() if value is not None}


async def changelog_view(faust_tables: FaustTables, partition: int) -> PartitionSnapshot:
    """What the changelog topics would restore for one partition, as a snapshot."""
    topics = faust_tables.changelog_topics()
    held = {
        name: await read_changelog(faust_tables.settings, topics[name], partition) for name in TABLE_NAMES
    }
    return normalized(
        PartitionSnapshot(
            list(held["rows"].values()),
            list(held["users"].values()),
            held["gates"].get(str(partition).encode()),
            list(held["pending"].values()),
        )
    )


@pytest.fixture
def faust_settings(servers: Settings, unique_name: Any, tmp_path: Path) -> Settings:
    return dataclasses.replace(
        servers,
        app_id=unique_name("tables"),
        data_dir=str(tmp_path / "worker"),
        topic_partitions=PARTITIONS,
        worker_web_port=0,
    )


@pytest.fixture
async def started_faust(faust_settings: Settings, topics_to_delete: list[str]) -> AsyncIterator[FaustTables]:
    made = FaustTables(faust_settings)
    topics_to_delete.extend(made.changelog_topics().values())  # faust declares them on start
    await made.start()
    yield made
    await made.stop()


@pytest.fixture(
    params=[
        pytest.param("memory", id="memory"),
        pytest.param("faust", id="faust", marks=pytest.mark.integration),
    ]
)
def tables(request: pytest.FixtureRequest) -> StateTables:
    if request.param == "faust":
        # Requested lazily so the memory runs never touch (or need) the servers.
        started: FaustTables = request.getfixturevalue("started_faust")
        faust_tables: StateTables = started.tables
        return faust_tables
    return MemoryTables()


# -- every implementation ------------------------------------------------------------------------


async def test_a_partition_never_written_is_empty(tables: StateTables) -> None:
    for partition in range(PARTITIONS):
        assert normalized(tables.snapshot(partition)) == EMPTY
    await tables.commit()
    assert normalized(tables.snapshot(0)) == EMPTY


async def test_each_partition_holds_exactly_what_was_written_to_it(tables: StateTables) -> None:
    tables.put_row(0, 7, CONV_A, b"row 0/7/a")
    tables.put_row(0, 7, CONV_B, b"row 0/7/b")
    tables.put_row(0, 8, CONV_A, b"row 0/8/a")
    tables.put_user(0, 7, b"user 0/7")
    tables.put_gate(0, b"gate 0")
    tables.put_pending(0, 7, 11, b"pending 0/7/11")
    tables.put_pending(0, 7, 12, b"pending 0/7/12")
    tables.put_row(1, 9, CONV_A, b"row 1/9/a")
    tables.put_user(1, BIG_USER, b"user 1/max")
    tables.put_pending(1, BIG_USER, 2**64 - 1, b"pending 1/max/max")
    expected = {
        0: PartitionSnapshot(
            [b"row 0/7/a", b"row 0/7/b", b"row 0/8/a"],
            [b"user 0/7"],
            b"gate 0",
            [b"pending 0/7/11", b"pending 0/7/12"],
        ),
        1: PartitionSnapshot([b"row 1/9/a"], [b"user 1/max"], None, [b"pending 1/max/max"]),
    }
    for partition, snapshot in expected.items():
        assert normalized(tables.snapshot(partition)) == snapshot
    await tables.commit()
    for partition, snapshot in expected.items():
        assert normalized(tables.snapshot(partition)) == snapshot


async def test_the_same_key_again_holds_the_last_value(tables: StateTables) -> None:
    for value in (b"row v1", b"row v2", b"row v3"):
        tables.put_row(0, 7, CONV_A, value)
    tables.put_user(0, 7, b"user v1")
    tables.put_user(0, 7, b"user v2")
    tables.put_gate(0, b"gate v1")
    tables.put_gate(0, b"gate v2")
    tables.put_pending(0, 7, 11, b"pending v1")
    await tables.commit()  # across commits too
    tables.put_pending(0, 7, 11, b"pending v2")
    tables.put_gate(1, b"gate 1")  # another partition's gate is another key
    assert normalized(tables.snapshot(0)) == PartitionSnapshot(
        [b"row v3"], [b"user v2"], b"gate v2", [b"pending v2"]
    )
    assert tables.snapshot(1).gate == b"gate 1"


async def test_a_deleted_pending_entry_is_gone_and_only_it(tables: StateTables) -> None:
    tables.put_pending(0, 7, 11, b"pending 0/7/11")
    tables.put_pending(0, 7, 12, b"pending 0/7/12")
    tables.put_pending(0, 8, 11, b"pending 0/8/11")
    tables.put_pending(1, 7, 11, b"pending 1/7/11")
    await tables.commit()
    tables.delete_pending(0, 7, 11)
    tables.delete_pending(0, 7, 99)  # never written: nothing happens
    assert sorted(tables.snapshot(0).pending) == [b"pending 0/7/12", b"pending 0/8/11"]
    assert tables.snapshot(1).pending == [b"pending 1/7/11"]
    tables.put_pending(0, 7, 11, b"pending 0/7/11 again")  # a key deleted can be written again
    tables.delete_pending(0, 8, 11)
    await tables.commit()
    assert sorted(tables.snapshot(0).pending) == [b"pending 0/7/11 again", b"pending 0/7/12"]


async def test_republish_and_commit_change_no_state(tables: StateTables) -> None:
    tables.put_row(0, 7, CONV_A, b"row")
    tables.put_user(0, 7, b"user")
    tables.put_gate(0, b"gate")
    tables.put_pending(0, 7, 11, b"pending")
    tables.put_row(1, 8, CONV_B, b"row 1")
    before = {p: normalized(tables.snapshot(p)) for p in range(PARTITIONS)}
    tables.republish(0)
    tables.republish(1)
    await tables.commit()
    tables.republish(0)
    assert {p: normalized(tables.snapshot(p)) for p in range(PARTITIONS)} == before
    tables.put_row(0, 7, CONV_A, b"row after")  # writes go on as before
    await tables.commit()
    assert tables.snapshot(0).rows == [b"row after"]


# -- with a changelog (faust) --------------------------------------------------------------------


@pytest.mark.integration
async def test_commit_hands_the_writes_since_the_last_commit_to_the_changelog(
    started_faust: FaustTables,
) -> None:
    tables = started_faust.tables
    tables.put_row(0, 7, CONV_A, b"row 0/7/a")
    tables.put_user(0, 7, b"user 0/7")
    tables.put_gate(0, b"gate 0")
    tables.put_pending(0, 7, 11, b"pending 0/7/11")
    tables.put_pending(0, 7, 12, b"pending 0/7/12")
    tables.put_row(1, 9, CONV_B, b"row 1/9/b")
    await started_faust.delivered()
    for partition in range(PARTITIONS):  # written to the stores, not handed over yet
        assert await changelog_view(started_faust, partition) == EMPTY
    await tables.commit()
    await started_faust.delivered()
    for partition in range(PARTITIONS):
        assert await changelog_view(started_faust, partition) == normalized(tables.snapshot(partition))
    # A delete goes as a tombstone; a value written again replaces the older one.
    tables.delete_pending(0, 7, 11)
    tables.put_row(0, 7, CONV_A, b"row 0/7/a v2")
    await tables.commit()
    await started_faust.delivered()
    assert await changelog_view(started_faust, 0) == normalized(tables.snapshot(0))
    assert tables.snapshot(0).pending == [b"pending 0/7/12"]


@pytest.mark.integration
async def test_republish_hands_the_partition_s_whole_state_to_the_changelog(
    started_faust: FaustTables,
) -> None:
    """A process wrote its stores and died before its commit (the records never left it): the
    next one republishes what the store holds, so the changelog catches up; only that partition."""
    died = started_faust.new_tables()
    died.put_row(0, 7, CONV_A, b"row 0/7/a")
    died.put_user(0, 7, b"user 0/7")
    died.put_gate(0, b"gate 0")
    died.put_pending(0, 7, 11, b"pending 0/7/11")
    died.put_row(1, 9, CONV_B, b"row 1/9/b")
    tables = started_faust.new_tables()
    tables.republish(0)
    await started_faust.delivered()
    assert await changelog_view(started_faust, 0) == EMPTY  # queued: sent by the commit
    await tables.commit()
    await started_faust.delivered()
    assert await changelog_view(started_faust, 0) == normalized(tables.snapshot(0))
    assert await changelog_view(started_faust, 1) == EMPTY


@pytest.mark.integration
async def test_a_store_lost_with_its_machine_comes_back_from_the_changelog(
    faust_settings: Settings, topics_to_delete: list[str], tmp_path: Path
) -> None:
    first = FaustTables(faust_settings)
    topics_to_delete.extend(first.changelog_topics().values())
    await first.start()  # stops itself if it cannot start
    try:
        tables = first.tables
        tables.put_row(0, 7, CONV_A, b"row 0/7/a")
        tables.put_row(0, 7, CONV_B, b"row 0/7/b")
        tables.put_user(0, 7, b"user 0/7")
        tables.put_gate(0, b"gate 0")
        tables.put_pending(0, 7, 11, b"pending 0/7/11")
        tables.put_pending(0, 7, 12, b"pending 0/7/12")
        tables.put_row(1, BIG_USER, CONV_A, b"row 1/max/a")
        tables.put_gate(1, b"gate 1")
        await tables.commit()
        tables.delete_pending(0, 7, 11)
        tables.put_row(0, 7, CONV_A, b"row 0/7/a v2")
        await tables.commit()
        await first.delivered()
        held = {p: normalized(tables.snapshot(p)) for p in range(PARTITIONS)}
    finally:
        await first.stop()

    # Another machine: same app, an empty data directory. Only the changelog can bring it back.
    second = FaustTables(dataclasses.replace(faust_settings, data_dir=str(tmp_path / "other-machine")))
    await second.start()
    try:
        assert {p: normalized(second.tables.snapshot(p)) for p in range(PARTITIONS)} == held
    finally:
        await second.stop()
