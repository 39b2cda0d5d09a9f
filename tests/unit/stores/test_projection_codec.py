"""The projection store's batch encoding: plain batches pass in one test, and anything else is
checked field by field, with the same errors in the same order as always (a bad row first)."""

from __future__ import annotations

import enum
from types import SimpleNamespace
from typing import Any, cast

import orjson
import pytest

from app.domain.badge import Badge
from app.domain.flush import UserFlush
from app.stores.projection_codec import U64_LIMIT, EncodedBatch, encode_batches

CONV = "5eed0000-0000-0000-0000-000000000001"


def _flush(**overrides: Any) -> UserFlush:
    fields: dict[str, Any] = {
        "user_id": 7,
        "rows": [{"conversation_id": CONV, "unread_count": 2}],
        "badge": Badge(2, 1, 0),
        "projection_mailbox_seq": 40,
        "prev_projection_mailbox_seq": 30,
        "structure_version": 3,
        "driving_event_id": "e-40",
        "driving_mailbox_seq": 40,
    }
    fields.update(overrides)
    return UserFlush(**fields)


class Small(enum.IntEnum):
    SEVEN = 7


def test_a_plain_batch_is_encoded_whole() -> None:
    assert encode_batches([_flush()]) == [
        EncodedBatch(
            user_id=7,
            version=40,
            structure_version=3,
            total_unread=2,
            total_mention=1,
            muted_unread=0,
            rows=[(CONV, orjson.dumps({"conversation_id": CONV, "unread_count": 2}))],
        )
    ]


def test_an_int_subclass_other_than_bool_is_still_accepted() -> None:
    (encoded,) = encode_batches([_flush(user_id=Small.SEVEN, badge=Badge(Small.SEVEN, 0, 0))])
    assert (encoded.user_id, encoded.total_unread) == (7, 7)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"user_id": -1}, "user_id must be an int in [0, "),
        ({"user_id": True}, "user_id must be an int"),
        ({"projection_mailbox_seq": 0}, "user 7: projection_mailbox_seq must be an int in [1, "),
        ({"projection_mailbox_seq": U64_LIMIT}, "user 7: projection_mailbox_seq"),
        ({"structure_version": "3"}, "user 7: structure_version"),
        ({"badge": Badge(U64_LIMIT, 0, 0)}, "user 7: total_unread"),
        ({"badge": Badge(0, 0.5, 0)}, "user 7: total_mention"),  # type: ignore[arg-type]
        ({"badge": Badge(0, 0, None)}, "user 7: muted_unread"),  # type: ignore[arg-type]
        ({"rows": [{"unread_count": 1}]}, "user 7: every row needs a conversation_id string"),
        # Both wrong: the row is said first (its check came first before the fast path too).
        ({"rows": [{"conversation_id": ""}], "projection_mailbox_seq": 0}, "user 7: every row needs"),
    ],
)
def test_a_bad_field_is_named(overrides: dict[str, Any], message: str) -> None:
    # The bad batch is a stand-in with UserFlush's attributes: in the compiled build UserFlush
    # itself refuses a str where an int belongs, and keeps True as the int 1; the codec's own
    # checks are what is tested here, in both builds.
    fields = {name: getattr(_flush(), name) for name in UserFlush.__dataclass_fields__}
    bad = cast(UserFlush, SimpleNamespace(**{**fields, **overrides}))
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(")):
        encode_batches([_flush(), bad])
