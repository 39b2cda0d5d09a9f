"""WorkerCore: decode once, gate per partition, apply in order in memory, persist per window, flush.

Per batch of records (one fetch of one partition, `app.worker.batch_intake`):
  (partition, [record]) → decode → dead letters out | markers → gate | entries → gate
  → released entries applied to the partition's Projector (wall-clock time), in memory
  → UserConversationState changes staged and written in batched calls by a background task
    (rounds of whatever was staged meanwhile), with the member directory's rows (group_members
    from join/leave) and statistics (member_stats from message/recall/delete entries,
    app/members/stats.py).

Hot state: the rows/users/gate/pending changes since the last persist stay in memory and are
written ONCE per row to the changelog tables at the partition's next persist: every flush
(before the store write: durable before visible), at least once per window otherwise, and when
the partition is revoked. Offsets follow it: only `durable_offsets()` (as of the last persist,
which first completes the Cassandra mirror writes of what it persists) are committed, so a crash
re-reads exactly what the changelog does not hold, and the gate's duplicate rule drops what it
does.

Flushes (window on the wall clock, or early past max_dirty_rows) write each dirty user's batch
to the projection store atomically, then emit one SESSION_DELTA and one BADGE_UPDATE per user.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import orjson

from app.domain.conversation import ConversationState
from app.domain.entries import (
    DeadLetter,
    DeleteMessageEntry,
    Entry,
    JoinEntry,
    LeaveEntry,
    MessageEntry,
    RecallEntry,
    WatermarkMarker,
    decode_record,
)
from app.domain.ports import MessageStore
from app.domain.projection_store import ProjectionStore
from app.domain.projector import Applied, Projector, ProjectorConfig, UserState
from app.domain.watermark import Offer, WatermarkGate
from app.members.stats import MemberStats
from app.worker.offsets import Admission, Verdict, admit
from app.worker.ports import FlushObserver, Outbox, RawRecord, StateTables, StateWriter

log = logging.getLogger("projector.worker")

# Batches that may stage Cassandra mirror writes while a mirror round is still writing, before
# the next batch waits for it (memory bound on staged writes; a persist waits for all of them).
MIRROR_BACKLOG_BATCHES = 8

# Fields of a row that UserConversationState keeps (what a rebuild from Cassandra needs).
_STATE_FIELDS = (
    "membership",
    "role",
    "joined_at",
    "left_at",
    "read_seq",
    "hidden_before",
    "deleted_before",
    "pin_rank",
    "archived",
    "muted",
)
# Entries that can move a member's statistics (the rest never touch them).
_STATS_ENTRIES = frozenset({MessageEntry, RecallEntry, DeleteMessageEntry})
# Key of the member statistics inside a row's changelog record (ConversationState.load ignores it).
_STATS_KEY = "member_stats"
# Key of the Cassandra writes a row's record still owes (the mirror failed at its persist).
_OWED_KEY = "mirror_owed"
# Key of the partition's next offset inside its gate record (WatermarkGate.load ignores it).
_NEXT_OFFSET_KEY = "next_offset"


CQL_BIGINT_MAX = 2**63 - 1
# first_seen_* are written with a cell timestamp derived from the seq (app/stores/cassandra_state).
FIRST_SEEN_LIMIT = 2**50


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(slots=True)
class WorkerStats:
    records: int = 0
    entries: int = 0
    applied: int = 0
    duplicates: int = 0
    dead_letters: int = 0
    markers: int = 0
    flushes: int = 0
    projection_writes: int = 0
    refused_writes: int = 0
    frames: int = 0
    state_writes: int = 0
    state_write_failures: int = 0
    state_unmirrorable: int = 0
    # Rows persisted while their mirror write was still owed (Cassandra failing), and owed
    # writes staged again from the changelog after a restart.
    state_owed_rows: int = 0
    state_restaged_rows: int = 0
    # The intake's offset rule (app/worker/offsets.py): batches refused because they did not start
    # where the partition's state stands in the log (never applied: read again after a seek back),
    # records skipped because the state already holds them (re-reads), and offsets the broker
    # reported as holding no record (transaction markers, compaction, retention).
    intake_gaps_refused: int = 0
    intake_records_skipped: int = 0
    intake_hole_offsets: int = 0
    last_flush_ms: float = 0.0
    # The unread audit (app/worker/audit.py): totals, and the last round's drifted/audited share.
    audit_rounds: int = 0
    audited_rows: int = 0
    audit_drifted_rows: int = 0
    audit_corrected_rows: int = 0
    audit_drift_ratio: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(slots=True)
class _Touched:
    """What changed in one partition since its state was last persisted: written to the tables
    once per row at the next persist, however many batches touched it."""

    rows: set[tuple[int, str]] = field(default_factory=set)
    users: set[int] = field(default_factory=set)
    gate: bool = False
    # Entries that started waiting since the last persist and still wait: (user, seq) -> raw.
    # An entry that waits and is released between two persists never touches the table: lanes
    # write their marker after their entries, so that is the common case, and writing then
    # deleting it would cost two changelog records per entry.
    pending_added: dict[tuple[int, int], bytes] = field(default_factory=dict)
    # Entries released since the last persist that an earlier persist stored.
    pending_released: list[tuple[int, int]] = field(default_factory=list)


class PartitionState:
    """The core for one partition: its watermark gate and its users' projector."""

    def __init__(self, partition: int, gate: WatermarkGate, projector: Projector) -> None:
        self.partition = partition
        self.gate = gate
        self.projector = projector
        # Per (user, conversation): the seq bitmaps behind the member directory's statistics.
        # Persisted inside the row's changelog record, so they survive exactly as the row does.
        self.member_stats: dict[tuple[int, str], MemberStats] = {}
        # Rows whose changelog record carries Cassandra writes still owed (see WorkerCore.persist).
        self.owing: set[tuple[int, str]] = set()
        # Highest mailbox_seq of any entry read here: minus gate.hi, the watermark lag (metrics).
        self.max_seen_seq = 0
        # Hot state: what the records read so far changed and the tables do not hold yet. The
        # offsets follow it: `processed` = next offset after the last record applied, `durable`
        # = the same as of the last persist (the only offset that may be committed).
        self.unpersisted = _Touched()
        self.unpersisted_since: int | None = None  # clock of the first change not persisted
        # The next mailbox-tail offset this state has not applied (app/worker/offsets.py): every
        # record below it is in the state, none at or above it. Persisted in the gate record, so
        # it is restored with the state it describes; None until the intake places a partition
        # that has no state yet.
        self.next_offset: int | None = None
        self.durable_offset: int | None = None  # next_offset as of the last persist
        self.committed_offset: int | None = None


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    lanes: int
    window_ms: int
    max_dirty_rows: int
    include_muted: bool
    unread_precise_limit: int

    def projector_config(self) -> ProjectorConfig:
        return ProjectorConfig(
            window_ms=self.window_ms,
            max_dirty_rows=self.max_dirty_rows,
            include_muted=self.include_muted,
            unread_precise_limit=self.unread_precise_limit,
        )


