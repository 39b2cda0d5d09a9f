"""Which rows a page shows and in what order: zones, folders, keyset positions (docs/contract.md §5, seed §6).

Pure: stdlib only. The query API (app/api) builds a per-user snapshot with :func:`build_folders`
and cuts pages with :meth:`Ordered.after`; the client library sorts with
:func:`app.domain.client.sort_rows`, and a test keeps the two orders identical.

Order, within a folder:

* pinned zone: ``pin_rank ASC, last_activity_id DESC, conversation_id ASC``;
* then the normal zone: ``last_activity_id DESC, conversation_id ASC``;
* a null ``last_activity_id`` sorts last within its zone (after every activity).

Every row maps to a :class:`Position`, and a position to a :data:`SortKey`, a tuple whose
*ascending* order is the list order, so "strictly after the cursor" is one ``bisect_right``.
DESC on the activity is ascending on its bytes complemented (``255 - b``: 16 fixed-length bytes,
so the complement reverses the order exactly); activity ids are 32 lowercase hex chars whose
string order equals their byte order, and canonical UUID strings order like their 16 bytes, so
this agrees with ``sort_rows`` (string comparisons) row for row.
"""

from __future__ import annotations

import enum
import re
import uuid
from bisect import bisect_right
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass
from itertools import compress
from operator import itemgetter
from typing import Final, Generic, NamedTuple, Protocol, TypeVar

Row = Mapping[str, object]
T = TypeVar("T")
# (zone, pin_rank, null_activity, complemented activity, conversation id bytes)
SortKey = tuple[int, int, int, bytes, bytes]

ACTIVITY_BYTES: Final = 16
CONVERSATION_BYTES: Final = 16
PIN_RANK_LIMIT: Final = 1 << 32  # pin_rank is a u32 (docs/contract.md §2)
_COMPLEMENT: Final = bytes(255 - b for b in range(256))
_CANONICAL_UUID: Final = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")


class Zone(enum.IntEnum):
    # Values are the zone's place in the order (pinned first); the cursor's protobuf enum is
    # mapped explicitly in app/api/cursor.py, never by value.
    PINNED = 0
    NORMAL = 1


class Folder(enum.Enum):
    MAIN = "main"
    ARCHIVED = "archived"


class RowError(ValueError):
    """A stored row that cannot be placed in the order (missing or ill-typed ordering field)."""


class Position(NamedTuple):
    """Where a row sits in its folder's order: what a page cursor carries.

    A NamedTuple, not a validating dataclass: a snapshot makes one per row (5,000 on a cold
    load), from fields :func:`position_of` has already checked. Positions built from outside
    input (a cursor) go through :meth:`checked`.
    """

    zone: Zone
    pin_rank: int  # 0 in the normal zone
    last_activity_id: bytes | None  # 16 bytes, None = no visible message yet
    conversation_id: bytes  # 16 bytes

    @classmethod
    def checked(
        cls, zone: Zone, pin_rank: int, last_activity_id: bytes | None, conversation_id: bytes
    ) -> Position:
        if zone is Zone.NORMAL and pin_rank != 0:
            raise ValueError("a normal-zone position has no pin_rank")
        if not 0 <= pin_rank < PIN_RANK_LIMIT:
            raise ValueError(f"pin_rank must be a u32, got {pin_rank}")
        if last_activity_id is not None and len(last_activity_id) != ACTIVITY_BYTES:
            raise ValueError(f"last_activity_id must be {ACTIVITY_BYTES} bytes")
        if len(conversation_id) != CONVERSATION_BYTES:
            raise ValueError(f"conversation_id must be {CONVERSATION_BYTES} bytes")
        return cls(zone, pin_rank, last_activity_id, conversation_id)

    @property
    def key(self) -> SortKey:
        # Plain ints and bytes only (zone as its int value): a tuple of atomic values is
        # untracked by the garbage collector, and a cache holds hundreds of thousands of keys.
        activity = self.last_activity_id
        if activity is None:
            return (self.zone.value, self.pin_rank, 1, b"", self.conversation_id)
        return (self.zone.value, self.pin_rank, 0, activity.translate(_COMPLEMENT), self.conversation_id)

    @classmethod
    def of_key(cls, key: SortKey) -> Position:
        """The position a key was made from (a snapshot keeps keys only)."""
        zone, pin_rank, no_activity, activity, conversation = key
        return cls(
            Zone(zone), pin_rank, None if no_activity else activity.translate(_COMPLEMENT), conversation
        )


