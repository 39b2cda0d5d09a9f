"""Mailbox entries: the typed wire contract (docs/contract.md §2) and its one validating decoder.

Raw bytes are decoded exactly once, straight into frozen typed structs (msgspec, a tagged
union on `type`). Anything that does not fit becomes a `DeadLetter` with a readable reason;
no exception leaves `decode_record`.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Callable
from typing import Annotated, Any, Final, Literal, get_args, get_origin, get_type_hints

import msgspec

U64_MAX = 2**64 - 1
U32_MAX = 2**32 - 1

# msgspec cannot express bounds past int64, and the contract bounds no seq or time below u64:
# the upper bounds are checked after decoding (decode_record), with one cheap test on the way.
U64 = Annotated[int, msgspec.Meta(ge=0)]
U32 = Annotated[int, msgspec.Meta(ge=0, le=U32_MAX)]
Positive = Annotated[int, msgspec.Meta(ge=1)]
NonNegative = Annotated[int, msgspec.Meta(ge=0)]
# Conversation seqs index RoaringBitmap64 ranges (seq + 1 must fit in u64).
SEQ_MAX = U64_MAX - 1
# conversation_id and activity_id are checked after decoding (see `_id_problem`): a regex in
# the decoder costs more than the rest of the decode, and conversation ids repeat (cached).
ConversationId = str
ActivityId = str
# A mailbox entry is a flat object of a few hundred bytes. Past this size a record is refused
# before it is parsed (its dead letter then carries only the head of the value): parsing,
# pending-buffer and dead-letter records all stay bounded whatever a producer sends.
MAX_RECORD_BYTES = 64 * 1024
# Fields the schema does not name are ignored (forward compatibility), but not without bound:
# nested deeper than this, a record is refused at the same depth in every driver (the JSON
# parsers recurse; without an explicit bound the verdict would depend on the caller's stack).
MAX_NESTING = 32

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
    # docs/contract.md §9: a member notification's kind (seed 004's `t`; app/domain/notices.py
    # says which kinds make a MEMBER_NOTICE). UNSET, not None: absent is the only way to say
    # "none" (a JSON null, a string, a float, a bool or a value outside u32 is a dead letter),
    # and a re-encoded entry (the pending buffer) leaves it out again.
    notification: U32 | msgspec.UnsetType = msgspec.UNSET
    # docs/contract.md §10, the fast lane: the producer marks the message urgent (flush its
    # user's rows at once). A JSON bool when present; UNSET (absent) is "not urgent", and a
    # re-encoded entry leaves it out again.
    urgent: bool | msgspec.UnsetType = msgspec.UNSET
    # docs/contract.md §10, the fast lane: the conversation's member count as the producer fanned
    # the message out (2 for a direct message). Absent: unknown, so not a small conversation.
    member_count: U32 | msgspec.UnsetType = msgspec.UNSET


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


class MarkUnreadEntry(_Entry, frozen=True, tag="mark_unread"):
    """docs/contract.md §10: the user marked the conversation unread (any device)."""


BadgeMode = Literal["messages", "conversations"]


class BadgePreferencesEntry(_Entry, frozen=True, tag="badge_preferences"):
    """docs/contract.md §10: the user's badge preferences from this entry's mailbox_seq on.

    A user-level entry: it carries a conversation_id like every entry (§2), which is validated
    and otherwise ignored (it makes no conversation known and touches no row)."""

    badge_mode: BadgeMode
    include_muted: bool


class WatermarkMarker(msgspec.Struct, frozen=True, tag_field="type", tag="watermark", kw_only=True, gc=False):
    """In-band control record: lane `lane` has written every entry with mailbox_seq <= watermark.

    `count` (optional, docs/contract.md §9): how many distinct entries of the lane with
    mailbox_seq <= watermark the producer has sent to this partition, cumulative; the worker
    compares it with what it received (app/domain/arrivals.py). Absent: nothing to compare (a
    `null` is no count: refused like any other non-integer)."""

    lane: NonNegative
    watermark: NonNegative
    ts: NonNegative
    count: NonNegative | msgspec.UnsetType = msgspec.UNSET

    @property
    def sent(self) -> int | None:
        """`count`, or None when the marker carries none."""
        count = self.count
        return count if isinstance(count, int) else None


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
    | MarkUnreadEntry
    | BadgePreferencesEntry
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
    "mark_unread",
    "badge_preferences",
)


# Why a record was dead-lettered, as a closed set: the `kind` of every DeadLetter, and the label
# of the worker's `projector_dead_letters_total{reason}` (a metric label must be bounded; the
# free-text `reason` can name any value a producer sent).
DEAD_LETTER_KINDS: Final = (
    "empty",  # a null or zero-length Kafka value
    "too_large",  # more than MAX_RECORD_BYTES: refused unparsed
    "not_json",  # not a JSON document at all
    "unknown_type",  # no `type`, or one this version does not know
    "schema",  # a field missing, of the wrong type or out of range; a key repeated; nested too deep
    "lane_out_of_range",  # lane >= the configured lanes
    "int_out_of_range",  # an id or sequence above its bound (u64, or the seq bound)
    "bad_conversation_id",  # conversation_id is not a UUID
    "bad_activity_id",  # activity_id is not 32 lowercase hex characters
)


class DeadLetter(msgspec.Struct, frozen=True):
    """A record that failed validation, with why (``kind``: one of DEAD_LETTER_KINDS; ``reason``:
    the readable detail). It never reaches the state."""

    reason: str
    raw: bytes
    kind: str = "schema"


_decoder: msgspec.json.Decoder[Record] = msgspec.json.Decoder(Record)
decode_json = _decoder.decode  # JSON to a Record, nothing checked (app/domain/decoding.py)


def decode_record(raw: bytes, lanes: int) -> Record | DeadLetter:
    """Decode one wire record; every failure becomes a `DeadLetter` with a reason."""
    if not raw:
        return DeadLetter(
            reason="empty record: no value (a null or zero-length Kafka value)", raw=raw, kind="empty"
        )
    if len(raw) > MAX_RECORD_BYTES:
        return DeadLetter(
            reason=f"record of {len(raw)} bytes, over the {MAX_RECORD_BYTES}-byte bound",
            raw=raw,
            kind="too_large",
        )
    try:
        record = _decoder.decode(raw)
    except msgspec.DecodeError as exc:
        return DeadLetter(reason=_reason(exc, raw), raw=raw, kind=_kind(exc))
    except RecursionError:  # msgspec skips an unknown field's value recursively
        return DeadLetter(reason=_TOO_DEEP, raw=raw, kind="schema")
    return checked(record, raw, lanes)


def checked(record: Record, raw: bytes, lanes: int) -> Record | DeadLetter:
    """The checks msgspec does not do, on a record it decoded from `raw`."""
    kind = type(record)
    # Every key and every string value of a record holds two quote bytes. A record with no more
    # quotes than its own fields need has no other key: no repeated key, no unknown field, no
    # nesting. Only the others (rare: unknown fields, quotes inside strings) are looked at whole.
    quotes, optional = _QUOTES[kind]
    if optional:
        for name, default in optional:
            value = getattr(record, name)
            if value != default:
                quotes += 4 if isinstance(value, str) else 2
    if raw.count(b'"') != quotes:
        problem = _shape_problem(raw)
        if problem is not None:
            return DeadLetter(reason=problem[1], raw=raw, kind=problem[0])
    if record.lane >= lanes:
        return DeadLetter(
            reason=f"lane {record.lane} out of range [0, {lanes})", raw=raw, kind="lane_out_of_range"
        )
    if kind is WatermarkMarker:
        marker: WatermarkMarker = record  # type: ignore[assignment]
        count = marker.sent
        if marker.watermark > U64_MAX or marker.ts > U64_MAX or (count is not None and count > U64_MAX):
            field = "watermark" if marker.watermark > U64_MAX else "ts" if marker.ts > U64_MAX else "count"
            return DeadLetter(
                reason=f"Expected `int` <= {U64_MAX} - at `$.{field}`", raw=raw, kind="int_out_of_range"
            )
        return marker
    entry: Entry = record  # type: ignore[assignment]  # narrowed by the `is` check above
    if kind is MessageEntry:
        # The hot type, its int fields (_MESSAGE_INTS) inline: the values are >= 0, so their OR
        # exceeds SEQ_MAX only when one of them does.
        message: MessageEntry = record  # type: ignore[assignment]
        too_big = (
            message.mailbox_seq
            | message.ts
            | message.user_id
            | message.conversation_seq
            | message.sender_id
            | message.created_at
        ) > SEQ_MAX
    else:
        too_big = max(_INT_FIELDS[kind][0](entry)) > SEQ_MAX
    if too_big:  # rare (every bound is >= SEQ_MAX): only then look at each field's own bound
        for name, high in _INT_FIELDS[kind][1]:
            if getattr(entry, name) > high:
                return DeadLetter(
                    reason=f"Expected `int` <= {high} - at `$.{name}`", raw=raw, kind="int_out_of_range"
                )
    conversation_id = entry.conversation_id
    if conversation_id not in _known_conversations:
        if not _is_uuid(conversation_id):
            return DeadLetter(
                reason=f"conversation_id is not a UUID: {conversation_id[:64]!r}",
                raw=raw,
                kind="bad_conversation_id",
            )
        if conversation_id != conversation_id.lower():
            # Canonical form is lowercase: one conversation must have one key. (The checks below
            # still apply: returning here let an invalid activity_id through.)
            entry = msgspec.structs.replace(entry, conversation_id=conversation_id.lower())
        else:
            if len(_known_conversations) >= _KNOWN_CONVERSATIONS_MAX:
                _known_conversations.clear()
            _known_conversations.add(conversation_id)
    if kind is MessageEntry:
        activity_id = entry.activity_id  # type: ignore[union-attr]
        if activity_id not in _known_activities:  # a message's id repeats in all its fan-out
            if len(activity_id) != 32 or activity_id.strip(_LOWER_HEX):
                return DeadLetter(
                    reason=f"activity_id is not 32 lowercase hex chars: {activity_id[:64]!r}",
                    raw=raw,
                    kind="bad_activity_id",
                )
            if len(_known_activities) >= _KNOWN_ACTIVITIES_MAX:
                _known_activities.clear()
            _known_activities.add(activity_id)
    return entry


_LOWER_HEX = "0123456789abcdef"
_ANY_HEX = "0123456789abcdefABCDEF"
# The validated-id caches are process-wide and outlive any one state's hot set, so they are
# small: a cache miss only costs a validation (`_is_uuid`), never a different result. At 1 << 20
# the conversations' set held up to ~1M ids (~120 MiB) and grew with every new conversation of a
# log, beyond `projector replay --state-dir --hot-rows`'s bound (issue 33, item 4).
_KNOWN_CONVERSATIONS_MAX = 1 << 16
_known_conversations: set[str] = set()  # canonical ids already validated
_KNOWN_ACTIVITIES_MAX = 1 << 16
_known_activities: set[str] = set()  # activity ids already validated
# The same sets, read by decode_records' fast path (app/domain/decoding.py); cleared, never replaced.
known_conversations: Final = _known_conversations
known_activities: Final = _known_activities


def _is_uuid(text: str) -> bool:
    """The canonical 8-4-4-4-12 hex form (any case)."""
    if len(text) != 36:
        return False
    if text[8] != "-" or text[13] != "-" or text[18] != "-" or text[23] != "-":
        return False
    return not text.replace("-", "").strip(_ANY_HEX) and text.count("-") == 4


_TOO_DEEP = f"nested deeper than {MAX_NESTING} levels"


class _Pairs(list[tuple[str, Any]]):
    """A JSON object as its key/value pairs, in order (repeated keys kept)."""


def _shape_problem(raw: bytes) -> tuple[str, str] | None:
    """(kind, reason) of what msgspec does not check in a record it accepted: a repeated key at
    the top level, nesting deeper than MAX_NESTING, text that is not UTF-8 or not Unicode in an
    unknown field (msgspec skips those unread); None when there is none of it."""
    try:
        # msgspec skips an unknown field without checking its text: the whole record must be
        # UTF-8 (strict: no encoded surrogates either), and its strings Unicode (below).
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return "not_json", f"not UTF-8: {exc.reason} at byte {exc.start}"
    try:
        # Numbers are not converted (no int-digit limits, no float overflow): only shape matters.
        top = json.loads(text, object_pairs_hook=_Pairs, parse_int=len, parse_float=len)
    except RecursionError:
        return "schema", _TOO_DEEP
    except ValueError as exc:  # msgspec accepted it: a parser difference, refused all the same
        return "not_json", f"not a plain JSON object: {str(exc)[:100]}"
    if not isinstance(top, _Pairs):
        return "schema", "not a JSON object"
    seen: set[str] = set()
    for key, _ in top:
        if key in seen:
            return "schema", f"duplicate key `{key[:64]}`: the record is ambiguous"
        seen.add(key)
    stack: list[tuple[Any, int]] = [(top, 1)]
    while stack:  # iterative: the depth is what is being bounded
        node, depth = stack.pop()
        if depth > MAX_NESTING:
            return "schema", _TOO_DEEP
        if isinstance(node, _Pairs):
            children: list[Any] = []
            for key, value in node:
                children.append(key)
                children.append(value)
        else:
            children = node
        for child in children:
            if isinstance(child, list):  # _Pairs (an object) or an array
                stack.append((child, depth + 1))
            elif isinstance(child, str) and not _is_unicode(child):
                return "not_json", "a string holds a lone UTF-16 surrogate (\\ud800-\\udfff escape)"
    return None


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _is_text(annotation: Any) -> bool:
    if get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    if get_origin(annotation) is Literal:
        return all(isinstance(arg, str) for arg in get_args(annotation))
    return annotation is str


def _quotes(kind: type[msgspec.Struct]) -> tuple[int, tuple[tuple[str, Any], ...]]:
    """Quote bytes a record of this class has with its required fields alone (the `type` tag:
    key and value), and its optional fields with their defaults."""
    quotes = 4
    optional = []
    hints = get_type_hints(kind, include_extras=True)
    for info in msgspec.structs.fields(kind):
        if info.required:
            quotes += 4 if _is_text(hints[info.name]) else 2
        else:
            optional.append((info.name, info.default))
    return quotes, tuple(optional)


_QUOTES = {kind: _quotes(kind) for kind in (*get_args(Entry), WatermarkMarker)}
# The quotes of a message's required fields alone: an optional field that is there (the
# notification, urgent, member_count: none of them a string) adds its key's two.
MESSAGE_QUOTES: Final = _QUOTES[MessageEntry][0]
_MESSAGE_HINTS = get_type_hints(MessageEntry, include_extras=True)
if any(_is_text(_MESSAGE_HINTS[name]) for name, _ in _QUOTES[MessageEntry][1]):
    raise AssertionError("a message's optional field is text: update decode_chunk's quote count")


def _int_fields(kind: type) -> tuple[Callable[[Any], tuple[int, ...]], tuple[tuple[str, int], ...]]:
    """Per entry class: a getter of all its int fields, and each field's upper bound."""
    bounds = []
    for name, annotation in get_type_hints(kind, include_extras=True).items():
        if name == "lane" or name == "pin_rank":
            continue  # lane is checked against --lanes, pin_rank is u32 in the decoder
        if annotation in (U64, Positive, NonNegative):
            is_seq = name.endswith("conversation_seq")
            bounds.append((name, SEQ_MAX if is_seq else U64_MAX))
    names = [name for name, _ in bounds]
    getter: Callable[[Any], tuple[int, ...]] = operator.attrgetter(*names)  # >= 3 fields: a tuple
    return getter, tuple(bounds)


