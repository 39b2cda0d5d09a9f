"""Persists, claims, standbys and rebuilds on the in-memory changelog with real RocksDB stores."""

from __future__ import annotations

from pathlib import Path

import pytest

from tables.durable.changelog import InMemoryChangelog
from tables.durable.checkpointer import ClaimLost, NotClaimed, PersistBatch, PersistFailed
from tables.durable.records import PersistId, row_state_key, user_state_key, waiting_state_key
from tables.durable.recovery import StoreBehindChangelog
from tests.support.durable import chain_states, open_partition, state_of

C1 = "00000000-0000-4000-8000-000000000001"
C2 = "00000000-0000-4000-8000-000000000002"


def _batch(offset: int, user_value: bytes | None = b"u", **rows: bytes | None) -> PersistBatch:
    return PersistBatch(
        input_next_offset=offset,
        rows={(7, C1 if name == "c1" else C2): value for name, value in rows.items()},
        users={7: user_value},
        waiting={(7, offset): b"raw"},
        meta=f"meta-{offset}".encode(),
    )


async def test_a_persist_is_one_append_ending_with_its_checkpoint(tmp_path: Path) -> None:
    changelog = InMemoryChangelog()
    owner = open_partition(tmp_path / "owner", changelog)
    await owner.checkpointer.claim()
    appends = changelog.appends
    checkpoint = await owner.checkpointer.persist(_batch(10, c1=b"row1", c2=b"row2"))
    assert changelog.appends == appends + 1
    assert changelog.records(0)[-1].key == b"c"
    assert checkpoint.previous == PersistId(1, 0) and checkpoint.persist == PersistId(1, 1)
    assert state_of(owner.store) == {
        row_state_key(7, C1): b"row1",
        row_state_key(7, C2): b"row2",
        user_state_key(7): b"u",
        waiting_state_key(7, 10): b"raw",
    }
    assert owner.store.position.checkpoint == checkpoint
    assert owner.store.position.changelog_next_offset == changelog.records(0)[-1].offset + 1


async def test_persist_needs_a_claim(tmp_path: Path) -> None:
    owner = open_partition(tmp_path / "owner", InMemoryChangelog())
    with pytest.raises(NotClaimed):
        await owner.checkpointer.persist(_batch(1, c1=b"a"))


async def test_a_standby_tails_the_changelog_into_the_same_state(tmp_path: Path) -> None:
    changelog = InMemoryChangelog()
    owner = open_partition(tmp_path / "owner", changelog)
    standby = open_partition(tmp_path / "standby", changelog)
    await owner.checkpointer.claim()
    for offset in (1, 2, 3):
        await owner.checkpointer.persist(_batch(offset, c1=str(offset).encode(), c2=None))
        await standby.reader.catch_up()
        assert state_of(standby.store) == state_of(owner.store)
        assert standby.store.position == owner.store.position
    # Promotion: the standby claims; the old owner's store is a prefix, never ahead.
    await standby.checkpointer.claim()
    assert standby.store.position.head == PersistId(2, 0)
    await standby.checkpointer.persist(_batch(4, c1=b"new owner"))
    with pytest.raises(PersistFailed, match="another writer"):
        await owner.checkpointer.persist(_batch(4, c1=b"zombie"))  # it does not know it lost the partition
    # Its store read what the log decided instead: the new owner's persist, never the zombie's.
    assert state_of(owner.store)[row_state_key(7, C1)] == b"new owner"
    fresh = open_partition(tmp_path / "fresh", changelog)
    await fresh.reader.catch_up()
    assert state_of(fresh.store)[row_state_key(7, C1)] == b"new owner"
    assert fresh.reader.stats.checkpoints_refused == 1
    assert chain_states(changelog.records(0))[-1][2] == state_of(fresh.store)


async def test_a_torn_persist_is_discarded_and_its_keys_written_again_by_the_next_claim(
    tmp_path: Path,
) -> None:
    changelog = InMemoryChangelog()
    owner = open_partition(tmp_path / "owner", changelog)
    await owner.checkpointer.claim()
    await owner.checkpointer.persist(_batch(1, c1=b"kept"))
    before = state_of(owner.store)
    changelog.tear_next_append(2)  # the waiting entry and the row: no user, no checkpoint
    with pytest.raises(PersistFailed, match="torn"):
        await owner.checkpointer.persist(_batch(2, c1=b"torn"))
    with pytest.raises(NotClaimed):
        await owner.checkpointer.persist(_batch(3, c1=b"x"))
    assert state_of(owner.store) == before
    # Restart with the data dir lost: the rebuild discards the torn tail.
    owner.close()
    again = open_partition(tmp_path / "again", changelog)
    claim = await again.checkpointer.claim()
    assert state_of(again.store) == before
    assert claim.input_next_offset == 1
    # The claim wrote the torn keys again (a deleted one as a tombstone), after them in the log.
    claim_records = [r for r in changelog.records(0) if r.offset >= changelog.records(0)[-1].offset - 2]
    assert {r.key for r in claim_records[:-1]} == {row_state_key(7, C1), waiting_state_key(7, 2)}
    assert [r.value for r in claim_records if r.key == waiting_state_key(7, 2)] == [None]
    # So compaction keeps the claim's values over the torn ones: a rebuild from it agrees.
    changelog.compact(0)
    rebuilt = open_partition(tmp_path / "rebuilt", changelog)
    await rebuilt.reader.catch_up()
    assert state_of(rebuilt.store) == before
    assert rebuilt.store.position.head == claim.persist


