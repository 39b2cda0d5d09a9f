"""The worker's `StateTables` port (app/worker/ports.py): one suite, every implementation.

- ``memory``: app/stores/memory_tables.MemoryTables (the rebuild's tables, the unit tests');
- ``rocks``: app/stores/rocks_tables.RocksTables, plain RocksDB in a temporary folder (the state of a
  replay or rebuild that does not fit in memory; no changelog);
- ``durable``: tables/durable/tables.CheckpointedTables, the worker's (a RocksDB store per
  partition in a temporary folder, checkpointed persists) over the in-memory changelog;
- ``durable-kafka``: the same over `KafkaChangelog` on the real Kafka (integration: `make
  test-fast` leaves it out).

What the worker relies on: writes are staged and `commit` makes them visible, all at once; every
call names its partition and a partition holds exactly what was committed to it; a key written
again holds the last value (in a commit and across commits), a deleted pending entry is gone;
the reads (multi-gets of users and rows, a user's rows by prefix, every row key in key order, the
checkpoint record, the pending entries) return what exists and nothing else, whatever the ids (u64
user ids in numeric order, a user id whose bytes spell the store's own bookkeeping). With a changelog
(durable): once `commit` returns the changelog's accepted chain (tests/support/durable.chain_states,
the independent model) holds every write, and a store lost with its machine comes back from the
changelog as it was.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from app.settings import Settings
from app.stores.memory_tables import MemoryTables
from app.stores.rocks_tables import RocksTables
from app.worker.ports import StateTables, parse_row_key, parse_user_key
from tables.durable.changelog import Changelog, InMemoryChangelog
from tables.durable.kafka import KafkaChangelog, ensure_changelog_topic
from tables.durable.records import CHECKPOINT_KEY, Checkpoint, InputIdentity, decode
from tables.durable.tables import CheckpointedTables
from tests.support.durable import IDENTITY, chain_states

pytestmark = pytest.mark.timeout(300)

PARTITIONS = 2
CONV_A = "0a0a0a0a-0000-4000-8000-00000000000a"
CONV_B = "0b0b0b0b-0000-4000-8000-00000000000b"
CONV_C = "ffffffff-0000-4000-8000-00000000000c"
BIG_USER = 2**64 - 1
# A user id whose 8 key bytes are the start of faust's own bookkeeping key in every RocksDB
# database ("__faust\0offset__", the persisted changelog offset): it must never read as state.
FAUST_LOOKALIKE_USER = int.from_bytes(b"__faust\x00", "big")


class Held(NamedTuple):
    """What a partition's tables hold, read through the port."""

    rows: dict[tuple[int, str], bytes]
    users: dict[int, bytes]
    checkpoint_record: bytes | None
    pending: list[bytes]  # sorted: the port promises no order


EMPTY = Held({}, {}, None, [])


def held(tables: StateTables, partition: int, user_ids: list[int]) -> Held:
    """The partition's state through the port: every row (by its keys), the given users (the
    port has no scan of users), the checkpoint record, the pending entries."""
    keys = list(tables.row_keys(partition))
    rows = tables.get_rows(partition, keys)
    assert set(rows) == set(keys), "row_keys named a row get_rows does not find"
    return Held(
        rows,
        tables.get_users(partition, user_ids),
        tables.checkpoint_record(partition),
        sorted(tables.pending(partition)),
    )


async def _identity() -> InputIdentity:
    return IDENTITY


async def _log_start(partition: int) -> int:
    return 0


async def durable_tables(folder: Path, changelog: Changelog) -> CheckpointedTables:
    """The worker's tables on `changelog`, owning every partition (claimed)."""
    made = CheckpointedTables(folder, changelog, _identity, _log_start)
    await made.acquire(list(range(PARTITIONS)))
    return made


async def changelog_view(changelog: Changelog, partition: int) -> Held:
    """What the changelog's accepted chain holds for one partition (the independent model)."""
    start, end, records = 0, await changelog.end_offset(partition), []
    while start < end:
        batch, start = await changelog.read(partition, start, end)
        records += batch
    chain = chain_states(records)
    state = chain[-1][2] if chain else {}
    checkpoint = None
    for record in records:
        if record.key == CHECKPOINT_KEY and record.value is not None:
            checkpoint = decode(record.key, record.value, record.headers)
    checkpoint_record = checkpoint.meta if isinstance(checkpoint, Checkpoint) and checkpoint.meta else None
    return Held(
        {parse_row_key(k[1:]): v for k, v in state.items() if k[:1] == b"r"},
        {parse_user_key(k[1:]): v for k, v in state.items() if k[:1] == b"u"},
        checkpoint_record,
        sorted(v for k, v in state.items() if k[:1] == b"w"),
    )