class WorkerCore:
    def __init__(
        self,
        config: WorkerConfig,
        *,
        message_store: MessageStore,
        projection_store: ProjectionStore,
        tables: StateTables,
        outbox: Outbox,
        state_writer: StateWriter | None = None,
        clock: Callable[[], int] = wall_clock_ms,
        after_store_write: Callable[[], None] | None = None,
        metrics: FlushObserver | None = None,
    ) -> None:
        self.config = config
        self.message_store = message_store
        self.projection_store = projection_store
        self.tables = tables
        self.outbox = outbox
        self.state_writer = state_writer
        self.clock = clock
        self.after_store_write = after_store_write  # fault-injection hook (J-7 tests)
        # Prometheus metrics: counters are pulled from self.stats (metrics.sync); only the flush
        # latency histogram is observed here, once per flush.
        self.metrics = metrics
        self.partitions: dict[int, PartitionState] = {}
        self.stats = WorkerStats()
        self._flush_lock = asyncio.Lock()
        # Held while a batch is applied and while a partition is persisted: a persist snapshots
        # rows, offsets and the Cassandra mirror at one point between batches.
        self._state_lock = asyncio.Lock()
        # The Cassandra mirror runs beside the batches: one writer task, writing round after
        # round whatever the batches staged meanwhile, so a slow round (the cold start's joins)
        # does not hold the next batches up; past MIRROR_BACKLOG_BATCHES waiting, they wait.
        self._mirror_task: asyncio.Future[None] | None = None
        self._mirror_backlog = 0  # batches staged since the current round began

    # -- partitions ---------------------------------------------------------------------------

    def partition(self, partition: int) -> PartitionState:
        """The partition's core, restored from the changelog tables on first use."""
        state = self.partitions.get(partition)
        if state is None:
            state = self.partitions[partition] = self._restore(partition)
        return state

    def _restore(self, partition: int) -> PartitionState:
        snapshot = self.tables.snapshot(partition)
        if snapshot.rows or snapshot.users or snapshot.pending or snapshot.gate:
            # The local store can be AHEAD of the changelog: a crash after a batch's local writes
            # but before its changelog records were delivered. That batch's entries are read again
            # and dropped as duplicates (the local state has them), so nothing would ever write
            # their effect to the changelog, and a later restart without this local store would
            # lose it while the offsets are already past. Publishing what was restored closes
            # that gap (before any offset of this incarnation is committed: a commit flushes the
            # producer first).
            self.tables.republish(partition)
        config = self.config.projector_config()
        lanes = self.config.lanes
        rows = []
        member_stats: dict[tuple[int, str], MemberStats] = {}
        owing: set[tuple[int, str]] = set()
        for blob in snapshot.rows:
            record = msgspec.msgpack.decode(blob)
            row = ConversationState.load(record)
            rows.append(row)
            key = (row.user_id, row.conversation_id)
            if _STATS_KEY in record:
                member_stats[key] = MemberStats.load(record[_STATS_KEY])
            if _OWED_KEY in record:
                owing.add(key)
                self._restage(key, record[_OWED_KEY])
        users = {"users": [msgspec.msgpack.decode(blob) for blob in snapshot.users], "rows": []}
        projector = Projector.restore(config, self.message_store, users)
        for row in rows:
            user = projector.users.get(row.user_id)
            if user is None:  # a row written in a batch whose user record was lost: keep the row
                user = projector.users[row.user_id] = UserState(row.user_id)
            user.rows[row.conversation_id] = row
        # Now that the rows are attached: the dirty set is lost (never checkpointed) and every
        # badge is recomputed in full (a restart replays from an older checkpoint: a reconcile).
        projector.restarted()
        if projector.dirty.row_count:
            # Unflushed work survived in the changelog: flush it within one window from now.
            projector.policy.window_start = self.clock()
        waiting: list[Entry] = []
        for raw in snapshot.pending:
            record = decode_record(raw, lanes)
            if not isinstance(record, DeadLetter | WatermarkMarker):
                waiting.append(record)
        gate_state = msgspec.msgpack.decode(snapshot.gate) if snapshot.gate else {"marks": [], "hi": 0}
        gate = WatermarkGate.load(lanes, gate_state, waiting)
        next_offset = gate_state.get(_NEXT_OFFSET_KEY)
        if projector.users or waiting:
            log.info(
                "restored partition %d: %d users, %d rows, %d waiting, hi=%d, next offset %s",
                partition,
                len(projector.users),
                len(rows),
                len(waiting),
                gate.hi,
                next_offset,
            )
        state = PartitionState(partition, gate, projector)
        state.next_offset = state.durable_offset = next_offset if isinstance(next_offset, int) else None
        state.member_stats = member_stats
        state.owing = owing
        if owing:
            self._mirror_soon()
        state.max_seen_seq = max([gate.hi, *(entry.mailbox_seq for entry in waiting)])
        return state

    async def restore_assigned(self, partitions: Sequence[int]) -> None:
        """After a rebalance (tables recovered): bring every assigned partition back now, so work
        that was applied but never flushed is flushed even if no new record arrives."""
        for partition in partitions:
            self.partition(partition)
        await self.tables.commit()

    async def release(self, partitions: Sequence[int]) -> None:
        """Partitions handed to another worker: persist their hot state (the new owner restores
        it from the changelog) and forget them. Commit `durable_offsets()` afterwards."""
        for partition in partitions:
            state = self.partitions.get(partition)
            if state is not None:
                await self.persist(state, handing_over=True)

    def forget(self, partitions: Sequence[int]) -> None:
        for partition in partitions:
            self.partitions.pop(partition, None)

    # -- records ------------------------------------------------------------------------------

    async def on_records(self, records: Sequence[RawRecord]) -> dict[int, Admission]:
        """A batch of records of any partitions, read in offset order without holes (a file or a
        plain consumer: rebuild by replay, tests); see `on_batch`."""
        by_partition: dict[int, list[RawRecord]] = {}
        for record in records:
            by_partition.setdefault(record.partition, []).append(record)
        return {
            partition: await self.on_batch(partition, batch, None, batch[-1].offset + 1)
            for partition, batch in by_partition.items()
        }

    async def on_batch(
        self, partition: int, records: Sequence[RawRecord], fetch_from: int | None, fetch_to: int
    ) -> Admission:
        """Process one fetch of one partition in memory, if it continues the partition's state in
        the log (app/worker/offsets.py; `fetch_from`/`fetch_to`: the consumer's position before
        and after the fetch). A GAP is refused and changes nothing: the caller seeks back to
        `expected_offset(partition)`. Its effects reach the changelog tables with the partition's
        next persist (every flush, and at least once per window): until then its offsets are not
        `durable_offsets()`, so a crash re-reads it."""
        async with self._state_lock:
            now = self.clock()
            state = self.partition(partition)
            admission = admit(state.next_offset, [r.offset for r in records], fetch_from, fetch_to)
            if admission.verdict is Verdict.GAP:
                self.stats.intake_gaps_refused += 1
                log.warning(
                    "partition %d: refused a batch at offsets %s..%s (fetched from %s): the state "
                    "expects offset %s next; reading again from there",
                    partition,
                    records[0].offset if records else fetch_to,
                    records[-1].offset if records else fetch_to,
                    fetch_from,
                    state.next_offset,
                )
                return admission
            if admission.verdict is Verdict.ALREADY_APPLIED:
                self.stats.intake_records_skipped += len(records)
                return admission
            self.stats.intake_records_skipped += admission.start
            fresh = records[admission.start :] if admission.start else records
            self.stats.intake_hole_offsets += self._holes(state.next_offset, fresh, fetch_to)
            letters: list[tuple[bytes | None, bytes]] = []
            if fresh:
                self._process(state, fresh, now, letters)
            # The gate record carries the offset: it is persisted with the state it describes.
            state.next_offset = admission.next_offset
            state.unpersisted.gate = True
            if state.unpersisted_since is None:
                state.unpersisted_since = now
            if letters:
                await self.outbox.dead_letters(letters)
            if self._mirror_soon() and self._mirror_backlog > MIRROR_BACKLOG_BATCHES:
                await self._mirror_in_flight()  # backpressure: Cassandra is behind
        await self.flush_due(self.clock(), only_memory_bound=True)
        return admission

    @staticmethod
    def _holes(expected: int | None, records: Sequence[RawRecord], fetch_to: int) -> int:
        """Offsets in [expected, fetch_to) that held no record (the broker moved past them)."""
        if expected is None:
            return 0
        return max(0, fetch_to - expected - len(records))

    def expected_offset(self, partition: int) -> int | None:
        """Where the partition's state stands in the log (None: not placed yet)."""
        return self.partition(partition).next_offset

    def start_at(self, partition: int, offset: int) -> None:
        """Place a partition that has no offset yet (a new partition, or state from before
        offsets were recorded) at `offset`: where the consumer group left it, or the log start."""
        state = self.partition(partition)
        if state.next_offset is None:
            state.next_offset = offset
            state.unpersisted.gate = True
            log.info("partition %d: starting at offset %d", partition, offset)

    def durable_offsets(self) -> dict[int, int]:
        """Per partition, the offset up to which every record's effect is in the changelog
        tables and that is not committed yet (see `offsets_committed`)."""
        return {
            partition: state.durable_offset
            for partition, state in self.partitions.items()
            if state.durable_offset is not None and state.durable_offset != state.committed_offset
        }

    def offsets_committed(self, offsets: dict[int, int]) -> None:
        for partition, offset in offsets.items():
            state = self.partitions.get(partition)
            if state is not None:
                state.committed_offset = offset

    async def persist(self, state: PartitionState, *, handing_over: bool = False) -> None:
        """Write what the partition's hot state changed to the changelog tables (once per row)
        and hand the records to the producer; its offsets become durable. `handing_over`: the
        partition goes to another worker, which takes over the Cassandra writes it still owes."""
        async with self._state_lock:  # no batch is applied meanwhile: one consistent snapshot
            # The Cassandra mirror first: once the changelog holds these entries, their re-reads
            # are duplicates and would never stage their UserConversationState writes again.
            await self._mirror_in_flight()
            owed: dict[tuple[int, str], dict[str, Any]] = {}
            if self.state_writer is not None:
                # Rounds run only when batches stage: this one retries what a failed round kept.
                await self._mirror_state(self.state_writer)
                # Still owed (Cassandra failing): the rows' records carry it, so a crash before
                # the retry succeeds cannot lose it (the entries will be read as duplicates).
                owed = self.state_writer.owed()
            touched, state.unpersisted = state.unpersisted, _Touched()
            offset, state.unpersisted_since = state.next_offset, None
            self._owe(state, touched, owed)
            self._persist(state, touched, owed)
            if handing_over and state.owing and self.state_writer is not None:
                # The new owner restages them from the records; a late write from here could
                # land after its newer ones (state columns are last-write-wins).
                self.state_writer.drop(state.owing)
            await self.tables.commit()
            if offset is not None:
                state.durable_offset = offset

    def _mirror_soon(self) -> bool:
        """Count staged work for the mirror and start a round unless one runs (then True)."""
        writer = self.state_writer
        if writer is None:
            return False
        self._mirror_backlog += 1
        task = self._mirror_task
        if task is not None and not task.done():
            return True
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # a restore outside the worker's loop: the next persist writes
            return False
        self._mirror_task = loop.create_task(self._mirror_rounds(writer))
        return False

    def _owe(
        self, state: PartitionState, touched: _Touched, owed: dict[tuple[int, str], dict[str, Any]]
    ) -> None:
        """Which rows' records carry owed writes from this persist on: rows newly owing or no
        longer owing are written again (an untouched row that still owes keeps its record)."""
        if not owed and not state.owing:
            return
        users = state.projector.users
        owing: set[tuple[int, str]] = set()
        for user_id, conversation_id in owed:
            user = users.get(user_id)
            if user is not None and conversation_id in user.rows:
                owing.add((user_id, conversation_id))
        touched.rows.update(owing ^ state.owing)
        state.owing = owing
        self.stats.state_owed_rows += len(owing & touched.rows)

    def _restage(self, key: tuple[int, str], owed: Any) -> None:
        writer = self.state_writer
        if writer is None:
            return
        try:
            writer.restage(key[0], key[1], owed)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:  # a record it cannot read
            log.error("owed Cassandra writes of %s not restaged: %s", key, exc)
            return
        self.stats.state_restaged_rows += 1

    async def _mirror_in_flight(self) -> None:
        task, self._mirror_task = self._mirror_task, None
        if task is not None:
            await task

    async def _mirror_rounds(self, writer: StateWriter) -> None:
        """Write what is staged; again while batches staged more during the round."""
        while self._mirror_backlog:
            self._mirror_backlog = 0
            await self._mirror_state(writer)

    async def _mirror_state(self, writer: StateWriter) -> None:
        try:
            self.stats.state_writes += await writer.flush()
        except Exception as exc:  # Cassandra is a mirror here: never stop the projection for it
            # The writer keeps what it could not write and retries with its next round.
            self.stats.state_write_failures += 1
            log.error("UserConversationState write failed (will retry): %s", exc)

    def _process(
        self,
        state: PartitionState,
        batch: Sequence[RawRecord],
        now: int,
        letters: list[tuple[bytes | None, bytes]],
    ) -> None:
        stats = self.stats
        lanes = self.config.lanes
        gate = state.gate
        touched = state.unpersisted
        for record in batch:
            stats.records += 1
            decoded = decode_record(record.value, lanes)
            if isinstance(decoded, WatermarkMarker):
                stats.markers += 1
                released = gate.mark(decoded)
                touched.gate = True
                for entry in released:
                    key = (entry.user_id, entry.mailbox_seq)
                    if touched.pending_added.pop(key, None) is None:
                        touched.pending_released.append(key)
                    self._apply(state, entry, now, touched)
                continue
            stats.entries += 1
            if isinstance(decoded, DeadLetter):
                stats.dead_letters += 1
                letters.append((record.key, dead_letter_envelope(record, decoded.reason)))
                log.warning(
                    "dead letter %s[%d]@%d: %s", record.topic, record.partition, record.offset, decoded.reason
                )
                continue
            if decoded.mailbox_seq > state.max_seen_seq:
                state.max_seen_seq = decoded.mailbox_seq
            offer = gate.offer(decoded)
            if offer is Offer.READY:
                self._apply(state, decoded, now, touched)
            elif offer is Offer.PENDING:
                touched.pending_added[(decoded.user_id, decoded.mailbox_seq)] = record.value
            else:
                stats.duplicates += 1

    def _apply(self, state: PartitionState, entry: Entry, now: int, touched: _Touched) -> None:
        projector = state.projector
        user = projector.users.get(entry.user_id)
        is_new_row = user is None or entry.conversation_id not in user.rows
        if projector.apply(entry, now) is Applied.DUPLICATE:
            self.stats.duplicates += 1
            return
        self.stats.applied += 1
        key = (entry.user_id, entry.conversation_id)
        touched.rows.add(key)
        touched.users.add(entry.user_id)
        if self.state_writer is not None and (is_new_row or not isinstance(entry, MessageEntry)):
            row = projector.users[entry.user_id].rows[entry.conversation_id]
            fields: dict[str, object] = {name: getattr(row, name) for name in _STATE_FIELDS}
            fields["updated_mailbox_seq"] = entry.mailbox_seq
            if is_new_row and entry.mailbox_seq < FIRST_SEEN_LIMIT and entry.ts <= CQL_BIGINT_MAX:
                fields["first_seen_mailbox_seq"] = entry.mailbox_seq
                fields["first_seen_ts"] = entry.ts
            if all(not isinstance(v, int) or v <= CQL_BIGINT_MAX for v in fields.values()):
                self.state_writer.stage(entry.user_id, entry.conversation_id, fields)
            else:
                # Valid u64 values above Cassandra's bigint cannot be mirrored; the projection
                # (changelog tables, Redis) still has them.
                self.stats.state_unmirrorable += 1
        self._member_directory(state, entry)

    def _member_directory(self, state: PartitionState, entry: Entry) -> None:
        """The member directory's share of an applied entry: a join or leave restages the
        member's group_members row (whole row, from the applied state); a message, recall or
        delete may move the member's statistics (bitmaps: a duplicate changes nothing)."""
        writer = self.state_writer
        kind = type(entry)
        if kind is JoinEntry or kind is LeaveEntry:
            if writer is not None:
                row = state.projector.users[entry.user_id].rows[entry.conversation_id]
                writer.stage_member(
                    entry.conversation_id, entry.user_id, row.role, row.membership, row.joined_at, row.left_at
                )
            return
        if kind not in _STATS_ENTRIES or not MemberStats.concerns(entry.user_id, entry):
            return
        key = (entry.user_id, entry.conversation_id)
        stats = state.member_stats.get(key) or MemberStats()
        changed = stats.apply(entry.user_id, entry)
        if not stats.empty:
            # Kept even when no count moved: a recall may arrive before its message.
            state.member_stats[key] = stats
        if changed and writer is not None:
            record_count, mention_count = stats.counts()
            writer.stage_member_stats(
                entry.conversation_id, entry.user_id, record_count, mention_count, entry.mailbox_seq
            )

    def _persist(
        self, state: PartitionState, touched: _Touched, owed: dict[tuple[int, str], dict[str, Any]]
    ) -> None:
        """Write what changed to the changelog tables: once per row, not per entry."""
        partition = state.partition
        owing = state.owing
        tables = self.tables
        users = state.projector.users
        for (user_id, mailbox_seq), raw in touched.pending_added.items():
            tables.put_pending(partition, user_id, mailbox_seq, raw)
        for user_id, mailbox_seq in touched.pending_released:
            tables.delete_pending(partition, user_id, mailbox_seq)
        for user_id, conversation_id in touched.rows:
            record = users[user_id].rows[conversation_id].dump()
            stats = state.member_stats.get((user_id, conversation_id))
            if stats is not None:
                record[_STATS_KEY] = stats.dump()
            if (user_id, conversation_id) in owing:
                record[_OWED_KEY] = owed[(user_id, conversation_id)]
            tables.put_row(partition, user_id, conversation_id, msgspec.msgpack.encode(record))
        for user_id in touched.users:
            tables.put_user(partition, user_id, msgspec.msgpack.encode(users[user_id].dump()))
        if touched.gate:
            record = state.gate.dump()
            if state.next_offset is not None:
                record[_NEXT_OFFSET_KEY] = state.next_offset
            tables.put_gate(partition, msgspec.msgpack.encode(record))

    def touch(self, state: PartitionState, rows: Iterable[tuple[int, str]], users: Iterable[int]) -> None:
        """Rows and users changed outside a batch (the unread audit correcting the state): they
        join the partition's hot state and go to the changelog tables with its next persist."""
        touched = state.unpersisted
        for user_id, conversation_id in rows:
            touched.rows.add((user_id, conversation_id))
            touched.users.add(user_id)
        touched.users.update(users)
        if state.unpersisted_since is None:
            state.unpersisted_since = self.clock()

    # -- flushing -----------------------------------------------------------------------------

    @property
    def flush_lock(self) -> asyncio.Lock:
        """Held by every flush. The unread audit holds it to read, compare and correct a user's
        stored projection while no flush writes it."""
        return self._flush_lock

    async def flush_due(self, now: int, *, only_memory_bound: bool = False) -> int:
        """Flush every partition whose window elapsed (or that holds too many dirty rows); persist
        the hot state of the others at least once per window (pending entries, gate marks,
        duplicates: changes that flush nothing still move the durable offset)."""
        flushed = 0
        for state in list(self.partitions.values()):
            projector = state.projector
            if only_memory_bound:
                due = projector.dirty.row_count > projector.policy.max_dirty_rows
            else:
                due = projector.flush_due(now)
            if due:
                flushed += await self.flush_partition(state)
            elif (
                not only_memory_bound
                and state.unpersisted_since is not None
                and now - state.unpersisted_since >= self.config.window_ms
            ):
                await self.persist(state)
        return flushed

    async def flush_all(self) -> int:
        return sum([await self.flush_partition(state) for state in list(self.partitions.values())])

    async def flush_partition(self, state: PartitionState) -> int:
        """One flush: the hot state persisted, atomic per-user writes to the projection store,
        then the frames."""
        async with self._flush_lock:  # one flush at a time keeps each user's versions in order
            batches = state.projector.flush()
            # Durable before visible: what the store is about to show is in the changelog first.
            await self.persist(state)
            if not batches:
                return 0
            started = time.perf_counter()
            previous = await self.projection_store.write(batches)
            if self.after_store_write is not None:
                self.after_store_write()
            deltas: list[tuple[bytes, bytes]] = []
            badges: list[tuple[bytes, bytes]] = []
            for batch, stored_before in zip(batches, previous, strict=True):
                if stored_before is None:
                    # The store already holds this version (a replay after a crash): the frames
                    # went out with the first write, or clients detect the gap and re-pull.
                    self.stats.refused_writes += 1
                    continue
                self.stats.projection_writes += len(batch.rows)
                # prev = what the store held, i.e. the last version any client can have seen.
                published = dataclasses.replace(batch, prev_projection_mailbox_seq=stored_before)
                key = str(batch.user_id).encode()
                deltas.append((key, orjson.dumps(published.session_delta())))
                badges.append((key, orjson.dumps(published.badge_update())))
            if deltas:
                await self.outbox.frames(deltas, badges)
            self.stats.flushes += 1
            self.stats.frames += len(deltas) + len(badges)
            elapsed = time.perf_counter() - started
            self.stats.last_flush_ms = elapsed * 1000
            if self.metrics is not None:
                self.metrics.observe_flush(elapsed)
            log.debug("flush: %d users in %.1f ms", len(batches), self.stats.last_flush_ms)
            return len(batches)


def dead_letter_envelope(record: RawRecord, reason: str) -> bytes:
    """What goes to the dead-letter topic: why, and exactly where the record came from."""
    try:
        value: str = record.value.decode("utf-8")
        encoding = "utf-8"
    except UnicodeDecodeError:
        value = base64.b64encode(record.value).decode("ascii")
        encoding = "base64"
    return orjson.dumps(
        {
            "reason": reason,
            "topic": record.topic,
            "partition": record.partition,
            "offset": record.offset,
            "key": record.key.decode("utf-8", "replace") if record.key is not None else None,
            "value": value,
            "value_encoding": encoding,
        }
    )
