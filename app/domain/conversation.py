"""Per-(user, conversation) state and its transitions, one per entry type (docs/contract.md §2, §3)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, NamedTuple

import msgspec

from app.domain import seqs
from app.domain.entries import (
    ArchiveEntry,
    ClearHistoryEntry,
    DeleteConversationEntry,
    DeleteMessageEntry,
    Entry,
    JoinEntry,
    LeaveEntry,
    MailboxDirtyEntry,
    MarkUnreadEntry,
    MessageEntry,
    MuteEntry,
    PinEntry,
    ReadEntry,
    RecallEntry,
    UnarchiveEntry,
    UnmuteEntry,
    UnpinEntry,
)
from app.domain.ports import MessageStore
from app.domain.record_fields import (
    bool_field,
    int_field,
    optional_bytes_field,
    optional_int_field,
    optional_str_field,
    str_field,
)
from app.domain.unread import derive_from_hand, prune_to_base, recompute, settle

# What a row holds in memory besides its seq sets and head ids (`footprint`): the object (31
# slots), its conversation id (a UUID's 36 characters), the ints above 256 it boxes (version,
# changed_at) and its entry in the user's rows dict. Measured by RSS over 200,000 rows read back
# from records: ~360 + 85 + ~40 bytes, rounded up to whole 16-byte units (residency.py).
ROW_BYTES = 496


class RowFacts(NamedTuple):
    """A row's fields the unread audit selects on (`ConversationState.audit_facts`); the same
    names as the row's, so the audit's rules take either."""

    unread_count: int
    unread_exact: bool
    changed_at: int
    base: int
    latest: int


class ConversationState:
    """Everything the projector keeps for one (user, conversation)."""

    __slots__ = (
        "archived",
        "base",
        "changed_at",
        "conversation_id",
        "counted_size",
        "counting",
        "deleted_before",
        "dirty",
        "fast_writes",
        "floor",
        "head_ids",
        "head_seq",
        "hidden_before",
        "joined_at",
        "left_at",
        "marked_unread",
        "membership",
        "mention_count",
        "mention_first",
        "mentioning",
        "muted",
        "pin_rank",
        "read_seq",
        "recalled",
        "received",
        "role",
        "unread_count",
        "unread_exact",
        "user_id",
        "version",
        "writes",
    )

    def __init__(self, user_id: int, conversation_id: str) -> None:
        self.user_id = user_id
        self.conversation_id = conversation_id
        self.membership = "active"
        self.role = "member"
        self.joined_at = 0
        self.left_at: int | None = None
        self.read_seq = 0
        self.hidden_before = 0
        self.deleted_before = 0
        self.base = 0  # max(read_seq, hidden_before, joined_at, deleted_before), kept by _rebase
        self.pin_rank: int | None = None
        self.archived = False
        self.muted = False
        # docs/contract.md §10: marked unread by the user; a read or a delete_conversation clears it.
        self.marked_unread = False
        self.head_seq: int | None = None
        # The head's message_id and activity_id packed into one bytes object (`pack_head_ids`):
        # ~56 bytes where two strings took ~145 and two entries of the interned-string table.
        self.head_ids: bytes | None = None
        # Sets of conversation seqs (app/domain/seqs.py; None until the first one):
        self.received: seqs.Seqs = None  # every message seq this user received here
        self.counting: seqs.Seqs = None  # hand: received/known seqs that count as unread
        self.mentioning: seqs.Seqs = None  # hand: counting seqs that mention the user
        self.recalled: seqs.Seqs = None  # hand: recalled or deleted targets
        self.floor = 0  # the hand is complete for every seq above floor
        self.unread_count = 0
        self.unread_exact = True
        self.mention_count = 0
        self.mention_first: int | None = None
        self.version = 0  # mailbox_seq of the last entry applied to this row
        # `ts` of that entry (event time, ms): how long the row has been idle, for the unread
        # audit (app/domain/audit.py); 0 = unknown (a record written before it was kept).
        self.changed_at = 0
        # How many flushes wrote this row (replay's max_writes_per_user_conversation; kept with
        # the row, so no second table of every row is needed to count it).
        self.writes = 0
        # Of them, the fast lane's (docs/contract.md §10): the J-1 bound is
        # ceil(span / window) + 1 + these (replay's max_window_writes_per_user_conversation).
        self.fast_writes = 0
        # In the projector's dirty set (app/domain/flush.py) since its last flush: a flag read on
        # every entry instead of a set lookup. Never persisted (a restart loses the dirty set).
        self.dirty = False
        # The footprint (`footprint()`) the hot set counted for this row when it last measured
        # it, in app/domain/residency.py's FOOTPRINT_UNITs (its byte bound; 0 while none is
        # kept). Never persisted.
        self.counted_size = 0

    # -- derived values ---------------------------------------------------------------------

    def _rebase(self) -> bool:
        """Recompute the unread base; True when it moved."""
        base = max(self.read_seq, self.hidden_before, self.joined_at, self.deleted_before)
        if base == self.base:
            return False
        self.base = base
        return True

    @property
    def head_message_id(self) -> str | None:
        ids = self.head_ids
        return None if ids is None else head_message_id(ids)

    @property
    def head_activity_id(self) -> str | None:
        ids = self.head_ids
        return None if ids is None else head_activity_id(ids)

    def set_head_ids(self, message_id: str | None, activity_id: str | None) -> None:
        self.head_ids = pack_head_ids(message_id, activity_id)

    def footprint(self) -> int:
        """About how many bytes the row holds in memory: its object with its conversation id and
        boxed fields, its seq sets, its head ids (shared by a fan-out's rows until they are read
        back, counted for each). The hot set's byte bound adds these up (app/domain/residency.py)."""
        size = ROW_BYTES + seqs.footprint(self.received) + seqs.footprint(self.counting)
        size += seqs.footprint(self.mentioning) + seqs.footprint(self.recalled)
        ids = self.head_ids
        return size if ids is None else size + sys.getsizeof(ids)

    @property
    def latest(self) -> int:
        return self.head_seq or 0

    @property
    def active(self) -> bool:
        return self.membership == "active"

    @property
    def listed(self) -> bool:
        return not (self.deleted_before > 0 and self.deleted_before >= self.latest)

    def visible(self, seq: int) -> bool:
        return self.membership == "active" or (self.left_at is not None and seq <= self.left_at)

    # -- transitions ------------------------------------------------------------------------

    def apply(self, entry: Entry, store: MessageStore, limit: int) -> None:
        """Apply one entry (already gated, de-duplicated and in mailbox_seq order)."""
        _HANDLERS[type(entry)](self, entry, store, limit)
        self.version = entry.mailbox_seq
        self.changed_at = entry.ts

    def apply_message(self, entry: MessageEntry, store: MessageStore, limit: int) -> None:
        """`apply` of a message, also called directly (the hot path: no dispatch). A message
        moves the head, the hand and the counts, never the membership, the folder or the mute."""
        self.version = entry.mailbox_seq  # first: the rule below returns early
        self.changed_at = entry.ts
        seq = entry.conversation_seq
        old_received = self.received
        self.received = received = seqs.add(old_received, seq)
        head = self.head_seq
        if (head is None or seq > head) and (
            self.membership == "active" or (self.left_at is not None and seq <= self.left_at)
        ):
            self.head_seq = head = seq
            # A fan-out's entries come one after another: its members' rows share one object
            # (the last packing, checked here first: the hot path makes no call then).
            last = _last_packed
            message_id = entry.message_id
            activity_id = entry.activity_id
            if last[0] == message_id and last[1] == activity_id:
                self.head_ids = last[2]
            else:
                self.head_ids = pack_head_ids(message_id, activity_id)
        base = self.base
        recalled = self.recalled
        if (
            entry.sender_id == self.user_id
            or not entry.counts_unread
            or seq <= base
            or (recalled is not None and seqs.has(recalled, seq))
        ):
            return
        counting = self.counting
        if counting is old_received and type(received) is bytes:
            # Every seq received counts (the common case): the two sets stay one immutable bytes
            # object (~57 bytes a row saved). `add` gives back the same object when the seq was
            # already there. Never shared as a roaring bitmap: those change in place.
            self.counting = received
            newly_counted = received is not old_received
        else:
            self.counting, newly_counted = seqs.added(counting, seq)
        newly_mentioned = False
        if entry.mention:
            self.mentioning, newly_mentioned = seqs.added(self.mentioning, seq)
        if not self.unread_exact:
            return  # an inexact row shows the limit until the base moves
        if self.floor > base:
            settle(self, store, limit)
            return
        # Incremental is exact here: the hand is complete above the base, and no counted seq
        # lies between the old head and a new one (anything received there would have been
        # visible, hence the head already).
        if head is not None and seq <= head:
            if newly_counted:
                self.unread_count += 1
            if newly_mentioned:
                self.mention_count += 1
                first = self.mention_first
                if first is None or seq < first:
                    self.mention_first = seq

    def _on_recall(self, entry: RecallEntry | DeleteMessageEntry, store: MessageStore, limit: int) -> None:
        # The target stops counting. Own messages and non-counting ones were never in the hand,
        # a target at or below the base is outside the count, and a second recall finds nothing
        # to remove: rule 5's conditions hold by construction. The target is remembered even at
        # or below the base (the base can move down with a join), so a message that arrives
        # after its recall never counts.
        seq = entry.target_conversation_seq
        self.recalled = seqs.add(self.recalled, seq)
        self.counting = seqs.discard(self.counting, seq)
        self.mentioning = seqs.discard(self.mentioning, seq)
        if self.unread_exact:
            self._refresh(store, limit)

    def _on_read(self, entry: ReadEntry, store: MessageStore, limit: int) -> None:
        self.marked_unread = False  # any read of the conversation, whatever its value (§10)
        if entry.read_conversation_seq > self.read_seq:
            self.read_seq = entry.read_conversation_seq
            if self._rebase():
                settle(self, store, limit)

    def _on_join(self, entry: JoinEntry, store: MessageStore, limit: int) -> None:
        old_base, old_latest = self.base, self.latest
        self.membership = "active"
        self.role = sys.intern(entry.role)  # one string per value, not one per decoded entry
        self.joined_at = entry.joined_at_conversation_seq
        self.left_at = None
        self._rebase()
        self._reset_head(store)
        self._after_move(old_base, old_latest, store, limit)

    def _on_leave(self, entry: LeaveEntry, store: MessageStore, limit: int) -> None:
        old_base, old_latest = self.base, self.latest
        self.membership = sys.intern(entry.reason)
        self.left_at = entry.left_at_conversation_seq
        self._reset_head(store)
        self._after_move(old_base, old_latest, store, limit)

    def _on_pin(self, entry: PinEntry, store: MessageStore, limit: int) -> None:
        self.pin_rank = entry.pin_rank

    def _on_unpin(self, entry: Entry, store: MessageStore, limit: int) -> None:
        self.pin_rank = None

    def _on_archive(self, entry: Entry, store: MessageStore, limit: int) -> None:
        self.archived = True

    def _on_unarchive(self, entry: Entry, store: MessageStore, limit: int) -> None:
        self.archived = False

    def _on_mute(self, entry: Entry, store: MessageStore, limit: int) -> None:
        self.muted = True

    def _on_unmute(self, entry: Entry, store: MessageStore, limit: int) -> None:
        self.muted = False

    def _on_clear_history(self, entry: ClearHistoryEntry, store: MessageStore, limit: int) -> None:
        self.hidden_before = max(self.hidden_before, entry.hidden_before_conversation_seq)
        if self._rebase():
            settle(self, store, limit)

    def _on_delete_conversation(
        self, entry: DeleteConversationEntry, store: MessageStore, limit: int
    ) -> None:
        self.deleted_before = max(self.deleted_before, entry.deleted_before_conversation_seq)
        self.marked_unread = False
        if self._rebase():
            settle(self, store, limit)

    def _on_mark_unread(self, entry: Entry, store: MessageStore, limit: int) -> None:
        self.marked_unread = True

    def _on_mailbox_dirty(self, entry: Entry, store: MessageStore, limit: int) -> None:
        self.reconcile(store, limit)

    def reconcile(self, store: MessageStore, limit: int) -> None:
        """Recompute the counts (MAILBOX_DIRTY). The hand is the definition evaluated over the
        user's own applied entries; where it covers (base, latest] the recompute runs from it,
        so a reconcile never changes the definition's value (docs/contract.md §2). Where it does not reach
        down to the base, one bounded MessageStore read fills the gap."""
        if self.floor <= self.base:
            prune_to_base(self)
            derive_from_hand(self)
        else:
            recompute(self, store, limit)

    def audit(self, store: MessageStore, limit: int) -> None:
        """Recompute from the MessageStore alone (audits, rebuilds from state)."""
        recompute(self, store, limit, received_only=False)

    # -- helpers ----------------------------------------------------------------------------

    def _refresh(self, store: MessageStore, limit: int) -> None:
        """Keep an exact row exact after a message or a recall."""
        if self.floor <= self.base:
            derive_from_hand(self)
        else:
            settle(self, store, limit)

    def _after_move(self, old_base: int, old_latest: int, store: MessageStore, limit: int) -> None:
        base, latest = self.base, self.latest
        if base != old_base or latest < old_latest or (self.unread_exact and latest != old_latest):
            settle(self, store, limit)

    def _reset_head(self, store: MessageStore) -> None:
        """Head = the highest visible received message (membership decides what is visible)."""
        received = self.received
        if not received:
            return
        if self.membership == "active" or self.left_at is None:
            top: int | None = seqs.highest(received)
        else:
            rank = seqs.rank(received, self.left_at)  # how many received seqs are <= left_at
            top = seqs.at(received, rank - 1) if rank else None
        if top == self.head_seq:
            return
        if top is None:
            self.head_seq = None
            self.head_ids = None
            return
        stored = store.get(self.conversation_id, top)
        self.head_seq = top
        self.head_ids = pack_head_ids(stored.message_id, stored.activity_id) if stored else None

    # -- output -----------------------------------------------------------------------------

    def as_row(self) -> dict[str, Any]:
        """The projection row of docs/contract.md §4.

        Its projection_mailbox_seq is the mailbox_seq of the last entry applied to this row: a
        row is then a pure function of the entries, identical whatever the flush timing (a
        rebuild by replay must reproduce it field by field). The frame that carries it has the
        user's version, which is >= it."""
        return {
            "user_id": self.user_id,
            "conversation_id": self.conversation_id,
            "listed": self.listed,
            "membership": self.membership,
            "pinned": self.pin_rank is not None,
            "pin_rank": self.pin_rank,
            "archived": self.archived,
            "muted": self.muted,
            "marked_unread": self.marked_unread,
            "last_activity_id": self.head_activity_id,
            "latest_conversation_seq": self.head_seq,
            "last_message_id": self.head_message_id,
            "unread_count": self.unread_count,
            "unread_exact": self.unread_exact,
            "mention_count": self.mention_count,
            "mention_first_conversation_seq": self.mention_first,
            "read_conversation_seq": self.read_seq,
            "hidden_before_conversation_seq": self.hidden_before,
            "deleted_before_conversation_seq": self.deleted_before,
            "joined_at_conversation_seq": self.joined_at,
            "left_at_conversation_seq": self.left_at,
            "projection_mailbox_seq": self.version,
        }

    # -- persistence (what a changelog table holds) --------------------------------------------

    def dump(self) -> list[Any]:
        """The row as its changelog record holds it: the fields in a fixed order (the key holds
        the user and the conversation), the seq sets in roaring's portable format (None when
        empty). Compact on disk and cheap to decode."""
        # Spelled out, in _PLAIN_FIELDS then _BITMAP_FIELDS order (checked below the class): a
        # getattr per field name cost 2x, and every changed row is dumped once per persist (at a
        # 100 ms window, about once per entry).
        dump = seqs.dump
        return [
            _RECORD_FORMAT,
            self.archived,
            self.base,
            self.changed_at,
            self.deleted_before,
            self.floor,
            self.head_activity_id,
            self.head_message_id,
            self.head_seq,
            self.hidden_before,
            self.joined_at,
            self.left_at,
            self.membership,
            self.mention_count,
            self.mention_first,
            self.muted,
            self.pin_rank,
            self.read_seq,
            self.role,
            self.unread_count,
            self.unread_exact,
            self.version,
            self.writes,
            dump(self.received),
            dump(self.counting),
            dump(self.mentioning),
            dump(self.recalled),
            self.marked_unread,
            self.fast_writes,
        ]

    @classmethod
    def load(cls, record: list[Any], user_id: int, conversation_id: str) -> ConversationState:
        record_format = record[0]
        fast_writes = 0
        if record_format == _RECORD_FORMAT:
            if len(record) != _RECORD_LENGTH:
                raise ValueError(f"a row record has {_RECORD_LENGTH} fields, not {len(record)}")
            fast_writes = int_field(record[-1], "fast_writes")
            marked_unread = bool_field(record[-2], "marked_unread")
            record = record[:-2]
        elif record_format == _RECORD_FORMAT_3:
            # Written before the fast lane counted its writes (docs/contract.md §10): none.
            if len(record) != _RECORD_LENGTH - 1:
                raise ValueError(f"a format-3 row record has {_RECORD_LENGTH - 1} fields, not {len(record)}")
            marked_unread = bool_field(record[-1], "marked_unread")
            record = record[:-1]
        elif record_format == _RECORD_FORMAT_2:
            # Written before marked_unread existed (docs/contract.md §10): not marked.
            if len(record) != _RECORD_LENGTH - 2:
                raise ValueError(f"a format-2 row record has {_RECORD_LENGTH - 2} fields, not {len(record)}")
            marked_unread = False
        else:
            raise ValueError(f"unknown row record format {record_format!r}")
        # The constructor, not cls.__new__(cls): the compiled build (mypyc) needs it.
        row = cls(user_id, sys.intern(conversation_id))
        # One unpacking into locals, then each value checked for its type as it is set
        # (app/domain/record_fields.py: both builds refuse the same records). Same order as
        # _PLAIN_FIELDS (checked below the class).
        (
            _,
            archived,
            base,
            changed_at,
            deleted_before,
            floor,
            head_activity_id,
            head_message_id,
            head_seq,
            hidden_before,
            joined_at,
            left_at,
            membership,
            mention_count,
            mention_first,
            muted,
            pin_rank,
            read_seq,
            role,
            unread_count,
            unread_exact,
            version,
            writes,
            received,
            counting,
            mentioning,
            recalled,
        ) = record
        row.archived = bool_field(archived, "archived")
        row.base = int_field(base, "base")
        row.changed_at = int_field(changed_at, "changed_at")
        row.deleted_before = int_field(deleted_before, "deleted_before")
        row.floor = int_field(floor, "floor")
        row.head_ids = pack_head_ids(
            optional_str_field(head_message_id, "head_message_id"),
            optional_str_field(head_activity_id, "head_activity_id"),
        )
        row.head_seq = optional_int_field(head_seq, "head_seq")
        row.hidden_before = int_field(hidden_before, "hidden_before")
        row.joined_at = int_field(joined_at, "joined_at")
        row.left_at = optional_int_field(left_at, "left_at")
        # Decoded strings are new objects: one "active" and one "member" per row cost ~110 bytes.
        row.membership = sys.intern(str_field(membership, "membership"))
        row.mention_count = int_field(mention_count, "mention_count")
        row.mention_first = optional_int_field(mention_first, "mention_first")
        row.muted = bool_field(muted, "muted")
        row.marked_unread = marked_unread
        row.pin_rank = optional_int_field(pin_rank, "pin_rank")
        row.read_seq = int_field(read_seq, "read_seq")
        row.role = sys.intern(str_field(role, "role"))
        row.unread_count = int_field(unread_count, "unread_count")
        row.unread_exact = bool_field(unread_exact, "unread_exact")
        row.version = int_field(version, "version")
        row.writes = int_field(writes, "writes")
        row.fast_writes = fast_writes
        for name, data in zip(_BITMAP_FIELDS, (received, counting, mentioning, recalled), strict=True):
            optional_bytes_field(data, name)
        load = seqs.load
        row.received = received_seqs = load(received)
        # Every seq received counts (the common case: nothing read yet) gives two equal sets: one
        # object for both while they are immutable bytes (a change replaces the object).
        row.counting = (
            received_seqs if counting == received and type(received_seqs) is bytes else load(counting)
        )
        row.mentioning = load(mentioning)
        row.recalled = load(recalled)
        return row

    @staticmethod
    def audit_facts(record: list[Any]) -> RowFacts:
        """What the unread audit selects a row on (app/domain/audit.py), read from its changelog
        record without loading the row (the seq sets stay undecoded): the audit's sweep reads
        many rows and loads only those it draws. Same places in every record format."""
        if record[0] not in (_RECORD_FORMAT, _RECORD_FORMAT_3, _RECORD_FORMAT_2):
            raise ValueError(f"unknown row record format {record[0]!r}")
        head_seq = optional_int_field(record[_HEAD_SEQ_AT], "head_seq")
        return RowFacts(
            int_field(record[_UNREAD_COUNT_AT], "unread_count"),
            bool_field(record[_UNREAD_EXACT_AT], "unread_exact"),
            int_field(record[_CHANGED_AT_AT], "changed_at"),
            int_field(record[_BASE_AT], "base"),
            head_seq or 0,
        )

    def copy(self) -> ConversationState:
        """An independent copy (seq sets included)."""
        return ConversationState.load(self.dump(), self.user_id, self.conversation_id)


