"""The reader on hand-made logs: which records it applies, and which keys it reports torn."""

from __future__ import annotations

from pathlib import Path

from tables.durable.changelog import InMemoryChangelog
from tables.durable.records import (
    Checkpoint,
    DataRecord,
    PersistId,
    encode_data,
    encode_persist,
    user_state_key,
)
from tests.support.durable import IDENTITY, open_partition, state_of

P10, P11, P12 = PersistId(1, 0), PersistId(1, 1), PersistId(1, 2)
P20, P21 = PersistId(2, 0), PersistId(2, 1)
K1, K2, K3 = user_state_key(1), user_state_key(2), user_state_key(3)


async def _persist(
    log: InMemoryChangelog, persist: PersistId, previous: PersistId | None, **values: bytes
) -> None:
    records = [DataRecord(user_state_key(int(k[1:])), v, persist) for k, v in values.items()]
    await log.append(0, encode_persist(records, Checkpoint(persist, previous, persist.seq, IDENTITY)))


async def _torn(log: InMemoryChangelog, persist: PersistId, **values: bytes) -> None:
    for k, v in values.items():
        await log.append(0, [encode_data(DataRecord(user_state_key(int(k[1:])), v, persist))])


async def test_records_without_their_checkpoint_are_never_applied_even_before_an_accepted_one(
    tmp_path: Path,
) -> None:
    log = InMemoryChangelog()
    await _persist(log, P10, None, k1=b"a")
    await _persist(log, P11, P10, k1=b"b", k2=b"b")
    await _torn(log, P12, k1=b"torn", k3=b"torn")  # a torn persist: no checkpoint
    reader = open_partition(tmp_path / "r", log)
    caught_up = await reader.reader.catch_up()
    assert caught_up.torn_keys == {K1, K3} and caught_up.highest_epoch == 1
    # A persist on top of 1.1 that does not write the torn keys again (no repair).
    await _persist(log, P20, P11, k2=b"c")
    await reader.reader.catch_up()
    assert state_of(reader.store) == {K1: b"b", K2: b"c"}
    fresh = open_partition(tmp_path / "fresh", log)
    await fresh.reader.catch_up()
    assert state_of(fresh.store) == {K1: b"b", K2: b"c"}


async def test_another_writers_records_between_a_persists_records_are_not_applied(tmp_path: Path) -> None:
    log = InMemoryChangelog()
    await _persist(log, P20, None, k1=b"owner")
    await _torn(log, P21, k1=b"owner2")
    await _torn(log, P12, k2=b"zombie", k3=b"zombie")  # an older epoch's writer, interleaved
    await log.append(0, encode_persist([], Checkpoint(P21, P20, 1, IDENTITY)))
    reader = open_partition(tmp_path / "r", log)
    await reader.reader.catch_up()
    assert state_of(reader.store) == {K1: b"owner2"}
    assert reader.store.position.head == P21


async def test_a_refused_checkpoints_records_are_reported_torn_and_not_applied(tmp_path: Path) -> None:
    log = InMemoryChangelog()
    await _persist(log, P10, None, k1=b"a")
    await _persist(log, P20, P10, k2=b"claim")  # the new owner's claim
    await _persist(log, P11, P10, k1=b"zombie", k3=b"zombie")  # the old owner, on top of 1.0
    reader = open_partition(tmp_path / "r", log)
    caught_up = await reader.reader.catch_up()
    assert state_of(reader.store) == {K1: b"a", K2: b"claim"}
    assert caught_up.torn_keys == {K1, K3}
    assert reader.reader.stats.checkpoints_refused == 1
    # The next claim writes them again; then the compacted log rebuilds the same state.
    await reader.checkpointer.claim()
    log.compact(0)
    rebuilt = open_partition(tmp_path / "rebuilt", log)
    await rebuilt.reader.catch_up()
    assert state_of(rebuilt.store) == state_of(reader.store) == {K1: b"a", K2: b"claim"}


async def test_a_claim_takes_an_epoch_above_a_torn_claims_below_the_stores_position(tmp_path: Path) -> None:
    log = InMemoryChangelog()
    await _persist(log, P10, None, k1=b"a")
    await _torn(log, P20, k1=b"lost claim")  # another worker's claim, torn; the owner goes on
    await _persist(log, PersistId(1, 1), P10, k2=b"b")
    standby = open_partition(tmp_path / "standby", log)
    await standby.reader.catch_up()
    standby.close()
    # Reopened, the store reads on from after 1.1: the torn 2.0 records are below its position.
    again = open_partition(tmp_path / "standby", log)
    assert again.store.position.highest_epoch == 2
    assert again.store.torn_keys() == {K1}  # remembered across the restart
    claim = await again.checkpointer.claim()
    assert claim.persist == PersistId(3, 0)  # never 2.0 again: a rebuild would take the torn records as its
    assert again.store.torn_keys() == set()  # the claim wrote k1 again, after the torn record
    log.compact(0)
    rebuilt = open_partition(tmp_path / "rebuilt", log)
    await rebuilt.reader.catch_up()
    assert state_of(rebuilt.store) == state_of(again.store) == {K1: b"a", K2: b"b"}