_INT_FIELDS = {kind: _int_fields(kind) for kind in get_args(Entry)}
# `checked` and app/domain/decoding.py's decode_records check a message's int fields inline, by
# name: a field added to MessageEntry must be added there too.
_MESSAGE_INTS = ("mailbox_seq", "ts", "user_id", "conversation_seq", "sender_id", "created_at")
if tuple(sorted(name for name, _ in _INT_FIELDS[MessageEntry][1])) != tuple(sorted(_MESSAGE_INTS)):
    raise AssertionError("MessageEntry's int fields changed: update checked's and decode_records' checks")


def _kind(exc: msgspec.DecodeError) -> str:
    if not isinstance(exc, msgspec.ValidationError):  # the JSON itself is malformed
        return "not_json"
    text = str(exc)
    if "`$.type`" in text or text.startswith("Object missing required field `type`"):
        return "unknown_type"
    return "schema"


def _reason(exc: msgspec.DecodeError, raw: bytes) -> str:
    text = str(exc)
    if len(text) > 300:  # msgspec quotes an invalid value whole (an unknown `type`)
        text = text[:300] + "..."
    if text.startswith("Invalid value") and "`$.type`" in text:
        return f"unknown type: {text}"
    if text.startswith("Object missing required field `type`"):
        return "missing field `type`"
    return text
