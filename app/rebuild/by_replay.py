"""Rebuild by replay (docs/contract.md §6, issue 7): re-consume every mailbox-tail partition from its
beginning up to the end offsets seen at the start, through the worker's own core
(:class:`app.worker.core.WorkerCore`) with in-memory tables, into a fresh projection namespace.

Same core, same rules: the rows are identical field by field to what the worker wrote (a row is
a pure function of the entries applied to it, whatever the flush timing), badges and versions
too. Nothing is produced: no frames (clients must never hear of a namespace that does not serve)
and no dead letters (the worker sent them the first time; they are counted). No consumer group:
the worker's committed offsets are untouched. A rebuild that dies starts over (its tables are
memory, or with ``--state-dir`` a scratch RocksDB folder: the worker's hot set then keeps at most
``hot_rows`` rows per partition in memory, and the folder's databases share one memtable budget
and one block cache whatever the partitions (app/stores/rocks_tables.py), so a log of any size
rebuilds in bounded memory).

From a timestamp (``--from-timestamp T``, for a log partly past retention): each partition is read
from the first record whose Kafka timestamp is >= T (``offsets_for_times``). Entries before T are
not read, so what they did must come from elsewhere: a user the retained tail names starts from
their rows rebuilt from UserConversationState + MessageStore (:class:`app.rebuild.StateBase`),
at the state's version (the last state-changing entry: the entries at or below it are in state,
and drop as duplicates; the ones above it are applied on top). Users the tail does not name are
rebuilt from state alone by the caller.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from app.domain.conversation import ConversationState
from app.domain.entries import DeadLetter, WatermarkMarker, decode_record
from app.domain.ports import MessageStore
from app.domain.projection_store import ProjectionStore
from app.metrics import RebuildMetrics
from app.rebuild.progress import Progress
from app.stores.memory_tables import MemoryTables
from app.worker.core import WorkerConfig, WorkerCore, wall_clock_ms
from app.worker.ports import RawRecord, StateTables, raw_record

FETCH_RECORDS = 5000
BASE_EVENT_ID: Final = "rebuild-base-from-state"

# user ids -> (rows, version) for the users durable state knows (a rebuild from a timestamp)
BaseLoader = Callable[[list[int]], Awaitable[dict[int, tuple[list[ConversationState], int]]]]


class SilentOutbox:
    """Counts what the worker would produce; produces nothing."""

    def __init__(self) -> None:
        self.dead_letters_seen = 0
        self.frames_seen = 0
        self.notices_seen = 0

    async def dead_letters(self, letters: Sequence[tuple[bytes | None, bytes]]) -> None:
        self.dead_letters_seen += len(letters)

    async def frames(
        self, session_deltas: Sequence[tuple[bytes, bytes]], badges: Sequence[tuple[bytes, bytes]]
    ) -> None:
        self.frames_seen += len(session_deltas) + len(badges)

    async def notices(self, notices: Sequence[tuple[bytes, bytes]]) -> None:
        # A rebuild re-reads old entries: their notices were sent when they were first applied.
        self.notices_seen += len(notices)


@dataclass(slots=True)
class ReplayRebuild:
    partitions: int = 0
    records: int = 0
    entries: int = 0
    applied: int = 0
    duplicates: int = 0
    dead_letters: int = 0
    pending: int = 0  # entries still above the watermark at the end (not in the projection)
    users: int = 0
    from_timestamp_ms: int | None = None
    start_offsets: dict[str, int] = field(default_factory=dict)  # partition -> first offset read
    users_from_state_base: int = 0  # tail users started from their rows rebuilt from state
    # Users the records read name, when there is a base (a rebuild from a timestamp rebuilds the
    # others from state).
    tail_users: set[int] = field(default_factory=set, repr=False)


class ReplaySourceError(RuntimeError):
    """mailbox-tail cannot be read: Kafka does not answer, or the topic is not there."""


async def _start(consumer: Any, bootstrap: str, security: Mapping[str, Any]) -> None:
    """Start the consumer; a Kafka that does not answer, or refuses the credentials, is one clear
    error (and the consumer is closed: aiokafka complains about an unclosed one at exit otherwise)."""
    from aiokafka.errors import KafkaError

    from app.connections import quiet_logger
    from app.kafka.refusal import kafka_unreachable

    try:
        with quiet_logger("aiokafka"):
            await consumer.start()
    except (KafkaError, OSError) as exc:
        await consumer.stop()
        raise ReplaySourceError(await kafka_unreachable(bootstrap, security, exc)) from None


async def rebuild_by_replay(
    *,
    bootstrap: str,
    topic: str,
    partitions: int,
    config: WorkerConfig,
    messages: MessageStore,
    target: ProjectionStore,
    progress_mode: str = "auto",
    metrics: RebuildMetrics | None = None,
    from_ms: int | None = None,
    base: BaseLoader | None = None,
    kafka_options: Mapping[str, Any] | None = None,
    tables: StateTables | None = None,
) -> ReplayRebuild:
    """Replay mailbox-tail into `target`: from the beginning, or from `from_ms` (Kafka record
    time, ms) with `base` giving the tail's users their state from before it. `tables`: where the
    core keeps its state (default: in memory; app.stores.rocks_tables.RocksTables for a log whose
    state does not fit in memory)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        group_id=None,
        auto_offset_reset="earliest",
        **dict(kafka_options or {}),  # security options (app/connections.kafka_security_options)
    )
    await _start(consumer, bootstrap, kafka_options or {})
    try:
        if topic not in await consumer.topics():
            raise ReplaySourceError(
                f"topic {topic!r} does not exist on Kafka at {bootstrap} (PROJECTOR_TOPIC_MAILBOX_TAIL): "
                "create it with `projector bootstrap`"
            )
        # Bootstrap creates every topic with `partitions` partitions (faust's co-partitioning).
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        end = await consumer.end_offsets(tps)
        if from_ms is None:
            start = await consumer.beginning_offsets(tps)
        else:
            found = await consumer.offsets_for_times({tp: from_ms for tp in tps})
            # None: no record at or after T in the partition; nothing of it is read.
            start = {tp: end[tp] if found[tp] is None else found[tp].offset for tp in tps}
        for tp in tps:
            consumer.seek(tp, start[tp])
        total = sum(end[tp] - start[tp] for tp in tps)
        progress = Progress(total, mode=progress_mode, unit="records", metrics=metrics)
        remaining = {tp for tp in tps if end[tp] > start[tp]}
        consumer.pause(*[tp for tp in tps if tp not in remaining])
        core = WorkerCore(
            config,
            message_store=messages,
            projection_store=target,
            tables=tables if tables is not None else MemoryTables(),
            outbox=SilentOutbox(),
        )
        result = ReplayRebuild(
            partitions=len(tps),
            from_timestamp_ms=from_ms,
            start_offsets={str(tp.partition): start[tp] for tp in tps},
        )
        done = 0
        while remaining:
            fetched = await consumer.getmany(*remaining, timeout_ms=1000, max_records=FETCH_RECORDS)
            records: list[RawRecord] = []
            for tp, batch in fetched.items():
                for m in batch:
                    if m.offset < end[tp]:  # later records arrived after the start: not ours
                        records.append(raw_record(m.topic, m.partition, m.offset, m.key, m.value))
            for tp in list(remaining):  # by position: offsets may skip (compaction, markers)
                if await consumer.position(tp) >= end[tp]:
                    remaining.discard(tp)
                    consumer.pause(tp)
            if records:
                await _adopt_new_users(core, records, config.lanes, result, base)
                await core.on_records(records)
                done += len(records)
            await core.flush_due(wall_clock_ms())
            progress.detail = f", {len(tps) - len(remaining)}/{len(tps)} partitions"
            progress.update(done, core.stats.projection_writes)
        await core.flush_all()  # the end of a replay input flushes everything
        progress.update(done, core.stats.projection_writes, final=True)
        stats = core.stats
        result.records = stats.records
        result.entries = stats.entries
        result.applied = stats.applied
        result.duplicates = stats.duplicates
        result.dead_letters = stats.dead_letters
        result.pending = sum(state.processor.pending_count for state in core.partitions.values())
        # Every applied user was flushed by flush_all: the target holds them all (the processors
        # hold only their hot sets).
        result.users = await _users_written(target, core)
        return result
    finally:
        await consumer.stop()