class OrderFields(Protocol):
    """What the order needs from a row: a mapping row gives it through :class:`RowFields`; the
    API decodes just these five fields of stored JSON (a struct with the same attributes)."""

    @property
    def conversation_id(self) -> object: ...
    @property
    def listed(self) -> object: ...
    @property
    def archived(self) -> object: ...
    @property
    def pin_rank(self) -> object: ...
    @property
    def last_activity_id(self) -> object: ...


class RowFields(NamedTuple):
    conversation_id: object
    listed: object
    archived: object
    pin_rank: object
    last_activity_id: object

    @classmethod
    def of(cls, row: Row) -> RowFields:
        return cls(
            row.get("conversation_id"),
            row.get("listed"),
            row.get("archived"),
            row.get("pin_rank"),
            row.get("last_activity_id"),
        )


def is_listed(row: Row) -> bool:
    """In the list at all: a deleted conversation (not revived) is not (docs/contract.md §3.7)."""
    return row.get("listed") is not False


def _uuid_bytes(cid: object) -> bytes | None:
    if not isinstance(cid, str):
        return None
    if _CANONICAL_UUID.match(cid):  # the stored form: skip uuid.UUID's slower general parser
        return bytes.fromhex(cid.replace("-", ""))
    try:
        return uuid.UUID(cid).bytes
    except ValueError:
        return None


def position_of(row: Row) -> Position:
    """The row's place in the order; RowError when its ordering fields are malformed."""
    return position_from(RowFields.of(row))


def position_from(fields: OrderFields) -> Position:
    cid = fields.conversation_id
    conversation = _uuid_bytes(cid)
    if conversation is None:
        raise RowError(f"row has no valid conversation_id: {cid!r}")
    rank = fields.pin_rank
    if rank is None:
        zone, pin_rank = Zone.NORMAL, 0
    elif isinstance(rank, int) and not isinstance(rank, bool) and 0 <= rank < PIN_RANK_LIMIT:
        zone, pin_rank = Zone.PINNED, rank
    else:
        raise RowError(f"row {cid}: pin_rank {rank!r} is not a u32 or null")
    activity = fields.last_activity_id
    if activity is None:
        activity_bytes = None
    else:
        try:
            activity_bytes = bytes.fromhex(activity) if isinstance(activity, str) else None
        except ValueError:
            activity_bytes = None
        if activity_bytes is None or len(activity_bytes) != ACTIVITY_BYTES:
            raise RowError(f"row {cid}: last_activity_id {activity!r} is not 32 hex chars")
    return Position(zone, pin_rank, activity_bytes, conversation)


@dataclass(frozen=True, slots=True)
class Ordered(Generic[T]):
    """One folder in list order: the items (rows, or whatever the caller keeps per row) and
    their keys (parallel lists)."""

    rows: list[T]
    keys: list[SortKey]

    def __len__(self) -> int:
        return len(self.rows)

    def after(self, position: Position | None) -> int:
        """Index of the first row strictly after ``position`` (0 for None: the first page).

        Works for any position, held or not: a cursor from this snapshot names a row in it, but
        the comparison itself only needs the order.
        """
        return 0 if position is None else bisect_right(self.keys, position.key)

    def head(self, count: int) -> Ordered[T]:
        return Ordered(self.rows[:count], self.keys[:count])

    def kept(self, wanted: Container[object]) -> Ordered[T]:
        """The items that are in ``wanted``, in order, with their keys (a reload: the rows of an
        earlier arrangement that are unchanged since)."""
        mask = [row in wanted for row in self.rows]
        return Ordered(list(compress(self.rows, mask)), list(compress(self.keys, mask)))


