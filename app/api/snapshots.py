"""Per-user in-memory snapshots and the pages cut from them (docs/contract.md §5, seed §6.1-6.3).

A snapshot is one user's list, both folders, in order, as of one load (one Redis round trip:
rows and meta together). Rows are held as the JSON bytes the store returned (with the user id
turned into a string, as clients get it): a warm page is a slice and a join, and ~1 KB per row
instead of a dict of 21 fields.

Lifecycle, and why:

* ``snapshot_revision`` is assigned at load, per user, from 1 upward. The counter outlives the
  snapshot (eviction, TTL), so a revision number is never reused for different contents.
* Revisions are counted per process: the cache has a random ``epoch`` that every cursor carries,
  so a cursor from before a restart (or from another instance) is stale, never mistaken for the
  same-numbered revision here. (Several instances want sticky routing by user, or every
  instance change restarts the walk.)
* A cursor is served from its revision only while that snapshot is held, younger than the TTL,
  and the store's ``structure_version`` (read per request: one HMGET) has not moved. Pin,
  unpin, archive, unarchive, leave and delete move it: keyset paging needs the order to stay
  put during a walk. Otherwise the answer is the first page of a new revision with
  ``projection_complete = false`` (the client restarts its walk).
* New messages and unread changes do NOT invalidate a revision: the walk goes on over the
  snapshot and the client merges SESSION_DELTA rows. But a page *without* cursor (a new walk)
  reloads when the store's version moved, so a fresh walk always reflects the store, and the
  version it reports is the one its rows are as of (the client's SessionView.reset needs that).
  The previous revision stays held next to the new one, so a walk already under way on another
  device keeps its revision through such a reload.
* Memory: an LRU over users bounded by the total rows held (``api_snapshot_cache_rows``).
* Concurrent requests of one cold user share one load.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec
import orjson

from app.api.cursor import Cursor
from app.api.sources import ProjectionReader, StateFiller, StoreMeta
from app.domain.listing import Folder, OrderFields, Position, RowFields, SortKey, arrange
from app.domain.wire_ids import row_json_to_client, row_to_client

log = logging.getLogger(__name__)

# How many revisions of one user are held at once (the live one and the one before it).
REVISIONS_PER_USER: Final = 2
# Revision counters of users whose snapshots are gone are remembered up to this many users; a
# forgotten user's counter restarts above every revision ever forgotten (`_floor`), so a number
# is still never reused.
REVISION_MEMORY: Final = 1_000_000


@dataclass(frozen=True, slots=True)
class FolderSnapshot:
    """One folder of a snapshot: parallel lists in list order. Keys only, no Position objects:
    a cursor's position is rebuilt from the key of a page's last row."""

    keys: list[SortKey]  # precomputed: a page is one bisect
    payloads: list[bytes]  # each row as JSON

    def __len__(self) -> int:
        return len(self.payloads)

    def after(self, position: Position | None) -> int:
        """Index of the first row strictly after ``position`` (0: the first page)."""
        return 0 if position is None else bisect_right(self.keys, position.key)


@dataclass(slots=True)
class Snapshot:
    user_id: int
    revision: int
    loaded_at_ms: int
    version: int  # the store's projection_mailbox_seq the rows are as of
    structure_version: int
    folders: dict[Folder, FolderSnapshot]
    filled_from_state: bool = False
    dropped: int = 0  # listed rows beyond api_snapshot_max_rows, not served
    rows: int = field(init=False)

    def __post_init__(self) -> None:
        self.rows = sum(len(f) for f in self.folders.values())


@dataclass(frozen=True, slots=True)
class Page:
    snapshot: Snapshot
    folder: Folder
    start: int
    end: int
    projection_complete: bool  # False: a stale cursor was answered with a new walk's first page

    @property
    def items(self) -> list[bytes]:
        return self.snapshot.folders[self.folder].payloads[self.start : self.end]

    @property
    def has_more(self) -> bool:
        return self.end < len(self.snapshot.folders[self.folder])

    @property
    def last_position(self) -> Position:
        return Position.of_key(self.snapshot.folders[self.folder].keys[self.end - 1])


class SnapshotCache:
    """Snapshots by user, LRU-bounded by rows held; TTL on an injected millisecond clock."""

    def __init__(self, max_rows: int, ttl_ms: int, clock_ms: Callable[[], int]) -> None:
        self.max_rows = max_rows
        self.ttl_ms = ttl_ms
        self.clock_ms = clock_ms
        self._users: OrderedDict[int, list[Snapshot]] = OrderedDict()  # oldest revision first
        self._revisions: OrderedDict[int, int] = OrderedDict()
        self._floor = 0
        self.epoch = secrets.randbits(63) + 1  # never 0: an unset protobuf field reads as 0
        self.held_rows = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._users)

    def next_revision(self, user_id: int) -> int:
        revision = self._revisions.pop(user_id, self._floor) + 1
        self._revisions[user_id] = revision
        while len(self._revisions) > REVISION_MEMORY:
            _, forgotten = self._revisions.popitem(last=False)
            self._floor = max(self._floor, forgotten)
        return revision

    def held(self, user_id: int) -> list[Snapshot]:
        """The user's unexpired snapshots, oldest first (expired ones are dropped here)."""
        snapshots = self._users.get(user_id)
        if not snapshots:
            return []
        now = self.clock_ms()
        alive = [s for s in snapshots if now - s.loaded_at_ms < self.ttl_ms]
        if len(alive) != len(snapshots):
            self.held_rows -= sum(s.rows for s in snapshots) - sum(s.rows for s in alive)
            if alive:
                self._users[user_id] = alive
            else:
                del self._users[user_id]
                return []
        self._users.move_to_end(user_id)
        return alive

    def put(self, snapshot: Snapshot) -> None:
        snapshots = self._users.pop(snapshot.user_id, [])
        snapshots.append(snapshot)
        while len(snapshots) > REVISIONS_PER_USER:
            self.held_rows -= snapshots.pop(0).rows
        self._users[snapshot.user_id] = snapshots
        self.held_rows += snapshot.rows
        self._evict(keep=snapshot.user_id)

    def _evict(self, keep: int) -> None:
        # Least recently used users first; the user just loaded stays (max_rows >= one user).
        while self.held_rows > self.max_rows:
            for user_id in self._users:
                if user_id != keep:
                    break
            else:
                return
            self.held_rows -= sum(s.rows for s in self._users.pop(user_id))
            self.evictions += 1


