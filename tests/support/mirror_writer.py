"""A StateWriter over a dict standing for Cassandra, for the worker core's unit tests.

Its cells resolve as the real tables do (app/stores/cassandra_state.py): state fields and member
rows by the last write, first_seen by the lowest mailbox_seq, member statistics by the highest
mailbox_seq. `down` makes a flush fail and keep what it staged, as the real writer does. The
`cassandra` dict outlives the writer: a crash loses the writer's staging, never the table.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

Key = tuple[int, str]

# The core's attribute names, as the real writer maps them to columns.
_ALIASES = {
    "joined_at": "joined_at_conversation_seq",
    "left_at": "left_at_conversation_seq",
    "read_seq": "read_conversation_seq",
    "hidden_before": "hidden_before_conversation_seq",
    "deleted_before": "deleted_before_conversation_seq",
}


def merge(into: dict[str, Any], newer: Mapping[str, Any]) -> None:
    """Resolve `newer` writes over `into` as the tables resolve cells."""
    fields = newer.get("state")
    if fields is not None:
        state = into.setdefault("state", {})
        for name, value in fields.items():
            if not name.startswith("first_seen"):
                state[name] = value
        seq = fields.get("first_seen_mailbox_seq")
        if seq is not None and (
            "first_seen_mailbox_seq" not in state or seq < state["first_seen_mailbox_seq"]
        ):
            state["first_seen_mailbox_seq"] = seq
            state["first_seen_ts"] = fields.get("first_seen_ts")
    if newer.get("member") is not None:
        into["member"] = list(newer["member"])
    stats = newer.get("stats")
    if stats is not None and ("stats" not in into or into["stats"][2] <= stats[2]):
        into["stats"] = list(stats)


class MirrorWriter:
    def __init__(self, cassandra: dict[Key, dict[str, Any]]) -> None:
        self.cassandra = cassandra
        self.down = False
        self.pending: dict[Key, dict[str, Any]] = {}
        self.failures = 0

    def _stage(self, key: Key, writes: Mapping[str, Any]) -> None:
        merge(self.pending.setdefault(key, {}), writes)

    def stage(self, user_id: int, conversation_id: str, fields: dict[str, object]) -> None:
        self._stage((user_id, conversation_id), {"state": {_ALIASES.get(k, k): v for k, v in fields.items()}})

    def stage_member(
        self,
        conversation_id: str,
        user_id: int,
        role: str | None,
        state: str,
        joined_at: int | None,
        left_at: int | None,
    ) -> None:
        self._stage((user_id, conversation_id), {"member": [role, state, joined_at, left_at]})

    def stage_member_stats(
        self, conversation_id: str, user_id: int, record_count: int, mention_count: int, mailbox_seq: int
    ) -> None:
        self._stage((user_id, conversation_id), {"stats": [record_count, mention_count, mailbox_seq]})

    async def flush(self) -> int:
        if self.down:
            self.failures += 1
            raise RuntimeError("cassandra down")
        written, self.pending = self.pending, {}
        for key, writes in written.items():
            merge(self.cassandra.setdefault(key, {}), writes)
        return len(written)

    def owed(self) -> dict[Key, dict[str, Any]]:
        return copy.deepcopy(self.pending)

    def drop(self, keys: Iterable[Key]) -> None:
        for key in keys:
            self.pending.pop(key, None)

    def restage(self, user_id: int, conversation_id: str, owed: Mapping[str, Any]) -> None:
        key = (user_id, conversation_id)
        restaged = copy.deepcopy(dict(owed))
        newer = self.pending.get(key)
        if newer is not None:
            merge(restaged, newer)  # anything staged since wins
        self.pending[key] = restaged
