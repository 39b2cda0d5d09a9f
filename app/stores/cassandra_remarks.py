"""Per-viewer remarks (备注) in Cassandra: the table ``member_remarks`` (app/stores/schema.py),
the production :class:`~app.members.remarks.RemarkStore`.

One partition per viewer, clustered by target: a batch read is one single-partition
``viewer_id = ? AND target_user_id IN (...)`` query of 0 to 50 targets (no scan, one replica set),
and a read can never return another viewer's remark. Writes are last-write-wins by the driver's
client timestamps (a PUT then a DELETE from one API process apply in that order).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from app.members.remarks import InvalidRemark, check_remark, check_targets
from app.stores.cassandra_exec import checked_keyspace, one_page, prepare_statement
from app.stores.schema import check_user_id


class CassandraRemarkStore:
    """The :class:`~app.members.remarks.RemarkStore` port over ``member_remarks``."""

    def __init__(self, session: Any, keyspace: str) -> None:

        self.session = session
        ks = checked_keyspace(keyspace)
        # Only the checked keyspace is spliced in; every value is a bind marker.
        statements = {
            "read": "SELECT target_user_id, remark FROM {ks}.member_remarks"
            " WHERE viewer_id = ? AND target_user_id IN ?",
            "write": "INSERT INTO {ks}.member_remarks (viewer_id, target_user_id, remark, updated_at)"
            " VALUES (?, ?, ?, ?)",
            "clear": "DELETE FROM {ks}.member_remarks WHERE viewer_id = ? AND target_user_id = ?",
        }
        prepared = {name: prepare_statement(session, ks, "remark", cql) for name, cql in statements.items()}
        self._read, self._write, self._clear = prepared["read"], prepared["write"], prepared["clear"]

    async def remarks(self, viewer_id: int, target_ids: Sequence[int]) -> dict[int, str]:
        ids = check_targets(viewer_id, target_ids)
        if not ids:
            return {}
        rows = await self._execute(self._read, (viewer_id, ids), "remarks read")
        return {int(row.target_user_id): row.remark for row in rows if row.remark is not None}

    async def set_remark(self, viewer_id: int, target_id: int, remark: str, updated_at_ms: int) -> None:
        check_user_id(viewer_id)
        check_user_id(target_id)
        if check_remark(remark) != remark:
            raise InvalidRemark("remark must be stored as check_remark returns it")
        await self._execute(self._write, (viewer_id, target_id, remark, updated_at_ms), "remark write")

    async def clear_remark(self, viewer_id: int, target_id: int) -> None:
        check_user_id(viewer_id)
        check_user_id(target_id)
        await self._execute(self._clear, (viewer_id, target_id), "remark clear")

    async def _execute(self, statement: Any, params: tuple[Any, ...], what: str) -> list[Any]:
        return await one_page(self.session, statement, params, what)
