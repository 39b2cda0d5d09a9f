"""The worker's state tables on the durable layer: `app.worker.ports.StateTables` over one
`PartitionStore` + `Checkpointer` per owned partition and a `ChangelogReader` per standby. A commit
is one persist per partition written to (its checkpoint record is the checkpoint's `meta`), atomic
per partition (docs/decisions/0001-one-atomic-checkpoint.md, docs/durability.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from app.worker.ports import parse_row_key, user_key
from tables.durable.changelog import Changelog
from tables.durable.checkpointer import Checkpointer, ClaimLost, PersistBatch, PersistFailed
from tables.durable.identity import check_identity
from tables.durable.records import (
    Checkpoint,
    InputIdentity,
    Kind,
    row_state_key,
    user_state_key,
)
from tables.durable.recovery import ChangelogReader, StoreBehindChangelog
from tables.durable.store import PartitionStore

log = logging.getLogger("projector.durable")

_ROW, _USER, _WAITING = Kind.ROW.value, Kind.USER.value, Kind.WAITING.value
# Claims lost in a row before an assignment gives up (another writer keeps persisting: the group
# gave the partition to someone else meanwhile, the next rebalance sorts it out).
CLAIM_ATTEMPTS = 5


class PartitionLost(Exception):
    """Another writer's persist is the partition's head: this worker does not own it any more."""


@dataclass
class DurableStats:
    """Counts the worker's metrics read (app/metrics/worker.py)."""

    persists: int = 0
    persist_failures: int = 0
    persisted_records: int = 0
    claims: int = 0
    claims_lost: int = 0
    rebuilds: int = 0  # local stores wiped and rebuilt from the changelog (lost, damaged, behind)
    standby_catch_ups: int = 0
    standby_records: int = 0


@dataclass
class _Staged:
    rows: dict[tuple[int, str], bytes | None] = field(default_factory=dict)
    users: dict[int, bytes | None] = field(default_factory=dict)
    waiting: dict[tuple[int, int], bytes | None] = field(default_factory=dict)
    meta: bytes | None = None
    input_next_offset: int | None = None


