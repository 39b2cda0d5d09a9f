"""State that outgrows memory: persisted state is the source of truth, memory holds a hot set.

A partition's users and rows live in its persisted state (the worker's RocksDB changelog tables,
replay's `--state-dir`), reached through the `StateSource` port. The processor keeps in memory
only what it works on: a batch reads the users and rows it touches (one multi-get per batch,
`prefetch`), an entry that meets a miss anyway reads it then, and a full badge recompute reads all
of a user's rows (`complete`). After each persist the driver may `evict`: clean rows (nothing
changed since the persist, nothing waiting for a flush) leave memory, least recently changed
first, until the resident rows are back under the bound; a user goes with its last row.

The bound is in rows (`hot_rows`) and, optionally, in bytes (`hot_bytes`): a row grows as it
holds messages (its seq sets, its head ids, its member statistics: about 500 bytes without, 700
with one or two), so a bound in rows alone lets the hot set's memory grow with the log. Each
resident row carries the footprint counted for it (`ConversationState.counted_size`), counted
when it comes into memory and again when its change is taken for a persist (`recount`): the
total follows the rows without a pass over them.

Pure: the source is a port; time is not read here.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Collection, Iterable, Iterator
from typing import Any, NamedTuple, Protocol

from app.domain.conversation import ConversationState
from app.domain.member_stats import MemberStats
from app.domain.projector import Projector, UserState

# The changelog record of a row: {"s": ConversationState.dump(), "m": MemberStats.dump()?, ...}
ROW_STATE_KEY = "s"
MEMBER_STATS_KEY = "m"
# A row's counted footprint is kept in units of 16 bytes (pymalloc's granule): a count below
# 4 KiB is then an int Python keeps cached (<= 256), so the count costs a row no allocation (a
# boxed int per row was ~3 MiB per 100,000 rows).
FOOTPRINT_UNIT = 16
# Evicting brings the resident rows down to this share of the bound, so that eviction rounds are
# rare (a round looks at every resident row once).
EVICT_TO = 0.8


class StateSource(Protocol):
    """One partition's persisted state, read-only, records decoded."""

    def get_users(self, user_ids: Collection[int]) -> dict[int, dict[str, Any]]: ...

    def get_rows(self, keys: Collection[tuple[int, str]]) -> dict[tuple[int, str], dict[str, Any]]: ...

    def user_rows(self, user_id: int) -> list[tuple[str, dict[str, Any]]]:
        """Every row of the user, by conversation id."""
        ...

    def rows_after(
        self, after: tuple[int, str] | None, limit: int
    ) -> list[tuple[tuple[int, str], dict[str, Any]]]:
        """At most `limit` rows whose (user, conversation) is above `after` (None: from the
        first), in (user, conversation) order."""
        ...

    def row_key_bounds(self) -> tuple[tuple[int, str], tuple[int, str]] | None:
        """The first and the last row's (user, conversation) (None: no rows)."""
        ...

    def estimated_rows(self) -> int:
        """About how many rows there are (the store's estimate)."""
        ...


class ReadUser(NamedTuple):
    """A user read away from the loop (`Residency.read_user`): its record and rows, loaded."""

    user_id: int
    record: dict[str, Any]
    rows: list[tuple[ConversationState, Any]]  # each row and its member stats record (or None)


