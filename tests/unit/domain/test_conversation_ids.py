"""Remembered conversation ids parse exactly as uuid.UUID does, and refuse what it refuses."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.domain.conversation_ids import conversation_uuid, conversation_uuid_bytes


@given(st.uuids())
def test_a_remembered_id_is_the_parsed_one(value: uuid.UUID) -> None:
    for text in (str(value), str(value).upper(), value.hex):
        assert conversation_uuid(text) == uuid.UUID(text)
        assert conversation_uuid_bytes(text) == uuid.UUID(text).bytes
        assert conversation_uuid(text) is conversation_uuid(text)  # once parsed, shared


@pytest.mark.parametrize("text", ["", "not-a-uuid", "5eed0000-0000-0000-0000-00000000000", "z" * 32])
def test_an_id_uuid_refuses_is_refused_every_time(text: str) -> None:
    for _ in range(2):  # a failure is not remembered as a value
        with pytest.raises(ValueError):
            conversation_uuid(text)
        with pytest.raises(ValueError):
            conversation_uuid_bytes(text)
