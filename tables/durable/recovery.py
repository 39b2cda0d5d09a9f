"""Changelog → local store: the one reader that restores a partition, rebuilds a lost store and
keeps a standby copy. It applies a persist only once it has read that persist's checkpoint, and
only on top of the persist the store holds (the checkpoint's `previous`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from tables.durable.changelog import Changelog, LoggedRecord
from tables.durable.records import Checkpoint, DataRecord, RecordRefused, decode
from tables.durable.store import PartitionStore

log = logging.getLogger("projector.durable")


@dataclass
class ReaderStats:
    persists_applied: int = 0
    records_applied: int = 0
    checkpoints_refused: int = 0  # read, not on top of the store's persist (a zombie's, a lost claim)
    records_refused: int = 0  # not in this format (reason logged)


class StoreBehindChangelog(Exception):
    """The changelog's log start is past the store's position: records the store never read are
    gone, so the store cannot catch up on top of its persist. Rebuild it."""


@dataclass(frozen=True, slots=True)
class CaughtUp:
    """A catch-up's outcome: every persist complete below `end` is applied. `torn_keys`: keys
    whose last record this reader read belongs to no accepted persist (torn, refused, or
    waiting for a checkpoint); the owner writes them again (a claim does) so that compaction
    keeps an accepted value last. Only what this reader read since it started counts."""

    end: int
    torn_keys: frozenset[bytes]
    highest_epoch: int


@dataclass
class ChangelogReader:
    """Reads one changelog partition into its store. `catch_up` reads from the store's position
    to the end of the log; call it again to tail (a standby). A fresh store (no persist yet)
    rebuilds: the first checkpoint it reads is accepted with every record before it that is
    not newer than it, whatever its `previous` (compaction removed the checkpoints before it)."""

    store: PartitionStore
    changelog: Changelog
    partition: int
    stats: ReaderStats = field(default_factory=ReaderStats)
    # Records read since the store's persist, in log order, waiting for their checkpoint.
    _waiting: list[DataRecord] = field(default_factory=list)
    # Keys whose last record read is not an accepted persist's (torn, refused, or discarded).
    _torn: set[bytes] = field(default_factory=set)
    _read_to: int | None = None
    _highest_epoch: int = 0

    def _reset(self) -> None:
        self._highest_epoch = max(self._highest_epoch, self.store.position.highest_epoch)
        self._waiting.clear()
        self._torn.clear()
        self._read_to = None

    async def catch_up(self) -> CaughtUp:
        """Read to the log's end as it is now; apply each complete persist as its checkpoint is
        read (one store write each: a kill between two leaves a whole prefix applied)."""
        position = self.store.position.changelog_next_offset
        # A reader keeps what it buffered past the store's position between calls (a standby
        # tailing); anything else starts again at the store's position.
        if self._read_to is None or self._read_to < position:
            self._reset()
            self._read_to = position
        log_start = await self.changelog.start_offset(self.partition)
        if log_start > self._read_to and self.store.position.head is not None:
            raise StoreBehindChangelog(
                f"changelog partition {self.partition} starts at {log_start}, "
                f"the store stands at {self._read_to}"
            )
        start = max(self._read_to, log_start)
        end = await self.changelog.end_offset(self.partition)
        while start < end:
            batch, start = await self.changelog.read(self.partition, start, end)
            for logged in batch:
                self._feed(logged)
            self._read_to = start
        self._highest_epoch = max(self._highest_epoch, self.store.position.highest_epoch)
        return CaughtUp(end, frozenset(self.torn_keys()), self._highest_epoch)

    def torn_keys(self) -> set[bytes]:
        return set(self.store.torn_keys()) | self._torn | {r.key for r in self._waiting}

    def _feed(self, logged: LoggedRecord) -> None:
        try:
            record = decode(logged.key, logged.value, logged.headers)
        except RecordRefused as exc:
            self.stats.records_refused += 1
            log.error(
                "changelog partition %d offset %d refused: %s", self.partition, logged.offset, exc.reason
            )
            return
        if isinstance(record, DataRecord):
            self._highest_epoch = max(self._highest_epoch, record.persist.epoch)
            self._waiting.append(record)
            return
        self._highest_epoch = max(self._highest_epoch, record.persist.epoch)
        self._on_checkpoint(record, logged.offset)

    def _on_checkpoint(self, checkpoint: Checkpoint, offset: int) -> None:
        position = self.store.position
        head = position.head
        if head is None:
            # Rebuilding: the records before the first checkpoint read belong to it or to
            # persists before it whose checkpoints compaction removed.
            accepted = [r for r in self._waiting if r.persist <= checkpoint.persist]
            newer = [r for r in self._waiting if r.persist > checkpoint.persist]
        elif checkpoint.previous == head and checkpoint.persist > head:
            accepted = [r for r in self._waiting if r.persist == checkpoint.persist]
            newer = []
        else:
            self.stats.checkpoints_refused += 1
            self._torn.update(r.key for r in self._waiting if r.persist == checkpoint.persist)
            self._waiting = [r for r in self._waiting if r.persist != checkpoint.persist]
            log.warning(
                "changelog partition %d offset %d: checkpoint %s on top of %s refused (the store holds %s)",
                self.partition,
                offset,
                checkpoint.persist,
                checkpoint.previous,
                head,
            )
            return
        # Other persists' records before this checkpoint are never applied (every later checkpoint
        # must name this one); their keys stay torn until an accepted persist writes them again.
        kept = {id(r) for r in accepted} | {id(r) for r in newer}
        torn = self._torn | {r.key for r in self._waiting if id(r) not in kept}
        self.store.apply(accepted, checkpoint, offset + 1, self._highest_epoch, torn)
        self.stats.persists_applied += 1
        self.stats.records_applied += len(accepted)
        self._torn = set()
        self._waiting = newer