class Residency:
    """The projector's `StateLoader` over a `StateSource`, with a bounded number of rows in
    memory (`hot_rows`) and, when `hot_bytes` is set, a bounded estimate of their bytes."""

    def __init__(
        self,
        projector: Projector,
        source: StateSource,
        member_stats: dict[tuple[int, str], MemberStats],
        hot_rows: int,
        hot_bytes: int | None = None,
    ) -> None:
        self.projector = projector
        self.source = source
        self.member_stats = member_stats
        self.hot_rows = hot_rows
        # None: no byte bound, and no footprint counted (nothing spent on it per row).
        self.hot_bytes = hot_bytes
        self.resident_rows = sum(len(user.rows) for user in projector.users.values())
        # The resident rows' counted footprints, in bytes (0 without a byte bound).
        self.resident_bytes = 0
        if hot_bytes is not None:
            for user in projector.users.values():
                for row in user.rows.values():
                    self._count(user.user_id, row)
        # Users read after a restore take part in a reconcile: their next flush recomputes the
        # badge in full (a restart is a reconcile trigger, seed §3.4), which reads all their rows.
        self.reconcile_on_load = False
        self.reads = 0  # rows and users read from the source (tests, metrics)
        # Eviction rounds that dropped rows: a read made away from the loop (`read_user`) may be
        # attached only if none happened since it began (`attach`).
        self.evictions = 0
        projector.loader = self

    # -- StateLoader --------------------------------------------------------------------------

    def load_user(self, user_id: int) -> UserState | None:
        record = self.source.get_users((user_id,)).get(user_id)
        return self._adopt_user(user_id, record) if record is not None else None

    def load_row(self, user: UserState, conversation_id: str) -> ConversationState | None:
        record = self.source.get_rows(((user.user_id, conversation_id),)).get((user.user_id, conversation_id))
        return self._adopt_row(user, conversation_id, record) if record is not None else None

    def complete(self, user: UserState) -> None:
        for conversation_id, record in self.source.user_rows(user.user_id):
            if conversation_id not in user.rows:
                self._adopt_row(user, conversation_id, record)
        user.complete = True

    def created(self, user: UserState, row: ConversationState | None) -> None:
        if row is not None:
            self.resident_rows += 1
            if self.hot_bytes is not None:
                self._count(user.user_id, row)

    def recount(self, keys: Iterable[tuple[int, str]]) -> None:
        """Count again the footprint of these rows (changed since the last persist: the rows a
        change can have grown), those in memory; nothing without a byte bound."""
        if self.hot_bytes is None:
            return
        users = self.projector.users
        for user_id, conversation_id in keys:
            user = users.get(user_id)
            row = user.rows.get(conversation_id) if user is not None else None
            if row is not None:
                self._count(user_id, row)

    # -- batches ------------------------------------------------------------------------------

    def prefetch(self, keys: Iterable[tuple[int, str]]) -> None:
        """Read, in one multi-get each, the users and rows these entries touch that are not in
        memory (a new user or row is simply not found)."""
        keys = set(keys)
        users = self.projector.users
        wanted_users = {user_id for user_id, _ in keys if user_id not in users}
        if wanted_users:
            for user_id, record in self.source.get_users(wanted_users).items():
                if user_id not in users:
                    self._adopt_user(user_id, record)
        wanted_rows = []
        for user_id, conversation_id in keys:
            user = users.get(user_id)
            if user is not None and not user.complete and conversation_id not in user.rows:
                wanted_rows.append((user_id, conversation_id))
        if wanted_rows:
            for (user_id, conversation_id), record in self.source.get_rows(wanted_rows).items():
                user = users[user_id]
                if conversation_id not in user.rows:
                    self._adopt_row(user, conversation_id, record)

    def evict(self, pinned_rows: Collection[tuple[int, str]], pinned_users: Collection[int]) -> int:
        """When the resident rows (or their bytes) are over the bound: drop clean rows (not in
        `pinned_rows`, not waiting for a flush), least recently changed first, until both are at
        most EVICT_TO of their bound; users left without rows go too (unless pinned or waiting
        for a flush). Returns how many rows left memory."""
        if not self._over():
            return 0
        projector = self.projector
        dirty = projector.dirty.rows
        target_rows = int(self.hot_rows * EVICT_TO)
        target_bytes = int(self.hot_bytes * EVICT_TO) if self.hot_bytes is not None else None

        def candidates() -> Iterator[tuple[int, int, str]]:
            for user_id, user in projector.users.items():
                waiting = dirty.get(user_id)
                for conversation_id, row in user.rows.items():
                    if (waiting is None or conversation_id not in waiting) and (
                        user_id,
                        conversation_id,
                    ) not in pinned_rows:
                        yield row.changed_at, user_id, conversation_id

        evicted = 0
        touched: set[int] = set()
        # One round picks as many of the coldest rows as the targets take at the resident rows'
        # mean footprint; another round follows only if colder rows than the mean were too small
        # to bring the hot set under its bound.
        while self._over():
            chosen = heapq.nsmallest(self._rows_to_drop(target_rows, target_bytes), candidates())
            for _, user_id, conversation_id in chosen:
                if self.resident_rows <= target_rows and (
                    target_bytes is None or self.resident_bytes <= target_bytes
                ):
                    break
                user = projector.users[user_id]
                row = user.rows.pop(conversation_id)
                self.resident_rows -= 1
                self.resident_bytes -= row.counted_size * FOOTPRINT_UNIT
                user.complete = False
                self.member_stats.pop((user_id, conversation_id), None)
                touched.add(user_id)
                evicted += 1
            if not chosen:
                break  # nothing left to drop: every resident row is pinned or waiting
        if evicted:
            self.evictions += 1
        for user_id in touched:
            user = projector.users[user_id]
            if not user.rows and user_id not in pinned_users and user_id not in dirty:
                del projector.users[user_id]
        return evicted

    def _over(self) -> bool:
        return self.resident_rows > self.hot_rows or (
            self.hot_bytes is not None and self.resident_bytes > self.hot_bytes
        )

    def _rows_to_drop(self, target_rows: int, target_bytes: int | None) -> int:
        """How many rows leaving would bring the hot set to its targets, the bytes counted at
        the resident rows' mean footprint."""
        rows = self.resident_rows - target_rows
        if target_bytes is not None and self.resident_bytes > target_bytes and self.resident_rows:
            mean = self.resident_bytes / self.resident_rows
            rows = max(rows, math.ceil((self.resident_bytes - target_bytes) / mean))
        return max(rows, 1)

    # -- reading --------------------------------------------------------------------------------

    def rows_after(
        self, after: tuple[int, str] | None, limit: int
    ) -> list[tuple[tuple[int, str], list[Any]]]:
        """Persisted rows in key order (the unread audit's sweep, app/domain/audit.RowRange), not
        loaded and not kept: the state as last persisted, whether or not the row is in memory.
        Reads the source only, so the worker may call it in a worker thread."""
        return [(key, record[ROW_STATE_KEY]) for key, record in self.source.rows_after(after, limit)]

    def key_bounds(self) -> tuple[tuple[int, str], tuple[int, str]] | None:
        return self.source.row_key_bounds()

    def estimated_rows(self) -> int:
        return self.source.estimated_rows()

    def read_user(self, user_id: int) -> ReadUser | None:
        """The user's record and every row, loaded but not adopted (None: no such user). Reads
        the source only, so the worker may call it in a worker thread; `attach` adopts it."""
        record = self.source.get_users((user_id,)).get(user_id)
        if record is None:
            return None
        rows = [
            (ConversationState.load(row[ROW_STATE_KEY], user_id, conversation_id), row.get(MEMBER_STATS_KEY))
            for conversation_id, row in self.source.user_rows(user_id)
        ]
        return ReadUser(user_id, record, rows)

    def attach(self, read: ReadUser, evictions: int) -> UserState | None:
        """On the loop: the user in memory and complete, from a `read_user` that began when
        `self.evictions` was `evictions`; rows in memory meanwhile stay as they are. None (nothing
        done) if rows were evicted since: a row could have been read, changed, persisted and
        evicted meanwhile, and the read copy would be older than its state. Without an eviction
        in between, a row not in memory now never was since the read, so its copy is current."""
        if evictions != self.evictions:
            return None
        user = self.projector.users.get(read.user_id)
        if user is None:
            user = self._adopt_user(read.user_id, read.record)
        if not user.complete:
            for row, stats in read.rows:
                if row.conversation_id not in user.rows:
                    user.rows[row.conversation_id] = row
                    if stats is not None:
                        self.member_stats[(user.user_id, row.conversation_id)] = MemberStats.load(stats)
                    self.resident_rows += 1
                    self.reads += 1
                    if self.hot_bytes is not None:
                        self._count(user.user_id, row)
            user.complete = True
        return user

    # -- helpers ------------------------------------------------------------------------------

    def _adopt_user(self, user_id: int, record: dict[str, Any]) -> UserState:
        self.reads += 1
        user = UserState.load(record, [])
        self.projector.defaults(user)
        user.complete = False
        if self.reconcile_on_load:
            user.badge_reconcile = True
        self.projector.users[user_id] = user
        return user

    def _adopt_row(self, user: UserState, conversation_id: str, record: dict[str, Any]) -> ConversationState:
        self.reads += 1
        row = ConversationState.load(record[ROW_STATE_KEY], user.user_id, conversation_id)
        user.rows[row.conversation_id] = row
        stats = record.get(MEMBER_STATS_KEY)
        if stats is not None:
            self.member_stats[(user.user_id, row.conversation_id)] = MemberStats.load(stats)
        self.resident_rows += 1
        if self.hot_bytes is not None:
            self._count(user.user_id, row)
        return row

    def _count(self, user_id: int, row: ConversationState) -> None:
        """Count the row's footprint (with its member statistics) in place of its last count."""
        size = row.footprint()
        stats = self.member_stats.get((user_id, row.conversation_id))
        if stats is not None:
            size += stats.footprint()
        units = -(-size // FOOTPRINT_UNIT)
        self.resident_bytes += (units - row.counted_size) * FOOTPRINT_UNIT
        row.counted_size = units
