"""A row's changelog record: `ConversationState.dump` writes the fields in the order `load` reads
them (both spelled out field by field for speed, so a field added to one and not the other, or
two fields swapped, must fail here)."""

from __future__ import annotations

from typing import Any

from app.domain import seqs
from app.domain.conversation import (
    _BITMAP_FIELDS,
    _PLAIN_FIELDS,
    _RECORD_FORMAT,
    ConversationState,
    pack_head_ids,
)

CONV = "5eed0000-0000-0000-0000-000000000001"


def _distinct_row() -> ConversationState:
    """A row whose every field holds a value no other field holds."""
    row = ConversationState(7, CONV)
    strings = {"membership": "left", "role": "admin"}
    for number, name in enumerate(_PLAIN_FIELDS, start=101):
        if name in ("head_activity_id", "head_message_id"):
            continue  # properties over `head_ids`
        if name in strings:
            setattr(row, name, strings[name])
        elif isinstance(getattr(row, name), bool):
            setattr(row, name, True)
        else:
            setattr(row, name, number)
    row.marked_unread = True
    row.fast_writes = 99
    row.head_ids = pack_head_ids("m-distinct", "019b76dc2ea100000000000000000042")
    for low, name in enumerate(_BITMAP_FIELDS, start=1):
        setattr(row, name, seqs.add_range(None, low * 1000, low * 1000 + low))
    return row


def test_the_record_holds_the_fields_in_their_declared_order() -> None:
    row = _distinct_row()
    expected: list[Any] = [
        _RECORD_FORMAT,
        *(getattr(row, name) for name in _PLAIN_FIELDS),
        *(seqs.dump(getattr(row, name)) for name in _BITMAP_FIELDS),
        row.marked_unread,  # format 3: docs/contract.md §10's field
        row.fast_writes,  # format 4: the fast lane's writes (§10), last
    ]
    assert row.dump() == expected


def test_a_loaded_record_gives_back_every_field() -> None:
    row = _distinct_row()
    loaded = ConversationState.load(row.dump(), row.user_id, row.conversation_id)
    for name in _PLAIN_FIELDS:
        assert getattr(loaded, name) == getattr(row, name), name
    for name in _BITMAP_FIELDS:
        assert seqs.dump(getattr(loaded, name)) == seqs.dump(getattr(row, name)), name
    assert loaded.dump() == row.dump()
    assert loaded.marked_unread is True
    assert loaded.fast_writes == 99


def test_a_format_3_record_loads_with_no_fast_writes() -> None:
    """Records written before the fast lane counted its writes (format 3, one field shorter)."""
    row = _distinct_row()
    old = [3, *row.dump()[1:-1]]
    loaded = ConversationState.load(old, row.user_id, row.conversation_id)
    assert loaded.marked_unread is True
    assert loaded.fast_writes == 0
    assert loaded.dump()[1:-1] == old[1:]


def test_a_format_2_record_loads_not_marked() -> None:
    """Records written before marked_unread (format 2, two fields shorter) still load."""
    row = _distinct_row()
    old = [2, *row.dump()[1:-2]]
    loaded = ConversationState.load(old, row.user_id, row.conversation_id)
    assert loaded.marked_unread is False
    assert loaded.fast_writes == 0
    assert loaded.dump()[1:-2] == old[1:]


def test_a_record_of_the_wrong_length_is_refused() -> None:
    row = _distinct_row()
    for record in ([4, *row.dump()[1:-1]], [3, *row.dump()[1:]], [2, *row.dump()[1:-1]]):
        try:
            ConversationState.load(record, row.user_id, row.conversation_id)
        except ValueError:
            continue
        raise AssertionError(f"loaded a record of {len(record)} fields")
