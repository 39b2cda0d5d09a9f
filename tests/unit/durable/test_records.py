from __future__ import annotations

import pytest

from tables.durable.records import (
    CHECKPOINT_KEY,
    FORMAT_HEADER,
    PERSIST_HEADER,
    Checkpoint,
    DataRecord,
    InputIdentity,
    PersistId,
    RecordRefused,
    decode,
    encode_checkpoint,
    encode_data,
    encode_persist,
    row_state_key,
    user_state_key,
    waiting_state_key,
)

CONVERSATION = "00000000-0000-4000-8000-000000000001"
IDENTITY = InputIdentity("cluster", "topic", 4)
P1 = PersistId(3, 7)


def test_data_records_and_tombstones_round_trip() -> None:
    for key in (row_state_key(1, CONVERSATION), user_state_key(2), waiting_state_key(3, 99)):
        for value in (b"blob", None):
            wire = encode_data(DataRecord(key, value, P1))
            assert decode(wire.key, wire.value, wire.headers) == DataRecord(key, value, P1)


def test_checkpoint_round_trips() -> None:
    checkpoint = Checkpoint(P1, PersistId(3, 6), 1234, IDENTITY, b"meta")
    wire = encode_checkpoint(checkpoint)
    assert wire.key == CHECKPOINT_KEY
    assert decode(wire.key, wire.value, wire.headers) == checkpoint
    first = Checkpoint(PersistId(1, 0), None, 0, IDENTITY)
    wire = encode_checkpoint(first)
    assert decode(wire.key, wire.value, wire.headers) == first


def test_persist_ids_order_epoch_first() -> None:
    assert PersistId(1, 99) < PersistId(2, 0) < PersistId(2, 1)
    assert PersistId.decode(P1.encode()) == P1


def test_a_persist_ends_with_its_checkpoint() -> None:
    records = [DataRecord(user_state_key(1), b"u", P1), DataRecord(user_state_key(2), None, P1)]
    wire = encode_persist(records, Checkpoint(P1, None, 5, IDENTITY))
    assert [w.key for w in wire] == [user_state_key(1), user_state_key(2), CHECKPOINT_KEY]
    with pytest.raises(RecordRefused, match="in persist"):
        encode_persist(
            [DataRecord(user_state_key(1), b"u", PersistId(3, 8))], Checkpoint(P1, None, 5, IDENTITY)
        )


GOOD = encode_data(DataRecord(user_state_key(1), b"u", P1))
GOOD_HEADERS = dict(GOOD.headers)
GOOD_CHECKPOINT = encode_checkpoint(Checkpoint(P1, None, 5, IDENTITY))


@pytest.mark.parametrize(
    ("key", "value", "headers", "reason"),
    [
        (None, b"x", GOOD.headers, "without a key"),
        (b"", b"x", GOOD.headers, "empty key"),
        (b"z" + bytes(8), b"x", GOOD.headers, "unknown key kind"),
        (b"u" + bytes(7), b"x", GOOD.headers, "a USER key has 9 bytes"),
        (b"r" + bytes(8), b"x", GOOD.headers, "a ROW key has 25 bytes"),
        (GOOD.key, b"x", ((PERSIST_HEADER, GOOD_HEADERS[PERSIST_HEADER]),), "format header"),
        (GOOD.key, b"x", ((FORMAT_HEADER, b"\x02"), (PERSIST_HEADER, P1.encode())), "format header"),
        (GOOD.key, b"x", ((FORMAT_HEADER, b"\x01"),), "no persist header"),
        (GOOD.key, b"x", ((FORMAT_HEADER, b"\x01"), (PERSIST_HEADER, b"short")), "16 bytes"),
        (CHECKPOINT_KEY, None, GOOD_CHECKPOINT.headers, "checkpoint without a value"),
        (CHECKPOINT_KEY, b"\xc1garbage", GOOD_CHECKPOINT.headers, "does not decode"),
        (
            CHECKPOINT_KEY,
            GOOD_CHECKPOINT.value,
            ((FORMAT_HEADER, b"\x01"), (PERSIST_HEADER, bytes(16))),
            "previous",
        ),
    ],
)
def test_records_not_in_this_format_are_refused_with_a_reason(
    key: bytes | None, value: bytes | None, headers: tuple[tuple[str, bytes], ...], reason: str
) -> None:
    if reason == "previous":
        # A checkpoint naming a previous persist at or after itself.
        value = encode_checkpoint(Checkpoint(PersistId(5, 0), PersistId(4, 0), 1, IDENTITY)).value
        headers = ((FORMAT_HEADER, b"\x01"), (PERSIST_HEADER, PersistId(4, 0).encode()))
    with pytest.raises(RecordRefused, match=reason):
        decode(key, value, headers)


def test_encoding_refuses_what_decoding_would() -> None:
    with pytest.raises(RecordRefused, match="checkpoint key"):
        encode_data(DataRecord(CHECKPOINT_KEY, b"x", P1))
    with pytest.raises(RecordRefused, match="negative"):
        encode_checkpoint(Checkpoint(P1, None, -1, IDENTITY))
    with pytest.raises(RecordRefused, match="not after"):
        encode_checkpoint(Checkpoint(P1, P1, 1, IDENTITY))
    with pytest.raises(RecordRefused, match="out of range"):
        PersistId(-1, 0)
