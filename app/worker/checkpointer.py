"""The checkpointer: a partition's hot state into the changelog tables, once per row, then its
checkpoint record (the processor's record plus the worker's keys below; its encoding is a contract
with every changelog written). Once acknowledged, its offsets are durable and the flushes queued
before its snapshot covered (docs/decisions/0001-one-atomic-checkpoint.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from app.domain.processor import Changes
from app.worker.mirror import MirrorPump
from app.worker.outbound import OutboundRecords
from app.worker.ports import StateTables
from app.worker.state import PartitionState, WorkerStats

# Key of the Cassandra writes a row's record still owes (the mirror failed at its persist).
OWED_KEY = "mirror_owed"
# Key of the last flushed version inside a user's record (UserState.dump).
FLUSHED_KEY = "flushed_seq"
# The worker's keys in a partition's checkpoint: the next offset, the users with work no flush
# carried, the persist number, the rows owing Cassandra writes (lists: what the last window touched).
NEXT_OFFSET_KEY = "next_offset"
UNFLUSHED_KEY = "unflushed"
PERSISTS_KEY = "persists"
OWING_KEY = "owing"


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A partition's checkpoint as read back (`record`: the whole decoded record, None: none)."""

    record: dict[str, Any] | None
    next_offset: int | None
    unflushed: list[int]
    persists: int
    owing: list[tuple[int, str]]


def read_checkpoint(raw: bytes | None) -> Checkpoint:
    record = msgspec.msgpack.decode(raw) if raw else None
    extras = record or {}
    next_offset = extras.get(NEXT_OFFSET_KEY)
    return Checkpoint(
        record=record,
        next_offset=next_offset if isinstance(next_offset, int) else None,
        unflushed=sorted({int(u) for u in extras.get(UNFLUSHED_KEY, ())}),
        persists=int(extras.get(PERSISTS_KEY, 0)),
        owing=sorted({(int(u), str(c)) for u, c in extras.get(OWING_KEY, ())}),
    )


# What the changelog's checkpoint says of a partition's lists: (unflushed, owing, persists).
_Persisted = tuple[list[int], set[tuple[int, str]], int]


