"""The worker's changelog tables (RocksDB via rocksdict, with Kafka changelog topics), and the
adapter that gives `app.worker.core` the `StateTables` Protocol on top of them.

Keys are `"{partition}/..."` strings: a partition's state can be found again after a rebalance
without knowing the producer's partitioner, and every write is routed to the changelog
partition of the source partition it belongs to (co-partitioned with mailbox-tail).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import faust

from app.worker.ports import PartitionSnapshot


def declare_tables(app: faust.App, partitions: int) -> dict[str, Any]:
    """Declare the tables on `app` (names become changelog topics: never rename casually)."""

    def table(name: str, help_text: str) -> Any:
        return app.Table(
            name,
            default=None,
            partitions=partitions,
            # No key/value types: the app's raw serializers pass bytes through untouched (str keys
            # are encoded as UTF-8); values are msgpack/JSON bytes made by the worker core.
            help=help_text,
        )

    return {
        "rows": table("rows", "per-(user, conversation) state: flags, head, unread hand"),
        "users": table("users", "per-user state: projection_mailbox_seq, badge, structure version"),
        "gates": table("gates", "per-partition watermark gate: highest marker per lane"),
        "pending": table("pending", "entries above the watermark, waiting (raw bytes)"),
    }


class FaustStateTables:
    """`StateTables` over faust tables. `remember(event)` must be called for every partition in
    a batch before `writing(partition)`: faust takes the changelog partition (and the RocksDB
    partition store) from the current event."""

    def __init__(self, tables: dict[str, Any]) -> None:
        self.rows = tables["rows"]
        self.users = tables["users"]
        self.gates = tables["gates"]
        self.pending = tables["pending"]
        self._events: dict[int, Any] = {}
        self._stream: Any = None

    def remember(self, stream: Any, event: Any) -> None:
        self._stream = stream
        self._events[event.message.partition] = event

    @contextmanager
    def writing(self, partition: int) -> Iterator[None]:
        event = self._events.get(partition)
        if event is None or self._stream is None:
            raise RuntimeError(f"no event of partition {partition} to write its tables under")
        previous = self._stream.current_event
        # faust routes table writes by the *current* event; a batch spans partitions, so make an
        # event of this partition current while its state is written.
        self._stream._set_current_event(event)
        try:
            yield
        finally:
            self._stream._set_current_event(previous)

    def put_row(self, partition: int, user_id: int, conversation_id: str, blob: bytes) -> None:
        self.rows[f"{partition}/{user_id}/{conversation_id}"] = blob

    def put_user(self, partition: int, user_id: int, blob: bytes) -> None:
        self.users[f"{partition}/{user_id}"] = blob

    def put_gate(self, partition: int, blob: bytes) -> None:
        self.gates[f"{partition}"] = blob

    def put_pending(self, partition: int, user_id: int, mailbox_seq: int, raw: bytes) -> None:
        self.pending[f"{partition}/{user_id}/{mailbox_seq}"] = raw

    def delete_pending(self, partition: int, user_id: int, mailbox_seq: int) -> None:
        key = f"{partition}/{user_id}/{mailbox_seq}"
        if key in self.pending:
            del self.pending[key]

    def snapshot(self, partition: int) -> PartitionSnapshot:
        # Iteration covers every active partition's store and needs no current event (point
        # reads would follow the current event's partition): the snapshot runs from signals too.
        prefix = f"{partition}/"
        gate_key = str(partition)
        gate = next((value for key, value in self._items(self.gates) if key == gate_key), None)
        return PartitionSnapshot(
            rows=[value for key, value in self._items(self.rows) if key.startswith(prefix)],
            users=[value for key, value in self._items(self.users) if key.startswith(prefix)],
            gate=gate,
            pending=[value for key, value in self._items(self.pending) if key.startswith(prefix)],
        )

    @staticmethod
    def _items(table: Any) -> Iterator[tuple[str, bytes]]:
        for key, value in table.items():
            if value is None:
                continue
            yield (key.decode() if isinstance(key, bytes) else str(key)), value
