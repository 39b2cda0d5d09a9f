"""The member directory's reads in Cassandra (tables ``group_members``, ``group_settings``,
``conversations_disabled``, ``user_conversation_state``, ``messages``: app/stores/schema.py).

Every query names its partition (no ALLOW FILTERING, no scan across partitions):

* a page is ``WHERE conversation_id = ? AND user_id > ? LIMIT ?`` on ``group_members`` (clustered
  by ``user_id ASC``), asked for ``limit + 1`` rows: the extra row only says ``has_more``.
  With ``active_only`` the same single-partition range is read without a LIMIT, in driver pages
  of ``limit + 1`` rows, and departed members are skipped here until ``limit + 1`` active rows
  are found: filtering on ``state`` inside Cassandra would need ALLOW FILTERING (or a second
  table kept in step with tombstones on every leave). Departed members are few next to active
  ones, so the extra rows read stay small.
* the access check is a point read of the caller's row plus a point read of
  ``conversations_disabled``; the identities of one presentation batch are one
  ``user_id IN (...)`` query (at most 50 keys, one partition); its statistics are aggregated at
  query time from the group's ``messages`` partition (driver pages of 5,000 rows, abandoned when
  the 2 s budget ends: the statistics are then unknown, never zero);
* read receipts read ``user_conversation_state`` by primary key (its partition is the user:
  one point read per member, bounded concurrency).

Calls are asynchronous on the driver's own I/O thread (``execute_async``), so a request that is
abandoned (the statistics budget, a cancelled HTTP request) costs no thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncGenerator, Sequence
from typing import Any

from app.members.model import BaseMember
from app.stores.cassandra_exec import StoreError, checked_keyspace, prepare_statement
from app.stores.schema import check_user_id

_CQL_BIGINT_MAX = 2**63 - 1
_MEMBER_COLUMNS = "user_id, role, state, joined_at_conversation_seq, left_at_conversation_seq"
# Point reads of user_conversation_state in flight per read-receipt request.
READ_CONCURRENCY = 64
SCAN_FETCH = 1000
STATS_FETCH = 5000


class CassandraMemberReader:
    """:class:`~app.members.server.MemberReader` on Cassandra."""

    def __init__(self, session: Any, keyspace: str, *, read_concurrency: int = READ_CONCURRENCY) -> None:

        self.session = session
        self.keyspace = ks = checked_keyspace(keyspace)
        self.read_concurrency = read_concurrency

        def prepare(cql: str) -> Any:
            # The worker writes at LOCAL_QUORUM: reading at LOCAL_QUORUM sees its flushed rows.
            return prepare_statement(session, ks, "member", cql, cols=_MEMBER_COLUMNS)

        self._member = prepare(
            "SELECT {cols} FROM {ks}.group_members WHERE conversation_id = ? AND user_id = ?"
        )
        self._disabled = prepare(
            "SELECT conversation_id FROM {ks}.conversations_disabled WHERE conversation_id = ?"
        )
        self._first = prepare("SELECT {cols} FROM {ks}.group_members WHERE conversation_id = ? LIMIT ?")
        self._after = prepare(
            "SELECT {cols} FROM {ks}.group_members WHERE conversation_id = ? AND user_id > ? LIMIT ?"
        )
        self._scan_first = prepare("SELECT {cols} FROM {ks}.group_members WHERE conversation_id = ?")
        self._scan_after = prepare(
            "SELECT {cols} FROM {ks}.group_members WHERE conversation_id = ? AND user_id > ?"
        )
        self._by_ids = prepare(
            "SELECT {cols} FROM {ks}.group_members WHERE conversation_id = ? AND user_id IN ?"
        )
        # Query-time statistics (seed 004: never the possibly stale persisted counts): the
        # group's message partition, read in driver pages, within the caller's budget.
        self._stats_scan = prepare(
            "SELECT sender_id, mentions, recalled, deleted, message_id FROM {ks}.messages"
            " WHERE conversation_id = ?"
        )
        self._settings = prepare("SELECT settings FROM {ks}.group_settings WHERE conversation_id = ?")
        self._set_settings = prepare(
            "INSERT INTO {ks}.group_settings (conversation_id, settings, updated_at) VALUES (?, ?, ?)"
        )
        self._read_seq = prepare(
            "SELECT read_conversation_seq FROM {ks}.user_conversation_state"
            " WHERE user_id = ? AND conversation_id = ?"
        )
        self._sender = prepare(
            "SELECT sender_id, message_id FROM {ks}.messages"
            " WHERE conversation_id = ? AND conversation_seq = ?"
        )
        self._disable = prepare(
            "INSERT INTO {ks}.conversations_disabled (conversation_id, disabled_at, reason) VALUES (?, ?, ?)"
        )
        self._enable = prepare("DELETE FROM {ks}.conversations_disabled WHERE conversation_id = ?")

    # -- MemberReader -------------------------------------------------------------------------

    async def membership(self, conversation_id: str, user_id: int) -> BaseMember | None:
        rows = await self._all(
            self._member, (uuid.UUID(conversation_id), check_user_id(user_id)), "membership"
        )
        return _member(rows[0]) if rows else None

    async def disabled(self, conversation_id: str) -> bool:
        return bool(await self._all(self._disabled, (uuid.UUID(conversation_id),), "disabled"))

    async def page(
        self, conversation_id: str, after_user_id: int | None, count: int, active_only: bool
    ) -> list[BaseMember]:
        cid = uuid.UUID(conversation_id)
        if not active_only:
            if after_user_id is None:
                rows = await self._all(self._first, (cid, count), "page")
            else:
                rows = await self._all(self._after, (cid, check_user_id(after_user_id), count), "page")
            return [_member(row) for row in rows]
        statement, params = (
            (self._scan_first, (cid,))
            if after_user_id is None
            else (self._scan_after, (cid, check_user_id(after_user_id)))
        )
        out: list[BaseMember] = []
        async with contextlib.aclosing(
            self._pages(statement, params, fetch_size=count, what="page")
        ) as pages:
            async for rows in pages:
                out += [m for m in map(_member, rows) if m.state == "active"]
                if len(out) >= count:
                    break  # stop fetching: the next driver page is never requested
        return out[:count]

    async def by_user_ids(self, conversation_id: str, user_ids: Sequence[int]) -> list[BaseMember]:
        if not user_ids:
            return []
        ids = sorted({check_user_id(u) for u in user_ids})
        rows = await self._all(self._by_ids, (uuid.UUID(conversation_id), ids), "by_user_ids")
        return [_member(row) for row in rows]

    async def stats(self, conversation_id: str, user_ids: Sequence[int]) -> dict[int, tuple[int, int]]:
        if not user_ids:
            return {}
        wanted = {check_user_id(u) for u in user_ids}
        records = dict.fromkeys(wanted, 0)
        mentions = dict.fromkeys(wanted, 0)
        async with contextlib.aclosing(
            self._pages(self._stats_scan, (uuid.UUID(conversation_id),), fetch_size=STATS_FETCH, what="stats")
        ) as pages:
            async for rows in pages:
                for row in rows:
                    # A recalled or deleted message counts for nobody; a row without message_id
                    # is a recall seen before its message (cassandra_messages.py).
                    if row.recalled or row.deleted or row.message_id is None:
                        continue
                    if row.sender_id is not None and int(row.sender_id) in records:
                        records[int(row.sender_id)] += 1
                    for mentioned in row.mentions or ():
                        if int(mentioned) in mentions:
                            mentions[int(mentioned)] += 1
        return {u: (records[u], mentions[u]) for u in wanted}

    async def group_settings(self, conversation_id: str) -> dict[str, str]:
        rows = await self._all(self._settings, (uuid.UUID(conversation_id),), "group_settings")
        return dict(rows[0].settings or {}) if rows else {}

    async def active_members(self, conversation_id: str) -> list[BaseMember]:
        out: list[BaseMember] = []
        async for rows in self._pages(
            self._scan_first, (uuid.UUID(conversation_id),), fetch_size=SCAN_FETCH, what="members"
        ):
            out += [m for m in map(_member, rows) if m.state == "active"]
        return out

    async def read_seqs(self, conversation_id: str, user_ids: Sequence[int]) -> dict[int, int]:
        cid = uuid.UUID(conversation_id)
        slots = asyncio.Semaphore(self.read_concurrency)

        async def one(user_id: int) -> tuple[int, int]:
            async with slots:
                rows = await self._all(self._read_seq, (check_user_id(user_id), cid), "read_seqs")
            return user_id, int(rows[0].read_conversation_seq or 0) if rows else 0

        return dict(await asyncio.gather(*(one(u) for u in user_ids)))

    async def message_sender(self, conversation_id: str, conversation_seq: int) -> int | None:
        if conversation_seq > _CQL_BIGINT_MAX:
            # A valid seq (up to 2^64-2) the messages table (bigint) cannot hold: no message is
            # stored there. Asking Cassandra would fail the request (found by the API fuzzer).
            return None
        rows = await self._all(self._sender, (uuid.UUID(conversation_id), conversation_seq), "sender")
        # A row without message_id is a recall seen before its message (cassandra_messages.py).
        if not rows or rows[0].message_id is None or rows[0].sender_id is None:
            return None
        return int(rows[0].sender_id)

    # -- administration (no mailbox entry disables a conversation) ----------------------------

    async def set_disabled(self, conversation_id: str, disabled_at_ms: int, reason: str) -> None:
        await self._all(self._disable, (uuid.UUID(conversation_id), disabled_at_ms, reason), "disable")

    async def clear_disabled(self, conversation_id: str) -> None:
        await self._all(self._enable, (uuid.UUID(conversation_id),), "enable")

    async def set_group_settings(
        self, conversation_id: str, settings: dict[str, str], updated_at_ms: int
    ) -> None:
        """Replace the group's settings (the chat backend's administration; no mailbox entry)."""
        await self._all(
            self._set_settings, (uuid.UUID(conversation_id), settings, updated_at_ms), "group_settings"
        )

    # -- driver bridging ----------------------------------------------------------------------

    async def _all(self, statement: Any, params: tuple[Any, ...], what: str) -> list[Any]:
        out: list[Any] = []
        async for rows in self._pages(statement, params, fetch_size=None, what=what):
            out += rows
        return out

    async def _pages(
        self, statement: Any, params: tuple[Any, ...], *, fetch_size: int | None, what: str
    ) -> AsyncGenerator[list[Any], None]:
        """The query's driver pages as they arrive (one query; the next page is only fetched
        when the consumer asks for it)."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[list[Any] | None, BaseException | None]] = asyncio.Queue()
        bound = statement.bind(params)
        if fetch_size is not None:
            bound.fetch_size = fetch_size
        try:
            future = self.session.execute_async(bound)
        except Exception as exc:
            raise StoreError(f"cassandra {what} failed: {type(exc).__name__}: {exc}") from None

        def on_rows(rows: Any) -> None:
            # Writes (INSERT/DELETE) answer with no rows at all: None.
            loop.call_soon_threadsafe(queue.put_nowait, (list(rows or ()), None))

        def on_error(exc: BaseException) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, (None, exc))

        future.add_callbacks(on_rows, on_error)
        while True:
            rows, error = await queue.get()
            if error is not None:
                raise StoreError(f"cassandra {what} failed: {type(error).__name__}: {error}") from None
            assert rows is not None
            yield rows
            if not future.has_more_pages:
                return
            future.start_fetching_next_page()


def _member(row: Any) -> BaseMember:
    return BaseMember(
        user_id=int(row.user_id),
        role=row.role or "member",
        state=row.state or "active",
        joined_at=row.joined_at_conversation_seq,
        left_at=row.left_at_conversation_seq,
    )
