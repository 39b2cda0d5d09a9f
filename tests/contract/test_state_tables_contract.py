"""The worker's `StateTables` port (app/worker/ports.py): one suite, every implementation.

- ``memory``: app/stores/memory_tables.MemoryTables (the rebuild's tables, the unit tests');
- ``rocks``: app/stores/rocks_tables.RocksTables, plain RocksDB in a temporary folder (the state of a
  replay or rebuild that does not fit in memory; no changelog);
- ``faust``: tables/state.FaustStateTables over the worker's real faust tables (the App built as
  the worker builds it, app/runtime/app.py, with the RocksDB store in a temporary directory and
  its changelog topics on the real Kafka; started so the table manager assigns, recovers and
  opens every partition). Integration: `make test-fast` leaves it out.

What the worker relies on: writes are staged and `commit` makes them visible, all at once; every
call names its partition and a partition holds exactly what was committed to it; a key written
again holds the last value (in a commit and across commits), a deleted pending entry is gone;
the reads (multi-gets of users and rows, a user's rows by prefix, every row key in key order, the
gate, the pending entries) return what exists and nothing else, whatever the ids (u64 user ids
in numeric order, a user id whose bytes spell the store's own bookkeeping). With a changelog
(faust): once `commit` returns the changelog has every write, and a store lost with its machine
comes back from the changelog as it was.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from app.settings import Settings
from app.stores.memory_tables import MemoryTables
from app.stores.rocks_tables import RocksTables
from app.worker.ports import GATE_KEY, StateTables, parse_row_key, parse_user_key

pytestmark = pytest.mark.timeout(300)

PARTITIONS = 2
TABLE_NAMES = ("rows", "users", "gates", "pending")
CONV_A = "0a0a0a0a-0000-4000-8000-00000000000a"
CONV_B = "0b0b0b0b-0000-4000-8000-00000000000b"
CONV_C = "ffffffff-0000-4000-8000-00000000000c"
BIG_USER = 2**64 - 1
# A user id whose 8 key bytes are the start of faust's own bookkeeping key in every RocksDB
# database ("__faust\0offset__", the persisted changelog offset): it must never read as state.
FAUST_LOOKALIKE_USER = int.from_bytes(b"__faust\x00", "big")
# Starting a worker's App (group join, assignment, table recovery) takes seconds; on a loaded
# CI machine much longer. Generous: waiting on events, never on time.
START_TIMEOUT_S = 180.0


class Held(NamedTuple):
    """What a partition's tables hold, read through the port."""

    rows: dict[tuple[int, str], bytes]
    users: dict[int, bytes]
    gate: bytes | None
    pending: list[bytes]  # sorted: the port promises no order


EMPTY = Held({}, {}, None, [])


def held(tables: StateTables, partition: int, user_ids: list[int]) -> Held:
    """The partition's state through the port: every row (by its keys), the given users (the
    port has no scan of users), the gate, the pending entries."""
    keys = list(tables.row_keys(partition))
    rows = tables.get_rows(partition, keys)
    assert set(rows) == set(keys), "row_keys named a row get_rows does not find"
    return Held(
        rows, tables.get_users(partition, user_ids), tables.gate(partition), sorted(tables.pending(partition))
    )


class FaustTables:
    """The worker's faust App with only its tables, started in this event loop."""

    def __init__(self, settings: Settings) -> None:
        # Imported here: the memory runs must not need faust's import cost (or faust at all).
        from tables.state import FaustStateTables, declare_tables

        from app.kafka.batches import BatchSender
        from app.runtime.app import new_faust_app

        os.makedirs(os.path.join(settings.data_dir, settings.app_id), exist_ok=True)
        self.settings = settings
        self.app = new_faust_app(settings)
        # faust creates the changelog topics as it starts, and its first assignment may be
        # computed before the consumer's metadata has them ("Ignoring missing topic"): they are
        # assigned at the next metadata refresh, 5 minutes later by default. Refresh every second
        # here, so `start` sees the rebalance that brings them within its budget.
        self.app.conf.consumer_metadata_max_age_ms = 1000
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


