"""A chunk of raw records decoded in one call: the replay and worker intake's hot loop.

`decode_records` is `decode_record` (app/domain/entries.py) of each record, with the common case
(a valid message whose conversation and activity ids were checked before) accepted in the loop
itself. A module of its own because entries.py stays interpreted in the compiled build (its
msgspec Struct classes with `tag=` must stay Python classes), while this loop is compiled
(setup.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import msgspec

from app.domain.entries import (
    MAX_RECORD_BYTES,
    MESSAGE_QUOTES,
    SEQ_MAX,
    DeadLetter,
    MessageEntry,
    Record,
    WatermarkMarker,
    checked,
    decode_json,
    decode_record,
    known_activities,
    known_conversations,
)

_MAX_BYTES: Final = MAX_RECORD_BYTES
_SEQ_MAX: Final = SEQ_MAX


def decode_records(raws: Sequence[bytes], lanes: int) -> list[Record | DeadLetter]:
    """`decode_record` of each record of a chunk, in order."""
    return decode_chunk(raws, lanes)[0]


def decode_chunk(raws: Sequence[bytes], lanes: int) -> tuple[list[Record | DeadLetter], list[int]]:
    """`decode_record` of each record of a chunk, in order, and the indexes of the markers and
    dead letters among them (what splits the entries into runs: the processor takes each run
    between two of them as one slice). A valid message whose ids were checked before (the
    conditions are `checked`'s, with its caches) is accepted here; any other record takes the
    full path."""
    decode = decode_json
    conversations = known_conversations
    activities = known_activities
    quotes = MESSAGE_QUOTES
    unset = msgspec.UNSET
    message_kind = MessageEntry
    marker_kind = WatermarkMarker
    dead_letter_kind = DeadLetter
    decoded: list[Record | DeadLetter] = []
    stops: list[int] = []
    append = decoded.append
    # The ids of the last message accepted here: a message fans out to every member, one record
    # each, so the next record most often names the same ones (a compare, not a set lookup).
    # None until a message is accepted: any str sentinel is a value a record can carry (an empty
    # conversation_id and activity_id matched a "" sentinel and were applied, unchecked).
    last_conversation: str | None = None
    last_activity: str | None = None
    for raw in raws:
        if not raw or len(raw) > _MAX_BYTES:
            stops.append(len(decoded))  # a dead letter
            append(decode_record(raw, lanes))
            continue
        try:
            record = decode(raw)
        except (msgspec.DecodeError, RecursionError):
            stops.append(len(decoded))  # a dead letter
            append(decode_record(raw, lanes))  # decoded again for the reason: rare
            continue
        if type(record) is message_kind:
            message: MessageEntry = record  # narrowed above
            conversation_id = message.conversation_id
            activity_id = message.activity_id
            # decode_record's checks of a message, inline (a call per entry costs here): the
            # int bound as its OR over _MESSAGE_INTS, the ids through `checked`'s caches.
            if (
                message.lane < lanes
                and (
                    message.mailbox_seq
                    | message.ts
                    | message.user_id
                    | message.conversation_seq
                    | message.sender_id
                    | message.created_at
                )
                <= _SEQ_MAX
                and (conversation_id == last_conversation or conversation_id in conversations)
                and (activity_id == last_activity or activity_id in activities)
                and raw.count(b'"')
                # The optional fields (none of them text) add their key's two quotes each: the
                # fast lane's urgent and member_count are on most messages of some producers.
                == quotes
                + (message.urgent is not unset) * 2
                + (message.member_count is not unset) * 2
                + (message.notification is not unset) * 2
            ):
                append(message)
                last_conversation = conversation_id
                last_activity = activity_id
                continue
        result = checked(record, raw, lanes)
        kind = type(result)
        if kind is marker_kind or kind is dead_letter_kind:
            stops.append(len(decoded))
        append(result)
    return decoded, stops
