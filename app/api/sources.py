"""What the API reads: the projection store (rows, meta) and the Cassandra fallback.

Two small ports with an adapter each, so handlers and the snapshot layer are tested against the
in-memory store and run against Redis/Cassandra unchanged:

* :class:`ProjectionReader`: ``load_rows`` (rows + meta in one round trip: the snapshot) and
  ``meta`` (one HMGET: the cheap per-request check of version and structure_version, and the
  badge);
* :class:`StateFiller`: rows for conversations UserConversationState knows and the projection
  store lacks (docs/contract.md §5), with unread by the core's rules (``row_from_state``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import Any, NamedTuple, Protocol

import orjson

from app.api.fleet import FleetState, memory_fleet
from app.domain.projection_store import StoredProjection
from app.domain.rebuild import Head, row_from_state
from app.stores.memory_projection import InMemoryProjectionStore
from app.stores.projection_codec import extra_fields
from app.stores.redis_fleet import RedisFleetState, live_meta
from app.stores.redis_projection import (
    EXTRA_FIELDS,
    SERVED_FIELDS,
    SERVING_RECHECK_S,
    ProjectionStoreError,
    RedisProjectionStore,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StoreMeta:
    """A user's meta hash: version (projection_mailbox_seq), structure_version, the badge, how
    many times rows were rewritten without a new version (corrections), and the fleet's live
    snapshot header (app/api/snapshots.py; None when there is none or it was not read)."""

    version: int
    structure_version: int
    total_unread: int
    total_mention: int
    muted_unread: int
    corrections: int = 0
    live: str | None = None
    # docs/contract.md §10 (a meta written before them: 0, messages mode, muted not included)
    archived_unread: int = 0
    archived_mention: int = 0
    badge_mode: str = "messages"
    include_muted: bool = False


class LoadedRows(NamedTuple):
    """A user's rows and meta from one instant; each row as the JSON bytes the store holds (the
    snapshot decodes only the fields the order needs, and serves the bytes as they are)."""

    meta: StoreMeta
    rows: list[bytes]


class ProjectionReader(Protocol):
    @property
    def fleet(self) -> FleetState:
        """What the API instances over this store share (app/api/fleet.py)."""
        ...

    async def load_rows(self, user_id: int) -> LoadedRows: ...

    async def meta(self, user_id: int) -> StoreMeta: ...

    async def some_rows(
        self, user_id: int, conversation_ids: list[str]
    ) -> tuple[list[bytes | None], StoreMeta]:
        """These rows as stored (None where the store has none) and the meta of the same instant:
        one round trip."""
        ...


class StateFiller(Protocol):
    async def rows(self, user_id: int, known: Collection[str]) -> list[dict[str, Any]]:
        """Listed rows for the user's conversations not in ``known`` (may be empty)."""
        ...


class RedisProjectionReader:
    """Reads the Redis projection store's layout (app/stores/redis_projection.py)."""

    def __init__(self, store: RedisProjectionStore) -> None:
        self.store = store
        self.fleet: FleetState = RedisFleetState(store)

    async def load_rows(self, user_id: int) -> LoadedRows:
        # As RedisProjectionStore.load (rows and meta of the same instant: MULTI, or one script
        # on a cluster), but the rows stay the stored bytes: decoding all 21 fields of 5,000 rows
        # only to re-encode them would be most of a cold load.
        await self.store.follow_serving(SERVING_RECHECK_S)
        raw_rows, raw_meta = await self.store.read_user(user_id)  # ProjectionStoreError: 503
        return LoadedRows(_meta(user_id, raw_meta), list(raw_rows.values()))

    async def some_rows(
        self, user_id: int, conversation_ids: list[str]
    ) -> tuple[list[bytes | None], StoreMeta]:
        await self.store.follow_serving(SERVING_RECHECK_S)
        rows, meta = await self.store.read_some(user_id, conversation_ids)
        return [None if row is None else bytes(row) for row in rows], _meta(user_id, meta)

    async def meta(self, user_id: int) -> StoreMeta:
        # The meta and the fleet's live snapshot header in one script call (one round trip).
        await self.store.follow_serving(SERVING_RECHECK_S)
        raw, live = await live_meta(self.store, user_id)
        return _meta(user_id, raw, None if live is None else _text(live))


