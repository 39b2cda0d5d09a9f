"""The worker's `StateTables` port in dicts: what a rebuild by replay runs on (never a changelog),
and the in-memory twin of the faust tables in tests; one contract suite runs against both."""

from __future__ import annotations

from app.worker.ports import PartitionSnapshot


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
