"""The processing object's `StateSource` (app/domain/residency.py) over one partition of the
worker's `StateTables` port: records decoded here (msgpack)."""

from __future__ import annotations

from collections.abc import Collection, Iterator
from typing import Any

import msgspec

from app.worker.ports import StateTables


class TablesSource:
    """The processor's `StateSource` over one partition of the changelog tables (records decoded
    here: msgpack)."""

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

    def row_keys(self) -> Iterator[tuple[int, str]]:
        return self.tables.row_keys(self.partition)