@pytest.fixture
async def kafka_changelog(
    servers: Settings, unique_name: Any, topics_to_delete: list[str]
) -> AsyncIterator[Changelog]:
    topic = unique_name("state-changelog")
    await ensure_changelog_topic(servers.kafka.kafka_bootstrap, topic, PARTITIONS, 86_400_000)
    topics_to_delete.append(topic)
    changelog = KafkaChangelog(servers.kafka.kafka_bootstrap, topic)
    await changelog.start()
    yield changelog
    await changelog.stop()


@pytest.fixture(
    params=[
        pytest.param("memory", id="memory"),
        pytest.param("rocks", id="rocks"),
        pytest.param("durable", id="durable"),
        pytest.param("durable-kafka", id="durable-kafka", marks=pytest.mark.integration),
    ]
)
def tables(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StateTables]:
    if request.param.startswith("durable"):
        # Requested lazily so the other runs never touch (or need) the servers.
        changelog: Changelog = InMemoryChangelog()
        if request.param == "durable-kafka":
            changelog = request.getfixturevalue("kafka_changelog")
        durable = OwnedAtFirstCommit(tmp_path / "state", changelog, _identity, _log_start)
        yield durable
        durable.close()
    elif request.param == "rocks":
        rocks = RocksTables(tmp_path / "state")
        yield rocks
        rocks.close()
    else:
        yield MemoryTables()


class OwnedAtFirstCommit(CheckpointedTables):
    """Claims every partition at its first commit (a sync fixture cannot await the claim)."""

    async def commit(self) -> None:
        if not self.owners:
            await self.acquire(list(range(PARTITIONS)))
        await super().commit()


@pytest.fixture(
    params=[
        pytest.param("memory", id="in-memory-changelog"),
        pytest.param("kafka", id="kafka-changelog", marks=pytest.mark.integration),
    ]
)
def changelog(request: pytest.FixtureRequest) -> Changelog:
    if request.param == "kafka":
        found: Changelog = request.getfixturevalue("kafka_changelog")
        return found
    return InMemoryChangelog()


def write_some(tables: StateTables) -> None:
    """Records of every table in both partitions (users 7, 8, 9, BIG_USER)."""
    tables.put_row(0, 7, CONV_A, b"row 0/7/a")
    tables.put_row(0, 7, CONV_B, b"row 0/7/b")
    tables.put_row(0, 8, CONV_A, b"row 0/8/a")
    tables.put_user(0, 7, b"user 0/7")
    tables.put_user(0, 8, b"user 0/8")
    tables.put_checkpoint_record(0, b"checkpoint 0")
    tables.put_pending(0, 7, 11, b"pending 0/7/11")
    tables.put_pending(0, 7, 12, b"pending 0/7/12")
    tables.put_row(1, 9, CONV_A, b"row 1/9/a")
    tables.put_user(1, BIG_USER, b"user 1/max")
    tables.put_pending(1, BIG_USER, 2**64 - 1, b"pending 1/max/max")


