"""One partition's local RocksDB store: the state, and the changelog position it reflects, in
one database, always written together (one WriteBatch per applied persist)."""

from __future__ import annotations

import shutil
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
from rocksdict import Options, Rdict, WriteBatch

from tables.durable.records import (
    Checkpoint,
    DataRecord,
    PersistId,
    RecordRefused,
    decode_checkpoint_value,
    encode_checkpoint,
)

# Sort before every state key (their first byte is a kind letter) and are none of them.
POSITION_KEY = b"\x00position"
# + a state key: a key whose last changelog record below the position belongs to no accepted
# persist (torn or refused). The owner writes it again (a claim, or its next persist), so that
# compaction keeps an accepted record of it last; kept here so a restart does not forget it.
TORN_PREFIX = b"\x00torn:"


class StoreDamaged(Exception):
    """The local store cannot be trusted (it does not open, or its position record does not
    decode): it is rebuilt from the changelog."""


class _PositionBody(msgspec.Struct, forbid_unknown_fields=True, array_like=True):
    changelog_next_offset: int
    persist: bytes  # the checkpoint's persist id
    checkpoint: bytes  # the checkpoint record's value
    highest_epoch: int


@dataclass(frozen=True, slots=True)
class Position:
    """Where the store stands: every persist up to `checkpoint` is in it, and the changelog is
    to be read on from `changelog_next_offset` (the offset after that checkpoint's record).
    `highest_epoch`: the highest persist epoch of any record below that offset, accepted or not
    (a claim takes a greater one, so a torn record's id is never given to another persist)."""

    changelog_next_offset: int
    checkpoint: Checkpoint | None
    highest_epoch: int = 0

    @property
    def head(self) -> PersistId | None:
        return None if self.checkpoint is None else self.checkpoint.persist


EMPTY = Position(0, None)
_POSITION_DECODER = msgspec.msgpack.Decoder(_PositionBody)
_POSITION_ENCODER = msgspec.msgpack.Encoder()


def store_options() -> Any:
    """The RocksDB options of a partition's store (bench/state_bench.py measures with them)."""
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    return options


