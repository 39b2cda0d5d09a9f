"""Rebuild by replay (DESIGN §6, issue 7): re-consume every mailbox-tail partition from its
beginning up to the end offsets seen at the start, through the worker's own core
(:class:`app.worker.core.WorkerCore`) with in-memory tables, into a fresh projection namespace.

Same core, same rules: the rows are identical field by field to what the worker wrote (a row is
a pure function of the entries applied to it, whatever the flush timing), badges and versions
too. Nothing is produced: no frames (clients must never hear of a namespace that does not serve)
and no dead letters (the worker sent them the first time; they are counted). No consumer group:
the worker's committed offsets are untouched. A rebuild that dies starts over (its tables are
memory).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.domain.ports import MessageStore, ProjectionStore
from app.rebuild import Progress
from app.worker.core import WorkerConfig, WorkerCore, wall_clock_ms
from app.worker.ports import PartitionSnapshot, RawRecord

FETCH_RECORDS = 5000


class MemoryTables:
    """StateTables in dicts (the rebuild's own; never a changelog)."""

    def __init__(self) -> None:
        self.rows: dict[int, dict[tuple[int, str], bytes]] = {}
        self.users: dict[int, dict[int, bytes]] = {}
        self.gates: dict[int, bytes] = {}
        self.pending: dict[int, dict[tuple[int, int], bytes]] = {}

    def put_row(self, partition: int, user_id: int, conversation_id: str, blob: bytes) -> None:
        self.rows.setdefault(partition, {})[(user_id, conversation_id)] = blob

    def put_user(self, partition: int, user_id: int, blob: bytes) -> None:
        self.users.setdefault(partition, {})[user_id] = blob

    def put_gate(self, partition: int, blob: bytes) -> None:
        self.gates[partition] = blob

    def put_pending(self, partition: int, user_id: int, mailbox_seq: int, raw: bytes) -> None:
        self.pending.setdefault(partition, {})[(user_id, mailbox_seq)] = raw

    def delete_pending(self, partition: int, user_id: int, mailbox_seq: int) -> None:
        self.pending.get(partition, {}).pop((user_id, mailbox_seq), None)

    def snapshot(self, partition: int) -> PartitionSnapshot:
        return PartitionSnapshot(
            list(self.rows.get(partition, {}).values()),
            list(self.users.get(partition, {}).values()),
            self.gates.get(partition),
            list(self.pending.get(partition, {}).values()),
        )

    def republish(self, partition: int) -> None:
        pass  # nothing behind these tables to fall behind

    async def commit(self) -> None:
        pass


class SilentOutbox:
    """Counts what the worker would produce; produces nothing."""

    def __init__(self) -> None:
        self.dead_letters_seen = 0
        self.frames_seen = 0

    async def dead_letters(self, letters: Sequence[tuple[bytes | None, bytes]]) -> None:
        self.dead_letters_seen += len(letters)

    async def frames(
        self, session_deltas: Sequence[tuple[bytes, bytes]], badges: Sequence[tuple[bytes, bytes]]
    ) -> None:
        self.frames_seen += len(session_deltas) + len(badges)


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


async def rebuild_by_replay(
    *,
    bootstrap: str,
    topic: str,
    partitions: int,
    config: WorkerConfig,
    messages: MessageStore,
    target: ProjectionStore,
    progress_mode: str = "auto",
) -> ReplayRebuild:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None, auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        if topic not in await consumer.topics():
            raise RuntimeError(f"topic {topic!r} does not exist (has `projector bootstrap` run?)")
        # Bootstrap creates every topic with `partitions` partitions (faust's co-partitioning).
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        begin = await consumer.beginning_offsets(tps)
        end = await consumer.end_offsets(tps)
        await consumer.seek_to_beginning(*tps)
        total = sum(end[tp] - begin[tp] for tp in tps)
        progress = Progress(total, mode=progress_mode, unit="records")
        remaining = {tp for tp in tps if end[tp] > begin[tp]}
        consumer.pause(*[tp for tp in tps if tp not in remaining])
        core = WorkerCore(
            config,
            message_store=messages,
            projection_store=target,
            tables=MemoryTables(),
            outbox=SilentOutbox(),
        )
        done = 0
        while remaining:
            fetched = await consumer.getmany(*remaining, timeout_ms=1000, max_records=FETCH_RECORDS)
            records: list[RawRecord] = []
            for tp, batch in fetched.items():
                for m in batch:
                    if m.offset < end[tp]:  # later records arrived after the start: not ours
                        records.append(RawRecord(m.topic, m.partition, m.offset, m.key, m.value))
            for tp in list(remaining):  # by position: offsets may skip (compaction, markers)
                if await consumer.position(tp) >= end[tp]:
                    remaining.discard(tp)
                    consumer.pause(tp)
            if records:
                await core.on_records(records)
                done += len(records)
            await core.flush_due(wall_clock_ms())
            progress.detail = f", {len(tps) - len(remaining)}/{len(tps)} partitions"
            progress.update(done, core.stats.projection_writes)
        await core.flush_all()  # the end of a replay input flushes everything
        progress.update(done, core.stats.projection_writes, final=True)
        stats = core.stats
        return ReplayRebuild(
            partitions=len(tps),
            records=stats.records,
            entries=stats.entries,
            applied=stats.applied,
            duplicates=stats.duplicates,
            dead_letters=stats.dead_letters,
            pending=sum(state.gate.pending_count for state in core.partitions.values()),
            users=sum(len(state.projector.users) for state in core.partitions.values()),
        )
    finally:
        await consumer.stop()
