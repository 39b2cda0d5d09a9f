from __future__ import annotations

from pathlib import Path

import pytest
from rocksdict import Options, Rdict

from tables.durable.records import Checkpoint, DataRecord, InputIdentity, PersistId, user_state_key
from tables.durable.store import EMPTY, POSITION_KEY, PartitionStore, StoreDamaged

IDENTITY = InputIdentity("cluster", "topic", 4)


def _checkpoint(seq: int, offset: int) -> Checkpoint:
    return Checkpoint(PersistId(1, seq), PersistId(1, seq - 1) if seq else None, offset, IDENTITY, b"m")


def test_data_and_position_are_written_together_and_survive_a_reopen(tmp_path: Path) -> None:
    store = PartitionStore.open(tmp_path / "p0")
    assert store.position == EMPTY
    store.apply([DataRecord(user_state_key(1), b"a", PersistId(1, 0))], _checkpoint(0, 10), 3)
    store.apply(
        [
            DataRecord(user_state_key(1), None, PersistId(1, 1)),
            DataRecord(user_state_key(2), b"b", PersistId(1, 1)),
        ],
        _checkpoint(1, 20),
        7,
    )
    store.close()
    again = PartitionStore.open(tmp_path / "p0")
    assert dict(again.items()) == {user_state_key(2): b"b"}
    assert again.position.changelog_next_offset == 7
    assert again.position.checkpoint == _checkpoint(1, 20)
    assert again.position.head == PersistId(1, 1)
    assert list(again.items(b"u")) == [(user_state_key(2), b"b")]
    assert again.get_many([user_state_key(1), user_state_key(2)]) == [None, b"b"]
    again.close()


def test_the_position_never_goes_back(tmp_path: Path) -> None:
    store = PartitionStore.open(tmp_path / "p0")
    store.apply([], _checkpoint(0, 1), 5)
    with pytest.raises(ValueError, match="behind"):
        store.apply([], _checkpoint(1, 2), 4)
    store.close()


def test_a_damaged_position_is_refused_and_rebuilt_empty(tmp_path: Path) -> None:
    path = tmp_path / "p0"
    store = PartitionStore.open(path)
    store.apply([DataRecord(user_state_key(1), b"a", PersistId(1, 0))], _checkpoint(0, 1), 2)
    store.close()
    options = Options(raw_mode=True)
    db = Rdict(str(path), options)
    db[POSITION_KEY] = b"\x93garbage"
    db.close()
    with pytest.raises(StoreDamaged, match="position record"):
        PartitionStore.open(path)
    rebuilt, why = PartitionStore.open_or_rebuild(path)
    assert why is not None and "position record" in why
    assert rebuilt.position == EMPTY and dict(rebuilt.items()) == {}
    rebuilt.close()


def test_a_store_that_does_not_open_is_rebuilt(tmp_path: Path) -> None:
    path = tmp_path / "p0"
    path.mkdir()
    (path / "CURRENT").write_text("MANIFEST-999999\n")  # names a manifest that does not exist
    with pytest.raises(StoreDamaged):
        PartitionStore.open(path)
    rebuilt, why = PartitionStore.open_or_rebuild(path)
    assert why is not None and rebuilt.position == EMPTY
    rebuilt.close()
