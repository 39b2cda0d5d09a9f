"""WorkerCore: the worker's I/O around the processing object, one per owned partition.

The rules (decode → gate → apply → flush decisions) are `app.domain.processor.PartitionProcessor`,
the object replay and a rebuild by replay run too. This module only does what needs I/O:

  (partition, [record]) → the offset rule (app/worker/offsets.py: the log is applied without a
  hole) → processor.on_records(values, wall clock) → dead letters to their topic | Cassandra
  mirror changes to the state writer (rounds in a background task) | member notices to the
  session-delta topic (after the mirror writes staged before them) | flushes queued

Hot state: what the processor changed since the last persist stays in memory and is written
ONCE per row to the changelog tables at the partition's next persist: before every flush is
published (durable before visible), at least once per window otherwise, and when the partition
is revoked. Offsets follow it: only `durable_offsets()` (as of the last persist, which first
completes the Cassandra mirror writes of what it persists) are committed, so a crash re-reads
exactly what the changelog does not hold, and the offset rule skips what it does.

Flushes (the processor's: a window closing before an entry, the memory bound, `on_deadline` at
the window's end, everything at a hand-over) are queued per partition in the order they were
produced and published in that order: each dirty user's batch to the projection store
atomically, then one SESSION_DELTA and one BADGE_UPDATE per user.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import orjson

from app.domain.entries import MAX_RECORD_BYTES
from app.domain.flush import UserFlush, badge_update_frame, session_delta_frame
from app.domain.notices import MemberNotice
from app.domain.ports import MessageStore
from app.domain.processor import (
    Changes,
    PartitionProcessor,
    ProcessingStats,
)
from app.domain.projection_store import ProjectionStore
from app.domain.projector import ProjectorConfig
from app.worker.mirror import MirrorPump
from app.worker.offsets import Admission, Verdict, admit, first_hole
from app.worker.ports import FlushObserver, Outbox, RawRecord, StateTables, StateWriter
from app.worker.ratelog import RateLimitedLog
from app.worker.retry import Backoff
from app.worker.state_source import TablesSource

log = logging.getLogger("projector.worker")

# Key of the Cassandra writes a row's record still owes (the mirror failed at its persist).
_OWED_KEY = "mirror_owed"
# Key of the partition's next offset inside its gate record (WatermarkGate.load ignores it).
_NEXT_OFFSET_KEY = "next_offset"
# Key of the last flushed version inside a user's record (UserState.dump).
_FLUSHED_KEY = "flushed_seq"
# Keys inside a partition's gate record: the users whose record says work no flush has carried
# (restored at once, flushed again within a window), and the rows whose record owes Cassandra
# writes (staged again at once). Both are small: what the last window touched.
_UNFLUSHED_KEY = "unflushed"
_PERSISTS_KEY = "persists"  # the gate's persist number
_OWING_KEY = "owing"


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(slots=True)
class WorkerStats(ProcessingStats):
    """The processing counts (shared by every partition's processor: partitions come and go, the
    totals must not) and the worker's own I/O counts."""

    flushes: int = 0
    projection_writes: int = 0
    refused_writes: int = 0
    frames: int = 0
    notices: int = 0  # MEMBER_NOTICE frames produced (app/domain/notices.py)
    notices_ahead_of_roster: int = 0  # of them, sent while the mirror's roster write failed
    # Sends of a batch's dead letters / member notices that raised (kept and sent again before
    # the partition's next persist, which waits for them).
    outbound_send_failures: int = 0
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
    # mailbox-tail's log start found past a partition's checkpoint (entries deleted unread: the
    # retention overran the worker), and the offsets lost so.
    retention_overruns: int = 0
    retention_lost_offsets: int = 0
    # Projection-store writes that raised while a store backoff was set (the flush stayed queued).
    store_write_failures: int = 0
    last_flush_ms: float = 0.0
    # The unread audit (app/worker/audit.py): totals, and the last round's drifted/audited share.
    audit_rounds: int = 0
    audited_rows: int = 0
    audit_drifted_rows: int = 0
    audit_corrected_rows: int = 0
    audit_drift_ratio: float = 0.0
    # Reconcile on request (app/worker/reconcile.py): requests by outcome, rows compared /
    # recounted from the MessageStore / corrected in place / filled, badges corrected.
    reconcile_outcomes: dict[str, int] = field(default_factory=dict)
    reconcile_rows_compared: int = 0
    reconcile_rows_recounted: int = 0
    reconcile_rows_corrected: int = 0
    reconcile_rows_filled: int = 0
    reconcile_badges_corrected: int = 0
    # Dead letters by kind (app.domain.entries.DEAD_LETTER_KINDS): the metrics' reason label.
    dead_letter_kinds: dict[str, int] = field(default_factory=dict)
    # The projection restore (app/worker/restore.py): partitions restored, users checked against
    # the store, users written again (and their rows), users handed to their next flush whole.
    projection_restores: int = 0
    restore_checked_users: int = 0
    restored_users: int = 0
    restored_rows: int = 0
    restore_reflushed_users: int = 0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class PartitionState:
    """One owned partition: its processor, and the I/O bookkeeping around it."""

    def __init__(self, partition: int, processor: PartitionProcessor) -> None:
        self.partition = partition
        self.processor = processor
        # Rows whose changelog record carries Cassandra writes still owed (see WorkerCore.persist),
        # and the same as the gate record last listed them.
        self.owing: set[tuple[int, str]] = set()
        self.owing_persisted: set[tuple[int, str]] = set()
        # The users the gate record lists as having work no flush carried (see _write_tables).
        self.unflushed: list[int] = []
        # Persists of this partition so far (kept in the gate).
        self.persists = 0
        # Flushes the processor produced and nobody published yet, in the order produced: a
        # user's versions must reach the store and the frames in order.
        self.unpublished: list[list[UserFlush]] = []
        # Flushes queued in this partition's life, and how many of them were published; a flush
        # may be published once a persist that snapshotted the state after it was produced has
        # completed (`durable_flushes`): a persist's changelog commit runs without the state
        # lock, so batches applied meanwhile may queue flushes that no completed persist covers.
        self.queued_flushes = 0
        self.published_flushes = 0
        self.durable_flushes = 0
        # Handed to another worker (`WorkerCore.release`): nothing of it is persisted or
        # published any more. A flush or persist still queued behind the hand-over (the flush
        # scheduler's, the audit's) must not write the changelog of a partition another worker
        # owns now: the hand-over's persist recorded its users' work as not flushed, the new
        # owner flushes it.
        self.released = False
        # The next mailbox-tail offset this state has not applied (app/worker/offsets.py): every
        # record below it is in the state, none at or above it. Persisted in the gate record, so
        # it is restored with the state it describes; None until the intake places a partition
        # that has no state yet.
        self.next_offset: int | None = None
        self.durable_offset: int | None = None  # next_offset as of the last persist
        self.committed_offset: int | None = None
        # (expected offset, first skipped offset) of a hole seen once and not confirmed yet.
        self.hole_seen: tuple[int, int] | None = None
        # Dead letters and member notices of applied batches whose send raised: events, not
        # state, so no later flush restates them; the next persist sends them first and fails
        # while it cannot (a crash then re-reads their records and produces them again).
        self.owed_dead_letters: list[tuple[bytes | None, bytes]] = []
        self.owed_notices: list[tuple[bytes, bytes]] = []

    @property
    def unpersisted_since(self) -> int | None:
        return self.processor.changes.since

    def queue(self, flushes: Sequence[list[UserFlush]]) -> None:
        """Flushes the processor produced, in order (under the core's state lock)."""
        self.unpublished.extend(flushes)
        self.queued_flushes += len(flushes)

    @property
    def publishable(self) -> bool:
        """The oldest queued flush is covered by a completed persist."""
        return not self.released and bool(self.unpublished) and self.published_flushes < self.durable_flushes


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    lanes: int
    projector: ProjectorConfig
    # Rows kept in memory per partition at most (the rest is read from the tables on demand).
    hot_rows: int = 500_000
    # Time between the starts of two Cassandra mirror rounds (writes to one key within it merge).
    mirror_spacing_ms: int = 100
    # Dead-letter log lines per second at most (app/worker/ratelog.py); every one is counted.
    dead_letter_log_per_s: int = 5

    @classmethod
    def from_settings(cls, settings: Any) -> WorkerConfig:
        """The processing configuration of `settings` (app.settings.Settings), built once."""
        return cls(
            lanes=settings.lanes,
            hot_rows=settings.hot_rows,
            mirror_spacing_ms=settings.mirror_spacing_ms,
            dead_letter_log_per_s=settings.dead_letter_log_per_s,
            projector=ProjectorConfig(
                window_ms=settings.projection_compaction_window_ms,
                max_dirty_rows=settings.max_dirty_rows,
                include_muted=settings.include_muted,
                unread_precise_limit=settings.unread_precise_limit,
                badge_mode=settings.badge_mode,
                fast_lane_max_members=settings.fast_lane_max_members,
                fast_lane_per_user_per_s=settings.fast_lane_per_user_per_s,
            ),
        )

    @property
    def window_ms(self) -> int:
        return self.projector.window_ms

    @property
    def include_muted(self) -> bool:
        return self.projector.include_muted

    @property
    def unread_precise_limit(self) -> int:
        return self.projector.unread_precise_limit


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
        store_backoff: Backoff | None = None,
    ) -> None:
        self.config = config
        # None: a failing store write raises (rebuild, replay, tests). Set (the worker): the flush
        # stays queued and is retried after the backoff (`publish`; "A failing store" below).
        self.store_backoff = store_backoff
        self.message_store = message_store
        self.projection_store = projection_store
        self.tables = tables
        self.outbox = outbox
        self.clock = clock
        self.after_store_write = after_store_write  # fault-injection hook (J-7 tests)
        # Prometheus metrics: counters are pulled from self.stats (metrics.sync); only the flush
        # latency histogram is observed here, once per flush.
        self.metrics = metrics
        self.partitions: dict[int, PartitionState] = {}
        self.stats = WorkerStats()
        # Users a flush found stored at a version older than their last flush's: the store lost
        # them (app/worker/restore.py writes them whole again). Kept only while a restorer
        # drains it (`track_store_behind`): otherwise it would only grow.
        self.store_behind: set[int] = set()
        self.track_store_behind = False
        self.mirror: MirrorPump | None = None
        self.state_writer = state_writer  # also makes the mirror (the property below)
        self._flush_lock = asyncio.Lock()
        # Persists one at a time: each stages its records and commits them before the next
        # stages (the changelog, the local store and the durable offsets move in order). The
        # commit waits for the broker WITHOUT the state lock: batches go on meanwhile.
        self._persist_lock = asyncio.Lock()
        # `background_publish` (the worker's runtime): a batch that produced flushes only wakes
        # the flush scheduler (`publish_wanted`) instead of publishing them itself, so the intake
        # reads the next window while the previous flush is written; it publishes itself only
        # past `max_queued_flushes` queued in its partition (memory and lag stay bounded).
        self.background_publish = False
        # True: a persist releases the state lock while the changelog acknowledges it (batches
        # go on meanwhile). False: it holds it, the intake waits. `PROJECTOR_WORKER_OVERLAP_FLUSHES`
        # sets both in the worker.
        self.commit_outside_state_lock = False
        # True: a flush goes to the store and the frames without waiting for a persist (visible
        # before durable; the persist follows within a window). Sound because a flush's rows and
        # badge are a function of the entries applied up to its version: after a crash the
        # re-read reproduces the same version with the same values (the store refuses it as a
        # repeat) or a newer one. False: each publish persists the partition first.
        # `PROJECTOR_WORKER_VISIBLE_BEFORE_DURABLE` sets it in the worker (docs/durability.md).
        self.visible_before_durable = False
        self.max_queued_flushes = 4
        self.publish_wanted = asyncio.Event()
        self.dead_letter_log = RateLimitedLog(log, config.dead_letter_log_per_s, "dead letters")
        # Held while a batch is applied and while a partition is persisted: a persist snapshots
        # rows, offsets and the Cassandra mirror at one point between batches.
        self._state_lock = asyncio.Lock()

    @property
    def state_writer(self) -> StateWriter | None:
        return self.mirror.writer if self.mirror is not None else None

    @state_writer.setter
    def state_writer(self, writer: StateWriter | None) -> None:
        # The Cassandra mirror runs beside the batches and off the flush path (app/worker/mirror.py).
        self.mirror = (
            MirrorPump(writer, self.stats, spacing_s=self.config.mirror_spacing_ms / 1000)
            if writer is not None
            else None
        )

    # -- partitions ---------------------------------------------------------------------------

    def partition(self, partition: int) -> PartitionState:
        """The partition's core, restored from the changelog tables on first use."""
        state = self.partitions.get(partition)
        if state is None:
            state = self.partitions[partition] = self._restore(partition)
        return state

    def _processor_options(self) -> dict[str, Any]:
        return {
            "lanes": self.config.lanes,
            "stats": self.stats,
            "mirror": self.state_writer is not None,
            "member_stats": True,
            "track_changes": True,
            "hot_rows": self.config.hot_rows,
        }

    def _restore(self, partition: int) -> PartitionState:
        """A partition's processor over its changelog tables, read lazily: the gate record (its
        next offset, the users with work no flush carried, the rows owing Cassandra writes), the
        waiting entries, and those users and rows; everything else on first touch."""
        tables = self.tables
        raw_gate = tables.gate(partition)
        gate = msgspec.msgpack.decode(raw_gate) if raw_gate else None
        extras = gate or {}
        unflushed = sorted({int(u) for u in extras.get(_UNFLUSHED_KEY, ())})
        processor = PartitionProcessor.restore_lazily(
            self.config.projector,
            self.message_store,
            TablesSource(tables, partition),
            gate,
            tables.pending(partition),
            unflushed,
            **self._processor_options(),
        )
        # Unflushed work survived in the changelog: flush it within one window from now.
        processor.open_window_at(self.clock())
        state = PartitionState(partition, processor)
        next_offset = extras.get(_NEXT_OFFSET_KEY)
        state.next_offset = state.durable_offset = next_offset if isinstance(next_offset, int) else None
        # The gate record's lists go on as they were persisted: a user stays listed until a
        # persist writes its record as flushed (a second crash before that must find it again).
        state.unflushed = unflushed
        state.persists = int(extras.get(_PERSISTS_KEY, 0))
        owing = sorted({(int(u), str(c)) for u, c in extras.get(_OWING_KEY, ())})
        state.owing_persisted = set(owing)
        mirror = self.mirror
        for key, blob in tables.get_rows(partition, owing).items():
            record = msgspec.msgpack.decode(blob)
            if _OWED_KEY in record and mirror is not None:
                state.owing.add(key)
                mirror.restage(key, record[_OWED_KEY])
        if state.owing and mirror is not None:
            mirror.kick()
        if gate is not None:
            log.info(
                "restored partition %d: %d users with unflushed work, %d waiting, hi=%d, next offset %s",
                partition,
                len(processor.users),
                processor.pending_count,
                processor.gate.hi,
                state.next_offset,
            )
        return state

    async def restore_assigned(self, partitions: Sequence[int]) -> None:
        """After a rebalance (tables recovered): bring every assigned partition back now, so work
        that was applied but never flushed is flushed even if no new record arrives."""
        async with self._persist_lock:  # a commit of its own: never one that a persist staged
            # Owned from here: each store caught up with its changelog and claimed (raises when
            # its checkpoint names another input: the worker exits).
            await self.tables.acquire(partitions)
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

    def drop(self, partitions: Sequence[int]) -> None:
        """Partitions held without being owned (never handed over): nothing of them is persisted
        or published any more, and they are forgotten."""
        for partition in partitions:
            state = self.partitions.pop(partition, None)
            if state is not None:
                state.released = True
                self.tables.hand_over(partition)

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
        """Process one fetch of one partition, if it continues the partition's state in the log
        (app/worker/offsets.py; `fetch_from`/`fetch_to`: the consumer's position before and after
        the fetch). A GAP is refused and changes nothing: the caller seeks back to
        `expected_offset(partition)`. Its effects reach the changelog tables with the partition's
        next persist (before its next flush is published, and at least once per window): until
        then its offsets are not `durable_offsets()`, so a crash re-reads it."""
        async with self._state_lock:
            now = self.clock()
            state = self.partition(partition)
            processor = state.processor
            offsets = [r.offset for r in records]
            admission = admit(state.next_offset, offsets, fetch_from, fetch_to)
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
            fresh = records[admission.start :] if admission.start else records
            expected = state.next_offset
            hole = None if expected is None else first_hole(expected, offsets[admission.start :], fetch_to)
            if expected is not None and hole is not None and state.hole_seen != (expected, hole):
                # A hole is taken only when a read from the expected offset shows it again
                # (app/worker/offsets.py): the first time, read again from there.
                state.hole_seen = (expected, hole)
                self.stats.intake_gaps_refused += 1
                log.warning(
                    "partition %d: a fetch (from %s to %s) would skip offsets from %d on: reading "
                    "again from %d to confirm",
                    partition,
                    fetch_from,
                    fetch_to,
                    hole,
                    expected,
                )
                return Admission(Verdict.GAP)
            holes = _holes(expected, fresh, fetch_to)
            if hole is not None:
                # Confirmed by a second read from `expected`: offsets with no record for us
                # (transaction markers, compaction, retention). A log written by plain
                # producers has none, so each is said (an entry skipped here is never applied).
                log.warning(
                    "partition %d: offsets from %d on hold no record (read twice from %d): "
                    "%d skipped up to %d",
                    partition,
                    hole,
                    expected,
                    holes,
                    fetch_to,
                )
            state.hole_seen = None
            self.stats.intake_records_skipped += admission.start
            self.stats.intake_hole_offsets += holes
            step = processor.on_records([r.value for r in fresh], now)
            # The gate record carries the offset: it is persisted with the state it describes.
            state.next_offset = admission.next_offset
            processor.changes.gate = True
            processor.touch((), (), now)
            if step.flushes:
                state.queue(step.flushes)
            mirror = self.mirror
            if step.mirror and mirror is not None:
                mirror.stage(step.mirror)
                if mirror.behind:
                    await mirror.drain()  # backpressure: Cassandra is behind
            if step.dead_letters or step.notices:
                await self._outbound(state, fresh, step.dead_letters, step.notices)
        if state.unpublished:
            if self.background_publish and len(state.unpublished) <= self.max_queued_flushes:
                self.publish_wanted.set()  # the flush scheduler publishes it
            else:
                await self.publish(state)
        return admission

    async def _outbound(
        self,
        state: PartitionState,
        records: Sequence[RawRecord],
        letters: Sequence[tuple[int, Any]],
        notices: Sequence[MemberNotice],
    ) -> None:
        """Send a batch's dead letters and member notices (events: nothing else carries them).
        Its state is applied already, so a send that raises (the producer gave up: broker away
        past its timeouts) must not lose them: they stay owed with the partition, and no persist
        makes its offsets durable before they are sent (`_send_owed`). Raising here instead, as
        the worker once did, left the batch applied and its letters gone: the next persist moved
        the offsets past records no dead-letter topic ever saw."""
        if letters:
            state.owed_dead_letters += self._dead_letters(records, letters)
        if notices:
            mirror = self.mirror
            # A notice says "re-read the roster", which the Cassandra mirror writes: the member
            # changes staged up to here (a join applied before the notice) are written first.
            # Notices are rare (a join or leave, once per member), so waiting costs the intake
            # little. A failed round (Cassandra failing) does not hold them back: the changes
            # stay owed and the mirror retries, and a notice is a hint to re-read, never a fact
            # (seed 004); the notices sent ahead of their roster are counted.
            if mirror is not None and not await mirror.drain():
                self.stats.notices_ahead_of_roster += len(notices)
            state.owed_notices += [(str(n.user_id).encode(), orjson.dumps(n.frame())) for n in notices]
        try:
            await self._send_owed(state)
        except Exception as exc:
            self.stats.outbound_send_failures += 1
            log.warning(
                "partition %d: sending %d dead letters and %d member notices failed (%s: %s); "
                "sent again before the partition's next persist",
                state.partition,
                len(state.owed_dead_letters),
                len(state.owed_notices),
                type(exc).__name__,
                exc,
            )

    async def _send_owed(self, state: PartitionState) -> None:
        """Send what the partition's applied batches owe the dead-letter topic and the clients;
        raises while it cannot. At least once: a send that failed part way is sent whole again
        (a client reacts to a notice once; a dead letter names its record's offset).

        Member notices go now, as their entries are applied, not with the flush: sent before any
        persist covers the batch, a crash re-reads the entries and sends them again, and a
        duplicate entry, never applied, sends nothing."""
        if state.owed_dead_letters:
            await self.outbox.dead_letters(state.owed_dead_letters)
            state.owed_dead_letters = []
        if state.owed_notices:
            await self.outbox.notices(state.owed_notices)
            self.stats.notices += len(state.owed_notices)
            state.owed_notices = []

    def _dead_letters(
        self, records: Sequence[RawRecord], letters: Sequence[tuple[int, Any]]
    ) -> list[tuple[bytes | None, bytes]]:
        kinds = self.stats.dead_letter_kinds
        out: list[tuple[bytes | None, bytes]] = []
        for index, letter in letters:
            record = records[index]
            kinds[letter.kind] = kinds.get(letter.kind, 0) + 1
            out.append((record.key, dead_letter_envelope(record, letter.reason)))
            # The kind, not the reason: a reason may quote the record's content (user data stays
            # out of the logs; the dead-letter topic has it).
            # Capped per second (a burst of bad records must not flood the logs or cost the
            # intake its time); the count above and the topic get every one.
            self.dead_letter_log.log(
                "dead letter %s[%d]@%d: %s", record.topic, record.partition, record.offset, letter.kind
            )
        return out

    def expected_offset(self, partition: int) -> int | None:
        """Where the partition's state stands in the log (None: not placed yet)."""
        return self.partition(partition).next_offset

    def start_at(self, partition: int, offset: int) -> None:
        """Place a partition that has no offset yet (a new partition, or state from before
        offsets were recorded) at `offset`: where the consumer group left it, or the log start."""
        state = self.partition(partition)
        if state.next_offset is None:
            state.next_offset = offset
            state.processor.changes.gate = True
            if offset > 0:  # begins mid-log: the lanes' counts are baselined (app/domain/arrivals.py)
                state.processor.arrivals.start_mid_stream()
            log.info("partition %d: starting at offset %d", partition, offset)

    def retention_overrun(self, partition: int, log_start: int) -> None:
        """mailbox-tail starts at `log_start`, past where the partition's state stands: the
        entries between were deleted unread. Counted and said (an alert fires on the count); the
        partition reads on from the log start, as nothing else can be read."""
        state = self.partition(partition)
        expected = state.next_offset
        if expected is None or log_start <= expected:
            return
        self.stats.retention_overruns += 1
        self.stats.retention_lost_offsets += log_start - expected
        log.error(
            "partition %d: mailbox-tail starts at offset %d, the checkpoint needs %d: %d entries "
            "were deleted unread (retention overrun); reading on from %d",
            partition,
            log_start,
            expected,
            log_start - expected,
            log_start,
        )
        state.next_offset = log_start
        state.processor.changes.gate = True
        state.processor.arrivals.start_mid_stream()

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

    # -- persisting ---------------------------------------------------------------------------

    async def persist(self, state: PartitionState, *, handing_over: bool = False) -> None:
        """Write what the partition's hot state changed to the changelog tables (once per row)
        and hand the records to the producer; its offsets become durable. `handing_over`: the
        partition goes to another worker, which takes over the Cassandra writes it still owes."""
        async with self._persist_lock:
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
            # The events of the batches this persist makes durable go out first (raises while
            # they cannot: nothing is written then, and a crash re-reads their records).
            await self._send_owed(state)
            mirror = self.mirror
            owed: dict[tuple[int, str], dict[str, Any]] = {}
            if mirror is not None:
                if handing_over:
                    # The new owner restages what is owed from the records; a round of ours
                    # landing after its newer writes would undo them (last write wins).
                    await mirror.settle()
                # Once the changelog holds these entries their re-reads are skipped, so what the
                # mirror has not written yet (staged, or in a round not acknowledged) goes into
                # the rows' records: a crash before it lands restages it (`_restore`).
                owed = mirror.owed()
            changes = state.processor.changes_since_persist()
            # What the gate record in the changelog says now: a persist that fails leaves it so.
            durable = (state.unflushed, state.owing_persisted, state.persists)
            try:
                offset = state.next_offset
                self._owe(state, changes, owed)
                self._write_tables(state, changes, owed)
                if handing_over and state.owing and mirror is not None:
                    mirror.drop(state.owing)
                covered = state.queued_flushes
                # Created here, under the lock; it takes what was staged when it starts (at once,
                # below: no other persist stages in between, they hold `_persist_lock`).
                commit = self.tables.commit()
                if not self.commit_outside_state_lock:
                    await commit
            except BaseException:
                self._not_persisted(state, changes, durable)
                raise
        # The broker's acknowledgement is awaited without the state lock: batches are applied
        # meanwhile (their changes go to the next persist); only the offsets and the flushes this
        # snapshot covers become durable / publishable once it is in.
        if self.commit_outside_state_lock:
            try:
                await commit
            except BaseException:
                self._not_persisted(state, changes, durable)
                raise
        async with self._state_lock:
            if offset is not None:
                state.durable_offset = offset
            state.durable_flushes = max(state.durable_flushes, covered)
            # Clean rows beyond the hot set's bound may leave memory now (the tables have them;
            # rows changed since the snapshot are pinned by the processor's own change set).
            pinned = {batch.user_id for batches in state.unpublished for batch in batches}
            state.processor.evict(pinned)

    @staticmethod
    def _not_persisted(
        state: PartitionState, changes: Changes, durable: tuple[list[int], set[tuple[int, str]], int]
    ) -> None:
        """A persist raised (the broker refused its records past the producer's timeouts, a
        write failed): any part of it may be in the changelog, none is known to be. Its changes go
        to the next persist with what changed since, and the gate's lists are what the changelog's
        gate says. Dropping them, as the worker once did, let the next persists move the gate past
        entries whose rows were never written: the flush scheduler "retried" only what changed
        after, and a restart restored those rows older than their entries."""
        state.unflushed, state.owing_persisted, state.persists = durable
        state.processor.persist_failed(changes)

    def _owe(
        self, state: PartitionState, changes: Changes, owed: dict[tuple[int, str], dict[str, Any]]
    ) -> None:
        """Which rows' records carry owed writes from this persist on. A row owes only what was
        staged when it changed, so a newly owing row is written by this persist anyway, and an
        untouched row that still owes keeps its record."""
        if not owed and not state.owing:
            return
        # The writer serves every partition: this one's owing rows are those it changed since
        # the last persist (a row is staged when a batch applies to it) or already owed. A
        # resident-rows test would miss a row evicted while it still owed.
        owing = {key for key in owed if key in changes.rows or key in state.owing}
        # Rows no longer owing keep their record as it is: the gate's list, not the record, says
        # what a restore restages (a stale `mirror_owed` is never read), so no extra write.
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
                record[_OWED_KEY] = owed[(user_id, conversation_id)]
            tables.put_row(partition, user_id, conversation_id, msgspec.msgpack.encode(record))
        # A flush produced but not published yet must not look flushed in the changelog: should
        # the worker die before the store write, the restored user would not be flushed again and
        # the store would keep the older rows. Its record says the version before that flush.
        unpublished: dict[int, int] = {}
        for batches in state.unpublished:
            for batch in batches:
                unpublished.setdefault(batch.user_id, batch.prev_projection_mailbox_seq)
        written = changes.users | unpublished.keys()
        unflushed = set(state.unflushed) - written
        for user_id in written:
            record = processor.user_record(user_id)
            if user_id in unpublished:
                record[_FLUSHED_KEY] = min(record[_FLUSHED_KEY], unpublished[user_id])
            if record["projection_mailbox_seq"] > record[_FLUSHED_KEY]:
                unflushed.add(user_id)
            tables.put_user(partition, user_id, msgspec.msgpack.encode(record))
        if changes.gate or changes.users or unpublished or owing != state.owing_persisted:
            listed = sorted(unflushed)
            gate = processor.gate_record()
            if state.next_offset is not None:
                gate[_NEXT_OFFSET_KEY] = state.next_offset
            state.persists += 1
            gate[_PERSISTS_KEY] = state.persists
            gate[_UNFLUSHED_KEY] = state.unflushed = listed
            gate[_OWING_KEY] = sorted(owing)
            state.owing_persisted = set(owing)
            tables.put_gate(partition, msgspec.msgpack.encode(gate), state.next_offset)

    # -- flushing -----------------------------------------------------------------------------

    @property
    def flush_lock(self) -> asyncio.Lock:
        """Held by every publication of flushes. The unread audit holds it to read, compare and
        correct a user's stored projection while no flush writes it."""
        return self._flush_lock

    def next_deadline(self) -> int | None:
        """The earliest time a partition's open window ends (the driver's flush timer)."""
        deadlines = [d for s in self.partitions.values() if (d := s.processor.next_deadline()) is not None]
        return min(deadlines) if deadlines else None

    async def flush_due(self, now: int) -> int:
        """Flush every partition whose window elapsed (or that holds too many dirty rows); persist
        the hot state of the others at least once per window (pending entries, gate marks,
        duplicates: changes that flush nothing still move the durable offset)."""
        self.dead_letter_log.tick()
        flushed = 0
        for state in list(self.partitions.values()):
            if state.released:
                continue
            async with self._state_lock:
                batches = state.processor.on_deadline(now)
                if batches:
                    state.queue([batches])
            if state.unpublished:
                flushed += await self.publish(state)
                if self.visible_before_durable and not state.released and self._persist_due(state, now):
                    # Publishing no longer persists: the window's persist still comes, however
                    # busy the fast lane keeps the publisher.
                    await self.persist(state)
            elif self._persist_due(state, now):
                await self.persist(state)
            elif state.owing and self.mirror is not None and self.mirror.caught_up:
                # Its records still say "owed" and the mirror has written it all since: without
                # a change to persist (the stream ended) they, and the owed-rows gauge, kept
                # saying so, and a restart restaged writes already made.
                await self.persist(state)
        return flushed

    def _persist_due(self, state: PartitionState, now: int) -> bool:
        """Changes older than a window are not persisted yet."""
        since = state.unpersisted_since
        return since is not None and now - since >= self.config.window_ms

    async def flush_all(self) -> int:
        """Everything flushes now (a clean stop); the mirror writes what it owes first, so the
        persist records nothing owed when Cassandra answers."""
        if self.mirror is not None:
            await self.mirror.drain()
        flushed = 0
        for state in list(self.partitions.values()):
            async with self._state_lock:
                batches = state.processor.on_end()
                if batches:
                    state.queue([batches])
            flushed += await self.publish(state, now=True)
        return flushed

    async def flush_partition(self, state: PartitionState) -> int:
        """One flush of everything the partition holds (tests, the audit's repair path)."""
        async with self._state_lock:
            batches = state.processor.on_end()
            if batches:
                state.queue([batches])
        return await self.publish(state, now=True)

    async def publish(self, state: PartitionState, *, now: bool = False) -> int:
        """Publish the partition's queued flushes in order: its hot state persisted first
        (durable before visible), then per flush the atomic per-user writes to the projection
        store and the frames. Returns how many user batches went out. With a store backoff, a
        write that raises leaves its flush (and the later ones) queued, and none is tried before
        the backoff allows (`now`: try once anyway, a clean stop's last chance)."""
        async with self._flush_lock:  # one publisher at a time keeps each user's versions in order
            if state.released:
                return 0
            if not now and not state.unpublished:
                # What the caller saw queued was published by the publisher it waited for (a
                # batch applied while the flush scheduler wrote the window's flush): nothing is
                # left to make durable before a store write. Persisting anyway cost a changelog
                # round trip per such batch (~40% of the persists at a 100 ms window, holding the
                # intake in serial mode); its offsets go durable with the next persist instead.
                return 0
            if not now and self._held(state):
                await self._persist_held(state)
                return 0
            failing = self.store_backoff is not None and self.store_backoff.failing
            uncovered = state.durable_flushes < state.queued_flushes
            visible_first = self.visible_before_durable
            if not visible_first and not (failing and state.unpersisted_since is None and not uncovered):
                # Persisted even with nothing queued: the caller asked for a flush, and a persist
                # is what makes the offsets durable. (A retry after a failed write, with nothing
                # changed since, has nothing to make durable: its flushes were persisted.)
                await self.persist(state)
            published = 0
            while self._publishable(state):
                count, batches = self._next_write(state)
                try:
                    published += await self._write(batches, flushes=count)
                except Exception as exc:
                    if not self._store_failed(exc, state):
                        raise
                    break  # queued, and recorded unflushed by every persist until written
                self._store_succeeded()
                del state.unpublished[:count]
                state.published_flushes += count
                # Their records now say these versions are flushed (with the next persist).
                state.processor.touch((), [batch.user_id for batch in batches], self.clock())
            if visible_first and now:
                # A clean stop's or a test's flush: what it wrote is made durable at once (its
                # records then say flushed, and the offsets can be committed).
                await self.persist(state)
            return published

    def _publishable(self, state: PartitionState) -> bool:
        """The oldest queued flush may be written now: any queued one when flushes are visible
        before durable, else one a completed persist covers."""
        if self.visible_before_durable:
            return not state.released and bool(state.unpublished)
        return state.publishable

    def _next_write(self, state: PartitionState) -> tuple[int, list[UserFlush]]:
        """The oldest queued flushes that go to the store in one write: the oldest, and after it
        every next durable one while no user repeats. The fast lane queues one flush per user
        (docs/contract.md §10), a store round trip each when written one by one; written together
        each user's batch is still atomic, and a user's versions still reach the store and the
        frames in order (a user appears once per write; a flush naming a user already in it
        starts the next write)."""
        queued = state.unpublished
        batches = list(queued[0])
        if self.visible_before_durable:
            writable = len(queued)
        else:
            writable = min(len(queued), state.durable_flushes - state.published_flushes)
        users = {batch.user_id for batch in batches}
        count = 1
        while count < writable:
            following = queued[count]
            if any(batch.user_id in users for batch in following):
                break
            users.update(batch.user_id for batch in following)
            batches += following
            count += 1
        return count, batches

    async def _write(self, batches: list[UserFlush], flushes: int = 1) -> int:
        """One store write of `batches` (the users of `flushes` queued flushes), then their frames."""
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
            if self.track_store_behind and stored_before < batch.prev_projection_mailbox_seq:
                self.store_behind.add(batch.user_id)  # it held more than this: its data went
            self.stats.projection_writes += len(batch.rows)
            # prev = what the store held, i.e. the last version any client can have seen.
            version = batch.projection_mailbox_seq
            key = str(batch.user_id).encode()
            delta = session_delta_frame(
                batch.user_id,
                batch.rows,
                version=version,
                prev_version=stored_before,
                driving_event_id=batch.driving_event_id,
                driving_mailbox_seq=batch.driving_mailbox_seq,
            )
            deltas.append((key, orjson.dumps(delta)))
            badge = badge_update_frame(
                batch.user_id, batch.badge, version=version, prev_version=stored_before
            )
            badges.append((key, orjson.dumps(badge)))
        if deltas:
            await self.outbox.frames(deltas, badges)
        self.stats.flushes += flushes
        self.stats.frames += len(deltas) + len(badges)
        elapsed = time.perf_counter() - started
        self.stats.last_flush_ms = elapsed * 1000
        if self.metrics is not None:
            self.metrics.observe_flush(elapsed)
        log.debug("flush: %d users in %.1f ms", len(batches), self.stats.last_flush_ms)
        return len(batches)

    # -- a failing store (the worker's `store_backoff`) ----------------------------------------

    @property
    def store_failing(self) -> bool:
        """Flushes are held: a write failed and none has succeeded since. (A streak whose held
        flushes all went to another worker with their partitions holds nothing: not failing,
        and the intake fetches again; the next flush tries the store after the backoff.)"""
        return self.store_backoff is not None and self.store_backoff.failing and self.held_flushes() > 0

    def held_flushes(self) -> int:
        """User batches produced and not yet published, all partitions."""
        return sum(len(batches) for s in self.partitions.values() for batches in s.unpublished)

    def held_rows(self) -> int:
        """Rows in those batches (what holding them costs in memory)."""
        return sum(
            len(b.rows) for s in self.partitions.values() for batches in s.unpublished for b in batches
        )

    def _held(self, state: PartitionState) -> bool:
        backoff = self.store_backoff
        return backoff is not None and bool(state.unpublished) and not backoff.ready(self.clock())

    async def _persist_held(self, state: PartitionState) -> None:
        """While flushes are held: persist at most once per window, like a partition that flushes
        nothing (every persist writes the held users' records again, saying "not flushed")."""
        since = state.unpersisted_since
        if since is not None and self.clock() - since >= self.config.window_ms:
            await self.persist(state)

    def _store_failed(self, exc: Exception, state: PartitionState) -> bool:
        """A flush's write raised: with a backoff, count it and log the streak's first failure
        (True: the caller keeps the flush queued); without one, False (the caller raises)."""
        backoff = self.store_backoff
        if backoff is None:
            return False
        self.stats.store_write_failures += 1
        reason = f"{type(exc).__name__}: {exc}"
        if backoff.failed(self.clock(), reason):
            log.error(
                "writing a flush failed (%s); %d flushes held, retried with backoff "
                "(up to %.0f s apart): nothing is lost, the changelog keeps them unflushed",
                reason,
                self.held_flushes(),
                backoff.max_delay_ms / 1000,
            )
        else:
            log.debug("writing a flush failed again (partition %d): %s", state.partition, reason)
        return True

    def _store_succeeded(self) -> None:
        streak = self.store_backoff.succeeded(self.clock()) if self.store_backoff is not None else None
        if streak is not None:
            log.warning(
                "flushes are written again after %d failed attempts in %.1f s; publishing %d held flushes",
                streak.failures,
                streak.duration_ms / 1000,
                self.held_flushes(),
            )

    # -- the unread audit's access (app/worker/audit.py) ----------------------------------------

    def holder(self, user_id: int) -> PartitionState | None:
        """The owned partition holding this user's state, if any."""
        for state in self.partitions.values():
            if user_id in state.processor.users:
                return state
        return None


def _holes(expected: int | None, records: Sequence[RawRecord], fetch_to: int) -> int:
    """Offsets in [expected, fetch_to) that held no record (the broker moved past them)."""
    if expected is None:
        return 0
    return max(0, fetch_to - expected - len(records))


def dead_letter_envelope(record: RawRecord, reason: str) -> bytes:
    """What goes to the dead-letter topic: why, and exactly where the record came from. A value
    over MAX_RECORD_BYTES is cut (the envelope must fit the topic whatever the input topic
    allowed; topic, partition and offset find the whole record)."""
    raw = record.value or b""
    cut = len(raw) > MAX_RECORD_BYTES
    if cut:
        raw = raw[:MAX_RECORD_BYTES]
    try:
        value: str = raw.decode("utf-8")
        encoding = "utf-8"
    except UnicodeDecodeError:
        value = base64.b64encode(raw).decode("ascii")
        encoding = "base64"
    envelope: dict[str, object] = {
        "reason": reason,
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "key": record.key[:1024].decode("utf-8", "replace") if record.key is not None else None,
        "value": value,
        "value_encoding": encoding,
    }
    if cut:
        envelope["value_truncated"] = True
        envelope["value_bytes"] = len(record.value)
    return orjson.dumps(envelope)
