"""The `StateWriter` port over dicts standing for Cassandra: the test double of
`app.stores.cassandra_state.UserConversationStateWriter` in the worker core's unit tests.

It stages through the writer's own code (`StateStaging` in app/stores/cassandra_state.py: the
field names and the core's aliases, the checks, the first-seen merge, the member and statistics rows),
and `MirrorCassandra` resolves cells as the real tables do: state columns and member rows by the
last write, first_seen by the lowest mailbox_seq (each of its two cells on its own), member
statistics by the highest mailbox_seq. `down` makes a flush fail with StoreError and keep what it
staged, as the real writer does. The `MirrorCassandra` outlives the writer: a crash loses the
writer's staging, never the tables. tests/contract/test_state_writer_contract.py runs one suite
against this double and the real writer on Cassandra.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from app.stores.cassandra_exec import StoreError
from app.stores.cassandra_state import (
    ALIASES,
    FIRST_SEEN_FIELDS,
    MemberKey,
    MemberStatsRow,
    StateKey,
    StateStaging,
    canonical_conversation_id,
    check_state_fields,
    checked_member_row,
    merge_first_seen,
)
from app.stores.schema import check_user_id


@dataclass
class MirrorCassandra:
    """What the three tables hold: user_conversation_state rows (column -> value; a column
    never written is absent), group_members rows, member_stats rows."""

    state: dict[StateKey, dict[str, Any]] = field(default_factory=dict)
    members: dict[MemberKey, dict[str, Any]] = field(default_factory=dict)
    member_stats: dict[MemberKey, MemberStatsRow] = field(default_factory=dict)
    # The mailbox_seq stamped on the first_seen_ts cell (its write timestamp is 2^50 - seq).
    first_seen_ts_seq: dict[StateKey, int] = field(default_factory=dict)

    def write_state(self, key: StateKey, fields: Mapping[str, Any]) -> None:
        row = self.state.setdefault(key, {})  # an INSERT: the row exists even with no values
        for name, value in fields.items():
            if name not in FIRST_SEEN_FIELDS:
                row[name] = value
        seq = fields.get("first_seen_mailbox_seq")
        if seq is None:
            return
        # Each first_seen cell keeps the write with the lowest seq (the newest cell timestamp).
        if row.get("first_seen_mailbox_seq") is None or seq < row["first_seen_mailbox_seq"]:
            row["first_seen_mailbox_seq"] = seq
        if "first_seen_ts" in fields and seq < self.first_seen_ts_seq.get(key, seq + 1):
            row["first_seen_ts"] = fields["first_seen_ts"]
            self.first_seen_ts_seq[key] = seq

    def write_member_stats(self, key: MemberKey, values: MemberStatsRow) -> None:
        stored = self.member_stats.get(key)
        if stored is None or stored[2] <= values[2]:  # USING TIMESTAMP mailbox_seq
            self.member_stats[key] = values


class MirrorWriter(StateStaging):
    def __init__(self, cassandra: MirrorCassandra) -> None:
        self.cassandra = cassandra
        self.down = False
        self.failures = 0
        super().__init__()

    async def flush(self) -> int:
        if self.down:
            self.failures += 1
            raise StoreError("cassandra flush failed: down (test double)")
        state, members, stats = self._state, self._members, self._member_stats
        self._state, self._members, self._member_stats = {}, {}, {}
        for key, fields in state.items():
            self.cassandra.write_state(key, fields)
        for member_key, row in members.items():
            self.cassandra.members[member_key] = dict(row)
        for member_key, values in stats.items():
            self.cassandra.write_member_stats(member_key, values)
        return len(state) + len(members) + len(stats)

    def owed(self) -> dict[StateKey, dict[str, Any]]:
        owed: dict[StateKey, dict[str, Any]] = {}
        for key, fields in self._state.items():
            owed[key] = {"state": copy.deepcopy(fields)}
        for (conversation_id, user_id), row in self._members.items():
            owed.setdefault((user_id, conversation_id), {})["member"] = dict(row)
        for (conversation_id, user_id), values in self._member_stats.items():
            owed.setdefault((user_id, conversation_id), {})["stats"] = list(values)
        return owed

    def restage(self, user_id: int, conversation_id: str, owed: Mapping[str, Any]) -> None:
        """What `owed` returned, staged again under anything staged since (which wins, but the
        lowest first_seen stays)."""
        fields = owed.get("state")
        if fields:
            check_state_fields(fields)
            key = (check_user_id(user_id), canonical_conversation_id(conversation_id))
            restaged = {ALIASES.get(name, name): value for name, value in fields.items()}
            newer = self._state.get(key)
            if newer is not None:
                merged = {**restaged, **{k: v for k, v in newer.items() if k not in FIRST_SEEN_FIELDS}}
                for source in (restaged, newer):
                    if "first_seen_mailbox_seq" in source:
                        merge_first_seen(merged, source)
                restaged = merged
            self._state[key] = restaged
        member = owed.get("member")
        if member is not None:
            member_key = (canonical_conversation_id(conversation_id), check_user_id(user_id))
            self._members.setdefault(member_key, checked_member_row(member))
        stats = owed.get("stats")
        if stats is not None:
            self.stage_member_stats(conversation_id, user_id, *stats)

    def drop(self, keys: Iterable[StateKey]) -> None:
        for user_id, conversation_id in keys:
            cid = canonical_conversation_id(conversation_id)
            self._state.pop((user_id, cid), None)
            self._members.pop((cid, user_id), None)
            self._member_stats.pop((cid, user_id), None)
