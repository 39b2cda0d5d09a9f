"""Conversation ids parsed once: the canonical string a conversation id travels as, to the UUID
that Cassandra's driver binds and to the 16 bytes the changelog keys hold.

A persist keys every changed row by its conversation's 16 bytes and the Cassandra mirror binds
every written row's UUID: at a 100 ms window that is a parse per entry (uuid.UUID's parser is
~1 µs) of ids that repeat (a conversation's every member, every message). Remembered for the
most recent conversations; an id that does not parse raises ValueError as uuid.UUID does (and
is not remembered).

Stdlib only (the domain core stays pure).
"""

from __future__ import annotations

import functools
import uuid
from typing import Final

# Conversations remembered: ~300 bytes each (the string key, the UUID, its bytes).
REMEMBERED: Final = 1 << 15


@functools.lru_cache(maxsize=REMEMBERED)
def conversation_uuid(conversation_id: str) -> uuid.UUID:
    """uuid.UUID(conversation_id), shared (a UUID is immutable)."""
    return uuid.UUID(conversation_id)


@functools.lru_cache(maxsize=REMEMBERED)
def conversation_uuid_bytes(conversation_id: str) -> bytes:
    """uuid.UUID(conversation_id).bytes."""
    return conversation_uuid(conversation_id).bytes