async def _users_written(target: ProjectionStore, core: WorkerCore) -> int:
    """Users the rebuild wrote: flush_all flushed every applied user, so the fresh namespace holds
    them all (the processors may hold only their hot sets by now). A store that cannot list its
    users: those in memory (all of them when nothing was evicted)."""
    listing = getattr(target, "user_ids", None)
    if listing is not None:
        return len(await listing())
    return sum(len(state.processor.users) for state in core.partitions.values())


async def _adopt_new_users(
    core: WorkerCore,
    records: Sequence[RawRecord],
    lanes: int,
    result: ReplayRebuild,
    base: BaseLoader | None,
) -> None:
    """Before a batch is applied: every user it names for the first time gets their state from
    before the tail, in the partition their entries arrive on (the core keeps users per
    partition). Entries are decoded here once more: the key is only a convention of the lanes,
    the entry's user_id is the truth. A full replay has no base: nothing to do."""
    if base is None:
        return
    first_seen: dict[int, int] = {}
    seen = result.tail_users
    for record in records:
        decoded = decode_record(record.value, lanes)
        if isinstance(decoded, DeadLetter | WatermarkMarker):
            continue
        user_id = decoded.user_id
        if user_id not in seen and user_id not in first_seen:
            first_seen[user_id] = record.partition
    if not first_seen:
        return
    seen.update(first_seen)
    loaded = await base(sorted(first_seen))
    for user_id, (rows, version) in loaded.items():
        core.partition(first_seen[user_id]).processor.projector.adopt(user_id, rows, version, BASE_EVENT_ID)
        result.users_from_state_base += 1
