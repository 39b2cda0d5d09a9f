"""The processor's `StateSource` (app/domain/residency.py) over a `StateTables` partition (msgpack)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import msgspec

from app.worker.ports import StateTables


class TablesSource:
    """The processor's `StateSource` over one partition of the changelog tables."""

    def __init__(self, tables: StateTables, partition: int) -> None:
        self.tables = tables
        self.partition = partition

    def get_users(self, user_ids: Collection[int]) -> dict[int, dict[str, Any]]:
        found = self.tables.get_users(self.partition, user_ids)
        return {user_id: msgspec.msgpack.decode(blob) for user_id, blob in found.items()}

    def get_rows(self, keys: Collection[tuple[int, str]]) -> dict[tuple[int, str], dict[str, Any]]:
        found = self.tables.get_rows(self.partition, keys)
        return {key: msgspec.msgpack.decode(blob) for key, blob in found.items()}

    def user_rows(self, user_id: int) -> list[tuple[str, dict[str, Any]]]:
        return [
            (cid, msgspec.msgpack.decode(blob))
            for cid, blob in self.tables.user_rows(self.partition, user_id)
        ]

    def rows_after(
        self, after: tuple[int, str] | None, limit: int
    ) -> list[tuple[tuple[int, str], dict[str, Any]]]:
        found = self.tables.rows_after(self.partition, after, limit)
        return [(key, msgspec.msgpack.decode(blob)) for key, blob in found]

    def row_key_bounds(self) -> tuple[tuple[int, str], tuple[int, str]] | None:
        return self.tables.row_key_bounds(self.partition)

    def estimated_rows(self) -> int:
        return self.tables.estimated_rows(self.partition)
