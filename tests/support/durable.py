"""Helpers for the tests of tables.durable: a partition's three objects, its state as a dict, a
changelog that kills the worker at a chosen await, and an independent model of which persists a
changelog holds (written from the contract in docs/durability.md, not from the reader)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tables.durable.changelog import Appended, Changelog, LoggedRecord
from tables.durable.checkpointer import Checkpointer
from tables.durable.records import (
    CHECKPOINT_KEY,
    PERSIST_HEADER,
    InputIdentity,
    PersistId,
    WireRecord,
    decode_checkpoint_value,
)
from tables.durable.recovery import ChangelogReader
from tables.durable.store import PartitionStore

IDENTITY = InputIdentity("cluster-a", "topic-id-1", 4)
State = dict[bytes, bytes]


class Killed(BaseException):
    """The worker process dies here (not an Exception: nothing in the code under test catches it)."""


@dataclass
class Opened:
    store: PartitionStore
    reader: ChangelogReader
    checkpointer: Checkpointer

    def close(self) -> None:
        self.store.close()


def open_partition(path: Path, changelog: Changelog, partition: int = 0) -> Opened:
    store, _ = PartitionStore.open_or_rebuild(path)
    return Opened(
        store,
        ChangelogReader(store, changelog, partition),
        Checkpointer(store, changelog, partition, IDENTITY),
    )


def state_of(store: PartitionStore) -> State:
    return dict(store.items())


class KillingChangelog:
    """Passes every call to `inner`, and kills the worker at the `kill_at`-th awaited call
    (counting from 0): before it, or, for an append, after `delivered` of its records went in."""

    def __init__(self, inner: Changelog, kill_at: int | None = None, delivered: int = 0) -> None:
        self.inner = inner
        self.kill_at = kill_at
        self.delivered = delivered
        self.calls = 0
        self.append_sizes: dict[int, int] = {}  # call number -> records of that append

    def _is_kill(self) -> bool:
        call, self.calls = self.calls, self.calls + 1
        return call == self.kill_at

    async def append(self, partition: int, records: Sequence[WireRecord]) -> Appended:
        self.append_sizes[self.calls] = len(records)
        if self._is_kill():
            if self.delivered:
                await self.inner.append(partition, records[: self.delivered])
            raise Killed
        return await self.inner.append(partition, records)

    async def read(self, partition: int, start: int, end: int) -> tuple[list[LoggedRecord], int]:
        if self._is_kill():
            raise Killed
        return await self.inner.read(partition, start, end)

    async def end_offset(self, partition: int) -> int:
        if self._is_kill():
            raise Killed
        return await self.inner.end_offset(partition)

    async def start_offset(self, partition: int) -> int:
        if self._is_kill():
            raise Killed
        return await self.inner.start_offset(partition)


def chain_states(records: Sequence[LoggedRecord]) -> list[tuple[PersistId, int, State]]:
    """The model: reading an uncompacted changelog from offset 0, the persists it holds in
    order, each with its input next offset and the whole state after it. A persist counts when
    its checkpoint is read and names the persist counted last (None for the first); its
    records are those before its checkpoint carrying its id."""
    state: State = {}
    head: PersistId | None = None
    out: list[tuple[PersistId, int, State]] = []
    seen: list[tuple[PersistId, bytes, bytes | None]] = []
    for record in records:
        persist = PersistId.decode(dict(record.headers)[PERSIST_HEADER])
        assert record.key is not None
        if record.key != CHECKPOINT_KEY:
            seen.append((persist, record.key, record.value))
            continue
        assert record.value is not None
        checkpoint = decode_checkpoint_value(persist, record.value)
        if checkpoint.previous != head:
            continue
        for owner, key, value in seen:
            if owner != persist:
                continue
            if value is None:
                state.pop(key, None)
            else:
                state[key] = value
        seen = []
        head = persist
        out.append((persist, checkpoint.input_next_offset, dict(state)))
    return out