class SessionLists:
    """Pages of GET /v1/sessions: snapshot choice, loads, fill from state."""

    def __init__(
        self,
        projections: ProjectionReader,
        cache: SnapshotCache,
        *,
        max_rows: int,
        state: StateFiller | None = None,
        fill_mode: str = "empty",
    ) -> None:
        self.projections = projections
        self.cache = cache
        self.max_rows = max_rows
        self.state = state if fill_mode != "never" else None
        self.fill_mode = fill_mode
        self._loading: dict[int, asyncio.Task[Snapshot]] = {}
        self.loads = 0
        self.hits = 0  # pages served from a held snapshot, without a load (metrics)

    @property
    def evictions(self) -> int:
        return self.cache.evictions

    async def page(self, user_id: int, folder: Folder, limit: int, cursor: Cursor | None) -> Page:
        meta = await self.projections.meta(user_id)
        held = self.cache.held(user_id)
        if cursor is not None and cursor.epoch == self.cache.epoch:
            snap = next((s for s in held if s.revision == cursor.revision), None)
            if snap is not None and snap.structure_version == meta.structure_version:
                listing = snap.folders[folder]
                start = listing.after(cursor.position)
                self.hits += 1
                return Page(snap, folder, start, min(start + limit, len(listing)), True)
        # A new walk: the first page of the live snapshot if it is current, else of a new one.
        live = held[-1] if held else None
        if live is None or not _current(live, meta):
            live = await self._load(user_id)
        else:
            self.hits += 1
        return Page(live, folder, 0, min(limit, len(live.folders[folder])), cursor is None)

    async def _load(self, user_id: int) -> Snapshot:
        # The load runs as its own task: concurrent requests of the user share it, and a
        # request that is cancelled (its client went away) does not cancel it for the others.
        task = self._loading.get(user_id)
        if task is None:
            task = asyncio.create_task(self._build(user_id))
            self._loading[user_id] = task
            task.add_done_callback(lambda done: self._finished(user_id, done))
        return await asyncio.shield(task)

    def _finished(self, user_id: int, task: asyncio.Task[Snapshot]) -> None:
        if self._loading.get(user_id) is task:
            del self._loading[user_id]
        if not task.cancelled():
            task.exception()  # retrieved here, so a failure nobody waits for any more is not logged as lost

    async def _build(self, user_id: int) -> Snapshot:
        loaded = await self.projections.load_rows(user_id)  # rows + meta, one MULTI round trip
        meta = loaded.meta
        items: list[tuple[OrderFields, bytes]] = []
        known: set[str] = set()
        unreadable = 0
        for data in loaded.rows:
            try:
                fields = _ORDER_DECODER.decode(data)
            except msgspec.DecodeError:  # not a JSON object: one bad row must not hide the list
                unreadable += 1
                continue
            # Held (and served) as clients get it: the u64 user id as a string (docs/contract.md §9).
            items.append((fields, row_json_to_client(data)))
            if isinstance(fields.conversation_id, str):
                known.add(fields.conversation_id)
        filled = False
        if self.state is not None and (self.fill_mode == "always" or (meta.version == 0 and not items)):
            extra = await self.state.rows(user_id, known)
            items.extend((RowFields.of(row), held_json(row_to_client(row))) for row in extra)
            filled = bool(extra)
        folders, dropped, bad = arrange(items, self.max_rows)
        if unreadable or bad:
            log.error("user %d: %d unreadable rows left out; %s", user_id, unreadable, "; ".join(bad[:5]))
        if dropped:
            log.warning("user %d: %d listed rows beyond %d not served", user_id, dropped, self.max_rows)
        snapshot = Snapshot(
            user_id=user_id,
            revision=self.cache.next_revision(user_id),
            loaded_at_ms=self.cache.clock_ms(),
            version=meta.version,
            structure_version=meta.structure_version,
            folders={f: FolderSnapshot(o.keys, o.rows) for f, o in folders.items()},
            filled_from_state=filled,
            dropped=dropped,
        )
        self.cache.put(snapshot)
        self.loads += 1
        return snapshot


class _OrderFields(msgspec.Struct):
    """The five fields the order needs, decoded from a stored row's JSON; the other sixteen are
    skipped by the decoder (about 3x faster than decoding the whole row). Typed Any: the
    values are checked by app.domain.listing exactly as for a decoded row."""

    conversation_id: Any = None
    listed: Any = None
    archived: Any = None
    pin_rank: Any = None
    last_activity_id: Any = None


_ORDER_DECODER: Final = msgspec.json.Decoder(_OrderFields)


def held_json(row: Any) -> bytes:
    """``row`` as JSON bytes to be held for long: an exact-size copy of orjson's output. orjson
    returns its bytes with the spare capacity of its write buffer still allocated (~8 KB per
    call, measured: 100,000 dumps of 600-byte rows take ~820 MB of RSS, their copies ~68 MB)."""
    return bytes(memoryview(orjson.dumps(row)))


def _current(snapshot: Snapshot, meta: StoreMeta) -> bool:
    return snapshot.version == meta.version and snapshot.structure_version == meta.structure_version