class Checkpointer:
    """Persists one partition at a time (each stages and commits before the next stages)."""

    def __init__(
        self,
        tables: StateTables,
        stats: WorkerStats,
        state_lock: asyncio.Lock,
        outbound: OutboundRecords,
        mirror: Callable[[], MirrorPump | None],
    ) -> None:
        self.tables = tables
        self.stats = stats
        # Shared with the intake: held while a batch is applied and while a persist snapshots.
        self._state_lock = state_lock
        self._outbound = outbound
        self._mirror = mirror
        self.lock = asyncio.Lock()
        # True: the commit runs outside the state lock (docs/decisions/0005-overlap-flushes-and-batches.md).
        self.commit_outside_state_lock = False

    async def persist(self, state: PartitionState, *, handing_over: bool = False) -> None:
        """Persist what the partition's hot state changed; its offsets become durable.
        `handing_over`: the new owner takes over the Cassandra writes still owed."""
        async with self.lock:
            if state.released:
                return
            try:
                await self._persist(state, handing_over)
            finally:
                if handing_over:
                    self.tables.hand_over(state.partition)
            if handing_over:
                state.released = True  # before any other persist can take the lock

    async def _persist(self, state: PartitionState, handing_over: bool) -> None:
        async with self._state_lock:  # no batch is applied meanwhile: one consistent snapshot
            # Owed events go out first; raises while they cannot
            # (docs/decisions/0010-outbound-events-owed.md).
            await self._outbound.send_owed(state)
            mirror = self._mirror()
            owed: dict[tuple[int, str], dict[str, Any]] = {}
            if mirror is not None:
                if handing_over:
                    # No round of ours may land after the new owner's writes
                    # (docs/decisions/0009-mirror-owed-writes.md).
                    await mirror.settle()
                # What the mirror has not written yet is owed in the rows' records
                # (docs/decisions/0009-mirror-owed-writes.md).
                owed = mirror.owed()
            changes = state.processor.changes_since_persist()
            # What the checkpoint in the changelog says now: a persist that fails leaves it so.
            persisted: _Persisted = (state.unflushed, state.owing_persisted, state.persists)
            try:
                offset = state.next_offset
                self._owe(state, changes, owed)
                self._write_tables(state, changes, owed)
                if handing_over and state.owing and mirror is not None:
                    mirror.drop(state.owing)
                covered = state.queued_flushes
                # Created under the lock: it takes what was staged (other persists wait on `self.lock`).
                commit = self.tables.commit()
                if not self.commit_outside_state_lock:
                    await commit
            except BaseException:
                self._not_persisted(state, changes, persisted)
                raise
        # Batches applied meanwhile go to the next persist; this snapshot's offsets go durable.
        if self.commit_outside_state_lock:
            try:
                await commit
            except BaseException:
                self._not_persisted(state, changes, persisted)
                raise
        async with self._state_lock:
            if offset is not None:
                state.durable_offset = offset
            state.durable_flushes = max(state.durable_flushes, covered)
            # Clean rows beyond the hot set's bound may leave memory now (the tables have them).
            pinned = {batch.user_id for batches in state.unpublished for batch in batches}
            state.processor.evict(pinned)

    @staticmethod
    def _not_persisted(state: PartitionState, changes: Changes, persisted: _Persisted) -> None:
        """A persist raised: any part of it may be in the changelog, none is known to be. Its
        changes go to the next persist, and the lists go back to what the last checkpoint says."""
        state.unflushed, state.owing_persisted, state.persists = persisted
        state.processor.persist_failed(changes)

    def _owe(
        self, state: PartitionState, changes: Changes, owed: dict[tuple[int, str], dict[str, Any]]
    ) -> None:
        """Which rows' records carry owed writes from this persist on (a newly owing row changed,
        so this persist writes it; an untouched row still owing keeps its record)."""
        if not owed and not state.owing:
            return
        # The writer serves every partition: this one's rows are those changed here or already owing.
        owing = {key for key in owed if key in changes.rows or key in state.owing}
        # A row no longer owing keeps its record: the checkpoint's list says what a restore restages.
        state.owing = owing
        self.stats.state_owed_rows += len(owing & changes.rows)

    def _write_tables(
        self, state: PartitionState, changes: Changes, owed: dict[tuple[int, str], dict[str, Any]]
    ) -> None:
        """Write what changed to the changelog tables: once per row, not per entry."""
        partition = state.partition
        processor = state.processor
        owing = state.owing
        tables = self.tables
        for (user_id, mailbox_seq), raw in changes.pending_added.items():
            tables.put_pending(partition, user_id, mailbox_seq, raw)
        for user_id, mailbox_seq in changes.pending_released:
            tables.delete_pending(partition, user_id, mailbox_seq)
        for user_id, conversation_id in changes.rows:
            record = processor.row_record(user_id, conversation_id)
            if (user_id, conversation_id) in owing:
                record[OWED_KEY] = owed[(user_id, conversation_id)]
            tables.put_row(partition, user_id, conversation_id, msgspec.msgpack.encode(record))
        # A flush not published yet must not look flushed: the record says the version before it.
        unpublished: dict[int, int] = {}
        for batches in state.unpublished:
            for batch in batches:
                unpublished.setdefault(batch.user_id, batch.prev_projection_mailbox_seq)
        written = changes.users | unpublished.keys()
        unflushed = set(state.unflushed) - written
        for user_id in written:
            record = processor.user_record(user_id)
            if user_id in unpublished:
                record[FLUSHED_KEY] = min(record[FLUSHED_KEY], unpublished[user_id])
            if record["projection_mailbox_seq"] > record[FLUSHED_KEY]:
                unflushed.add(user_id)
            tables.put_user(partition, user_id, msgspec.msgpack.encode(record))
        if changes.gate or changes.users or unpublished or owing != state.owing_persisted:
            listed = sorted(unflushed)
            checkpoint = processor.gate_record()
            if state.next_offset is not None:
                checkpoint[NEXT_OFFSET_KEY] = state.next_offset
            state.persists += 1
            checkpoint[PERSISTS_KEY] = state.persists
            checkpoint[UNFLUSHED_KEY] = state.unflushed = listed
            checkpoint[OWING_KEY] = sorted(owing)
            state.owing_persisted = set(owing)
            tables.put_checkpoint_record(partition, msgspec.msgpack.encode(checkpoint), state.next_offset)
