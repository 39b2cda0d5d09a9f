"""The changelog's record format: typed, validated, versioned.

A record is (key, value, headers): a kind byte then the state's key (app/worker/ports.py layouts);
the ``persist`` header names the persist that wrote it (headers survive compaction); a data value is
the state's blob or None (deleted), a checkpoint's a msgpack map (`CheckpointBody`). Decoding
refuses, with a reason, anything this version did not write (docs/durability.md, "What is stored
where").
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import msgspec

from app.worker.ports import pending_key, row_key, user_key

FORMAT_VERSION = 1
FORMAT_HEADER = "format"
PERSIST_HEADER = "persist"
_U64_MAX = (1 << 64) - 1

Headers = tuple[tuple[str, bytes], ...]


class RecordRefused(ValueError):
    """A changelog record this format does not accept; `reason` says why in one line."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Kind(enum.Enum):
    """The first byte of a changelog key, and the length of the key after it."""

    ROW = b"r"  # (user, conversation): user id 8 + conversation uuid 16
    USER = b"u"  # user id 8
    WAITING = b"w"  # an entry waiting above the watermark: user id 8 + mailbox_seq 8
    CHECKPOINT = b"c"  # one key per changelog partition: the latest persist's checkpoint


_KEY_LENGTHS = {Kind.ROW: 24, Kind.USER: 8, Kind.WAITING: 16, Kind.CHECKPOINT: 0}
_KINDS = {kind.value[0]: kind for kind in Kind}
CHECKPOINT_KEY = Kind.CHECKPOINT.value


@dataclass(frozen=True, slots=True, order=True)
class PersistId:
    """Names one persist. `epoch` is taken anew by every owner when it claims the partition
    (greater than every epoch its changelog holds); `seq` counts the owner's persists from 0 (the
    claim). Ordered: a later persist of a partition has a greater id."""

    epoch: int
    seq: int

    def __post_init__(self) -> None:
        if not (0 <= self.epoch <= _U64_MAX and 0 <= self.seq <= _U64_MAX):
            raise RecordRefused(f"persist id out of range: {self.epoch}.{self.seq}")

    def encode(self) -> bytes:
        return self.epoch.to_bytes(8, "big") + self.seq.to_bytes(8, "big")

    @classmethod
    def decode(cls, raw: bytes) -> PersistId:
        if len(raw) != 16:
            raise RecordRefused(f"a persist id has 16 bytes, not {len(raw)}")
        return cls(int.from_bytes(raw[:8], "big"), int.from_bytes(raw[8:], "big"))

    def __str__(self) -> str:
        return f"{self.epoch}.{self.seq}"


@dataclass(frozen=True, slots=True)
class InputIdentity:
    """What a checkpoint is a checkpoint of: the Kafka cluster, the mailbox-tail topic's
    incarnation (its topic id: a recreated topic has a new one) and its partition count (users
    map to partitions by it)."""

    cluster_id: str
    topic_id: str
    partition_count: int


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """The last record of a persist. `previous` is the persist it was built on (None only for
    a partition's very first persist): a reader accepts it only on top of that one.
    `input_next_offset` is the first mailbox-tail offset of this partition whose entry the
    state does not contain. `meta` is the worker's partition-level record (watermark lanes,
    flush bookkeeping), opaque here."""

    persist: PersistId
    previous: PersistId | None
    input_next_offset: int
    identity: InputIdentity
    meta: bytes = b""


class DataRecord(NamedTuple):
    """One state key written by a persist: `value` None deletes it. (A NamedTuple: a persist
    makes thousands of them, and a frozen dataclass costs several times more to build.)"""

    key: bytes
    value: bytes | None
    persist: PersistId

    @property
    def kind(self) -> Kind:
        return _KINDS[self.key[0]]


class WireRecord(NamedTuple):
    """A record as the changelog carries it."""

    key: bytes
    value: bytes | None
    headers: Headers


class _CheckpointBody(msgspec.Struct, forbid_unknown_fields=True, array_like=True):
    previous: bytes | None
    input_next_offset: int
    cluster_id: str
    topic_id: str
    partition_count: int
    meta: bytes


_CHECKPOINT_ENCODER = msgspec.msgpack.Encoder()
_CHECKPOINT_DECODER = msgspec.msgpack.Decoder(_CheckpointBody)
_FORMAT = bytes([FORMAT_VERSION])


_ROW, _USER, _WAITING = Kind.ROW.value, Kind.USER.value, Kind.WAITING.value


def row_state_key(user_id: int, conversation_id: str) -> bytes:
    return _ROW + row_key(user_id, conversation_id)


