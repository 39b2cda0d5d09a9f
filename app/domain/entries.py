"""Mailbox entries: the typed wire contract (DESIGN §2) and its one validating decoder.

Raw bytes are decoded exactly once, straight into frozen typed structs (msgspec, a tagged
union on `type`). Anything that does not fit becomes a `DeadLetter` with a readable reason;
no exception leaves `decode_record`.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

U64_MAX = 2**64 - 1
U32_MAX = 2**32 - 1

U64 = Annotated[int, msgspec.Meta(ge=0)]  # upper bound: msgspec refuses ints past u64
U32 = Annotated[int, msgspec.Meta(ge=0, le=U32_MAX)]
Positive = Annotated[int, msgspec.Meta(ge=1, le=2**63 - 1)]
NonNegative = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
# conversation_id and activity_id are checked after decoding (see `_id_problem`): a regex in
# the decoder costs more than the rest of the decode, and conversation ids repeat (cached).
ConversationId = str
ActivityId = str

Membership = Literal["active", "left", "removed"]
Role = Literal["owner", "admin", "member"]


class _Entry(msgspec.Struct, frozen=True, tag_field="type", kw_only=True, gc=False):
    """Fields every mailbox entry carries."""

    mailbox_seq: Positive
    lane: NonNegative
    ts: NonNegative
    event_id: str
    user_id: U64
    conversation_id: ConversationId


class MessageEntry(_Entry, frozen=True, tag="message"):
    conversation_seq: Positive
    message_id: str
    activity_id: ActivityId
    sender_id: U64
    created_at: NonNegative
    counts_unread: bool
    mention: bool


class ReadEntry(_Entry, frozen=True, tag="read"):
    read_conversation_seq: NonNegative


class RecallEntry(_Entry, frozen=True, tag="recall"):
    target_conversation_seq: Positive
    target_sender_id: U64
    target_counts_unread: bool
    target_mention: bool


class DeleteMessageEntry(_Entry, frozen=True, tag="delete_message"):
    target_conversation_seq: Positive
    target_sender_id: U64
    target_counts_unread: bool
    target_mention: bool


class JoinEntry(_Entry, frozen=True, tag="join"):
    joined_at_conversation_seq: NonNegative
    role: Role = "member"


class LeaveEntry(_Entry, frozen=True, tag="leave"):
    left_at_conversation_seq: NonNegative
    reason: Literal["left", "removed"]


class PinEntry(_Entry, frozen=True, tag="pin"):
    pin_rank: U32


class UnpinEntry(_Entry, frozen=True, tag="unpin"):
    pass


class ArchiveEntry(_Entry, frozen=True, tag="archive"):
    pass


class UnarchiveEntry(_Entry, frozen=True, tag="unarchive"):
    pass


class MuteEntry(_Entry, frozen=True, tag="mute"):
    pass


class UnmuteEntry(_Entry, frozen=True, tag="unmute"):
    pass


class ClearHistoryEntry(_Entry, frozen=True, tag="clear_history"):
    hidden_before_conversation_seq: NonNegative


class DeleteConversationEntry(_Entry, frozen=True, tag="delete_conversation"):
    deleted_before_conversation_seq: NonNegative


class MailboxDirtyEntry(_Entry, frozen=True, tag="mailbox_dirty"):
    pass


class WatermarkMarker(msgspec.Struct, frozen=True, tag_field="type", tag="watermark", kw_only=True, gc=False):
    """In-band control record: lane `lane` has written every entry with mailbox_seq <= watermark."""

    lane: NonNegative
    watermark: NonNegative
    ts: NonNegative


Entry = (
    MessageEntry
    | ReadEntry
    | RecallEntry
    | DeleteMessageEntry
    | JoinEntry
    | LeaveEntry
    | PinEntry
    | UnpinEntry
    | ArchiveEntry
    | UnarchiveEntry
    | MuteEntry
    | UnmuteEntry
    | ClearHistoryEntry
    | DeleteConversationEntry
    | MailboxDirtyEntry
)
Record = Entry | WatermarkMarker

ENTRY_TYPES: tuple[str, ...] = (
    "message",
    "read",
    "recall",
    "delete_message",
    "join",
    "leave",
    "pin",
    "unpin",
    "archive",
    "unarchive",
    "mute",
    "unmute",
    "clear_history",
    "delete_conversation",
    "mailbox_dirty",
)


class DeadLetter(msgspec.Struct, frozen=True):
    """A record that failed validation, with why. It never reaches the state."""

    reason: str
    raw: bytes


_decoder: msgspec.json.Decoder[Record] = msgspec.json.Decoder(Record)


def decode_record(raw: bytes, lanes: int) -> Record | DeadLetter:
    """Decode one wire record; every failure becomes a `DeadLetter` with a reason."""
    try:
        record = _decoder.decode(raw)
    except msgspec.DecodeError as exc:
        return DeadLetter(reason=_reason(exc, raw), raw=raw)
    if record.lane >= lanes:
        return DeadLetter(reason=f"lane {record.lane} out of range [0, {lanes})", raw=raw)
    kind = type(record)
    if kind is WatermarkMarker:
        return record
    entry: Entry = record  # type: ignore[assignment]  # narrowed by the `is` check above
    if (
        entry.user_id > U64_MAX
        or (kind is MessageEntry and entry.sender_id > U64_MAX)  # type: ignore[union-attr]
        or (kind in _RECALL_KINDS and entry.target_sender_id > U64_MAX)  # type: ignore[union-attr]
    ):
        return DeadLetter(reason=f"Expected `int` <= {U64_MAX} - at {_u64_field(entry)}", raw=raw)
    conversation_id = entry.conversation_id
    if conversation_id not in _known_conversations:
        if not _is_uuid(conversation_id):
            return DeadLetter(reason=f"conversation_id is not a UUID: {conversation_id[:64]!r}", raw=raw)
        if conversation_id != conversation_id.lower():
            # Canonical form is lowercase: one conversation must have one key.
            return msgspec.structs.replace(entry, conversation_id=conversation_id.lower())
        if len(_known_conversations) >= _KNOWN_CONVERSATIONS_MAX:
            _known_conversations.clear()
        _known_conversations.add(conversation_id)
    if kind is MessageEntry:
        activity_id = entry.activity_id  # type: ignore[union-attr]
        if len(activity_id) != 32 or activity_id.strip(_LOWER_HEX):
            return DeadLetter(
                reason=f"activity_id is not 32 lowercase hex chars: {activity_id[:64]!r}", raw=raw
            )
    return entry


_LOWER_HEX = "0123456789abcdef"
_ANY_HEX = "0123456789abcdefABCDEF"
_KNOWN_CONVERSATIONS_MAX = 1 << 20
_known_conversations: set[str] = set()  # canonical ids already validated


def _is_uuid(text: str) -> bool:
    """The canonical 8-4-4-4-12 hex form (any case)."""
    if len(text) != 36:
        return False
    if text[8] != "-" or text[13] != "-" or text[18] != "-" or text[23] != "-":
        return False
    return not text.replace("-", "").strip(_ANY_HEX) and text.count("-") == 4


_RECALL_KINDS = (RecallEntry, DeleteMessageEntry)


def _u64_field(entry: Entry) -> str:
    """Which u64 field is above 2^64-1 (msgspec's bounds stop at int64)."""
    if entry.user_id > U64_MAX:
        return "`$.user_id`"
    if isinstance(entry, MessageEntry):
        return "`$.sender_id`"
    return "`$.target_sender_id`"


def _reason(exc: msgspec.DecodeError, raw: bytes) -> str:
    text = str(exc)
    if text.startswith("Invalid value") and "`$.type`" in text:
        return f"unknown type: {text}"
    if text.startswith("Object missing required field `type`"):
        return "missing field `type`"
    return text
