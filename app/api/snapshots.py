"""Per-user in-memory snapshots and the pages cut from them (docs/contract.md §5, seed §6.1-6.3).

A snapshot is one user's list, both folders, in order, as of one load (one Redis round trip:
rows and meta together). Rows are held as the JSON bytes the store returned (~1 KB per row
instead of a dict of 21 fields), and a page makes the served form of its rows (the user id
turned into a string, as clients get it; ~1 µs a row): a warm page is a slice, 50 conversions
and a join, and a cold load converts the rows it serves, not all 5,000 (issue 32). A reload
keeps each row whose stored bytes the user's newest snapshot holds (the same bytes are the same
order fields) where that snapshot put it, without parsing it.

Lifecycle, and why:

* The fleet shares the walks (issue 32): a new snapshot is *published* in the projection store
  (app/stores/redis_fleet.py, under the user's hash tag, kept for the snapshot TTL) as its
  frozen record: the order of its walk (the sort keys of each folder) and what it was loaded
  at (version, structure version, corrections). Publishing gives it its ``snapshot_revision``
  from the user's counter in the store (from 1 upward, fleet-wide) and makes it the user's
  live snapshot. Each snapshot also has a random 63-bit id, made once where it is built; a
  cursor carries revision and id, so it names one snapshot of the fleet, never a
  same-numbered other one (a counter that restarted after its key expired, a store that lost
  data), and no process's identity: any instance honours it.
* The in-process snapshot is a cache in front of the record. An instance asked for a cursor of
  a snapshot it does not hold *adopts* it: reads the record (its frozen order) and, page by
  page, the rows of each page it serves (one HMGET; a page once read is held like any other).
  A snapshot filled from Cassandra state is adopted whole (store rows plus the fill again).
  The next page is then exact under J-5 wherever it is served: the same order, the same keyset
  position, so no duplicate and no gap; a row a message changed since the load may be served as
  it is now (newer than the page's ``projection_mailbox_seq``, which the client's merge rule
  accepts: a newer whole row overwrites). A frozen row missing from the store (a lost
  projection) cannot be placed: the walk restarts rather than skip it.
* A cursor is served from its revision only while that snapshot is held or its record kept,
  younger than the TTL, and the store's ``structure_version`` (read per request with the live
  header: one script call) has not moved. Pin,
  unpin, archive, unarchive, leave and delete move it: keyset paging needs the order to stay
  put during a walk. Otherwise the answer is the first page of a new revision with
  ``projection_complete = false`` (the client restarts its walk).
* New messages and unread changes do NOT invalidate a revision: the walk goes on over the
  snapshot and the client merges SESSION_DELTA rows. But a page *without* cursor (a new walk)
  reloads when the store's version moved, so a fresh walk always reflects the store, and the
  version it reports is the one its rows are as of (the client's SessionView.reset needs that).
  Likewise when the store's ``corrections`` moved: the audit, the console's reconcile and the
  projection repair rewrite rows without a new version (correction frames reach the walks in
  flight), and a held snapshot must not serve the rows they replaced to new walks, on any
  instance. A new walk is served the fleet's live snapshot when it is current (held here, or
  adopted), else a new one is built and published.
  The previous revision stays held next to the new one, so a walk already under way on another
  device keeps its revision through such a reload.
* Memory: an LRU over users bounded by the total rows held (``api_snapshot_cache_rows``).
* Concurrent requests of one cold user share one load.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import uuid
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Final, cast

import msgspec
import orjson

from app.api.cursor import Cursor
from app.api.sources import LoadedRows, ProjectionReader, StateFiller, StoreMeta
from app.domain.listing import (
    Folder,
    Ordered,
    OrderFields,
    Position,
    RowError,
    RowFields,
    SortKey,
    arrange,
    position_from,
)
from app.domain.wire_ids import row_json_to_client, row_to_client

log = logging.getLogger(__name__)

# How many revisions of one user are held at once (the live one and the one before it).
REVISIONS_PER_USER: Final = 2


@dataclass(frozen=True, slots=True)
class FolderSnapshot:
    """One folder of a snapshot: parallel lists in list order. Keys only, no Position objects:
    a cursor's position is rebuilt from the key of a page's last row."""

    keys: list[SortKey]  # precomputed: a page is one bisect
    # Each row's JSON as the store holds it. None: not read yet (a snapshot adopted from the
    # fleet's record reads the rows of a page when it serves that page: SessionLists._fill).
    stored: list[bytes | None]

    def __len__(self) -> int:
        return len(self.stored)

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
    snapshot_id: int = 0  # random, made where it was built; with the revision in every cursor
    corrections: int = 0  # the store's corrections counter the rows are as of
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
        """The page's rows as served: the u64 user id as a string (docs/contract.md §9)."""
        # Read by SessionLists.page before a Page is handed out (no None in the range).
        rows = cast("list[bytes]", self.snapshot.folders[self.folder].stored[self.start : self.end])
        return [row_json_to_client(row, self.snapshot.user_id) for row in rows]

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
        self.held_rows = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._users)

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
        self.held_rows -= sum(s.rows for s in snapshots if s.snapshot_id == snapshot.snapshot_id)
        snapshots = [s for s in snapshots if s.snapshot_id != snapshot.snapshot_id]
        snapshots.append(snapshot)
        snapshots.sort(key=lambda s: s.revision)  # an adopted older revision stays the older one
        self.held_rows += snapshot.rows
        while len(snapshots) > REVISIONS_PER_USER:
            self.held_rows -= snapshots.pop(0).rows
        self._users[snapshot.user_id] = snapshots
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