class PartitionStore:
    """Open with `open` (refuses a damaged store) or `open_or_rebuild` (wipes it, and the
    changelog rebuilds it). Reads see applied persists only."""

    def __init__(self, path: Path, db: Any, position: Position) -> None:
        self.path = path
        self._db = db
        self._position = position
        self._torn = {key[len(TORN_PREFIX) :] for key, _ in self._scan(TORN_PREFIX)}

    @classmethod
    def open(cls, path: Path) -> PartitionStore:
        try:
            db = Rdict(str(path), store_options())
        except Exception as exc:  # rocksdict raises plain Exceptions for corruption and locks
            raise StoreDamaged(f"{path}: {exc}") from None
        try:
            position = _read_position(db.get(POSITION_KEY))
        except StoreDamaged:
            db.close()
            raise
        return cls(path, db, position)

    @classmethod
    def open_or_rebuild(cls, path: Path) -> tuple[PartitionStore, str | None]:
        """The store, and why it was wiped (None when it opened as it was)."""
        try:
            return cls.open(path), None
        except StoreDamaged as exc:
            cls.destroy(path)
            return cls.open(path), str(exc)

    @staticmethod
    def destroy(path: Path) -> None:
        shutil.rmtree(path, ignore_errors=True)

    @property
    def position(self) -> Position:
        return self._position

    def apply(
        self,
        records: Sequence[DataRecord],
        checkpoint: Checkpoint,
        changelog_next_offset: int,
        highest_epoch: int = 0,
        torn: Collection[bytes] = (),
    ) -> None:
        """One persist, whole: its records and the position after its checkpoint in one write.
        `highest_epoch`: of the records below `changelog_next_offset` (never lowered). `torn`:
        keys whose last record below it is no accepted persist's (`torn_keys`); a key this
        persist writes is no longer torn."""
        if changelog_next_offset < self._position.changelog_next_offset:
            behind = self._position.changelog_next_offset
            raise ValueError(f"position {changelog_next_offset} is behind the store's {behind}")
        batch = WriteBatch(raw_mode=True)
        for record in records:
            if record.value is None:
                batch.delete(record.key)
            else:
                batch.put(record.key, record.value)
        written = {record.key for record in records}
        now_torn = (self._torn | set(torn)) - written
        for key in self._torn - now_torn:
            batch.delete(TORN_PREFIX + key)
        for key in now_torn - self._torn:
            batch.put(TORN_PREFIX + key, b"")
        epoch = max(highest_epoch, checkpoint.persist.epoch, self._position.highest_epoch)
        body = _PositionBody(
            changelog_next_offset,
            checkpoint.persist.encode(),
            encode_checkpoint(checkpoint).value or b"",
            epoch,
        )
        batch.put(POSITION_KEY, _POSITION_ENCODER.encode(body))
        self._db.write(batch)
        self._position = Position(changelog_next_offset, checkpoint, epoch)
        self._torn = now_torn

    def torn_keys(self) -> frozenset[bytes]:
        return frozenset(self._torn)

    def get(self, key: bytes) -> bytes | None:
        value: bytes | None = self._db.get(key)
        return value

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        values: list[bytes | None] = self._db.get(list(keys))
        return values

    def items(self, prefix: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
        """The state's (key, value) pairs in key order, those starting with `prefix`."""
        if prefix.startswith(b"\x00"):
            raise ValueError("state keys do not start with 0x00")
        return self._scan(prefix or b"\x01", everything_after=not prefix)

    def items_after(self, prefix: bytes, after: bytes | None, limit: int) -> list[tuple[bytes, bytes]]:
        """At most `limit` of the (key, value) pairs starting with `prefix` whose key is above
        `after` (None: from the first), in key order: one seek and `limit` steps."""
        if not prefix or prefix.startswith(b"\x00"):
            raise ValueError("a state key prefix, not empty and not 0x00")
        out: list[tuple[bytes, bytes]] = []
        if limit <= 0:
            return out
        iterator = self._db.iter()
        iterator.seek(prefix if after is None else after)
        if after is not None and iterator.valid() and iterator.key() == after:
            iterator.next()
        while iterator.valid() and len(out) < limit:
            key: bytes = iterator.key()
            if not key.startswith(prefix):
                break
            out.append((key, iterator.value()))
            iterator.next()
        return out

    def key_bounds(self, prefix: bytes) -> tuple[bytes, bytes] | None:
        """The first and the last key starting with `prefix` (None: there is none)."""
        if not prefix or prefix.startswith(b"\x00") or prefix.endswith(b"\xff"):
            raise ValueError("a state key prefix, not empty, not 0x00, not ending in 0xff")
        iterator = self._db.iter()
        iterator.seek(prefix)
        if not iterator.valid() or not iterator.key().startswith(prefix):
            return None
        first: bytes = iterator.key()
        # The key right after the prefix's range: its last byte + 1 (so seek_for_prev lands on
        # the range's last key).
        iterator.seek_for_prev(prefix[:-1] + bytes([prefix[-1] + 1]))
        if iterator.valid() and iterator.key() == prefix[:-1] + bytes([prefix[-1] + 1]):
            iterator.prev()
        last: bytes = iterator.key()
        return first, last

    def estimated_keys(self) -> int:
        """RocksDB's estimate of the keys it holds (every kind: rows, users, waiting entries)."""
        value = self._db.property_int_value("rocksdb.estimate-num-keys")
        return int(value) if value is not None else 0

    def _scan(self, prefix: bytes, everything_after: bool = False) -> Iterator[tuple[bytes, bytes]]:
        iterator = self._db.iter()
        iterator.seek(prefix)
        while iterator.valid():
            key: bytes = iterator.key()
            if not everything_after and not key.startswith(prefix):
                break
            yield key, iterator.value()
            iterator.next()

    def close(self) -> None:
        self._db.close()


def _read_position(raw: bytes | None) -> Position:
    if raw is None:
        return EMPTY
    try:
        body = _POSITION_DECODER.decode(raw)
        persist = PersistId.decode(body.persist)
        checkpoint = decode_checkpoint_value(persist, body.checkpoint)
    except (msgspec.DecodeError, RecordRefused) as exc:
        raise StoreDamaged(f"position record does not decode: {exc}") from None
    if body.changelog_next_offset < 0:
        raise StoreDamaged(f"negative changelog position {body.changelog_next_offset}")
    return Position(body.changelog_next_offset, checkpoint, body.highest_epoch)