async def changelog_view(faust_tables: FaustTables, partition: int) -> Held:
    """What the changelog topics would restore for one partition."""
    topics = faust_tables.changelog_topics()
    log = {name: await read_changelog(faust_tables.settings, topics[name], partition) for name in TABLE_NAMES}
    return Held(
        {parse_row_key(key): value for key, value in log["rows"].items()},
        {parse_user_key(key): value for key, value in log["users"].items()},
        log["gates"].get(GATE_KEY),
        sorted(log["pending"].values()),
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
    await made.start()  # stops itself if it cannot start
    yield made
    await made.stop()


@pytest.fixture(
    params=[
        pytest.param("memory", id="memory"),
        pytest.param("rocks", id="rocks"),
        pytest.param("faust", id="faust", marks=pytest.mark.integration),
    ]
)
def tables(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StateTables]:
    if request.param == "faust":
        # Requested lazily so the other runs never touch (or need) the servers.
        started: FaustTables = request.getfixturevalue("started_faust")
        yield started.tables
    elif request.param == "rocks":
        rocks = RocksTables(tmp_path / "state")
        yield rocks
        rocks.close()
    else:
        yield MemoryTables()


def write_some(tables: StateTables) -> None:
    """Records of every table in both partitions (users 7, 8, 9, BIG_USER)."""
    tables.put_row(0, 7, CONV_A, b"row 0/7/a")
    tables.put_row(0, 7, CONV_B, b"row 0/7/b")
    tables.put_row(0, 8, CONV_A, b"row 0/8/a")
    tables.put_user(0, 7, b"user 0/7")
    tables.put_user(0, 8, b"user 0/8")
    tables.put_gate(0, b"gate 0")
    tables.put_pending(0, 7, 11, b"pending 0/7/11")
    tables.put_pending(0, 7, 12, b"pending 0/7/12")
    tables.put_row(1, 9, CONV_A, b"row 1/9/a")
    tables.put_user(1, BIG_USER, b"user 1/max")
    tables.put_pending(1, BIG_USER, 2**64 - 1, b"pending 1/max/max")


WRITTEN = {
    0: Held(
        {(7, CONV_A): b"row 0/7/a", (7, CONV_B): b"row 0/7/b", (8, CONV_A): b"row 0/8/a"},
        {7: b"user 0/7", 8: b"user 0/8"},
        b"gate 0",
        [b"pending 0/7/11", b"pending 0/7/12"],
    ),
    1: Held({(9, CONV_A): b"row 1/9/a"}, {BIG_USER: b"user 1/max"}, None, [b"pending 1/max/max"]),
}
USERS = [7, 8, 9, BIG_USER]


# -- every implementation ------------------------------------------------------------------------


async def test_a_partition_never_written_holds_nothing(tables: StateTables) -> None:
    for partition in range(PARTITIONS):
        assert held(tables, partition, USERS) == EMPTY
        assert tables.user_rows(partition, 7) == []
    await tables.commit()  # nothing staged: nothing changes
    assert held(tables, 0, USERS) == EMPTY


async def test_writes_are_visible_once_committed_each_in_its_partition(tables: StateTables) -> None:
    write_some(tables)
    for partition in range(PARTITIONS):  # staged, not committed
        assert held(tables, partition, USERS) == EMPTY
    await tables.commit()
    for partition, expected in WRITTEN.items():
        assert held(tables, partition, USERS) == expected
    await tables.commit()  # a commit with nothing staged changes nothing
    for partition, expected in WRITTEN.items():
        assert held(tables, partition, USERS) == expected


async def test_the_same_key_again_holds_the_last_value(tables: StateTables) -> None:
    for value in (b"row v1", b"row v2", b"row v3"):  # within one commit: staged order
        tables.put_row(0, 7, CONV_A, value)
    tables.put_user(0, 7, b"user v1")
    tables.put_user(0, 7, b"user v2")
    tables.put_gate(0, b"gate v1")
    tables.put_gate(0, b"gate v2")
    tables.put_pending(0, 7, 11, b"pending v1")
    await tables.commit()
    tables.put_pending(0, 7, 11, b"pending v2")  # across commits
    tables.put_user(0, 7, b"user v3")
    tables.put_gate(1, b"gate 1")  # another partition's gate is another record
    await tables.commit()
    assert held(tables, 0, [7]) == Held(
        {(7, CONV_A): b"row v3"}, {7: b"user v3"}, b"gate v2", [b"pending v2"]
    )
    assert tables.gate(1) == b"gate 1"


async def test_a_deleted_pending_entry_is_gone_and_only_it(tables: StateTables) -> None:
    tables.put_pending(0, 7, 11, b"pending 0/7/11")
    tables.put_pending(0, 7, 12, b"pending 0/7/12")
    tables.put_pending(0, 8, 11, b"pending 0/8/11")
    tables.put_pending(1, 7, 11, b"pending 1/7/11")
    await tables.commit()
    tables.delete_pending(0, 7, 11)
    tables.delete_pending(0, 7, 99)  # never written: nothing happens
    assert len(tables.pending(0)) == 3  # not before the commit
    await tables.commit()
    assert sorted(tables.pending(0)) == [b"pending 0/7/12", b"pending 0/8/11"]
    assert tables.pending(1) == [b"pending 1/7/11"]
    # Within one commit the last write wins: written then deleted is gone, deleted then written is there.
    tables.put_pending(0, 9, 1, b"pending 0/9/1")
    tables.delete_pending(0, 9, 1)
    tables.delete_pending(0, 7, 11)
    tables.put_pending(0, 7, 11, b"pending 0/7/11 again")
    await tables.commit()
    assert sorted(tables.pending(0)) == [b"pending 0/7/11 again", b"pending 0/7/12", b"pending 0/8/11"]


async def test_multi_gets_return_what_exists_and_nothing_else(tables: StateTables) -> None:
    write_some(tables)
    await tables.commit()
    assert tables.get_users(0, [7, 9, 8, BIG_USER]) == {7: b"user 0/7", 8: b"user 0/8"}
    assert tables.get_users(0, []) == {}
    assert tables.get_rows(0, [(7, CONV_B), (7, CONV_C), (9, CONV_A), (8, CONV_A)]) == {
        (7, CONV_B): b"row 0/7/b",
        (8, CONV_A): b"row 0/8/a",
    }
    assert tables.get_rows(1, [(7, CONV_A)]) == {}  # partition 0's row, asked of partition 1


async def test_a_users_rows_by_prefix_in_conversation_order_and_no_one_elses(tables: StateTables) -> None:
    for user in (6, 7, 8, 7 << 8, FAUST_LOOKALIKE_USER):  # neighbours in key order
        for conversation in (CONV_C, CONV_A, CONV_B):
            tables.put_row(0, user, conversation, f"row {user}/{conversation[:2]}".encode())
    tables.put_user(0, 7, b"user 7")  # another table, same user
    tables.put_pending(0, 7, 1, b"pending 7/1")
    await tables.commit()
    assert tables.user_rows(0, 7) == [(CONV_A, b"row 7/0a"), (CONV_B, b"row 7/0b"), (CONV_C, b"row 7/ff")]
    assert [cid for cid, _ in tables.user_rows(0, FAUST_LOOKALIKE_USER)] == [CONV_A, CONV_B, CONV_C]
    assert tables.user_rows(0, 9) == [] and tables.user_rows(1, 7) == []


async def test_row_keys_are_every_row_in_key_order_and_only_rows(tables: StateTables) -> None:
    users = [BIG_USER, 2**63, 256, 2, FAUST_LOOKALIKE_USER, 0]
    for user in users:
        tables.put_row(1, user, CONV_B, b"b")
        tables.put_row(1, user, CONV_A, b"a")
        tables.put_user(1, user, b"u")
        tables.put_pending(1, user, 5, b"p")
    tables.put_gate(1, b"gate")
    await tables.commit()
    # Users in numeric order (big-endian keys), then conversations by their UUID bytes.
    assert list(tables.row_keys(1)) == [(user, cid) for user in sorted(users) for cid in (CONV_A, CONV_B)]
    assert list(tables.row_keys(0)) == []


async def test_reads_show_only_what_was_written_after_commits_of_every_table(tables: StateTables) -> None:
    """After commits every table also holds its implementation's bookkeeping (faust: the
    persisted changelog offset, a 16-byte key in each database): none of it reads as state."""
    write_some(tables)
    await tables.commit()
    tables.put_pending(0, FAUST_LOOKALIKE_USER, int.from_bytes(b"offset_-", "big"), b"lookalike")
    tables.put_user(0, FAUST_LOOKALIKE_USER, b"lookalike user")
    await tables.commit()
    assert sorted(tables.pending(0)) == [b"lookalike", b"pending 0/7/11", b"pending 0/7/12"]
    assert held(tables, 1, USERS) == WRITTEN[1]
    assert tables.get_users(0, [FAUST_LOOKALIKE_USER]) == {FAUST_LOOKALIKE_USER: b"lookalike user"}
    assert tables.gate(1) is None


# -- with a changelog (faust) --------------------------------------------------------------------


@pytest.mark.integration
async def test_once_commit_returns_the_changelog_has_every_write(started_faust: FaustTables) -> None:
    tables = started_faust.tables
    write_some(tables)
    for partition in range(PARTITIONS):  # staged: neither in the changelog nor in the store
        assert await changelog_view(started_faust, partition) == EMPTY
    await tables.commit()
    for partition, expected in WRITTEN.items():
        assert held(tables, partition, USERS) == expected
        assert await changelog_view(started_faust, partition) == expected
    # A delete goes as a tombstone; a value written again replaces the older one.
    tables.delete_pending(0, 7, 11)
    tables.put_row(0, 7, CONV_A, b"row 0/7/a v2")
    await tables.commit()
    assert await changelog_view(started_faust, 0) == held(tables, 0, USERS)
    assert tables.pending(0) == [b"pending 0/7/12"]


@pytest.mark.integration
async def test_a_store_lost_with_its_machine_comes_back_from_the_changelog(
    faust_settings: Settings, topics_to_delete: list[str], tmp_path: Path
) -> None:
    first = FaustTables(faust_settings)
    topics_to_delete.extend(first.changelog_topics().values())
    await first.start()  # stops itself if it cannot start
    try:
        tables = first.tables
        write_some(tables)
        await tables.commit()
        tables.delete_pending(0, 7, 11)
        tables.put_row(0, 7, CONV_A, b"row 0/7/a v2")
        tables.put_gate(1, b"gate 1")
        await tables.commit()
        before = {p: held(tables, p, USERS) for p in range(PARTITIONS)}
        assert before[0].rows[(7, CONV_A)] == b"row 0/7/a v2" and before[1].gate == b"gate 1"
    finally:
        await first.stop()

    # Another machine: same app, an empty data directory. Only the changelog can bring it back.
    second = FaustTables(dataclasses.replace(faust_settings, data_dir=str(tmp_path / "other-machine")))
    await second.start()
    try:
        assert {p: held(second.tables, p, USERS) for p in range(PARTITIONS)} == before
    finally:
        await second.stop()