@pytest.mark.parametrize("drop_tombstones", [False, True])
async def test_a_rebuild_from_the_compacted_changelog_equals_the_owners_store(
    tmp_path: Path, drop_tombstones: bool
) -> None:
    changelog = InMemoryChangelog()
    owner = open_partition(tmp_path / "owner", changelog)
    await owner.checkpointer.claim()
    for offset in range(1, 8):
        await owner.checkpointer.persist(
            _batch(offset, user_value=None if offset == 5 else b"u%d" % offset, c1=b"%d" % offset, c2=None)
        )
        if offset == 4:
            changelog.compact(0, drop_tombstones=drop_tombstones)  # some history compacted, some not
    changelog.compact(0, below=changelog.records(0)[-3].offset, drop_tombstones=drop_tombstones)
    rebuilt = open_partition(tmp_path / "rebuilt", changelog)
    await rebuilt.reader.catch_up()
    assert state_of(rebuilt.store) == state_of(owner.store)
    assert rebuilt.store.position == owner.store.position


async def test_a_claim_refused_for_a_checkpoint_that_came_first_is_lost(tmp_path: Path) -> None:
    changelog = InMemoryChangelog()
    first = open_partition(tmp_path / "first", changelog)
    second = open_partition(tmp_path / "second", changelog)
    await first.checkpointer.claim()
    await second.reader.catch_up()
    # `first` persists after `second` read the log and before `second`'s claim lands.
    real_append = changelog.append

    async def append_after_first_persists(partition: int, records):  # type: ignore[no-untyped-def]
        changelog.append = real_append  # type: ignore[method-assign]
        await first.checkpointer.persist(_batch(1, c1=b"first"))
        return await real_append(partition, records)

    changelog.append = append_after_first_persists  # type: ignore[method-assign]
    with pytest.raises(ClaimLost):
        await second.checkpointer.claim()
    assert not second.checkpointer.claimed
    claim = await second.checkpointer.claim()  # again, on top of `first`'s persist
    assert state_of(second.store)[row_state_key(7, C1)] == b"first"
    assert claim.input_next_offset == 1


async def test_a_store_behind_the_changelogs_start_must_be_rebuilt(tmp_path: Path) -> None:
    changelog = InMemoryChangelog()
    owner = open_partition(tmp_path / "owner", changelog)
    standby = open_partition(tmp_path / "standby", changelog)
    await owner.checkpointer.claim()
    await standby.reader.catch_up()
    await owner.checkpointer.persist(_batch(1, c1=b"a"))
    changelog.delete_before(0, changelog.records(0)[-1].offset)
    with pytest.raises(StoreBehindChangelog):
        await standby.reader.catch_up()


async def test_an_owner_whose_store_took_another_writers_claim_does_not_persist_on_top_of_it(
    tmp_path: Path,
) -> None:
    changelog = InMemoryChangelog()
    old = open_partition(tmp_path / "old", changelog)
    new = open_partition(tmp_path / "new", changelog)
    await old.checkpointer.claim()
    await old.checkpointer.persist(_batch(1, c1=b"old"))
    await new.checkpointer.claim()  # right after the old owner's last persist
    await old.reader.catch_up()  # the old owner's reader tails and applies the new owner's claim
    assert old.store.position.head == PersistId(2, 0)
    with pytest.raises(PersistFailed, match="another writer took the partition"):
        await old.checkpointer.persist(_batch(2, c1=b"zombie"))
    await new.checkpointer.persist(_batch(2, c1=b"new"))
    fresh = open_partition(tmp_path / "fresh", changelog)
    await fresh.reader.catch_up()
    assert state_of(fresh.store) == state_of(new.store)


async def test_keys_a_refused_writer_left_are_written_again_by_the_owners_next_persist(
    tmp_path: Path,
) -> None:
    changelog = InMemoryChangelog()
    old = open_partition(tmp_path / "old", changelog)
    new = open_partition(tmp_path / "new", changelog)
    await old.checkpointer.claim()
    await old.checkpointer.persist(_batch(1, c1=b"old", c2=b"old"))
    await new.checkpointer.claim()
    await new.checkpointer.persist(_batch(2, c1=b"new"))
    with pytest.raises(PersistFailed):
        await old.checkpointer.persist(_batch(3, c2=b"zombie"))  # lands, refused by every reader
    standby = open_partition(tmp_path / "standby", changelog)
    caught_up = await standby.reader.catch_up()
    assert row_state_key(7, C2) in caught_up.torn_keys
    new.checkpointer.note_torn(caught_up.torn_keys)
    await new.checkpointer.persist(_batch(4, c1=b"new4"))
    changelog.compact(0)  # the zombie's records are superseded by the owner's
    rebuilt = open_partition(tmp_path / "rebuilt", changelog)
    await rebuilt.reader.catch_up()
    assert state_of(rebuilt.store) == state_of(new.store)
    assert state_of(rebuilt.store)[row_state_key(7, C2)] == b"old"