class FrozenRecord(msgspec.Struct, array_like=True, frozen=True):
    """What the fleet keeps of a snapshot (app/stores/redis_fleet.py): the order of its walk, as
    sort keys per folder, and what its rows were loaded at. The rows themselves are not kept
    (~40 bytes a row instead of ~600): an instance that adopts it takes them from the store."""

    version: int
    structure_version: int
    corrections: int
    created_ms: int
    filled_from_state: bool
    dropped: int
    main: list[tuple[int, int, int, bytes, bytes]]
    archived: list[tuple[int, int, int, bytes, bytes]]


_RECORD_ENCODER: Final = msgspec.msgpack.Encoder()
_RECORD_DECODER: Final = msgspec.msgpack.Decoder(FrozenRecord)


@dataclass(frozen=True, slots=True)
class LiveHeader:
    """The fleet's live snapshot of a user, as the store's header names it:
    ``<revision>:<id>:<version>:<structure_version>:<corrections>``."""

    revision: int
    snapshot_id: int
    version: int
    structure_version: int
    corrections: int

    @classmethod
    def parse(cls, text: str | None) -> LiveHeader | None:
        if not text:
            return None
        try:
            revision, snapshot_id, version, structure_version, corrections = map(int, text.split(":"))
        except ValueError:
            log.error("unreadable live snapshot header %r", text[:100])
            return None
        return cls(revision, snapshot_id, version, structure_version, corrections)

    def current(self, meta: StoreMeta) -> bool:
        return (self.version, self.structure_version, self.corrections) == (
            meta.version,
            meta.structure_version,
            meta.corrections,
        )


