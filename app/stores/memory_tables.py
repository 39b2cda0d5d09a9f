"""The worker's `StateTables` port in dicts: what a rebuild by replay runs on (never a changelog),
and the in-memory twin of the checkpointed tables (tables/durable) in tests; one contract suite
runs against every implementation.

Writes become visible at `commit`, all of a commit's or none (as a checkpointed persist: a torn
append is discarded by its missing checkpoint)."""

from __future__ import annotations

import bisect
import random
from collections.abc import Collection, Iterator, Sequence

from app.worker.ports import (
    CHECKPOINT_KEY,
    parse_row_key,
    pending_key,
    row_key,
    user_key,
)


class TornCommit(Exception):
    """A commit died part way (`MemoryTables.tear_next_commit`)."""


class MemoryTables:
    """StateTables in dicts (per partition: table -> key -> value)."""

    def __init__(self) -> None:
        self.data: dict[int, dict[str, dict[bytes, bytes]]] = {}
        self._tear: random.Random | None = None
        self._staged: list[tuple[int, str, bytes, bytes | None]] = []

    def _table(self, partition: int, name: str) -> dict[bytes, bytes]:
        return self.data.setdefault(partition, {}).setdefault(name, {})

    async def acquire(self, partitions: Sequence[int]) -> None:
        """Nothing else writes these dicts: nothing to claim."""

    def hand_over(self, partition: int) -> None:
        """Nothing else writes this store: a hand-over needs no bookkeeping."""

    def put_row(self, partition: int, user_id: int, conversation_id: str, blob: bytes) -> None:
        self._staged.append((partition, "rows", row_key(user_id, conversation_id), blob))

    def put_user(self, partition: int, user_id: int, blob: bytes) -> None:
        self._staged.append((partition, "users", user_key(user_id), blob))

    def put_checkpoint_record(self, partition: int, blob: bytes, next_offset: int | None = None) -> None:
        # The checkpoint record carries the offset itself (the core writes both).
        self._staged.append((partition, "checkpoints", CHECKPOINT_KEY, blob))

    def put_pending(self, partition: int, user_id: int, mailbox_seq: int, raw: bytes) -> None:
        self._staged.append((partition, "pending", pending_key(user_id, mailbox_seq), raw))

    def delete_pending(self, partition: int, user_id: int, mailbox_seq: int) -> None:
        self._staged.append((partition, "pending", pending_key(user_id, mailbox_seq), None))

    def tear_next_commit(self, rnd: random.Random) -> None:
        """Tests: the next commit dies, as a worker killed while the changelog acknowledges a
        persist: each partition's writes landed whole or not at all (a torn append has no
        checkpoint, so no reader applies it), then it raises `TornCommit`."""
        self._tear = rnd

    def take(self) -> list[tuple[int, str, bytes, bytes | None]]:
        """What is staged, taken: the last write of each key."""
        staged, self._staged = self._staged, []
        return list({(item[0], item[1], item[2]): item for item in staged}.values())

    async def commit(self) -> None:
        staged = self.take()
        rnd, self._tear = self._tear, None
        if rnd is not None:
            landed = {p for p in sorted({item[0] for item in staged}) if rnd.random() < 0.5}
            self._write([item for item in staged if item[0] in landed])
            raise TornCommit(f"commit died: partitions {sorted(landed)} landed, the others did not")
        self._write(staged)

    def _write(self, staged: list[tuple[int, str, bytes, bytes | None]]) -> None:
        for partition, name, key, value in staged:
            table = self._table(partition, name)
            if value is None:
                table.pop(key, None)
            else:
                table[key] = value

    def get_users(self, partition: int, user_ids: Collection[int]) -> dict[int, bytes]:
        table = self._table(partition, "users")
        found = {user_id: table.get(user_key(user_id)) for user_id in user_ids}
        return {user_id: value for user_id, value in found.items() if value is not None}

    def get_rows(self, partition: int, keys: Collection[tuple[int, str]]) -> dict[tuple[int, str], bytes]:
        table = self._table(partition, "rows")
        found = {key: table.get(row_key(*key)) for key in keys}
        return {key: value for key, value in found.items() if value is not None}

    def user_rows(self, partition: int, user_id: int) -> list[tuple[str, bytes]]:
        prefix = user_key(user_id)
        table = self._table(partition, "rows")
        return sorted(
            (parse_row_key(key)[1], value) for key, value in table.items() if key.startswith(prefix)
        )

    def row_keys(self, partition: int) -> Iterator[tuple[int, str]]:
        return iter([parse_row_key(key) for key in sorted(self._table(partition, "rows"))])

    def rows_after(
        self, partition: int, after: tuple[int, str] | None, limit: int
    ) -> list[tuple[tuple[int, str], bytes]]:
        table = self._table(partition, "rows")
        keys = sorted(list(table))  # list(): one step under the GIL (a worker thread calls this)
        start = 0 if after is None else bisect.bisect_right(keys, row_key(*after))
        out = []
        for key in keys[start : start + max(limit, 0)]:
            value = table.get(key)
            if value is not None:
                out.append((parse_row_key(key), value))
        return out

    def row_key_bounds(self, partition: int) -> tuple[tuple[int, str], tuple[int, str]] | None:
        table = self._table(partition, "rows")
        if not table:
            return None
        keys = list(table)
        return parse_row_key(min(keys)), parse_row_key(max(keys))

    def estimated_rows(self, partition: int) -> int:
        return len(self._table(partition, "rows"))

    def checkpoint_record(self, partition: int) -> bytes | None:
        return self._table(partition, "checkpoints").get(CHECKPOINT_KEY)

    def pending(self, partition: int) -> list[bytes]:
        table = self._table(partition, "pending")
        return [table[key] for key in sorted(table)]

    # -- inspection (tests) ---------------------------------------------------------------------

    def count(self, partition: int, name: str) -> int:
        """How many records a table holds for the partition (tests)."""
        return len(self._table(partition, name))
