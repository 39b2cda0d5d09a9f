"""The changelog port, and its in-memory implementation (tests, the state machine, replay-like
drivers). `tables.durable.kafka.KafkaChangelog` is the real one; tests/contract holds the suite
both pass."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from tables.durable.records import Headers, WireRecord


class ChangelogUnavailable(Exception):
    """The changelog refused or lost a request: whether an append landed, in whole or in part,
    is unknown."""


@dataclass(frozen=True, slots=True)
class LoggedRecord:
    """A record read back, with its offset in its changelog partition."""

    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers


@dataclass(frozen=True, slots=True)
class Appended:
    """Where an append's records landed: offsets `first`..`last`. `contiguous`: nothing else
    was written between them (one writer's records in one produce batch are)."""

    first: int
    last: int
    count: int

    @property
    def contiguous(self) -> bool:
        return self.last - self.first + 1 == self.count


class Changelog(Protocol):
    """One changelog topic; a partition of it per mailbox-tail partition."""

    async def append(self, partition: int, records: Sequence[WireRecord]) -> Appended:
        """Send `records` (at least one), in order, as one produce and wait once for the
        acknowledgement of all of them. Raises `ChangelogUnavailable`: then any prefix of the
        records may have been written."""
        ...

    async def read(self, partition: int, start: int, end: int) -> tuple[list[LoggedRecord], int]:
        """Some records at offsets in [start, end) (at least one when there is one; compacted
        or deleted offsets are skipped) and the offset to read from next (> start unless
        start >= end)."""
        ...

    async def end_offset(self, partition: int) -> int:
        """The offset the next appended record will get."""
        ...

    async def start_offset(self, partition: int) -> int:
        """The log start offset: the lowest offset still readable."""
        ...


@dataclass
class _Partition:
    records: list[LoggedRecord] = field(default_factory=list)
    end: int = 0
    start: int = 0


class InMemoryChangelog:
    """A `Changelog` in memory, with the broker-side operations tests need: compaction (keep the
    last record of each key; optionally drop tombstones), deletion of records below an offset
    (retention), and a torn append (`tear_next_append`)."""

    def __init__(self) -> None:
        self._partitions: dict[int, _Partition] = {}
        self._tear: int | None = None
        self.appends = 0

    def _partition(self, partition: int) -> _Partition:
        return self._partitions.setdefault(partition, _Partition())

    def tear_next_append(self, delivered: int) -> None:
        """The next append writes only its first `delivered` records, then raises."""
        self._tear = delivered

    async def append(self, partition: int, records: Sequence[WireRecord]) -> Appended:
        if not records:
            raise ValueError("an append has at least one record")
        self.appends += 1
        tear, self._tear = self._tear, None
        log = self._partition(partition)
        first = log.end
        for index, record in enumerate(records):
            if tear is not None and index >= tear:
                raise ChangelogUnavailable(f"append torn after {tear} of {len(records)} records")
            log.records.append(LoggedRecord(log.end, record.key, record.value, record.headers))
            log.end += 1
        if tear is not None:
            raise ChangelogUnavailable(f"append acknowledgement lost after {len(records)} records")
        return Appended(first, log.end - 1, len(records))

    async def read(self, partition: int, start: int, end: int) -> tuple[list[LoggedRecord], int]:
        log = self._partition(partition)
        end = min(end, log.end)
        if start >= end:
            return [], max(start, log.start)
        batch = [r for r in log.records if max(start, log.start) <= r.offset < end][:500]
        return batch, (batch[-1].offset + 1 if len(batch) == 500 else end)

    async def end_offset(self, partition: int) -> int:
        return self._partition(partition).end

    async def start_offset(self, partition: int) -> int:
        return self._partition(partition).start

    def compact(self, partition: int, below: int | None = None, drop_tombstones: bool = False) -> None:
        """Log compaction of the records below `below` (default: all): of each key only the
        last record stays (a later record of the key at or above `below` also supersedes)."""
        log = self._partition(partition)
        limit = log.end if below is None else below
        last: dict[bytes | None, int] = {}
        for record in log.records:
            last[record.key] = record.offset
        log.records = [
            r
            for r in log.records
            if r.offset >= limit or (last[r.key] == r.offset and not (drop_tombstones and r.value is None))
        ]

    def delete_before(self, partition: int, offset: int) -> None:
        """Retention, or the admin API's delete-records: offsets below `offset` are gone."""
        log = self._partition(partition)
        log.start = max(log.start, min(offset, log.end))
        log.records = [r for r in log.records if r.offset >= log.start]

    def copy(self) -> InMemoryChangelog:
        """Another changelog holding the same records (to run several futures from one log)."""
        other = InMemoryChangelog()
        for number, log in self._partitions.items():
            other._partitions[number] = _Partition(list(log.records), log.end, log.start)
        return other

    def records(self, partition: int) -> list[LoggedRecord]:
        return list(self._partition(partition).records)