# -- the head's ids, packed ----------------------------------------------------------------------
# A row's head names its message twice: message_id (any string) and activity_id (16 bytes as 32
# lowercase hex characters, checked on input). As two strings they cost ~145 bytes per row (and
# interning them, to share them between a group's rows, two entries of the interned-string table),
# which with the conversation id was a third of a resident row when a conversation's members are
# not resident together (each row has its own). Packed: one bytes object, b"\x00" + the activity
# id's 16 bytes + the message id in UTF-8. Anything else (an activity id not in that form, a
# missing id) takes the general form b"\x01" + msgpack [message_id, activity_id]. Both give the
# strings back exactly.

_HEX_DIGITS = "0123456789abcdef"
_PACKED = 0
_GENERAL = 1
# The last packing, reused while the same ids come again (a message's fan-out to a group: every
# member's row then holds the same object).
_last_packed: list[Any] = [None, None, None]


def pack_head_ids(message_id: str | None, activity_id: str | None) -> bytes | None:
    if message_id is None and activity_id is None:
        return None
    last = _last_packed
    if last[0] == message_id and last[1] == activity_id:
        packed: bytes = last[2]
        return packed
    if (
        message_id is not None
        and activity_id is not None
        and len(activity_id) == 32
        and not activity_id.strip(_HEX_DIGITS)
    ):
        packed = b"\x00" + bytes.fromhex(activity_id) + message_id.encode("utf-8", "surrogatepass")
    else:
        packed = b"\x01" + msgspec.msgpack.encode([_utf8(message_id), _utf8(activity_id)])
    last[0], last[1], last[2] = message_id, activity_id, packed
    return packed


