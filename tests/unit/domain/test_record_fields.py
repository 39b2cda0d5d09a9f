"""State records are read with their types checked, never coerced (issue 30): a compiled class
kept a bool given for an int as 1 and refused an int for a bool, where the interpreted class kept
what it was given. Run by both builds (scripts/test_compiled.sh runs tests/unit)."""

from __future__ import annotations

from typing import Any

import pytest

from app.domain.arrivals import ArrivalLedger
from app.domain.conversation import ConversationState
from app.domain.projector import UserState
from app.domain.watermark import WatermarkGate

CONV = "00000000-0000-0000-0000-000000000001"
ROW_FIELDS = ConversationState(1, CONV).dump()


def _row(**changes: Any) -> list[Any]:
    row = ConversationState(1, CONV)
    row.head_seq, row.pin_rank, row.mention_first, row.left_at = 5, 3, 4, 2
    for name, value in changes.items():
        setattr(row, name, value)
    return row.dump()


def _replaced(record: list[Any], index: int, value: Any) -> list[Any]:
    return [*record[:index], value, *record[index + 1 :]]


def test_a_valid_row_loads_as_it_was_dumped() -> None:
    record = _row(unread_count=3, muted=True, archived=False, unread_exact=False)
    assert ConversationState.load(record, 1, CONV).dump() == record


@pytest.mark.parametrize("index", range(1, len(ROW_FIELDS)))
@pytest.mark.parametrize("value", [True, False, 1, 1.0, "1", b"1", [1], {"a": 1}])
def test_each_row_field_refuses_values_of_another_type(index: int, value: Any) -> None:
    record = _row()
    kind = type(record[index])
    allowed = {int: (int,), bool: (bool,), str: (str,), bytes: (bytes,), type(None): ()}[kind]
    if kind is type(None):  # optional fields (None in this record): an int or a str is allowed
        allowed = (int, str, bytes)
    changed = _replaced(record, index, value)
    if type(value) in allowed:
        try:
            ConversationState.load(changed, 1, CONV)
        except (ValueError, IndexError) as exc:  # bytes that are not a seq set (pyroaring's error)
            assert str(exc)
        return
    with pytest.raises((ValueError, TypeError)):
        ConversationState.load(changed, 1, CONV)


@pytest.mark.parametrize("name", ["unread_count", "mention_count", "version", "base", "read_seq"])
def test_a_bool_for_an_int_is_refused_not_kept_as_one(name: str) -> None:
    record = _row()
    index = 1 + [
        "archived", "base", "changed_at", "deleted_before", "floor", "head_activity_id", "head_message_id",
        "head_seq", "hidden_before", "joined_at", "left_at", "membership", "mention_count", "mention_first",
        "muted", "pin_rank", "read_seq", "role", "unread_count", "unread_exact", "version", "writes",
    ].index(name)  # fmt: skip
    with pytest.raises(ValueError, match=f"{name}: expected an integer, got bool"):
        ConversationState.load(_replaced(record, index, True), 1, CONV)


@pytest.mark.parametrize("name", ["archived", "muted", "unread_exact"])
def test_an_int_for_a_bool_is_refused(name: str) -> None:
    index = {"archived": 1, "muted": 15, "unread_exact": 20}[name]
    with pytest.raises(ValueError, match=f"{name}: expected true or false, got int"):
        ConversationState.load(_replaced(_row(), index, 1), 1, CONV)


def test_user_gate_and_arrival_records_refuse_bools_and_floats() -> None:
    user = UserState(3).dump()
    assert UserState.load(user, []).dump() == user
    for key in ("user_id", "projection_mailbox_seq", "flushed_seq", "structure_version"):
        for value in (True, 1.0, "1"):
            with pytest.raises(ValueError, match=key):
                UserState.load({**user, key: value}, [])
    with pytest.raises(ValueError, match="badge"):
        UserState.load({**user, "badge": [0, True, 0]}, [])
    with pytest.raises(ValueError, match="badge"):
        UserState.load({**user, "badge": [0, 0]}, [])
    gate = {"marks": [3, None], "hi": 3}
    assert WatermarkGate.load(2, gate, []).dump() == gate
    for bad in ({"marks": [True, None], "hi": 3}, {"marks": [3, None], "hi": 3.0}, {"marks": "3", "hi": 3}):
        with pytest.raises(ValueError):
            WatermarkGate.load(2, bad, [])
    ledger = {"counted": [1], "covered": [1], "expected": [None], "base": [0], "unbased": [False]}
    assert ArrivalLedger.load(1, ledger, [None], []).dump() == ledger
    wrong: list[tuple[str, Any]] = [("counted", [True]), ("expected", [1.5]), ("unbased", [1]), ("base", 0)]
    for key, value in wrong:
        with pytest.raises(ValueError, match=key):
            ArrivalLedger.load(1, {**ledger, key: value}, [None], [])