class MemoryProjectionReader:
    """Unit tests: the in-memory store, same semantics."""

    def __init__(self, store: InMemoryProjectionStore) -> None:
        self.store = store
        fleet = memory_fleet(store)
        self.fleet: FleetState = fleet
        self.fleet_snapshots = fleet.snapshots

    async def load_rows(self, user_id: int) -> LoadedRows:
        s = await self.store.load(user_id)
        meta = _meta_of(s, self.store.corrections(user_id))
        # Exact-size copies: these bytes are held in snapshots (see snapshots.held_json).
        return LoadedRows(meta, [bytes(memoryview(orjson.dumps(row))) for row in s.rows.values()])

    async def some_rows(
        self, user_id: int, conversation_ids: list[str]
    ) -> tuple[list[bytes | None], StoreMeta]:
        s = await self.store.load(user_id)
        rows = [None if (row := s.rows.get(c)) is None else orjson.dumps(row) for c in conversation_ids]
        return rows, _meta_of(s, self.store.corrections(user_id))

    async def meta(self, user_id: int) -> StoreMeta:
        meta = _meta_of(await self.store.load(user_id), self.store.corrections(user_id))
        return replace(meta, live=self.fleet_snapshots.live(user_id))


def _meta_of(s: StoredProjection, corrections: int = 0) -> StoreMeta:
    return StoreMeta(
        s.projection_mailbox_seq,
        s.structure_version,
        s.total_unread,
        s.total_mention,
        s.muted_unread,
        corrections,
        archived_unread=s.archived_unread,
        archived_mention=s.archived_mention,
        badge_mode=s.badge_mode,
        include_muted=s.include_muted,
    )


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _meta(user_id: int, raw: list[Any], live: str | None = None) -> StoreMeta:
    try:
        by_name = {name: 0 if v is None else int(v) for name, v in zip(SERVED_FIELDS, raw, strict=True)}
    except ValueError as exc:  # an unreadable int: the store's data, not the request, is bad
        raise ProjectionStoreError(f"projection store: unreadable meta for user {user_id}: {exc}") from None
    return StoreMeta(
        version=by_name["version"],
        structure_version=by_name["structure_version"],
        total_unread=by_name["total_unread"],
        total_mention=by_name["total_mention"],
        muted_unread=by_name["muted_unread"],
        corrections=by_name["corrections"],
        live=live,
        **extra_fields([by_name[name] for name in EXTRA_FIELDS]),
    )


class CassandraStateFiller:
    """UserConversationState (one single-partition read) joined with the MessageStore heads of
    the missing conversations; unread by :func:`app.domain.rebuild.row_from_state` (a bounded
    MessageStore range read where the row has unread). The driver calls block, so the whole
    fill runs in a worker thread, never on the event loop."""

    def __init__(self, state: Any, messages: Any, unread_limit: int) -> None:
        self.state = state  # UserConversationStateWriter (load_user)
        self.messages = messages  # CassandraMessageStore (heads, range, get)
        self.unread_limit = unread_limit

    async def rows(self, user_id: int, known: Collection[str]) -> list[dict[str, Any]]:
        return await asyncio.to_thread(self._rows, user_id, frozenset(known))

    def _rows(self, user_id: int, known: frozenset[str]) -> list[dict[str, Any]]:
        states = [s for s in self.state.load_user(user_id) if s["conversation_id"] not in known]
        if not states:
            return []
        heads = self.messages.heads([s["conversation_id"] for s in states])
        out: list[dict[str, Any]] = []
        for state in states:
            cid = state["conversation_id"]
            h = heads.get(cid)
            head = Head(h.latest_conversation_seq, h.last_message_id, h.last_activity_id) if h else None
            row = row_from_state(user_id, cid, state, head, self.messages, self.unread_limit).as_row()
            if row["listed"]:
                out.append(row)
        log.info("user %d: %d rows filled from UserConversationState", user_id, len(out))
        return out
