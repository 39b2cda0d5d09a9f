"""The worker's changelog tables (RocksDB via rocksdict, with Kafka changelog topics), and the
adapter that gives `app.worker.core` the `StateTables` Protocol on top of them.

Keys are `"{partition}/..."` strings: a partition's state can be found again after a rebalance
without knowing the producer's partitioner, and every write is routed to the changelog
partition of the source partition it belongs to (co-partitioned with mailbox-tail).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import faust
from faust.types import TP

from app.kafka.batches import BatchSender
from app.worker.ports import PartitionSnapshot


def declare_tables(app: faust.App, partitions: int) -> dict[str, Any]:
    """Declare the tables on `app` (names become changelog topics: never rename casually)."""

    def table(name: str, help_text: str) -> Any:
        return app.Table(
            name,
            default=None,
            partitions=partitions,
            # bytes in, bytes out: keys and values are the worker's own encodings (UTF-8 keys,
            # msgpack/JSON values). Any other type makes faust JSON-decode changelog records
            # during recovery, which fails on them.
            key_type=bytes,
            value_type=bytes,
            help=help_text,
        )

    return {
        "rows": table("rows", "per-(user, conversation) state: flags, head, unread hand"),
        "users": table("users", "per-user state: projection_mailbox_seq, badge, structure version"),
        "gates": table("gates", "per-partition watermark gate: highest marker per lane"),
        "pending": table("pending", "entries above the watermark, waiting (raw bytes)"),
    }


class FaustStateTables:
    """`StateTables` over faust tables, writing the RocksDB partition stores and the changelog
    topics directly.

    A batch writes thousands of keys. Through `table[key] = value` each write would pass faust's
    ProducerBuffer, which drains one message at a time and stalls the stream every 100 pending
    messages (measured: ~2k table writes/s, the whole worker at ~1k entries/s); and faust picks
    the partition's store from the current stream event, which batch intake does not have. Here
    each write goes to the named partition's RocksDB database and its changelog record to the
    producer's batching accumulator; `commit()` (end of a persist) awaits their hand-off, and the
    offset commit flushes the producer first, so no offset is committed past a changelog record
    in flight.

    Keys are our own UTF-8 bytes (never decoded by faust), `"{partition}/..."`, so a partition's
    state can be found again after a rebalance.
    """

    def __init__(self, tables: dict[str, Any], sender: BatchSender) -> None:
        self.sender = sender
        self.rows = tables["rows"]
        self.users = tables["users"]
        self.gates = tables["gates"]
        self.pending = tables["pending"]
        self._outgoing: list[tuple[Any, bytes, bytes | None, int]] = []

    def _write(self, table: Any, partition: int, key: str, value: bytes | None) -> None:
        # faust's RocksDB store keeps one rocksdict database per partition. Its key index (a
        # cache for faust's own reads by key) is not kept: these tables are only read whole.
        db = table.data._db_for_partition(partition)
        raw_key = key.encode()
        if value is None:
            db.delete(raw_key)
        else:
            db.put(raw_key, value)
        self._outgoing.append((table, raw_key, value, partition))

    async def commit(self) -> None:
        """Hand this batch's changelog records to the producer, one batch per partition."""
        outgoing, self._outgoing = self._outgoing, []
        grouped: dict[int, dict[int, list[tuple[bytes | None, bytes | None]]]] = {}
        tables: dict[int, Any] = {}
        for table, key, value, partition in outgoing:
            tables[id(table)] = table
            grouped.setdefault(id(table), {}).setdefault(partition, []).append((key, value))
        for table_id, by_partition in grouped.items():
            table = tables[table_id]
            topic = table.changelog_topic.get_topic_name()

            def persisted(partition: int, metadata: Any, table: Any = table, topic: str = topic) -> None:
                # The batch's FIRST offset: recovery may re-read the rest of the batch (applying
                # a changelog record twice is harmless), never skip past what the store lacks.
                table.data.set_persisted_offset(TP(topic, partition), metadata.offset)

            await self.sender.send(topic, by_partition, persisted)

    def republish(self, partition: int) -> None:
        prefix = f"{partition}/".encode()
        gate_key = str(partition).encode()
        for table in (self.rows, self.users, self.pending):
            for key, value in self._items(table):
                if key.startswith(prefix):
                    self._outgoing.append((table, key, value, partition))
        for key, value in self._items(self.gates):
            if key == gate_key:
                self._outgoing.append((self.gates, key, value, partition))

    def put_row(self, partition: int, user_id: int, conversation_id: str, blob: bytes) -> None:
        self._write(self.rows, partition, f"{partition}/{user_id}/{conversation_id}", blob)

    def put_user(self, partition: int, user_id: int, blob: bytes) -> None:
        self._write(self.users, partition, f"{partition}/{user_id}", blob)

    def put_gate(self, partition: int, blob: bytes) -> None:
        self._write(self.gates, partition, f"{partition}", blob)

    def put_pending(self, partition: int, user_id: int, mailbox_seq: int, raw: bytes) -> None:
        self._write(self.pending, partition, f"{partition}/{user_id}/{mailbox_seq}", raw)

    def delete_pending(self, partition: int, user_id: int, mailbox_seq: int) -> None:
        self._write(self.pending, partition, f"{partition}/{user_id}/{mailbox_seq}", None)

    def snapshot(self, partition: int) -> PartitionSnapshot:
        # Iteration covers every active partition's store and needs no current event, so the
        # snapshot can run from the rebalance signal too.
        prefix = f"{partition}/".encode()
        gate_key = str(partition).encode()
        gate = next((value for key, value in self._items(self.gates) if key == gate_key), None)
        return PartitionSnapshot(
            rows=[value for key, value in self._items(self.rows) if key.startswith(prefix)],
            users=[value for key, value in self._items(self.users) if key.startswith(prefix)],
            gate=gate,
            pending=[value for key, value in self._items(self.pending) if key.startswith(prefix)],
        )

    @staticmethod
    def _items(table: Any) -> Iterator[tuple[bytes, bytes]]:
        for key, value in table.data._iteritems():
            if value is not None:
                yield key, value