class SessionLists:
    """Pages of GET /v1/sessions: snapshot choice, loads, adoption of the fleet's, fill from state."""

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
        self.records = projections.fleet.snapshots
        self.cache = cache
        self.max_rows = max_rows
        self.state = state if fill_mode != "never" else None
        self.fill_mode = fill_mode
        self._loading: dict[Hashable, asyncio.Task[Snapshot | None]] = {}
        self.loads = 0
        self.adoptions = 0  # snapshots another instance built, taken from the store (metrics)
        self.hits = 0  # pages served from a held snapshot, without a load (metrics)

    @property
    def evictions(self) -> int:
        return self.cache.evictions

    async def page(self, user_id: int, folder: Folder, limit: int, cursor: Cursor | None) -> Page:
        meta = await self.projections.meta(user_id)  # with the fleet's live header: one round trip
        held = self.cache.held(user_id)
        unservable = 0  # a snapshot whose rows the store no longer has: not the live one either
        if cursor is not None:
            snap = next(
                (s for s in held if s.revision == cursor.revision and s.snapshot_id == cursor.snapshot_id),
                None,
            )
            held_here = snap is not None
            if snap is None and cursor.snapshot_id:  # made somewhere in the fleet: its record, if kept
                snap = await self._adopt(user_id, cursor.revision, cursor.snapshot_id)
            if snap is not None and snap.structure_version == meta.structure_version:
                listing = snap.folders[folder]
                start = listing.after(cursor.position)
                end = min(start + limit, len(listing))
                if await self._fill(snap, folder, start, end):
                    self.hits += held_here
                    return Page(snap, folder, start, end, True)
                unservable = snap.snapshot_id
        # A new walk: the first page of the fleet's live snapshot if it is current, else of a new one.
        live = None
        header = LiveHeader.parse(meta.live)
        if header is not None and header.current(meta) and header.snapshot_id != unservable:
            live = next((s for s in held if s.snapshot_id == header.snapshot_id), None)
            held_here = live is not None
            if live is None:
                live = await self._adopt(user_id, header.revision, header.snapshot_id)
            if live is not None and not await self._fill(
                live, folder, 0, min(limit, len(live.folders[folder]))
            ):
                live = None
            elif held_here:
                self.hits += 1
        if live is None:
            live = await self._load(user_id)  # every row read: nothing to fill
        return Page(live, folder, 0, min(limit, len(live.folders[folder])), cursor is None)

    async def _fill(self, snapshot: Snapshot, folder: Folder, start: int, end: int) -> bool:
        """Reads the rows of a page an adopted snapshot has not read yet (one round trip); False
        when the store lacks one of them (the frozen order cannot be served without a gap)."""
        listing = snapshot.folders[folder]
        stored = listing.stored
        unread = [i for i in range(start, end) if stored[i] is None]
        if not unread:
            return True
        wanted = [str(uuid.UUID(bytes=listing.keys[i][4])) for i in unread]
        rows, meta = await self.projections.some_rows(snapshot.user_id, wanted)
        if meta.structure_version != snapshot.structure_version:
            return False  # a pin, archive, ... since the request's first read: the walk restarts
        if any(row is None for row in rows):
            log.warning(
                "user %d: snapshot %d names rows the store lacks: not served (the walk restarts)",
                snapshot.user_id,
                snapshot.revision,
            )
            return False
        for i, row in zip(unread, rows, strict=True):
            stored[i] = bytes(cast(bytes, row))
        return True

    async def _load(self, user_id: int) -> Snapshot:
        snapshot = await self._shared((user_id, 0), lambda: self._build(user_id))
        assert snapshot is not None
        return snapshot

    async def _adopt(self, user_id: int, revision: int, snapshot_id: int) -> Snapshot | None:
        return await self._shared((user_id, snapshot_id), lambda: self._take(user_id, revision, snapshot_id))

    async def _shared(self, key: Hashable, make: Callable[[], Awaitable[Snapshot | None]]) -> Snapshot | None:
        # A load runs as its own task: concurrent requests of the user share it, and a
        # request that is cancelled (its client went away) does not cancel it for the others.
        task = self._loading.get(key)
        if task is None:

            async def run() -> Snapshot | None:
                return await make()

            task = asyncio.create_task(run())
            self._loading[key] = task
            task.add_done_callback(lambda done: self._finished(key, done))
        return await asyncio.shield(task)

    def _finished(self, key: Hashable, task: asyncio.Task[Snapshot | None]) -> None:
        if self._loading.get(key) is task:
            del self._loading[key]
        if not task.cancelled():
            task.exception()  # retrieved here, so a failure nobody waits for any more is not logged as lost

    def _earlier(self, user_id: int, rows: list[bytes]) -> dict[Folder, Ordered[bytes]]:
        """The rows the user's newest held snapshot placed that are among ``rows`` (the same
        stored bytes are the same order fields, so the same key and folder), in its order: a
        reload after a few rows changed neither parses nor sorts the others again, and holds the
        bytes objects the older revision holds (one copy for both)."""
        held = self.cache.held(user_id)
        if not held:
            return {}
        present = set(rows)
        return {
            folder: Ordered(cast("list[bytes]", listing.stored), listing.keys).kept(present)
            for folder, listing in held[-1].folders.items()
        }

    async def _items(
        self, user_id: int, fill: bool | None, reuse: bool = False
    ) -> tuple[StoreMeta, list[tuple[OrderFields, bytes]], dict[Folder, Ordered[bytes]], bool]:
        """The user's rows as (order fields, JSON as stored), with the fill from state when
        `fill` says (None: as the fill mode says for this load). With `reuse`, the rows the
        user's newest held snapshot placed unchanged are returned apart, in their order (for
        :func:`arrange`'s ``earlier``), not in the list."""
        loaded: LoadedRows = await self.projections.load_rows(user_id)  # rows + meta, one round trip
        meta = loaded.meta
        earlier = self._earlier(user_id, loaded.rows) if reuse else {}
        unchanged = {row for listing in earlier.values() for row in listing.rows}
        items: list[tuple[OrderFields, bytes]] = []
        unreadable = 0
        for data in loaded.rows:
            if data in unchanged:
                continue
            try:
                fields = _ORDER_DECODER.decode(data)
            except msgspec.DecodeError:  # not a JSON object: one bad row must not hide the list
                unreadable += 1
                continue
            items.append((fields, data))
        if unreadable:
            log.error("user %d: %d unreadable rows left out", user_id, unreadable)
        if fill is None:
            fill = self.fill_mode == "always" or (meta.version == 0 and not items and not unchanged)
        filled = False
        if self.state is not None and fill:
            known = {str(uuid.UUID(bytes=key[4])) for listing in earlier.values() for key in listing.keys}
            known.update(c for fields, _ in items if isinstance(c := fields.conversation_id, str))
            extra = await self.state.rows(user_id, known)
            # Held in the served form already (converting it again changes nothing).
            items.extend((RowFields.of(row), held_json(row_to_client(row))) for row in extra)
            filled = bool(extra)
        return meta, items, earlier, filled

    async def _build(self, user_id: int) -> Snapshot:
        meta, items, earlier, filled = await self._items(user_id, None, reuse=True)
        folders, dropped, bad = arrange(items, self.max_rows, earlier)
        if bad:
            log.error("user %d: rows left out; %s", user_id, "; ".join(bad[:5]))
        if dropped:
            log.warning("user %d: %d listed rows beyond %d not served", user_id, dropped, self.max_rows)
        snapshot_id = secrets.randbits(63) + 1  # never 0: an unset protobuf field reads as 0
        now = self.cache.clock_ms()
        record = FrozenRecord(
            version=meta.version,
            structure_version=meta.structure_version,
            corrections=meta.corrections,
            created_ms=now,
            filled_from_state=filled,
            dropped=dropped,
            main=folders[Folder.MAIN].keys,
            archived=folders[Folder.ARCHIVED].keys,
        )
        header = f"{snapshot_id}:{meta.version}:{meta.structure_version}:{meta.corrections}"
        revision = await self.records.publish(
            user_id, snapshot_id, header, _RECORD_ENCODER.encode(record), self.cache.ttl_ms
        )
        snapshot = Snapshot(
            user_id=user_id,
            revision=revision,
            loaded_at_ms=now,
            version=meta.version,
            structure_version=meta.structure_version,
            folders={
                f: FolderSnapshot(o.keys, cast("list[bytes | None]", o.rows)) for f, o in folders.items()
            },
            filled_from_state=filled,
            dropped=dropped,
            snapshot_id=snapshot_id,
            corrections=meta.corrections,
        )
        self.cache.put(snapshot)
        self.loads += 1
        return snapshot

    async def _take(self, user_id: int, revision: int, snapshot_id: int) -> Snapshot | None:
        """Adopt a snapshot of the fleet: its frozen order, with the user's rows from the store
        (None when its record is gone, unreadable, expired, or names a row the store lacks)."""
        raw = await self.records.record(user_id, snapshot_id)
        if raw is None:
            return None
        try:
            record = _RECORD_DECODER.decode(raw)
        except msgspec.DecodeError as exc:
            log.error("user %d: unreadable snapshot record %d: %s", user_id, snapshot_id, exc)
            return None
        if self.cache.clock_ms() - record.created_ms >= self.cache.ttl_ms:
            return None
        if not record.filled_from_state:  # the rows are the store's: each page reads its own
            lazy = {
                folder: FolderSnapshot(list(keys), [None] * len(keys))
                for folder, keys in ((Folder.MAIN, record.main), (Folder.ARCHIVED, record.archived))
            }
            return self._adopted(user_id, revision, snapshot_id, record, lazy)
        _, items, _, _ = await self._items(user_id, record.filled_from_state)
        by_conversation: dict[bytes, bytes] = {}
        for fields, payload in items:
            try:
                by_conversation[position_from(fields).conversation_id] = payload
            except RowError:
                continue
        folders: dict[Folder, FolderSnapshot] = {}
        for folder, keys in ((Folder.MAIN, record.main), (Folder.ARCHIVED, record.archived)):
            payloads = [by_conversation.get(key[4]) for key in keys]
            present = [p for p in payloads if p is not None]
            if len(present) != len(payloads):
                log.warning(
                    "user %d: snapshot %d names %d rows the store lacks: not adopted (the walk restarts)",
                    user_id,
                    revision,
                    len(payloads) - len(present),
                )
                return None
            folders[folder] = FolderSnapshot(list(keys), cast("list[bytes | None]", present))
        return self._adopted(user_id, revision, snapshot_id, record, folders)

    def _adopted(
        self,
        user_id: int,
        revision: int,
        snapshot_id: int,
        record: FrozenRecord,
        folders: dict[Folder, FolderSnapshot],
    ) -> Snapshot:
        snapshot = Snapshot(
            user_id=user_id,
            revision=revision,
            loaded_at_ms=record.created_ms,
            version=record.version,
            structure_version=record.structure_version,
            folders=folders,
            filled_from_state=record.filled_from_state,
            dropped=record.dropped,
            snapshot_id=snapshot_id,
            corrections=record.corrections,
        )
        self.cache.put(snapshot)
        self.adoptions += 1
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