def order(rows: Iterable[Row]) -> Ordered[Row]:
    """Rows in list order (no filtering; RowError for a malformed row)."""
    return _ordered([(position_of(row).key, row) for row in rows])


def _ordered(pairs: list[tuple[SortKey, T]]) -> Ordered[T]:
    # Stable and adaptive: pairs that come already in order (the unchanged rows of a reload,
    # in their earlier order) cost one comparison each.
    pairs.sort(key=itemgetter(0))
    return Ordered(rows=[item for _, item in pairs], keys=[key for key, _ in pairs])


# At most this many new items are inserted one by one into an earlier arrangement (a bisect and
# a list insert each); more are sorted in with it.
_INSERTED_ONE_BY_ONE: Final = 64


def arrange(
    items: Iterable[tuple[OrderFields, T]],
    max_rows: int | None = None,
    earlier: Mapping[Folder, Ordered[T]] | None = None,
) -> tuple[dict[Folder, Ordered[T]], int, list[str]]:
    """Listed items split by folder, each in list order; unlisted ones are left out.

    Each item comes with its row's :class:`OrderFields`; what is kept per row (the row itself,
    its stored bytes) is the caller's. ``earlier``: per folder, items already in list order
    with their keys, as an earlier arrangement put them (a reload after a few rows changed: the
    unchanged rows, :meth:`Ordered.kept`, are neither parsed nor compared again); ``items`` are
    then the others, and the result is what arranging them all from scratch gives (an earlier
    item sorts before a new one with an equal key). ``max_rows`` bounds the rows kept over both
    folders together (the seed's max_conversations_per_user): the *last* rows in order are
    dropped, main folder kept first. A row whose ordering fields are malformed is left out
    rather than failing the whole list. Returns the folders, how many listed rows were dropped,
    and what was wrong with each malformed row.
    """
    fresh: dict[Folder, list[tuple[SortKey, T]]] = {folder: [] for folder in Folder}
    main, archived = fresh[Folder.MAIN], fresh[Folder.ARCHIVED]
    bad: list[str] = []
    for fields, item in items:
        if fields.listed is False:
            continue
        try:
            key = position_from(fields).key
        except RowError as exc:
            bad.append(str(exc))
            continue
        (archived if fields.archived is True else main).append((key, item))
    folders = {}
    for folder in Folder:
        before = (earlier or {}).get(folder)
        folders[folder] = _ordered(fresh[folder]) if before is None else _merged(before, fresh[folder])
    dropped = 0
    if max_rows is not None:
        budget = max_rows
        for folder in Folder:  # MAIN first: it is what every client shows
            held = folders[folder]
            if len(held) > budget:
                dropped += len(held) - budget
                folders[folder] = held.head(budget)
            budget -= len(folders[folder])
    return folders, dropped, bad


def _merged(before: Ordered[T], new: list[tuple[SortKey, T]]) -> Ordered[T]:
    """``before`` (in order) with ``new`` items placed among them, each after equal keys."""
    if len(new) > _INSERTED_ONE_BY_ONE:
        return _ordered(list(zip(before.keys, before.rows, strict=True)) + new)
    keys, rows = list(before.keys), list(before.rows)
    new.sort(key=itemgetter(0))
    for key, item in new:
        at = bisect_right(keys, key)
        keys.insert(at, key)
        rows.insert(at, item)
    return Ordered(rows=rows, keys=keys)


def build_folders(
    rows: Iterable[Row], max_rows: int | None = None
) -> tuple[dict[Folder, Ordered[Row]], int, list[str]]:
    """:func:`arrange` over mapping rows (the rows themselves are kept)."""
    return arrange(((RowFields.of(row), row) for row in rows), max_rows)