WRITTEN = {
    0: Held(
        {(7, CONV_A): b"row 0/7/a", (7, CONV_B): b"row 0/7/b", (8, CONV_A): b"row 0/8/a"},
        {7: b"user 0/7", 8: b"user 0/8"},
        b"checkpoint 0",
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
    tables.put_checkpoint_record(0, b"checkpoint v1")
    tables.put_checkpoint_record(0, b"checkpoint v2")
    tables.put_pending(0, 7, 11, b"pending v1")
    await tables.commit()
    tables.put_pending(0, 7, 11, b"pending v2")  # across commits
    tables.put_user(0, 7, b"user v3")
    tables.put_checkpoint_record(1, b"checkpoint 1")  # another partition's checkpoint is another record
    await tables.commit()
    assert held(tables, 0, [7]) == Held(
        {(7, CONV_A): b"row v3"}, {7: b"user v3"}, b"checkpoint v2", [b"pending v2"]
    )
    assert tables.checkpoint_record(1) == b"checkpoint 1"


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
    tables.put_checkpoint_record(1, b"checkpoint")
    await tables.commit()
    # Users in numeric order (big-endian keys), then conversations by their UUID bytes.
    assert list(tables.row_keys(1)) == [(user, cid) for user in sorted(users) for cid in (CONV_A, CONV_B)]
    assert list(tables.row_keys(0)) == []


async def test_rows_after_reads_bounded_ranges_in_key_order_and_the_bounds_are_the_ends(
    tables: StateTables,
) -> None:
    """The unread audit's sweep (app/worker/audit.py): a range after any key (present or not),
    at most `limit` rows, never a user record or a pending entry; the first and last row keys;
    an estimate of the rows that sees them (RocksDB's counts every kind of key: at least the rows)."""
    users = [BIG_USER, 2**63, 256, 2, FAUST_LOOKALIKE_USER, 0]
    for user in users:
        for cid in (CONV_C, CONV_A, CONV_B):
            tables.put_row(1, user, cid, f"{user}/{cid[:2]}".encode())
        tables.put_user(1, user, b"u")
        tables.put_pending(1, user, 5, b"p")
    tables.put_checkpoint_record(1, b"checkpoint")
    await tables.commit()
    every = [(user, cid) for user in sorted(users) for cid in (CONV_A, CONV_B, CONV_C)]
    walked: list[tuple[int, str]] = []
    after: tuple[int, str] | None = None
    while True:
        got = tables.rows_after(1, after, 4)
        assert len(got) <= 4
        for key, value in got:
            assert value == f"{key[0]}/{key[1][:2]}".encode()
        walked += [key for key, _ in got]
        if len(got) < 4:
            break
        after = got[-1][0]
    assert walked == every
    # After a key that is no row: from the next row on.
    assert [k for k, _ in tables.rows_after(1, (256, "00000000-0000-4000-8000-000000000000"), 2)] == [
        (256, CONV_A),
        (256, CONV_B),
    ]
    assert [k for k, _ in tables.rows_after(1, (3, CONV_A), 1)] == [(256, CONV_A)]
    assert tables.rows_after(1, every[-1], 10) == [] and tables.rows_after(1, None, 0) == []
    assert tables.row_key_bounds(1) == (every[0], every[-1])
    assert tables.row_key_bounds(0) is None and tables.rows_after(0, None, 5) == []
    # The durable store's estimate counts its position record too: "about", not exact.
    assert tables.estimated_rows(1) >= len(every) and tables.estimated_rows(0) <= 1


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
    assert tables.checkpoint_record(1) is None


# -- with a changelog (durable) ------------------------------------------------------------------


async def test_once_commit_returns_the_changelog_has_every_write(
    changelog: Changelog, tmp_path: Path
) -> None:
    tables = await durable_tables(tmp_path / "state", changelog)
    try:
        write_some(tables)
        for partition in range(PARTITIONS):  # staged: neither in the changelog nor in the store
            assert await changelog_view(changelog, partition) == EMPTY
            assert held(tables, partition, USERS) == EMPTY
        await tables.commit()
        for partition, expected in WRITTEN.items():
            assert held(tables, partition, USERS) == expected
            assert await changelog_view(changelog, partition) == expected
        # A delete goes as a tombstone; a value written again replaces the older one.
        tables.delete_pending(0, 7, 11)
        tables.put_row(0, 7, CONV_A, b"row 0/7/a v2")
        await tables.commit()
        assert await changelog_view(changelog, 0) == held(tables, 0, USERS)
        assert tables.pending(0) == [b"pending 0/7/12"]
    finally:
        tables.close()


async def test_a_store_lost_with_its_machine_comes_back_from_the_changelog(
    changelog: Changelog, tmp_path: Path
) -> None:
    first = await durable_tables(tmp_path / "first-machine", changelog)
    try:
        write_some(first)
        await first.commit()
        first.delete_pending(0, 7, 11)
        first.put_row(0, 7, CONV_A, b"row 0/7/a v2")
        first.put_checkpoint_record(1, b"checkpoint 1")
        await first.commit()
        before = {p: held(first, p, USERS) for p in range(PARTITIONS)}
        assert (
            before[0].rows[(7, CONV_A)] == b"row 0/7/a v2" and before[1].checkpoint_record == b"checkpoint 1"
        )
    finally:
        first.close()

    # Another machine: an empty data directory. Only the changelog can bring it back.
    second = await durable_tables(tmp_path / "other-machine", changelog)
    try:
        assert {p: held(second, p, USERS) for p in range(PARTITIONS)} == before
    finally:
        second.close()
