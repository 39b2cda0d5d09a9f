"""A row's head ids are held packed (one bytes object) and must come back exactly as given: in the
projection row, in the row's record, whatever the ids look like."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.domain.conversation import ConversationState, head_activity_id, head_message_id, pack_head_ids
from app.domain.entries import MessageEntry
from app.stores.memory_messages import InMemoryMessageStore

CONV = "5eed0000-0000-0000-0000-000000000001"
ACTIVITY = "019b76dc2ea100000000000000000001"

ids = st.one_of(st.none(), st.text(), st.sampled_from([ACTIVITY, ACTIVITY.upper(), "", "\udc80", "a" * 32]))


@given(message_id=ids, activity_id=ids)
def test_packed_ids_give_back_what_was_packed(message_id: str | None, activity_id: str | None) -> None:
    packed = pack_head_ids(message_id, activity_id)
    if message_id is None and activity_id is None:
        assert packed is None
        return
    assert packed is not None
    assert head_message_id(packed) == message_id
    assert head_activity_id(packed) == activity_id


@pytest.mark.parametrize(
    ("message_id", "activity_id", "compact"),
    [
        ("m-1", ACTIVITY, True),  # the checked form: 16 bytes of activity id
        ("m-1", ACTIVITY.upper(), False),  # not lowercase: kept as given
        ("m-1", "0" * 31 + " ", False),  # fromhex would skip the space
        ("m-1", None, False),
    ],
)
def test_only_a_lowercase_hex_activity_id_is_stored_as_bytes(
    message_id: str, activity_id: str | None, compact: bool
) -> None:
    packed = pack_head_ids(message_id, activity_id)
    assert packed is not None
    assert (len(packed) == 1 + 16 + len(message_id)) is compact
    assert (head_message_id(packed), head_activity_id(packed)) == (message_id, activity_id)


def _message(user_id: int, seq: int, message_id: str, activity_id: str) -> MessageEntry:
    line = {
        "type": "message",
        "mailbox_seq": seq,
        "lane": 0,
        "ts": 1_767_225_600_000 + seq,
        "event_id": f"e{seq}",
        "user_id": user_id,
        "conversation_id": CONV,
        "conversation_seq": seq,
        "message_id": message_id,
        "activity_id": activity_id,
        "sender_id": 99,
        "created_at": 1_767_225_600_000 + seq,
        "counts_unread": True,
        "mention": False,
    }
    return msgspec.json.decode(msgspec.json.encode(line), type=MessageEntry)


def test_a_row_shows_and_persists_its_head_as_strings() -> None:
    store = InMemoryMessageStore()
    rows = [ConversationState(user_id, CONV) for user_id in (1, 2)]
    for row in rows:
        row.apply_message(_message(row.user_id, 3, "m-3", ACTIVITY), store, 100)
    out = rows[0].as_row()
    assert (out["last_message_id"], out["last_activity_id"], out["latest_conversation_seq"]) == (
        "m-3",
        ACTIVITY,
        3,
    )
    # A fan-out's rows share one packed object.
    assert rows[0].head_ids is rows[1].head_ids
    record = rows[0].dump()
    assert "m-3" in record and ACTIVITY in record  # the record keeps the strings (its format)
    loaded = ConversationState.load(record, 1, CONV)
    assert loaded.as_row() == out
    assert loaded.copy().as_row() == out
