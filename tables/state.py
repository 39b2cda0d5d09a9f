"""The worker's changelog tables (RocksDB via rocksdict, with Kafka changelog topics), and the
adapter that gives `app.worker.core` the `StateTables` Protocol on top of them.

Every write is routed to the changelog partition of the source partition it belongs to
(co-partitioned with mailbox-tail); each table partition is its own RocksDB database.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Iterable, Iterator
from typing import Any

import faust
from faust.types import TP
from rocksdict import WriteBatch

from app.kafka.batches import BatchSender
from app.worker.ports import (
    COMMIT_STEPS,
    GATE_INTENT_KEY,
    GATE_KEY,
    commit_step,
    parse_row_key,
    pending_key,
    row_key,
    user_key,
)

# faust's RocksDB options for every table partition's database (faust's defaults unless set here;
# bench/state_bench.py opens its databases with the same, to measure what the worker's take).
# The block cache is bounded: faust's default is 2 GiB per table partition's database, so a
# worker reading much of its state over time would grow towards its whole rows database in RAM —
# the opposite of a bounded hot set (issue 13). The hot rows live in Python (PROJECTOR_HOT_ROWS);
# RocksDB's cache only has to keep index/filter blocks and recently read data blocks warm.
ROCKSDB_OPTIONS: dict[str, Any] = {"block_cache_size": 16 * 1024 * 1024}

log = logging.getLogger("projector.worker")

ROW_KEY_BYTES = 24  # user id (8) + conversation UUID (16)
PENDING_KEY_BYTES = 16  # user id (8) + mailbox_seq (8)


class LocalStoreGuard:
    """What keeps the four tables' local stores (shared by them) from falling behind or going
    back in time against their changelogs, beside faust's own recovery:

    * `since`, per (table, partition) this worker writes: the first changelog offset of its
      latest commit there (set by `FaustStateTables.commit`, cleared by its `hand_over`);
    * `holes`, per (table, partition): the lowest changelog offset of records faust dropped
      before applying them (cleared once a recovery of the partition as active has read
      through it: `FaustStateTables.recovered`)."""

    def __init__(self) -> None:
        self.since: dict[tuple[str, int], int] = {}
        self.holes: dict[tuple[str, int], int] = {}
        self.dropped = 0  # changelog records older than `since`, offered by faust's applier
        self.holes_seen = 0  # changelog records faust dropped from its queue unapplied


class WorkerTable(faust.Table[bytes, bytes]):
    """A faust table whose local store never goes back in time, and never skips a record.

    Back in time: while this worker writes a partition, its local store holds everything of
    the changelog below its latest commit's first offset (the recovery read it all, and each
    commit wrote its records locally once delivered, in order). faust's applier may still be
    handed records of the partition from below that offset (records its changelog consumer
    fetched and buffered, applied at its next `flush_buffers`, such as the start of the next
    rebalance, before the worker's revocation hook runs); applied, they would put an older value
    of a row back under a newer one. They are not applied (counted, logged).

    Skipping: faust clears its changelog queue on every `flow_control.resume()`, also after its
    standby partitions started reading (the end of each recovery): the records queued then were
    fetched (the consumer's position is past them) and are never applied, while the records
    after them are, and faust's persisted offset moves past the hole. A standby that became
    active restored its rows from that store: rows missing there were created again, empty (a
    crash run: a pin, a join, a read and a deletion lost from four early rows). The queue's
    clear is watched (`changelog_records_dropped`): the partition's persisted offset goes back
    below the hole and stays there (every later apply writes it below the hole in the same write
    as its records), so the next recovery reads through it."""

    local_guard: LocalStoreGuard

    def apply_changelog_batch(self, batch: Iterable[Any]) -> None:
        guard = self.local_guard
        since = guard.since
        name = self.name
        kept: list[Any] = []
        older: list[tuple[int, int]] = []
        for event in batch:
            message = event.message
            if message.offset < since.get((name, message.partition), -1):
                older.append((message.partition, message.offset))
            else:
                kept.append(event)
        if older:
            guard.dropped += len(older)
            log.warning(
                "changelog %s: %d records older than this worker's own commits not applied to the "
                "local store (partition, offset) %s..%s",
                name,
                len(older),
                min(older),
                max(older),
            )
        if kept:
            self._write_applied(kept)

    def _write_applied(self, events: list[Any]) -> None:
        """faust's RocksDB apply (a partition's records in one write batch; its persisted offset
        the highest one applied), with the persisted offset written IN that write batch and kept
        below a noted hole. faust sets the offset with a put of its own after the batch, and this
        table used to lower it after that: a SIGKILL between the two left the offset past the
        hole on disk, the next start (data dir kept) read the changelog from there, and the local
        store kept the hole for good (a partition restored from it lacked those records; nothing
        showed it once the rows were written again)."""
        store: Any = self.data
        holes = self.local_guard.holes
        batches: dict[int, WriteBatch] = {}
        highest: dict[int, int] = {}
        for event in events:
            message = event.message
            partition = message.partition
            batch = batches.get(partition)
            if batch is None:
                batch = batches[partition] = WriteBatch(raw_mode=True)
            if message.value is None:
                batch.delete(message.key)
            else:
                batch.put(message.key, message.value)
            if message.offset > highest.get(partition, -1):
                highest[partition] = message.offset
        for partition, batch in batches.items():
            offset = highest[partition]
            hole = holes.get((self.name, partition))
            if hole is not None and offset >= hole:
                offset = hole - 1  # read again from below the hole at the next recovery
            batch.put(store.offset_key, str(offset).encode())
            store._db_for_partition(partition).write(batch)

    def changelog_records_dropped(self, partition: int, offset: int) -> None:
        """faust dropped a record of this table's changelog at `offset` before applying it."""
        guard = self.local_guard
        key = (self.name, partition)
        hole = guard.holes.get(key)
        guard.holes_seen += 1
        if hole is None or offset < hole:
            guard.holes[key] = offset
            self._persisted_below(partition, offset)

    def _persisted_below(self, partition: int, offset: int) -> None:
        """faust's persisted offset of the partition at most `offset - 1` (its next recovery,
        standby or active, reads from there). Only ever lowered: none persisted means "read
        from the start", and the records below the hole may not be applied yet either (a
        standby's buffer; setting it to `offset - 1` there skipped them all: a hunt run's
        worker restored rows from before them)."""
        tp = TP(self.changelog_topic.get_topic_name(), partition)
        store: Any = self.data
        persisted = store.persisted_offset(tp)
        if persisted is not None and persisted >= offset:
            store.set_persisted_offset(tp, offset - 1)


def declare_tables(app: faust.App, partitions: int, guard: LocalStoreGuard | None = None) -> dict[str, Any]:
    """Declare the tables on `app` (names become changelog topics: never rename casually)."""
    shared = guard if guard is not None else LocalStoreGuard()

    def table(name: str, help_text: str) -> Any:
        declared = WorkerTable(
            app,
            name=name,
            beacon=app.tables.beacon,
            default=None,
            partitions=partitions,
            # bytes in, bytes out: keys and values are the worker's own encodings (UTF-8
            # keys, msgpack/JSON values). Any other type makes faust JSON-decode changelog
            # records during recovery, which fails on them.
            key_type=bytes,
            value_type=bytes,
            help=help_text,
            options=dict(ROCKSDB_OPTIONS),
        )
        declared.local_guard = shared
        app.tables.add(declared)
        return declared

    return {
        "rows": table("rows", "per-(user, conversation) state: flags, head, unread hand"),
        "users": table("users", "per-user state: projection_mailbox_seq, badge, structure version"),
        "gates": table("gates", "per-partition watermark gate: highest marker per lane"),
        "pending": table("pending", "entries above the watermark, waiting (raw bytes)"),
    }


class FaustStateTables:
    """`StateTables` over faust tables: one RocksDB database per table partition (faust's own
    stores), and a changelog topic per table.

    A persist writes thousands of keys. Through `table[key] = value` each write would pass
    faust's ProducerBuffer (measured: ~2k table writes/s), and faust picks the partition's store
    from the current stream event, which batch intake does not have. Here the writes of a persist
    are staged; `commit()` hands the changelog records to the producer in one batch per
    partition, in steps (app/worker/ports.py `commit_step`: each delivered before the next),
    WAITS until the broker has them all, and only then writes them to the local RocksDB
    databases (one write batch each, with faust's persisted-offset key).

    So the local store is never ahead of the changelog, and a gate record never ahead of the
    data it covers: a crash before the broker has a persist's gate leaves the entries to be read
    again (data already delivered is found through the intent), a crash after leaves the local
    store behind, and faust's recovery brings it up to the changelog at the next start.
    Restoring a partition never has to publish what it holds again, whatever its size.

    Keys are the worker's own bytes (app/worker/ports.py: user ids big-endian, conversation ids
    as UUID bytes), never decoded by faust.
    """

    def __init__(self, tables: dict[str, Any], sender: BatchSender) -> None:
        self.sender = sender
        self.guard: LocalStoreGuard = tables["rows"].local_guard
        self.rows = tables["rows"]
        self.users = tables["users"]
        self.gates = tables["gates"]
        self.pending_table = tables["pending"]
        self._staged: list[tuple[Any, bytes, bytes | None, int]] = []

    def hand_over(self, partition: int) -> None:
        since = self.guard.since
        for key in [key for key in since if key[1] == partition]:
            del since[key]

    def recovered(self, partitions: Collection[int]) -> None:
        """These partitions were just recovered as active (their recovery read from below any
        hole: the persisted offset was kept there)."""
        holes = self.guard.holes
        for key in [key for key in holes if key[1] in partitions]:
            del holes[key]

    @staticmethod
    def _db(table: Any, partition: int) -> Any:
        # faust's RocksDB store keeps one rocksdict database per partition (raw bytes mode).
        return table.data._db_for_partition(partition)

    def _stage(self, table: Any, partition: int, key: bytes, value: bytes | None) -> None:
        self._staged.append((table, key, value, partition))

    def put_row(self, partition: int, user_id: int, conversation_id: str, blob: bytes) -> None:
        self._stage(self.rows, partition, row_key(user_id, conversation_id), blob)

    def put_user(self, partition: int, user_id: int, blob: bytes) -> None:
        self._stage(self.users, partition, user_key(user_id), blob)

    def put_gate(self, partition: int, blob: bytes) -> None:
        self._stage(self.gates, partition, GATE_KEY, blob)

    def put_gate_intent(self, partition: int, blob: bytes) -> None:
        self._stage(self.gates, partition, GATE_INTENT_KEY, blob)

    def put_pending(self, partition: int, user_id: int, mailbox_seq: int, raw: bytes) -> None:
        self._stage(self.pending_table, partition, pending_key(user_id, mailbox_seq), raw)

    def delete_pending(self, partition: int, user_id: int, mailbox_seq: int) -> None:
        self._stage(self.pending_table, partition, pending_key(user_id, mailbox_seq), None)

    async def commit(self) -> None:
        """The changelog first (delivered step by step: `StateTables.commit`), then the local
        store."""
        staged, self._staged = self._staged, []
        if not staged:
            return
        names = {id(self.rows): "rows", id(self.users): "users", id(self.gates): "gates"}
        names[id(self.pending_table)] = "pending"
        steps: list[list[tuple[Any, bytes, bytes | None, int]]] = [[] for _ in range(COMMIT_STEPS)]
        last = {(id(item[0]), item[1], item[3]): item for item in staged}  # the last write wins
        for item in last.values():
            steps[commit_step(names[id(item[0])], item[1], item[2])].append(item)
        # (table, partition) -> the lowest offset this persist's records got in its changelog
        first_offsets: dict[tuple[int, int], int] = {}
        for step in steps:
            if step:
                await self._deliver(step, first_offsets)  # every record of the step is in
        batches: dict[tuple[int, int], tuple[Any, Any]] = {}
        tables: dict[int, Any] = {}
        for table, key, value, partition in staged:
            tables[id(table)] = table
            entry = batches.get((id(table), partition))
            if entry is None:
                batch = WriteBatch(raw_mode=True)
                entry = batches[(id(table), partition)] = (self._db(table, partition), batch)
            if value is None:
                entry[1].delete(key)
            else:
                entry[1].put(key, value)
        for (table_id, partition), (db, batch) in batches.items():
            # faust's recovery reads a partition's changelog from this offset into the local
            # store: written in the same write batch as the records, and the persist's FIRST
            # offset, so a worker killed before this write, or after it, re-reads (harmlessly)
            # rather than skips a record the local store lacks. (Set from the delivery callback,
            # as before, a later batch's offset could land without an earlier batch's records.)
            offset = first_offsets.get((table_id, partition))
            if offset is not None:
                batch.put(tables[table_id].data.offset_key, str(offset).encode())
            db.write(batch)
            if offset is not None:
                self.guard.since[(tables[table_id].name, partition)] = offset

    async def _deliver(
        self, staged: list[tuple[Any, bytes, bytes | None, int]], first_offsets: dict[tuple[int, int], int]
    ) -> None:
        grouped: dict[int, dict[int, list[tuple[bytes | None, bytes | None]]]] = {}
        tables: dict[int, Any] = {}
        for table, key, value, partition in staged:
            tables[id(table)] = table
            grouped.setdefault(id(table), {}).setdefault(partition, []).append((key, value))
        futures: list[asyncio.Future[Any]] = []
        for table_id, by_partition in grouped.items():
            topic = tables[table_id].changelog_topic.get_topic_name()

            def delivered(partition: int, metadata: Any, table_id: int = table_id) -> None:
                # metadata.offset: the batch's first offset
                key = (table_id, partition)
                known = first_offsets.get(key)
                if known is None or metadata.offset < known:
                    first_offsets[key] = metadata.offset

            futures += await self.sender.send(topic, by_partition, delivered)
        await asyncio.gather(*futures)

    def get_users(self, partition: int, user_ids: Collection[int]) -> dict[int, bytes]:
        ids = list(user_ids)
        values = self._db(self.users, partition).get([user_key(u) for u in ids])
        return {u: v for u, v in zip(ids, values, strict=True) if v is not None}

    def get_rows(self, partition: int, keys: Collection[tuple[int, str]]) -> dict[tuple[int, str], bytes]:
        wanted = list(keys)
        values = self._db(self.rows, partition).get([row_key(u, c) for u, c in wanted])
        return {k: v for k, v in zip(wanted, values, strict=True) if v is not None}

    def user_rows(self, partition: int, user_id: int) -> list[tuple[str, bytes]]:
        prefix = user_key(user_id)
        out = []
        for key, value in self._db(self.rows, partition).items(from_key=prefix):
            if not key.startswith(prefix):
                break
            if len(key) == ROW_KEY_BYTES:
                out.append((parse_row_key(key)[1], value))
        return out

    def row_keys(self, partition: int) -> Iterator[tuple[int, str]]:
        for key in self._db(self.rows, partition).keys():  # noqa: SIM118  # an Rdict, not a dict
            if len(key) == ROW_KEY_BYTES:  # faust keeps its own bookkeeping keys beside ours
                yield parse_row_key(key)

    def gate(self, partition: int) -> bytes | None:
        value: bytes | None = self._db(self.gates, partition).get(GATE_KEY)
        return value

    def gate_intent(self, partition: int) -> bytes | None:
        value: bytes | None = self._db(self.gates, partition).get(GATE_INTENT_KEY)
        return value

    def pending(self, partition: int) -> list[bytes]:
        # faust's own bookkeeping key (the persisted changelog offset, b"__faust\0offset__") is
        # 16 bytes too: only the exact key is skipped, a pending key cannot be told by its length.
        offset_key = self.pending_table.data.offset_key
        return [
            value
            for key, value in self._db(self.pending_table, partition).items()
            if len(key) == PENDING_KEY_BYTES and key != offset_key
        ]
