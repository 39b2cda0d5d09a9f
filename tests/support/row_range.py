"""The unread audit's `RowRange` port (app/domain/audit.py) over a list: rows kept in key order,
each read counted (how many rows each call returned)."""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import Any

from app.domain.audit import RowKey
from app.domain.conversation import ConversationState


def key_of(row: ConversationState) -> RowKey:
    return row.user_id, row.conversation_id


class ListRange:
    """`overestimate`: `estimated_rows` says this many times the rows (RocksDB's estimate counts
    every kind of key)."""

    def __init__(self, rows: Iterable[ConversationState], overestimate: int = 1) -> None:
        self.overestimate = overestimate
        self.rows = sorted(rows, key=key_of)
        self.keys = [key_of(row) for row in self.rows]
        self.reads: list[int] = []  # rows returned, per call

    def rows_after(self, after: RowKey | None, limit: int) -> list[tuple[RowKey, list[Any]]]:
        start = 0 if after is None else bisect.bisect_right(self.keys, after)
        got = self.rows[start : start + max(limit, 0)]
        self.reads.append(len(got))
        return [(key_of(row), row.dump()) for row in got]

    def key_bounds(self) -> tuple[RowKey, RowKey] | None:
        return (self.keys[0], self.keys[-1]) if self.keys else None

    def estimated_rows(self) -> int:
        return len(self.rows) * self.overestimate
