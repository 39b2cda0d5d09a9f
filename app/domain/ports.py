"""Ports: what the pure core needs from the outside world, as Protocols.

Adapters (in-memory for replay, Cassandra for the worker) implement them; one contract test
suite runs against every implementation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol


class StoredMessage(NamedTuple):
    """One message as the MessageStore knows it (the authority for recomputes)."""

    conversation_seq: int
    message_id: str
    activity_id: str
    sender_id: int
    counts_unread: bool
    recalled: bool  # recalled or deleted for everyone: it never counts
    mentions: frozenset[int]  # users the message mentions (@all included)


class MessageStore(Protocol):
    """Read side of the MessageStore, as the core uses it."""

    def range(self, conversation_id: str, after_seq: int, upto_seq: int) -> Sequence[StoredMessage]:
        """Messages with `after_seq < conversation_seq <= upto_seq`, ascending.

        One single-partition range read; callers bound the width (unread_precise_limit).
        """
        ...

    def get(self, conversation_id: str, conversation_seq: int) -> StoredMessage | None:
        """One message, or None when the store does not hold it."""
        ...
