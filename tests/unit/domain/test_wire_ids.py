"""Ids towards clients (docs/contract.md §9): u64 ids as decimal strings, and back, exactly."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.domain.wire_ids import (
    frame_from_client,
    frame_to_client,
    id_text,
    parse_id,
    row_from_client,
    row_json_to_client,
    row_to_client,
)

JS_UNSAFE = 11982011376358104761


@given(st.integers(0, 2**64 - 1))
def test_every_u64_round_trips_through_its_string(user_id: int) -> None:
    assert parse_id(id_text(user_id)) == user_id
    row = {"user_id": user_id, "conversation_id": "c", "unread_count": 3}
    stored = orjson.dumps(row)
    sent = row_json_to_client(stored)
    assert orjson.loads(sent) == {**row, "user_id": str(user_id)} == row_to_client(row)
    assert row_from_client(orjson.loads(sent)) == row


def test_the_byte_rewrite_touches_only_the_user_id_key() -> None:
    row = {
        "last_message_id": '"user_id":5',  # inside a string every quote is escaped
        "sender_user_id": 9,
        "user_id": JS_UNSAFE,
        "mention_count": 1,
    }
    sent = orjson.loads(row_json_to_client(orjson.dumps(row)))
    assert sent == {**row, "user_id": "11982011376358104761"}
    already = orjson.dumps(sent)
    assert row_json_to_client(already) == already  # converting twice changes nothing


def test_frames_convert_the_frame_and_its_rows_and_back() -> None:
    frame = {
        "type": "SESSION_DELTA",
        "user_id": JS_UNSAFE,
        "projection_mailbox_seq": 9,
        "prev_projection_mailbox_seq": 4,
        "conversations": [{"user_id": JS_UNSAFE, "conversation_id": "a"}],
    }
    sent = frame_to_client(frame)
    assert sent["user_id"] == "11982011376358104761"
    assert sent["conversations"][0]["user_id"] == "11982011376358104761"
    assert sent["projection_mailbox_seq"] == 9  # versions stay numbers
    assert frame_from_client(orjson.loads(orjson.dumps(sent))) == frame


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "-1",
        "+1",
        "007",
        " 7",
        "7 ",
        "٣",
        "0x10",
        "1e3",
        "18446744073709551616",
        -1,
        2**64,
        True,
        1.0,
        None,
    ],
)
def test_anything_but_a_canonical_u64_is_refused(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_id(bad)


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["user_id", "x"]), inner, max_size=2)
    ),
    max_leaves=6,
)


@given(
    st.integers(0, 2**64 - 1),
    st.integers(0, 2**64 - 1),
    st.dictionaries(
        st.sampled_from(["a", "sender_user_id", "user_id", "title", "z"]), _JSON_VALUES, max_size=5
    ),
    st.booleans(),
)
def test_the_search_for_the_expected_user_id_rewrites_exactly_as_the_pattern(
    user_id: int, other: int, fields: dict[str, object], first: bool
) -> None:
    """The cold load's fast path (the row's expected user_id given) changes nothing: rows of
    this user, of another, already converted, with lookalike keys and nested user_ids."""
    for value in (user_id, other, str(user_id)):
        row = {"user_id": value, **fields} if first else {**fields, "user_id": value}
        stored = orjson.dumps(row)
        assert row_json_to_client(stored, user_id) == row_json_to_client(stored)