class CheckpointedTables:
    """`StateTables` whose commit is one checkpointed persist per partition. `identity`: the live
    input, looked up once per assignment; `input_start(partition)`: where a partition with no
    checkpoint starts in mailbox-tail (its log start)."""

    def __init__(
        self,
        folder: Path,
        changelog: Changelog,
        identity: Callable[[], Awaitable[InputIdentity]],
        input_start: Callable[[int], Awaitable[int]],
    ) -> None:
        self.folder = folder
        self.changelog = changelog
        self._identity = identity
        self._input_start = input_start
        self.stores: dict[int, PartitionStore] = {}
        self.owners: dict[int, Checkpointer] = {}
        self.standbys: dict[int, ChangelogReader] = {}
        self._staged: dict[int, _Staged] = {}
        self.stats = DurableStats()
        # One reader of the changelog at a time per partition: the standby loop and a claim of
        # the same partition never interleave their reads into one store.
        self._locks: dict[int, asyncio.Lock] = {}

    # -- ownership --------------------------------------------------------------------------------

    def _lock(self, partition: int) -> asyncio.Lock:
        return self._locks.setdefault(partition, asyncio.Lock())

    def _store(self, partition: int) -> PartitionStore:
        store = self.stores.get(partition)
        if store is None:
            path = self.folder / f"partition-{partition}"
            store, wiped = PartitionStore.open_or_rebuild(path)
            if wiped is not None:
                self.stats.rebuilds += 1
                log.warning("partition %d: local store rebuilt from the changelog (%s)", partition, wiped)
            self.stores[partition] = store
        return store

    def _rebuild(self, partition: int, why: str) -> PartitionStore:
        store = self.stores.pop(partition, None)
        if store is not None:
            store.close()
            PartitionStore.destroy(store.path)
        self.standbys.pop(partition, None)
        self.stats.rebuilds += 1
        log.warning("partition %d: local store wiped, rebuilt from the changelog (%s)", partition, why)
        return self._store(partition)

    async def acquire(self, partitions: Sequence[int]) -> None:
        """Own these partitions: each store caught up to the end of its changelog (a standby's
        reader goes on from where it stood), its checkpoint checked against the live input
        (`InputMismatch` propagates: the worker exits), and claimed."""
        if not partitions:
            return
        identity = await self._identity()
        for partition in partitions:
            async with self._lock(partition):
                await self._claim(partition, identity)

    async def _claim(self, partition: int, identity: InputIdentity) -> Checkpointer:
        reader = self.standbys.pop(partition, None)
        store = self._store(partition)
        for attempt in range(1, CLAIM_ATTEMPTS + 1):
            checkpointer = Checkpointer(store, self.changelog, partition, identity)
            if reader is not None and reader.store is store:
                checkpointer.reader = reader  # what it buffered past the store's position stays
            reader = None
            try:
                await checkpointer.reader.catch_up()
            except StoreBehindChangelog as exc:
                store = self._rebuild(partition, str(exc))
                continue
            check_identity(store.position.checkpoint, identity, partition)
            start = 0 if store.position.checkpoint is not None else await self._input_start(partition)
            try:
                checkpoint = await checkpointer.claim(start)
            except ClaimLost as exc:
                self.stats.claims_lost += 1
                log.warning("partition %d: %s (attempt %d)", partition, exc, attempt)
                continue
            self.stats.claims += 1
            self.owners[partition] = checkpointer
            log.info(
                "partition %d claimed: persist %s, input next offset %d, changelog at %d",
                partition,
                checkpoint.persist,
                checkpoint.input_next_offset,
                store.position.changelog_next_offset,
            )
            return checkpointer
        raise PartitionLost(f"partition {partition}: {CLAIM_ATTEMPTS} claims lost in a row")

    def checkpoint(self, partition: int) -> Checkpoint | None:
        store = self.stores.get(partition)
        return None if store is None else store.position.checkpoint

    def hand_over(self, partition: int) -> None:
        """No more persists of this partition here (another worker writes it next); its store
        stays, kept warm as a standby if the worker keeps one."""
        self.owners.pop(partition, None)
        self._staged.pop(partition, None)

    # -- standby copies ---------------------------------------------------------------------------

    def keep_standbys(self, partitions: Collection[int]) -> None:
        """Keep a warm copy of exactly these partitions (never one this worker owns)."""
        wanted = set(partitions) - set(self.owners)
        for partition in list(self.standbys):
            if partition not in wanted:
                del self.standbys[partition]
        for partition in sorted(wanted - set(self.standbys)):
            self.standbys[partition] = ChangelogReader(self._store(partition), self.changelog, partition)

    async def tail_standbys(self) -> int:
        """One catch-up of every standby copy; the records applied."""
        applied = 0
        for partition, reader in list(self.standbys.items()):
            async with self._lock(partition):
                if self.standbys.get(partition) is not reader:
                    continue  # claimed or dropped meanwhile
                before = reader.stats.records_applied
                try:
                    await reader.catch_up()
                except StoreBehindChangelog as exc:
                    store = self._rebuild(partition, str(exc))
                    self.standbys[partition] = ChangelogReader(store, self.changelog, partition)
                    continue
                self.stats.standby_catch_ups += 1
                applied += reader.stats.records_applied - before
        self.stats.standby_records += applied
        return applied

    # -- writes (staged until `commit`) -----------------------------------------------------------

    def _staging(self, partition: int) -> _Staged:
        staged = self._staged.get(partition)
        if staged is None:
            staged = self._staged[partition] = _Staged()
        return staged

    def put_row(self, partition: int, user_id: int, conversation_id: str, blob: bytes) -> None:
        self._staging(partition).rows[(user_id, conversation_id)] = blob

    def put_user(self, partition: int, user_id: int, blob: bytes) -> None:
        self._staging(partition).users[user_id] = blob

    def put_checkpoint_record(self, partition: int, blob: bytes, next_offset: int | None = None) -> None:
        staged = self._staging(partition)
        staged.meta = blob
        if next_offset is not None:
            staged.input_next_offset = next_offset

    def put_pending(self, partition: int, user_id: int, mailbox_seq: int, raw: bytes) -> None:
        self._staging(partition).waiting[(user_id, mailbox_seq)] = raw

    def delete_pending(self, partition: int, user_id: int, mailbox_seq: int) -> None:
        self._staging(partition).waiting[(user_id, mailbox_seq)] = None

    async def commit(self) -> None:
        """Each partition's staged writes as one persist (one acknowledged append, then one
        local write batch). A persist that fails raises `PersistFailed`: the partition's next
        commit claims it again first, but only if its head is still this owner's (else
        `PartitionLost`: another worker writes it now)."""
        staged, self._staged = self._staged, {}
        for partition, writes in staged.items():
            await self._persist(partition, writes)

    async def _persist(self, partition: int, writes: _Staged) -> None:
        owner = self.owners.get(partition)
        if owner is None:
            raise PartitionLost(f"partition {partition} is not owned here: its writes are dropped")
        async with self._lock(partition):
            if not owner.claimed:
                await self._reclaim(partition, owner)
            head = owner.store.position.checkpoint
            offset = writes.input_next_offset
            if offset is None:
                offset = head.input_next_offset if head is not None else 0
            meta = writes.meta if writes.meta is not None else (head.meta if head is not None else b"")
            batch = PersistBatch(offset, writes.rows, writes.users, writes.waiting, meta)
            try:
                await owner.persist(batch)
            except PersistFailed:
                self.stats.persist_failures += 1
                raise
            self.stats.persists += 1
            self.stats.persisted_records += len(writes.rows) + len(writes.users) + len(writes.waiting) + 1

    async def _reclaim(self, partition: int, owner: Checkpointer) -> None:
        """After a failed persist: read what the changelog holds now, and claim again if the
        head is this owner's (its last persist, or the failed one if it landed)."""
        own_epoch = owner.last.epoch if owner.last is not None else None
        await owner.reader.catch_up()
        head = owner.store.position.head
        if head is None or head.epoch != own_epoch:
            self.owners.pop(partition, None)
            raise PartitionLost(
                f"partition {partition}: the changelog's head is persist {head}, not this owner's "
                f"(epoch {own_epoch}): another worker took it"
            )
        try:
            await owner.claim()
        except ClaimLost as exc:
            self.owners.pop(partition, None)
            raise PartitionLost(str(exc)) from None
        self.stats.claims += 1

    # -- reads (applied persists only) ------------------------------------------------------------

    def _read_store(self, partition: int) -> PartitionStore:
        return self._store(partition)

    def get_users(self, partition: int, user_ids: Collection[int]) -> dict[int, bytes]:
        ids = list(user_ids)
        values = self._read_store(partition).get_many([user_state_key(u) for u in ids])
        return {u: v for u, v in zip(ids, values, strict=True) if v is not None}

    def get_rows(self, partition: int, keys: Collection[tuple[int, str]]) -> dict[tuple[int, str], bytes]:
        wanted = list(keys)
        values = self._read_store(partition).get_many([row_state_key(u, c) for u, c in wanted])
        return {k: v for k, v in zip(wanted, values, strict=True) if v is not None}

    def user_rows(self, partition: int, user_id: int) -> list[tuple[str, bytes]]:
        prefix = _ROW + user_key(user_id)
        return [
            (parse_row_key(key[1:])[1], value) for key, value in self._read_store(partition).items(prefix)
        ]

    def row_keys(self, partition: int) -> Iterator[tuple[int, str]]:
        for key, _ in self._read_store(partition).items(_ROW):
            yield parse_row_key(key[1:])

    def rows_after(
        self, partition: int, after: tuple[int, str] | None, limit: int
    ) -> list[tuple[tuple[int, str], bytes]]:
        # Called from a worker thread (the audit's sweep): reads an open store only.
        store = self.stores.get(partition)
        if store is None:
            return []
        start = None if after is None else row_state_key(*after)
        return [(parse_row_key(key[1:]), value) for key, value in store.items_after(_ROW, start, limit)]

    def row_key_bounds(self, partition: int) -> tuple[tuple[int, str], tuple[int, str]] | None:
        store = self.stores.get(partition)
        bounds = None if store is None else store.key_bounds(_ROW)
        return None if bounds is None else (parse_row_key(bounds[0][1:]), parse_row_key(bounds[1][1:]))

    def estimated_rows(self, partition: int) -> int:
        store = self.stores.get(partition)
        return 0 if store is None else store.estimated_keys()

    def checkpoint_record(self, partition: int) -> bytes | None:
        checkpoint = self._read_store(partition).position.checkpoint
        if checkpoint is None or not checkpoint.meta:
            return None
        return checkpoint.meta

    def pending(self, partition: int) -> list[bytes]:
        return [value for _, value in self._read_store(partition).items(_WAITING)]

    def close(self) -> None:
        for store in self.stores.values():
            store.close()
        self.stores.clear()
        self.owners.clear()
        self.standbys.clear()


def owned_elsewhere(partitions: int, owned: Iterable[int]) -> list[int]:
    """The partitions this worker does not own: the ones its standby copies follow."""
    mine = set(owned)
    return [p for p in range(partitions) if p not in mine]