def _utf8(text: str | None) -> bytes | None:
    # surrogatepass: any str comes back exactly, even one no JSON encoder would write
    return None if text is None else text.encode("utf-8", "surrogatepass")


def _general(packed: bytes, index: int) -> str | None:
    part: bytes | None = msgspec.msgpack.decode(packed[1:])[index]
    return None if part is None else part.decode("utf-8", "surrogatepass")


def head_message_id(packed: bytes) -> str | None:
    if packed[0] == _PACKED:
        return packed[17:].decode("utf-8", "surrogatepass")
    return _general(packed, 0)


def head_activity_id(packed: bytes) -> str | None:
    if packed[0] == _PACKED:
        return packed[1:17].hex()
    return _general(packed, 1)


# Entry types that move a conversation between zones or change membership: they invalidate
# the paging snapshot's revision (docs/contract.md §5).
STRUCTURAL_ENTRIES: frozenset[type] = frozenset(
    {PinEntry, UnpinEntry, ArchiveEntry, UnarchiveEntry, LeaveEntry, DeleteConversationEntry}
)

_BITMAP_FIELDS = ("received", "counting", "mentioning", "recalled")
# The record's layout: every field but the ids (the record's key holds them), the seq sets and
# the dirty flag, in the order they first had (the slots' order). A change of layout is a new
# format number.
_PLAIN_FIELDS = (
    "archived",
    "base",
    "changed_at",
    "deleted_before",
    "floor",
    "head_activity_id",
    "head_message_id",
    "head_seq",
    "hidden_before",
    "joined_at",
    "left_at",
    "membership",
    "mention_count",
    "mention_first",
    "muted",
    "pin_rank",
    "read_seq",
    "role",
    "unread_count",
    "unread_exact",
    "version",
    "writes",
)
# Format 3 = format 2 + `marked_unread` (bool) last; format 4 = format 3 + `fast_writes` (int)
# last. Format 2 and 3 records still load (not marked; no fast writes).
_RECORD_FORMAT = 4
_RECORD_FORMAT_3 = 3
_RECORD_FORMAT_2 = 2
_RECORD_LENGTH = 1 + len(_PLAIN_FIELDS) + len(_BITMAP_FIELDS) + 2
# A field's place in a record (after the format number), for `audit_facts`.
_BASE_AT = 1 + _PLAIN_FIELDS.index("base")
_CHANGED_AT_AT = 1 + _PLAIN_FIELDS.index("changed_at")
_HEAD_SEQ_AT = 1 + _PLAIN_FIELDS.index("head_seq")
_UNREAD_COUNT_AT = 1 + _PLAIN_FIELDS.index("unread_count")
_UNREAD_EXACT_AT = 1 + _PLAIN_FIELDS.index("unread_exact")
# `load` unpacks and `dump` writes a record in this exact order: a new field must be added to both.
# fmt: off
assert _PLAIN_FIELDS == (
    "archived", "base", "changed_at", "deleted_before", "floor", "head_activity_id",
    "head_message_id", "head_seq", "hidden_before", "joined_at", "left_at", "membership",
    "mention_count", "mention_first", "muted", "pin_rank", "read_seq", "role", "unread_count",
    "unread_exact", "version", "writes",
), "ConversationState.load and .dump take the record fields in _PLAIN_FIELDS order"
assert _BITMAP_FIELDS == ("received", "counting", "mentioning", "recalled"), "and these after them"
# fmt: on

# Dispatch on the decoded struct's class: one dict lookup on the hot path.
_HANDLERS: dict[type, Callable[[ConversationState, Any, MessageStore, int], None]] = {
    MessageEntry: ConversationState.apply_message,
    ReadEntry: ConversationState._on_read,
    RecallEntry: ConversationState._on_recall,
    DeleteMessageEntry: ConversationState._on_recall,
    JoinEntry: ConversationState._on_join,
    LeaveEntry: ConversationState._on_leave,
    PinEntry: ConversationState._on_pin,
    UnpinEntry: ConversationState._on_unpin,
    ArchiveEntry: ConversationState._on_archive,
    UnarchiveEntry: ConversationState._on_unarchive,
    MuteEntry: ConversationState._on_mute,
    UnmuteEntry: ConversationState._on_unmute,
    ClearHistoryEntry: ConversationState._on_clear_history,
    DeleteConversationEntry: ConversationState._on_delete_conversation,
    MailboxDirtyEntry: ConversationState._on_mailbox_dirty,
    MarkUnreadEntry: ConversationState._on_mark_unread,
}
