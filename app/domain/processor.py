"""One partition's processing, the one loop every driver runs: decode → gate → apply → flush.

A `PartitionProcessor` is a stateful-logic object with the clock injected (bytewax's
`StatefulLogic` shape): drivers hand it raw records with the time they stand at, ask it when it
next has to flush, and take what it produced. It does no I/O: the MessageStore port is the only
thing it reads (bounded recomputes), and what must be written (flushes, changelog records,
Cassandra mirror changes, dead letters) comes back to the driver.

Three drivers run it:

* `projector replay` (app/replay): event time — each entry's `ts` is the clock; the MessageStore
  is in memory and learns the messages and recalls the processor applies.
* the worker (app/worker): processing time — the wall clock at each batch and at each deadline;
  the driver persists `changes_since_persist()` to the changelog tables, writes the flushes to the
  projection store and the frames to Kafka, and the mirror changes to Cassandra.
* a rebuild by replay (app/rebuild): the worker's driver over a plain consumer.

Flush decisions (docs/contract.md §3.9) live here and nowhere else: a window closes BEFORE the
first entry applied past it (so a row is written at most once per window), the memory bound
(`max_dirty_rows`) flushes right after the entry that crossed it, and `next_deadline()` tells a
processing-time driver when the open window ends.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice
from operator import lt
from typing import Any, Protocol

import msgspec

from app.domain.arrivals import ArrivalLedger
from app.domain.conversation import ConversationState
from app.domain.decoding import decode_chunk
from app.domain.entries import (
    BadgePreferencesEntry,
    DeadLetter,
    DeleteMessageEntry,
    Entry,
    JoinEntry,
    LeaveEntry,
    MarkUnreadEntry,
    MessageEntry,
    ReadEntry,
    RecallEntry,
    WatermarkMarker,
    decode_record,
)
from app.domain.fast_lane import FastLaneLimiter
from app.domain.flush import UserFlush
from app.domain.member_stats import MemberStats
from app.domain.notices import MemberNotice, notice_of
from app.domain.ports import MessageStore
from app.domain.projector import Applied, Projector, ProjectorConfig, UserState
from app.domain.residency import MEMBER_STATS_KEY, ROW_STATE_KEY, Residency, StateSource
from app.domain.stats import ProcessingStats as ProcessingStats  # re-exported (its home before)
from app.domain.watermark import Offer, WatermarkGate

# Fields of a row that UserConversationState keeps (what a rebuild from state needs).
STATE_FIELDS = (
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
# Key of the arrival counts inside a partition's gate record (WatermarkGate.load ignores it).
ARRIVALS_KEY = "arrivals"
# Entries that can move a member's statistics (the rest never touch them).
_STATS_ENTRIES = frozenset({MessageEntry, RecallEntry, DeleteMessageEntry})


class LearningMessageStore(MessageStore, Protocol):
    """A MessageStore that learns what is applied (replay's in-memory store, docs/contract.md §7)."""

    def record_message(
        self,
        conversation_id: str,
        conversation_seq: int,
        *,
        message_id: str,
        activity_id: str,
        sender_id: int,
        counts_unread: bool,
        mentioned_user: int | None,
    ) -> None: ...

    def record_recall(self, conversation_id: str, conversation_seq: int) -> None: ...


# -- what a step produces -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StateChange:
    """A UserConversationState row to mirror (Cassandra): the row's state fields after `entry`."""

    user_id: int
    conversation_id: str
    fields: dict[str, object]
    mailbox_seq: int
    ts: int
    new_row: bool


@dataclass(frozen=True, slots=True)
class MemberChange:
    """A group_members row to mirror: the member's role and membership after a join/leave."""

    conversation_id: str
    user_id: int
    role: str | None
    membership: str
    joined_at: int | None
    left_at: int | None


@dataclass(frozen=True, slots=True)
class MemberStatsChange:
    conversation_id: str
    user_id: int
    record_count: int
    mention_count: int
    mailbox_seq: int


MirrorChange = StateChange | MemberChange | MemberStatsChange


@dataclass(slots=True)
class Step:
    """What one call produced: flushes (in order; each a list of user batches, never empty),
    dead letters (index in the batch, reason), the Cassandra mirror's changes (when the
    processor mirrors), and the member notices of the entries applied (in the order applied:
    app/domain/notices.py; a duplicate makes none). Drivers without a live stream (replay, a
    rebuild) drop the notices."""

    flushes: list[list[UserFlush]] = field(default_factory=list)
    dead_letters: list[tuple[int, DeadLetter]] = field(default_factory=list)
    mirror: list[MirrorChange] = field(default_factory=list)
    notices: list[MemberNotice] = field(default_factory=list)


@dataclass(slots=True)
class Changes:
    """What changed since the last persist: written to the changelog tables once per row, however
    many batches touched it."""

    rows: set[tuple[int, str]] = field(default_factory=set)
    users: set[int] = field(default_factory=set)
    gate: bool = False
    # Entries that started waiting and still wait: (user, seq) -> raw record. An entry that waits
    # and is released between two persists never reaches the tables (lanes write their marker
    # after their entries, so that is the common case; writing then deleting it would cost two
    # changelog records per entry).
    pending_added: dict[tuple[int, int], bytes] = field(default_factory=dict)
    # Entries released that an earlier persist stored.
    pending_released: list[tuple[int, int]] = field(default_factory=list)
    since: int | None = None  # the clock of the first change

    def __bool__(self) -> bool:
        return bool(self.rows or self.users or self.gate or self.pending_added or self.pending_released)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A partition's whole state as the changelog tables hold it (decoded records): rows as
    (user_id, conversation_id, record)."""

    rows: list[tuple[int, str, dict[str, Any]]]
    users: list[dict[str, Any]]
    gate: dict[str, Any] | None
    pending: list[bytes]


class PartitionProcessor:
    """The rules for one partition (the whole input, in replay). Options:

    * `learn_messages`: the MessageStore learns every applied message and recall (replay);
    * `mirror`: applied entries yield the Cassandra mirror's changes (the worker);
    * `member_stats`: keep the member directory's per-(user, conversation) statistics (the
      worker; persisted inside the rows' changelog records);
    * `track_changes`: keep what changed since the last persist (the worker's changelog);
    * `source`: persisted state behind the processor: memory holds a hot set of at most
      `hot_rows` rows and, when `hot_bytes` is set, about that many bytes of them
      (app/domain/residency.py)."""

    def __init__(
        self,
        config: ProjectorConfig,
        store: MessageStore,
        *,
        lanes: int = 1,
        stats: ProcessingStats | None = None,
        learn_messages: bool = False,
        mirror: bool = False,
        member_stats: bool = False,
        track_changes: bool = False,
        source: StateSource | None = None,
        hot_rows: int = 0,
        hot_bytes: int | None = None,
    ) -> None:
        self.config = config
        self.lanes = lanes
        self.projector = Projector(config, store)
        self.gate = WatermarkGate(lanes)
        # What each lane's markers say was sent here vs what arrived (app/domain/arrivals.py).
        self.arrivals = ArrivalLedger(lanes)
        self.stats = stats if stats is not None else ProcessingStats()
        self.learning: LearningMessageStore | None = store if learn_messages else None  # type: ignore[assignment]
        # The last message the learning store recorded (conversation, seq): its fan-out to the
        # other members needs no second record.
        self._recorded_conversation = ""
        self._recorded_seq = 0
        self.mirror = mirror
        self.keeps_member_stats = member_stats
        self.track_changes = track_changes
        # Per (user, conversation): the seq bitmaps behind the member directory's statistics.
        self.member_stats: dict[tuple[int, str], MemberStats] = {}
        # Highest mailbox_seq of any entry read: minus gate.hi, the watermark lag (metrics).
        self.max_seen_seq = 0
        self.changes = Changes()
        # The fast lane (docs/contract.md §10, app/domain/fast_lane.py): None when it is off.
        self.fast_lane = (
            FastLaneLimiter(config.fast_lane_per_user_per_s) if config.fast_lane_per_user_per_s > 0 else None
        )
        # With persisted state behind it, memory holds a bounded hot set (app/domain/residency.py).
        self.residency = (
            Residency(self.projector, source, self.member_stats, hot_rows, hot_bytes)
            if source is not None
            else None
        )

    # -- input ----------------------------------------------------------------------------------

    def on_records(self, records: Sequence[bytes], now: int | None) -> Step:
        """Decode, gate and apply a batch of raw records, in order. `now`: the processing time
        of the batch; None = event time (each entry's `ts` is the clock). Every record counts (an
        empty one is a dead letter); a driver reading a file drops its blank lines first."""
        step = Step()
        stats = self.stats
        gate = self.gate
        apply_all = self._apply_all
        changes = self.changes if self.track_changes else None
        arrivals = self.arrivals
        decoded, stops = decode_chunk(records, self.lanes)
        if self.residency is not None:
            # One multi-get for the users and rows this batch touches (entries released from the
            # pending buffer by its markers are read as they meet a miss).
            self.residency.prefetch(
                (record.user_id, record.conversation_id)
                for record in decoded
                if not isinstance(record, WatermarkMarker | DeadLetter)
            )
        markers = dead_letters = duplicates = 0
        # The entries between two markers (or dead letters) are offered as one slice: between
        # markers a lane's entries usually all go to the end of the gate's run.
        start = 0  # index of the first record after the last marker or dead letter
        marker_kind = WatermarkMarker  # read once (in the compiled build a global is a dict lookup)
        for index in stops:
            if index > start:
                run: list[Entry] = decoded[start:index]  # type: ignore[assignment]  # entries only
                duplicates += self._offer(run, start, records, now, step)
            record = decoded[index]
            start = index + 1
            if type(record) is marker_kind:
                markers += 1
                marker: WatermarkMarker = record  # narrowed above
                released = gate.mark(marker)
                arrivals.marked(marker.lane, marker.watermark, marker.sent)
                if changes is not None:
                    changes.gate = True
                    for waited in released:
                        key = (waited.user_id, waited.mailbox_seq)
                        if changes.pending_added.pop(key, None) is None:
                            changes.pending_released.append(key)
                if released:
                    apply_all(released, now, step)
            else:
                dead_letters += 1
                step.dead_letters.append((index, record))  # type: ignore[arg-type]
        if start < len(decoded):
            rest: list[Entry] = decoded[start:]  # type: ignore[assignment]  # entries only
            duplicates += self._offer(rest, start, records, now, step)
        # Counted once per batch (a marker is a record, not an entry; a dead letter is both).
        stats.records += len(records)
        stats.markers += markers
        stats.entries += len(records) - markers
        stats.dead_letters += dead_letters
        stats.duplicates += duplicates
        if changes is not None and changes and changes.since is None and now is not None:
            changes.since = now
        return step

    def _offer(
        self, entries: list[Entry], start: int, records: Sequence[bytes], now: int | None, step: Step
    ) -> int:
        """Offer consecutive entries (records[start:start + len(entries)]) to the gate, in order:
        those at or below the watermark are applied, the others wait. Returns the duplicates."""
        gate = self.gate
        arrivals = self.arrivals
        changes = self.changes if self.track_changes else None
        seqs = [entry.mailbox_seq for entry in entries]
        first = seqs[0]
        last = seqs[-1]
        increasing = len(seqs) == 1 or all(map(lt, seqs, islice(seqs, 1, None)))
        if increasing and gate.offer_run(entries, first, last):
            # All of them wait at the end of the gate's run (the common case: see offer_run).
            if last > self.max_seen_seq:
                self.max_seen_seq = last
            arrivals.received_all(entries)
            if changes is not None:
                pending_added = changes.pending_added
                for offset, entry in enumerate(entries):
                    pending_added[(entry.user_id, entry.mailbox_seq)] = records[start + offset]
            return 0
        duplicates = 0
        max_seen = self.max_seen_seq
        arrived = arrivals.counted  # READY entries are at or below every lane's marker
        apply_all = self._apply_all
        ready, pending = Offer.READY, Offer.PENDING
        for offset, entry in enumerate(entries):
            if entry.mailbox_seq > max_seen:
                max_seen = entry.mailbox_seq
            offer = gate.offer(entry)
            if offer is ready:
                if apply_all((entry,), now, step):
                    arrived[entry.lane] += 1
            elif offer is pending:
                arrivals.received(entry.lane, entry.mailbox_seq)
                if changes is not None:
                    changes.pending_added[(entry.user_id, entry.mailbox_seq)] = records[start + offset]
            else:
                duplicates += 1
        self.max_seen_seq = max_seen
        return duplicates

    def _apply(self, entry: Entry, now: int | None, step: Step) -> bool:
        """Apply one entry; False when it was a duplicate (nothing changed)."""
        return self._apply_all((entry,), now, step) > 0

    def _apply_all(self, entries: Iterable[Entry], now: int | None, step: Step) -> int:
        """Apply entries in order (a marker releases them by the thousand: what does not change
        from one to the next is read once); returns how many were applied (not duplicates)."""
        projector = self.projector
        policy = projector.policy
        window_ms = policy.window_ms
        max_dirty_rows = policy.max_dirty_rows
        stats = self.stats
        learning = self.learning
        mirror = self.mirror
        track_changes = self.track_changes
        keeps_member_stats = self.keeps_member_stats
        fast_lane = self.fast_lane
        fast_max_members = self.config.fast_lane_max_members
        apply = projector.apply
        apply_message = projector.apply_message
        duplicate = Applied.DUPLICATE
        unset = msgspec.UNSET
        # Classes read once (in the compiled build a module global is a dict lookup).
        message_kind = MessageEntry
        recorded_seq = self._recorded_seq
        recorded_conversation = self._recorded_conversation
        applied = applied_messages = 0  # added to the stats after the loop
        for entry in entries:
            at = entry.ts if now is None else now
            start = policy.window_start  # policy.window_elapsed(at), inline
            if start is not None and at - start >= window_ms and not projector.is_duplicate(entry):
                # The window is over: it closes before this entry opens the next one.
                self._flush_into(step)
            if mirror:
                # Read through: with state on disk, a row not in memory is not a new row.
                user = projector.user(entry.user_id)
                new_row = user is None or projector.row(user, entry.conversation_id) is None
            kind = type(entry)
            if kind is message_kind:  # the hot path: most entries are messages
                message: MessageEntry = entry  # type: ignore[assignment]  # narrowed by `kind`
                if not apply_message(message, at):
                    stats.duplicates += 1
                    continue
                applied += 1
                applied_messages += 1
                if message.notification is not unset:  # rare: look closer
                    notice = notice_of(message)
                    if notice is not None:
                        step.notices.append(notice)
                if learning is not None:
                    # A message fans out to every member one after the other: the store has it
                    # already when the last one recorded was the same (only a mention adds to it).
                    conversation_seq = message.conversation_seq
                    conversation_id = message.conversation_id
                    if (
                        message.mention
                        or conversation_seq != recorded_seq
                        or conversation_id != recorded_conversation
                    ):
                        learning.record_message(
                            conversation_id,
                            conversation_seq,
                            message_id=message.message_id,
                            activity_id=message.activity_id,
                            sender_id=message.sender_id,
                            counts_unread=message.counts_unread,
                            mentioned_user=message.user_id if message.mention else None,
                        )
                        recorded_conversation = conversation_id
                        recorded_seq = conversation_seq
                if track_changes:
                    changes = self.changes
                    changes.rows.add((message.user_id, message.conversation_id))
                    changes.users.add(message.user_id)
                if mirror and new_row:
                    self._mirror_state(message, new_row, step)
                if keeps_member_stats and MemberStats.concerns(message.user_id, message):
                    self._member_stats(message, step)
                if fast_lane is not None:
                    members = message.member_count  # matters now? (app/domain/fast_lane.py)
                    if (
                        message.mention
                        or message.urgent is True
                        or (isinstance(members, int) and members <= fast_max_members)
                    ):
                        self._fast_flush(fast_lane, message.user_id, at, step)
            else:
                if apply(entry, at) is duplicate:
                    stats.duplicates += 1
                    continue
                applied += 1
                if kind is BadgePreferencesEntry:
                    # User-level (docs/contract.md §10): the user's record changed, no row did.
                    if track_changes:
                        self.changes.users.add(entry.user_id)
                    continue
                if learning is not None and (kind is RecallEntry or kind is DeleteMessageEntry):
                    target: RecallEntry = entry  # type: ignore[assignment]
                    learning.record_recall(target.conversation_id, target.target_conversation_seq)
                if track_changes:
                    changes = self.changes
                    changes.rows.add((entry.user_id, entry.conversation_id))
                    changes.users.add(entry.user_id)
                if mirror:
                    self._mirror_state(entry, new_row, step)
                if kind is JoinEntry or kind is LeaveEntry:
                    if mirror:
                        row = projector.users[entry.user_id].rows[entry.conversation_id]
                        step.mirror.append(
                            MemberChange(
                                entry.conversation_id,
                                entry.user_id,
                                row.role,
                                row.membership,
                                row.joined_at,
                                row.left_at,
                            )
                        )
                elif (
                    keeps_member_stats
                    and kind in _STATS_ENTRIES
                    and MemberStats.concerns(entry.user_id, entry)
                ):
                    self._member_stats(entry, step)
                if fast_lane is not None and (kind is ReadEntry or kind is MarkUnreadEntry):
                    self._fast_flush(fast_lane, entry.user_id, at, step)
            if projector.dirty.row_count > max_dirty_rows:  # policy.over_memory_bound, inline
                self._flush_into(step)
        self._recorded_seq = recorded_seq
        self._recorded_conversation = recorded_conversation
        stats.applied += applied
        stats.applied_messages += applied_messages
        return applied

    def _mirror_state(self, entry: Entry, new_row: bool, step: Step) -> None:
        """The Cassandra mirror's change for the entry's row (after the entry)."""
        row = self.projector.users[entry.user_id].rows[entry.conversation_id]
        step.mirror.append(
            StateChange(
                entry.user_id,
                entry.conversation_id,
                {name: getattr(row, name) for name in STATE_FIELDS},
                entry.mailbox_seq,
                entry.ts,
                new_row,
            )
        )

    def _fast_flush(self, fast_lane: FastLaneLimiter, user_id: int, now: int, step: Step) -> None:
        """An applied entry that matters to its user now (docs/contract.md §10): the user's dirty
        rows flush at once, within the per-user rate; beyond it they wait for the window."""
        projector = self.projector
        if user_id not in projector.dirty.rows or not fast_lane.admit(user_id, now):
            return
        batch = projector.flush_user(user_id)
        if batch is not None:
            step.flushes.append([batch])
            self.stats.fast_flushes += 1

    def _flush_into(self, step: Step) -> None:
        batches = self.projector.flush()
        if batches:
            step.flushes.append(batches)

    def _member_stats(self, entry: Entry, step: Step) -> None:
        """A message, recall or delete may move the member's statistics (bitmaps: a duplicate
        changes nothing)."""
        key = (entry.user_id, entry.conversation_id)
        stats = self.member_stats.get(key) or MemberStats()
        changed = stats.apply(entry.user_id, entry)
        if not stats.empty:
            # Kept even when no count moved: a recall may arrive before its message.
            self.member_stats[key] = stats
        if changed and self.mirror:
            record_count, mention_count = stats.counts()
            step.mirror.append(
                MemberStatsChange(
                    entry.conversation_id, entry.user_id, record_count, mention_count, entry.mailbox_seq
                )
            )

    # -- time -----------------------------------------------------------------------------------

    def next_deadline(self) -> int | None:
        """When the open window ends (the processing-time driver flushes then); None when
        nothing waits for a flush."""
        projector = self.projector
        start = projector.policy.window_start
        if start is None or not projector.dirty.rows:  # rows: users with or without dirty rows
            return None
        return start + projector.policy.window_ms

    def on_deadline(self, now: int) -> list[UserFlush]:
        """The flushes due at `now`: the window elapsed, or more than `max_dirty_rows` held."""
        projector = self.projector
        return projector.flush() if projector.flush_due(now) else []

    def on_end(self) -> list[UserFlush]:
        """End of the input (replay) or of the partition here (a clean stop, a hand-over):
        everything flushes."""
        return self.projector.flush()

    def open_window_at(self, now: int) -> None:
        """Work that survived a crash must flush within one window: open it now if it is not."""
        if self.projector.dirty.rows and self.projector.policy.window_start is None:
            self.projector.policy.window_start = now

    # -- persistence ----------------------------------------------------------------------------

    def changes_since_persist(self) -> Changes:
        """What changed since the last call (and reset): the rows, users, gate and pending
        entries the changelog tables must be written with."""
        changes, self.changes = self.changes, Changes()
        if self.residency is not None:
            # The rows a change can have grown: the hot set's byte count follows them.
            self.residency.recount(changes.rows)
        return changes

    def persist_failed(self, changes: Changes) -> None:
        """`changes` (taken by `changes_since_persist`) did not reach the tables: they go to the
        next persist with what changed since. An entry that waited then and was released since
        stays released (its record may be in the table: the delete is kept, never the put)."""
        now = self.changes
        now.rows |= changes.rows
        now.users |= changes.users
        now.gate = now.gate or changes.gate
        released = set(now.pending_released)
        waiting = {key: raw for key, raw in changes.pending_added.items() if key not in released}
        waiting.update(now.pending_added)
        now.pending_added = waiting
        now.pending_released = [*changes.pending_released, *now.pending_released]
        if changes.since is not None and (now.since is None or changes.since < now.since):
            now.since = changes.since

    def touch(self, rows: Iterable[tuple[int, str]], users: Iterable[int], now: int) -> None:
        """Rows and users changed outside a batch (the unread audit correcting the state): they
        go to the changelog with the next persist."""
        changes = self.changes
        for user_id, conversation_id in rows:
            changes.rows.add((user_id, conversation_id))
            changes.users.add(user_id)
        changes.users.update(users)
        if changes and changes.since is None:
            changes.since = now

    def row_record(self, user_id: int, conversation_id: str) -> dict[str, Any]:
        """A row's changelog record: the row's state, with the member statistics kept beside it
        (read from the persisted state first if the row is not in memory)."""
        projector = self.projector
        user = projector.user(user_id)
        row = projector.row(user, conversation_id) if user is not None else None
        if row is None:
            raise KeyError(f"no row for user {user_id} in conversation {conversation_id}")
        record: dict[str, Any] = {ROW_STATE_KEY: row.dump()}
        stats = self.member_stats.get((user_id, conversation_id))
        if stats is not None:
            record[MEMBER_STATS_KEY] = stats.dump()
        return record

    def user_record(self, user_id: int) -> dict[str, Any]:
        user = self.projector.user(user_id)
        if user is None:
            raise KeyError(f"no user {user_id}")
        return user.dump()

    def gate_record(self) -> dict[str, Any]:
        """The gate and the arrival counts: one record, so both are restored as of one persist
        (with the partition's offset, which the worker adds)."""
        record = self.gate.dump()
        record[ARRIVALS_KEY] = self.arrivals.dump()
        return record

    def unflushed_users(self) -> list[int]:
        """Users in memory with applied entries no flush has carried yet."""
        return [u.user_id for u in self.projector.users.values() if u.projection_mailbox_seq > u.flushed_seq]

    def snapshot(self) -> Snapshot:
        """Everything this processor holds for the partition (replay's crash tests; all in
        memory)."""
        users = self.projector.users
        return Snapshot(
            rows=[(u, c, self.row_record(u, c)) for u, user in users.items() for c in user.rows],
            users=[user.dump() for user in users.values()],
            gate=self.gate_record(),
            pending=list(self.pending_raw()),
        )

    def pending_raw(self) -> Iterator[bytes]:
        """The waiting entries, as records (re-encoded)."""
        for entry in self.gate.waiting():
            yield msgspec.json.encode(entry)

    @classmethod
    def restore(
        cls,
        config: ProjectorConfig,
        store: MessageStore,
        snapshot: Snapshot,
        **options: Any,
    ) -> PartitionProcessor:
        """A processor over a whole restored state, all in memory: the dirty set is lost (never
        checkpointed), so every user with work not yet flushed is dirty again, and every badge
        is recomputed in full (a restart is a reconcile)."""
        processor = cls(config, store, **options)
        projector = processor.projector
        for user_state in snapshot.users:
            loaded = UserState.load(user_state, [])
            projector.users[loaded.user_id] = loaded
        for user_id, conversation_id, record in snapshot.rows:
            user = projector.users.get(user_id)
            if user is None:  # a row written in a batch whose user record was lost: keep the row
                user = projector.users[user_id] = UserState(user_id)
            row = ConversationState.load(record[ROW_STATE_KEY], user_id, conversation_id)
            user.rows[row.conversation_id] = row
            if MEMBER_STATS_KEY in record:
                processor.member_stats[(user_id, row.conversation_id)] = MemberStats.load(
                    record[MEMBER_STATS_KEY]
                )
        projector.restarted()
        processor._restore_gate(snapshot.gate, snapshot.pending)
        return processor

    @classmethod
    def restore_lazily(
        cls,
        config: ProjectorConfig,
        store: MessageStore,
        source: StateSource,
        gate: dict[str, Any] | None,
        pending: list[bytes],
        unflushed: Iterable[int],
        **options: Any,
    ) -> PartitionProcessor:
        """A processor over persisted state it reads on demand: only the gate, the waiting
        entries and the users with work no flush carried (all their rows: they are flushed
        again, within one window) come into memory now; every other user and row is read on
        first touch, and its badge is then recomputed at its next flush (a restart is a
        reconcile). So the time to the first batch does not grow with the state's size."""
        processor = cls(config, store, source=source, **options)
        residency = processor.residency
        assert residency is not None
        projector = processor.projector
        for user_id in unflushed:
            user = projector.user(user_id)
            if user is not None:
                projector.complete(user)
        projector.restarted()  # the users in memory: all rows dirty, badges recomputed
        residency.reconcile_on_load = True
        processor._restore_gate(gate, pending)
        return processor

    def _restore_gate(self, gate: dict[str, Any] | None, pending: list[bytes]) -> None:
        waiting: list[Entry] = []
        for raw in pending:
            decoded = decode_record(raw, self.lanes)
            if not isinstance(decoded, DeadLetter | WatermarkMarker):
                waiting.append(decoded)
        self.gate = WatermarkGate.load(
            self.lanes, gate if gate is not None else {"marks": [], "hi": 0}, waiting
        )
        # No gate record: a state that starts here, counted exactly from here. A gate record
        # without counts: written before the ledger existed (baselined; see ArrivalLedger.load).
        self.arrivals = (
            ArrivalLedger(self.lanes)
            if gate is None
            else ArrivalLedger.load(self.lanes, gate.get(ARRIVALS_KEY), gate.get("marks", ()), waiting)
        )
        self.max_seen_seq = max([self.gate.hi, *(entry.mailbox_seq for entry in waiting)])

    def evict(self, pinned_users: Collection[int] = ()) -> int:
        """After a persist: clean rows beyond the hot set's bound leave memory (none without a
        persisted state behind the processor); `pinned_users` stay (the driver still needs them)."""
        if self.residency is None:
            return 0
        return self.residency.evict(self.changes.rows, set(self.changes.users).union(pinned_users))

    @property
    def resident_rows(self) -> int:
        if self.residency is not None:
            return self.residency.resident_rows
        return sum(len(user.rows) for user in self.projector.users.values())

    # -- reads (audit, metrics) -----------------------------------------------------------------

    @property
    def users(self) -> dict[int, UserState]:
        return self.projector.users

    def dirty_rows(self, user_id: int) -> Collection[str]:
        """The user's rows waiting for the next flush."""
        return self.projector.dirty.rows.get(user_id, ())

    def mark_dirty(self, user_id: int, conversation_ids: Iterable[str], now: int) -> None:
        """Have these rows written again by the user's next flush (within one window)."""
        self.projector.mark_dirty(user_id, conversation_ids, now)

    @property
    def pending_count(self) -> int:
        return self.gate.pending_count