def user_state_key(user_id: int) -> bytes:
    return _USER + user_key(user_id)


def waiting_state_key(user_id: int, mailbox_seq: int) -> bytes:
    return _WAITING + pending_key(user_id, mailbox_seq)


def check_key(key: bytes) -> Kind:
    """The kind of a state key; refused when it names none or has the wrong length."""
    if not key:
        raise RecordRefused("empty key")
    kind = _KINDS.get(key[0])
    if kind is None:
        raise RecordRefused(f"unknown key kind {key[:1]!r}")
    if len(key) - 1 != _KEY_LENGTHS[kind]:
        raise RecordRefused(f"a {kind.name} key has {_KEY_LENGTHS[kind] + 1} bytes, not {len(key)}")
    return kind


def _headers(persist: PersistId) -> Headers:
    return ((FORMAT_HEADER, _FORMAT), (PERSIST_HEADER, persist.encode()))


def encode_data(record: DataRecord) -> WireRecord:
    if check_key(record.key) is Kind.CHECKPOINT:
        raise RecordRefused("a data record cannot use the checkpoint key")
    return WireRecord(record.key, record.value, _headers(record.persist))


def encode_checkpoint(checkpoint: Checkpoint) -> WireRecord:
    if checkpoint.input_next_offset < 0:
        raise RecordRefused(f"negative input offset {checkpoint.input_next_offset}")
    if checkpoint.previous is not None and checkpoint.previous >= checkpoint.persist:
        raise RecordRefused(f"persist {checkpoint.persist} is not after {checkpoint.previous}")
    identity = checkpoint.identity
    body = _CheckpointBody(
        previous=None if checkpoint.previous is None else checkpoint.previous.encode(),
        input_next_offset=checkpoint.input_next_offset,
        cluster_id=identity.cluster_id,
        topic_id=identity.topic_id,
        partition_count=identity.partition_count,
        meta=checkpoint.meta,
    )
    return WireRecord(CHECKPOINT_KEY, _CHECKPOINT_ENCODER.encode(body), _headers(checkpoint.persist))


def encode_persist(records: Sequence[DataRecord], checkpoint: Checkpoint) -> list[WireRecord]:
    """One persist's records in produce order: its data, then its checkpoint, last. The same
    checks as `encode_data`, with the headers built once."""
    persist = checkpoint.persist
    headers = _headers(persist)
    wire: list[WireRecord] = []
    for key, value, owner in records:
        if owner != persist:
            raise RecordRefused(f"record of persist {owner} in persist {persist}")
        kind = _KINDS.get(key[0]) if key else None
        if kind is None or kind is Kind.CHECKPOINT or len(key) - 1 != _KEY_LENGTHS[kind]:
            check_key(key)  # raises with the reason
            raise RecordRefused("a data record cannot use the checkpoint key")
        wire.append(WireRecord(key, value, headers))
    wire.append(encode_checkpoint(checkpoint))
    return wire


def decode_checkpoint_value(persist: PersistId, value: bytes) -> Checkpoint:
    try:
        body = _CHECKPOINT_DECODER.decode(value)
    except msgspec.DecodeError as exc:
        raise RecordRefused(f"checkpoint does not decode: {exc}") from None
    if body.input_next_offset < 0 or body.partition_count < 0:
        raise RecordRefused("checkpoint with a negative offset or partition count")
    previous = None if body.previous is None else PersistId.decode(body.previous)
    if previous is not None and previous >= persist:
        raise RecordRefused(f"checkpoint {persist} names a later or equal previous {previous}")
    identity = InputIdentity(body.cluster_id, body.topic_id, body.partition_count)
    return Checkpoint(persist, previous, body.input_next_offset, identity, body.meta)


def decode(
    key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes]]
) -> DataRecord | Checkpoint:
    """A changelog record as this format reads it; `RecordRefused` with the reason otherwise."""
    if key is None:
        raise RecordRefused("record without a key")
    kind = check_key(key)
    found = dict(headers)
    if found.get(FORMAT_HEADER) != _FORMAT:
        raise RecordRefused(f"format header {found.get(FORMAT_HEADER)!r}, this reader reads {_FORMAT!r}")
    raw_persist = found.get(PERSIST_HEADER)
    if raw_persist is None:
        raise RecordRefused("no persist header")
    persist = PersistId.decode(raw_persist)
    if kind is Kind.CHECKPOINT:
        if value is None:
            raise RecordRefused("checkpoint without a value")
        return decode_checkpoint_value(persist, value)
    return DataRecord(key, value, persist)
