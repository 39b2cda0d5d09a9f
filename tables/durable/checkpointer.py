"""State → changelog → local store: a persist is one append whose last record is its checkpoint,
then one local write batch. The owner of a partition claims it first (a new epoch, and the keys a
torn or refused persist left written again), then persists."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tables.durable.changelog import Changelog, ChangelogUnavailable
from tables.durable.records import (
    Checkpoint,
    DataRecord,
    InputIdentity,
    PersistId,
    encode_persist,
    row_state_key,
    user_state_key,
    waiting_state_key,
)
from tables.durable.recovery import ChangelogReader
from tables.durable.store import PartitionStore


class PersistFailed(Exception):
    """The persist may or may not be in the changelog. The checkpointer is unusable until the
    partition is recovered and claimed again (its next persist could not name its previous)."""


class ClaimLost(Exception):
    """Another writer's checkpoint landed before this claim's: recover and claim again (or
    give the partition up)."""


class NotClaimed(Exception):
    """`persist` before a successful `claim`, or after a failed persist."""


@dataclass
class PersistBatch:
    """What one persist writes: the rows, users and waiting entries that changed since the last
    one (None deletes), the mailbox-tail offset the state has applied every entry below, and the
    worker's partition-level record."""

    input_next_offset: int
    rows: Mapping[tuple[int, str], bytes | None] = field(default_factory=dict)
    users: Mapping[int, bytes | None] = field(default_factory=dict)
    waiting: Mapping[tuple[int, int], bytes | None] = field(default_factory=dict)
    meta: bytes = b""

    def records(self, persist: PersistId) -> list[DataRecord]:
        records = [DataRecord(waiting_state_key(u, s), v, persist) for (u, s), v in self.waiting.items()]
        records += [DataRecord(row_state_key(u, c), v, persist) for (u, c), v in self.rows.items()]
        records += [DataRecord(user_state_key(u), v, persist) for u, v in self.users.items()]
        return records


class Checkpointer:
    """The one writer of a partition's changelog and local store while it owns the partition.
    Its `reader` (the same code a standby runs) catches the store up before a claim, and decides
    a persist whose records another writer's came between."""

    def __init__(
        self, store: PartitionStore, changelog: Changelog, partition: int, identity: InputIdentity
    ) -> None:
        self.store = store
        self.reader = ChangelogReader(store, changelog, partition)
        self.changelog = changelog
        self.partition = partition
        self.identity = identity
        self._next: PersistId | None = None  # the id of the next persist; None: not claimed
        self._last: PersistId | None = None  # the last persist this checkpointer wrote
        self._torn: set[bytes] = set()  # keys to write again with the next persist
        self.round_trips = 0

    @property
    def claimed(self) -> bool:
        return self._next is not None

    @property
    def last(self) -> PersistId | None:
        """The last persist this checkpointer wrote and saw accepted (its claim at first)."""
        return self._last

    def note_torn(self, keys: frozenset[bytes] | set[bytes]) -> None:
        """Keys another writer's refused or torn records wrote after this owner's claim (a
        reader tailing the changelog finds them: `CaughtUp.torn_keys`): the next persist writes
        them again with this state's values, so compaction keeps ours."""
        self._torn |= keys

    async def claim(self, input_start: int = 0) -> Checkpoint:
        """Take the partition: catch the store up, then persist a claim (a new epoch, above every
        epoch read; the torn keys written again with the store's values) and read it back: it
        is ours only if it was accepted on top of the store's persist. `input_start`: the
        mailbox-tail offset to start from when the partition has no checkpoint yet."""
        self._next = None
        reader = self.reader
        caught_up = await reader.catch_up()
        position = self.store.position
        head = position.checkpoint
        persist = PersistId(max(caught_up.highest_epoch, position.highest_epoch) + 1, 0)
        torn = sorted(caught_up.torn_keys)
        repairs = [DataRecord(k, v, persist) for k, v in zip(torn, self.store.get_many(torn), strict=True)]
        checkpoint = Checkpoint(
            persist,
            None if head is None else head.persist,
            input_start if head is None else head.input_next_offset,
            self.identity,
            b"" if head is None else head.meta,
        )
        try:
            self.round_trips += 1
            await self.changelog.append(self.partition, encode_persist(repairs, checkpoint))
        except ChangelogUnavailable as exc:
            raise PersistFailed(f"claim {persist} of partition {self.partition}: {exc}") from exc
        await reader.catch_up()
        if self.store.position.head != persist:
            raise ClaimLost(
                f"partition {self.partition}: claim {persist} refused, the changelog holds "
                f"{self.store.position.head} on top of {checkpoint.previous}"
            )
        self._next = PersistId(persist.epoch, 1)
        self._last = persist
        self._torn.clear()
        return checkpoint

    async def persist(self, batch: PersistBatch) -> Checkpoint:
        """One append (data, then the checkpoint), acknowledged once, then one local write.

        The store takes the persist itself when its records landed right after the store's
        position with nothing between them: then the log's accepted persist before them is the
        store's, and every reader accepts this one too. When another writer's records came
        between, the reader reads them and this persist: the store takes what the log decided,
        and the persist stands only if every reader accepts it; otherwise `PersistFailed` (this
        writer lost the partition without knowing)."""
        persist = self._next
        if persist is None:
            raise NotClaimed(f"partition {self.partition} is not claimed by this checkpointer")
        head = self.store.position.head
        if head != self._last:
            self._next = None
            raise PersistFailed(
                f"partition {self.partition}: the store holds persist {head}, not this owner's last "
                f"{self._last}: another writer took the partition"
            )
        checkpoint = Checkpoint(persist, head, batch.input_next_offset, self.identity, batch.meta)
        records = batch.records(persist)
        written = {r.key for r in records}
        repairs = sorted((self._torn | self.store.torn_keys()) - written)
        records += [
            DataRecord(k, v, persist) for k, v in zip(repairs, self.store.get_many(repairs), strict=True)
        ]
        wire = encode_persist(records, checkpoint)
        # Whatever happens next, this id is spent and the head unknown until a new claim.
        self._next = None
        position = self.store.position.changelog_next_offset
        try:
            self.round_trips += 1
            appended = await self.changelog.append(self.partition, wire)
        except ChangelogUnavailable as exc:
            raise PersistFailed(f"persist {persist} of partition {self.partition}: {exc}") from exc
        # Keys written by this persist need no repair, unless records after it wrote them again.
        self._torn -= {r.key for r in records}
        if appended.first == position and appended.contiguous:
            self.store.apply(records, checkpoint, appended.last + 1, persist.epoch)
        else:
            caught_up = await self.reader.catch_up()
            if self.store.position.head != persist:
                raise PersistFailed(
                    f"persist {persist} of partition {self.partition} (offsets {appended.first}.."
                    f"{appended.last}) refused: the log holds {self.store.position.head} there, "
                    "another writer took the partition"
                )
            self._torn |= caught_up.torn_keys
        self._next = PersistId(persist.epoch, persist.seq + 1)
        self._last = persist
        return checkpoint
