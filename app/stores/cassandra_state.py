"""UserConversationState and the group member directory in Cassandra (app/stores/schema.py).

``user_conversation_state`` is the authority for *which* conversations a user has (docs/contract.md §5)
and the rebuild fallback when the mailbox log is past retention (§6); ``group_members`` backs the
member directory (§8). The worker keeps the live state in its changelog tables and mirrors it
here after each batch (one background writer task, a round of whatever was staged meanwhile,
waited for before the state is persisted), so the writer is built for that rhythm:

* ``stage``/``stage_member`` only accumulate in memory (last write per key wins within a batch,
  field by field); ``flush`` writes everything staged at once: one statement per row, rows of
  one partition folded into a single-partition UNLOGGED batch, bounded concurrency. Never one
  round trip per entry.
* A field not staged is *left alone* in Cassandra (bound as UNSET: no cell, no tombstone); a
  field staged as ``None`` is cleared (``left_at`` on rejoin, ``pin_rank`` on unpin).
* Rows are written with INSERT, not UPDATE: an INSERT also writes the row marker, so a known
  conversation stays listed in the authority even when all its staged values are null.
* ``first_seen_mailbox_seq`` / ``first_seen_ts`` keep the *first* appearance, i.e. the lowest
  ``first_seen_mailbox_seq`` (within a batch, and in Cassandra forever) without a read and
  without LWT: they are written ``USING TIMESTAMP 2^50 - first_seen_mailbox_seq``, so a lower
  seq has the newer cell timestamp and last-write-wins keeps it. A replay after a crash, or a
  rebuild from a truncated log that restages a later "first" appearance, cannot move it. An LWT
  (``IF first_seen_mailbox_seq = null``) did the same at ~20x the cost (measured on one node:
  5,000 new rows flushed in 7.3 s vs 0.3 s), and a new 1,000-member group makes 1,000 new rows
  at once. The ceiling 2^50 µs (year 2005) is below any wall-clock timestamp, so an ordinary
  DELETE of a row still removes these cells; the price is that a row re-created after such a
  DELETE cannot get its first_seen back until the tombstone is purged (the product never
  deletes these rows). Everything else is a plain idempotent upsert: re-flushing the same batch
  writes the same values.
* ``stage_member_stats`` stages the member directory's statistics (app/members/stats.py) as
  absolute values written ``USING TIMESTAMP <mailbox_seq>`` of the entry that produced them:
  re-writing is harmless and an older state can never overwrite a newer one (no counters:
  they are not idempotent).
* A failed flush puts its rows back (under anything staged since), raises
  :class:`~app.stores.cassandra_exec.StoreError`, and can simply be retried.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any

from app.domain.conversation_ids import conversation_uuid
from app.stores.cassandra_exec import (
    BATCH_PARTITIONS,
    CONCURRENCY,
    StoreError,
    Write,
    checked_keyspace,
    execute_all,
    execute_all_async,
    group_by_partition,
    prepare_statement,
    replica_sets,
)
from app.stores.schema import GROUP_MEMBERS, USER_CONVERSATION_STATE, check_user_id

FIRST_SEEN_FIELDS = ("first_seen_mailbox_seq", "first_seen_ts")
# first_seen cells are stamped FIRST_SEEN_CEILING - first_seen_mailbox_seq (see the docstring).
FIRST_SEEN_CEILING = 2**50
# Every non-key column but the write-once ones, in schema order.
STATE_FIELDS: tuple[str, ...] = tuple(
    name
    for name, _ in USER_CONVERSATION_STATE.columns
    if name not in USER_CONVERSATION_STATE.key_columns and name not in FIRST_SEEN_FIELDS
)
MEMBER_FIELDS: tuple[str, ...] = tuple(
    name for name, _ in GROUP_MEMBERS.columns if name not in GROUP_MEMBERS.key_columns
)
# The core's ConversationState attribute names, accepted as they are (the worker stages
# `{name: getattr(row, name)}`); every other field goes by its column name.
ALIASES: dict[str, str] = {
    "joined_at": "joined_at_conversation_seq",
    "left_at": "left_at_conversation_seq",
    "read_seq": "read_conversation_seq",
    "hidden_before": "hidden_before_conversation_seq",
    "deleted_before": "deleted_before_conversation_seq",
}
_KNOWN_FIELDS = frozenset(STATE_FIELDS) | frozenset(FIRST_SEEN_FIELDS) | frozenset(ALIASES)
_MEMBERSHIPS = frozenset({"active", "left", "removed"})
_ROLES = frozenset({"owner", "admin", "member"})

StateKey = tuple[int, str]  # (user_id, conversation_id)
MemberKey = tuple[str, int]  # (conversation_id, user_id)
INT64_MAX = 2**63 - 1
MemberStatsRow = tuple[int, int, int]  # (record_count, mention_count, mailbox_seq)
_Staged = tuple[
    dict[StateKey, dict[str, Any]], dict[MemberKey, dict[str, Any]], dict[MemberKey, MemberStatsRow]
]


class StateStaging:
    """The staging rules, one copy: what a flush writes next, per (user, conversation) state row,
    member row and member statistics row. The Cassandra writer below and its test double
    (tests/support/mirror_writer.py) both stage through them."""

    _state: dict[StateKey, dict[str, Any]]
    _members: dict[MemberKey, dict[str, Any]]
    _member_stats: dict[MemberKey, MemberStatsRow]

    def __init__(self) -> None:
        self._state = {}
        self._members = {}
        self._member_stats = {}

    def stage(self, user_id: int, conversation_id: str, fields: Mapping[str, Any]) -> None:
        """Stage state fields for (user, conversation); later stages of a field win, except
        ``first_seen_*`` (the pair with the lowest ``first_seen_mailbox_seq`` wins). Fields are
        column names or the core's short names (:data:`ALIASES`: ``read_seq``, ``joined_at``)."""
        check_state_fields(fields)
        key = (check_user_id(user_id), canonical_conversation_id(conversation_id))
        staged = self._state.get(key)
        if staged is None:
            staged = self._state[key] = {}
        for name, value in fields.items():
            name = ALIASES.get(name, name)
            if name not in FIRST_SEEN_FIELDS:
                staged[name] = value
        if "first_seen_mailbox_seq" in fields:
            merge_first_seen(staged, fields)

    def stage_member(
        self,
        conversation_id: str,
        user_id: int,
        role: str | None,
        state: str,
        joined_at: int | None,
        left_at: int | None,
    ) -> None:
        """Stage a member directory row from a join or leave (the whole row: last one wins)."""
        row = {
            "role": role,
            "state": state,
            "joined_at_conversation_seq": joined_at,
            "left_at_conversation_seq": left_at,
        }
        key = (canonical_conversation_id(conversation_id), check_user_id(user_id))
        self._members[key] = checked_member_row(row)

    def stage_member_stats(
        self, conversation_id: str, user_id: int, record_count: int, mention_count: int, mailbox_seq: int
    ) -> None:
        """Stage a member's statistics (absolute values, from the entry ``mailbox_seq``); the
        highest ``mailbox_seq`` staged for a member wins, here and in Cassandra."""
        values = checked_member_stats(record_count, mention_count, mailbox_seq)
        key = (canonical_conversation_id(conversation_id), check_user_id(user_id))
        staged = self._member_stats.get(key)
        if staged is None or staged[2] <= values[2]:
            self._member_stats[key] = values


class UserConversationStateWriter(StateStaging):
    """Stages per-(user, conversation) state and member rows; writes them in one flush."""

    def __init__(
        self,
        session: Any,
        keyspace: str,
        *,
        concurrency: int = CONCURRENCY,
        batch_partitions: int = BATCH_PARTITIONS,
    ) -> None:

        self.session = session
        self.keyspace = ks = checked_keyspace(keyspace)
        self.concurrency = concurrency
        # Most users' rows in a round are one or two rows of one partition: alone, each was a
        # request of its own (app/stores/cassandra_exec.py says what that cost).
        self.batch_partitions = batch_partitions
        self._replica_set = _partition_replicas(session, ks)
        super().__init__()
        # The share of the round being written (asyncio flush): owed until acknowledged.
        self._in_flight: _Staged | None = None

        def prepare(template: str, **parts: str) -> Any:
            return prepare_statement(session, ks, "state", template, **parts)

        state_columns = ", ".join(("user_id", "conversation_id", *STATE_FIELDS))
        marks = ", ".join("?" * (2 + len(STATE_FIELDS)))
        self._upsert_state = prepare(
            "INSERT INTO {ks}.user_conversation_state ({columns}) VALUES ({marks})",
            columns=state_columns,
            marks=marks,
        )
        self._first_seen = prepare(
            "UPDATE {ks}.user_conversation_state USING TIMESTAMP ?"
            " SET first_seen_mailbox_seq = ?, first_seen_ts = ?"
            " WHERE user_id = ? AND conversation_id = ?"
        )
        member_columns = ", ".join(("conversation_id", "user_id", *MEMBER_FIELDS))
        member_marks = ", ".join("?" * (2 + len(MEMBER_FIELDS)))
        self._upsert_member = prepare(
            "INSERT INTO {ks}.group_members ({columns}) VALUES ({marks})",
            columns=member_columns,
            marks=member_marks,
        )
        self._upsert_member_stats = prepare(
            "INSERT INTO {ks}.member_stats"
            " (conversation_id, user_id, record_count, mention_count, stats_mailbox_seq)"
            " VALUES (?, ?, ?, ?, ?) USING TIMESTAMP ?"
        )
        self._load_user = prepare("SELECT * FROM {ks}.user_conversation_state WHERE user_id = ?")
        self._user_ids = prepare("SELECT DISTINCT user_id FROM {ks}.user_conversation_state")
        self._load_members = prepare("SELECT * FROM {ks}.group_members WHERE conversation_id = ?")

    # -- staging ---------------------------------------------------------------------------------

    def owed(self) -> dict[StateKey, dict[str, Any]]:
        """What is staged or being written and not acknowledged yet, per (user, conversation):
        ``state`` (the fields),
        ``member`` (the group_members row) and ``stats`` ([record_count, mention_count, seq]).
        Plain values, so the worker can keep them in a changelog record; :meth:`restage` takes
        them back after a restart."""
        state, members, member_stats = dict(self._state), dict(self._members), dict(self._member_stats)
        if self._in_flight is not None:
            # A round writing now may still fail: until it is done, its share is owed too.
            _merge_older((state, members, member_stats), self._in_flight)
        owed: dict[StateKey, dict[str, Any]] = {}
        for key, fields in state.items():
            owed[key] = {"state": dict(fields)}
        for (conversation_id, user_id), row in members.items():
            owed.setdefault((user_id, conversation_id), {})["member"] = dict(row)
        for (conversation_id, user_id), values in member_stats.items():
            owed.setdefault((user_id, conversation_id), {})["stats"] = list(values)
        return owed

    def restage(self, user_id: int, conversation_id: str, owed: Mapping[str, Any]) -> None:
        """Stage again what :meth:`owed` returned (anything staged since for the key wins)."""
        fields = owed.get("state")
        if fields:
            check_state_fields(fields)
            key = (check_user_id(user_id), canonical_conversation_id(conversation_id))
            self._restore({key: {ALIASES.get(name, name): value for name, value in fields.items()}}, {})
        member = owed.get("member")
        if member is not None:
            member_key = (canonical_conversation_id(conversation_id), check_user_id(user_id))
            self._members.setdefault(member_key, checked_member_row(member))
        stats = owed.get("stats")
        if stats is not None:
            record_count, mention_count, mailbox_seq = stats
            self.stage_member_stats(conversation_id, user_id, record_count, mention_count, mailbox_seq)

    def drop(self, keys: Iterable[StateKey]) -> None:
        """Forget what is staged for these (user, conversation) keys: another writer took them
        over (a partition handed to another worker, which restages them from its changelog)."""
        parts = [(self._state, self._members, self._member_stats)]
        if self._in_flight is not None:  # a failing round must not restore them
            parts.append(self._in_flight)
        for user_id, conversation_id in keys:
            cid = canonical_conversation_id(conversation_id)
            for state, members, member_stats in parts:
                state.pop((user_id, cid), None)
                members.pop((cid, user_id), None)
                member_stats.pop((cid, user_id), None)

    @property
    def staged(self) -> int:
        """Rows waiting for the next flush (state rows + member rows + member statistics)."""
        return len(self._state) + len(self._members) + len(self._member_stats)

    # -- flushing --------------------------------------------------------------------------------

    async def flush(self) -> int:
        """Write everything staged; returns the number of rows written (state + members).
        Does not block the event loop."""
        staged = self._take()
        statements = self._statements(*staged)
        self._in_flight = staged
        try:
            await execute_all_async(
                self.session, statements, what="state flush", concurrency=self.concurrency
            )
        except StoreError:
            self._restore(*staged)
            raise
        finally:
            self._in_flight = None
        return sum(len(part) for part in staged)

    def flush_sync(self) -> int:
        """:meth:`flush` for callers without an event loop (rebuild tools, scripts)."""
        staged = self._take()
        statements = self._statements(*staged)
        try:
            execute_all(self.session, statements, what="state flush", concurrency=self.concurrency)
        except StoreError:
            self._restore(*staged)
            raise
        return sum(len(part) for part in staged)

    def _take(self) -> _Staged:
        # Swap the staging dicts out first: stages made while the flush is in flight go to the
        # next one instead of being half-written by this one.
        staged = self._state, self._members, self._member_stats
        self._state, self._members, self._member_stats = {}, {}, {}
        return staged

    def _restore(
        self,
        state: dict[StateKey, dict[str, Any]],
        members: dict[MemberKey, dict[str, Any]],
        member_stats: dict[MemberKey, MemberStatsRow] | None = None,
    ) -> None:
        _merge_older((self._state, self._members, self._member_stats), (state, members, member_stats or {}))

    def _statements(
        self,
        state: dict[StateKey, dict[str, Any]],
        members: dict[MemberKey, dict[str, Any]],
        member_stats: dict[MemberKey, MemberStatsRow] | None = None,
    ) -> list[tuple[Any, Any]]:
        from cassandra.query import UNSET_VALUE

        writes: list[Write] = []
        for (user_id, conversation_id), fields in state.items():
            cid = conversation_uuid(conversation_id)
            first_seen = fields.get("first_seen_mailbox_seq")
            if first_seen is None or any(name in fields for name in STATE_FIELDS):
                # An INSERT even with nothing else staged: the row is known, its marker must exist.
                params = (user_id, cid, *(fields.get(name, UNSET_VALUE) for name in STATE_FIELDS))
                writes.append((user_id, self._upsert_state, params))
            if first_seen is not None:
                # Same partition, so it joins the row's batch; its own timestamp (allowed in a
                # batch that sets none) makes the lowest seq win.
                params = (
                    FIRST_SEEN_CEILING - first_seen,
                    first_seen,
                    fields.get("first_seen_ts", UNSET_VALUE),
                    user_id,
                    cid,
                )
                writes.append((user_id, self._first_seen, params))
        for (conversation_id, user_id), row in members.items():
            cid = conversation_uuid(conversation_id)
            params = (cid, user_id, *(row[name] for name in MEMBER_FIELDS))
            writes.append((cid, self._upsert_member, params))
        for (conversation_id, user_id), (record, mention, seq) in (member_stats or {}).items():
            cid = conversation_uuid(conversation_id)
            # Keyed apart from group_members: same uuid, but another table is another partition.
            params = (cid, user_id, record, mention, seq, seq)
            writes.append((("member_stats", cid), self._upsert_member_stats, params))
        return group_by_partition(
            writes, batch_partitions=self.batch_partitions, replica_set=self._replica_set
        )

    # -- reading ---------------------------------------------------------------------------------

    def load_user(self, user_id: int) -> list[dict[str, Any]]:
        """Every state row of one user (one single-partition query), ordered by conversation_id
        as stored; ``conversation_id`` as the canonical string, unset columns as None."""
        rows = self._read(self._load_user, (check_user_id(user_id),), "load_user")
        return [_row_dict(row) for row in rows]

    def user_ids(self) -> list[int]:
        """Every user with state (a scan of the table's partition keys: rebuild, not serving)."""
        return sorted(int(row.user_id) for row in self._read(self._user_ids, (), "user_ids"))

    def load_members(self, conversation_id: str) -> list[dict[str, Any]]:
        """Every member row of one conversation, ascending user_id (tests, small groups; the
        member API pages with its own keyset query)."""
        rows = self._read(self._load_members, (uuid.UUID(conversation_id),), "load_members")
        return [_row_dict(row) for row in rows]

    def _read(self, statement: Any, params: tuple[Any, ...], what: str) -> list[Any]:
        try:
            return list(self.session.execute(statement, params))  # pages are fetched as needed
        except Exception as exc:  # driver errors have no common base worth naming
            raise StoreError(f"cassandra {what} failed: {type(exc).__name__}: {exc}") from None


def _partition_replicas(session: Any, keyspace: str) -> Callable[[Hashable], Hashable]:
    """A `_statements` partition key -> the nodes holding that partition. Every table here has a
    one-column partition key, a user id (varint) or a conversation id (uuid): its routing key is
    that value serialized as the driver does."""
    from cassandra.marshal import varint_pack

    replica_set = replica_sets(session, keyspace)

    def replicas(key: Hashable) -> Hashable:
        value = key[1] if isinstance(key, tuple) else key  # ("member_stats", cid): keyed apart
        return replica_set(value.bytes if isinstance(value, uuid.UUID) else varint_pack(value))

    return replicas


def _merge_older(into: _Staged, older: _Staged) -> None:
    """Add what was staged before (`older`: a failed or in-flight round's share) under what was
    staged since (`into`): the later values win, the first appearance is the lowest seq."""
    state, members, member_stats = into
    for key, fields in older[0].items():
        newer = state.get(key)
        if newer is not None:
            merged = {**fields, **{k: v for k, v in newer.items() if k not in FIRST_SEEN_FIELDS}}
            for source in (fields, newer):
                if "first_seen_mailbox_seq" in source:
                    merge_first_seen(merged, source)
            fields = merged
        state[key] = fields
    for member_key, row in older[1].items():
        members.setdefault(member_key, row)
    for member_key, values in older[2].items():
        staged_since = member_stats.get(member_key)
        if staged_since is None or staged_since[2] < values[2]:
            member_stats[member_key] = values


# The staging rules below are public: the writer's test double (tests/support/mirror_writer.py)
# stages by them too, and one contract suite (tests/contract/test_state_writer_contract.py) holds
# both to the same behaviour.


def merge_first_seen(staged: dict[str, Any], fields: Mapping[str, Any]) -> None:
    """The first appearance is the lowest mailbox_seq: keep the pair with the lower seq."""
    seq = fields["first_seen_mailbox_seq"]
    if staged.get("first_seen_mailbox_seq") is None or seq < staged["first_seen_mailbox_seq"]:
        staged["first_seen_mailbox_seq"] = seq
        if "first_seen_ts" in fields:
            staged["first_seen_ts"] = fields["first_seen_ts"]
        else:
            staged.pop("first_seen_ts", None)


def canonical_conversation_id(conversation_id: str) -> str:
    # One key per conversation however the caller spells it (ValueError when not a UUID).
    return str(uuid.UUID(conversation_id))


def check_state_fields(fields: Mapping[str, Any]) -> None:
    unknown = fields.keys() - _KNOWN_FIELDS
    if unknown:
        raise ValueError(f"unknown user_conversation_state fields: {sorted(unknown)}")
    _check_choice("membership", fields.get("membership"), _MEMBERSHIPS)
    _check_choice("role", fields.get("role"), _ROLES)
    if "first_seen_ts" in fields or "first_seen_mailbox_seq" in fields:
        seq = fields.get("first_seen_mailbox_seq")
        # The seq is the cell timestamp's source: it must come with the ts, as a real seq.
        if isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq < FIRST_SEEN_CEILING:
            raise ValueError(f"first_seen_* needs first_seen_mailbox_seq as an int in [0, 2^50), got {seq!r}")


def checked_member_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A group_members row (MEMBER_FIELDS), its role and state checked."""
    _check_choice("role", row.get("role"), _ROLES)
    _check_choice("state", row.get("state"), _MEMBERSHIPS)
    return {name: row.get(name) for name in MEMBER_FIELDS}


def checked_member_stats(record_count: int, mention_count: int, mailbox_seq: int) -> MemberStatsRow:
    """A member_stats row (record_count, mention_count, mailbox_seq), checked; the seq clamped to
    what a write timestamp holds."""
    for name, value in (("record_count", record_count), ("mention_count", mention_count)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    if isinstance(mailbox_seq, bool) or not isinstance(mailbox_seq, int) or not 0 < mailbox_seq < 2**64:
        raise ValueError(f"mailbox_seq must be a positive u64, got {mailbox_seq!r}")
    # A write timestamp (and the bigint column) holds 63 bits: the u64 contract's top half is
    # clamped. Seqs that far up would only tie with each other (then the larger values win,
    # Cassandra's tie rule); a worker must never stop on a valid entry over it.
    return record_count, mention_count, min(mailbox_seq, INT64_MAX)


def _check_choice(name: str, value: Any, allowed: frozenset[str]) -> None:
    if value is not None and value not in allowed:
        raise ValueError(f"{name} must be one of {sorted(allowed)}, got {value!r}")


def _row_dict(row: Any) -> dict[str, Any]:
    out: dict[str, Any] = row._asdict()
    out["conversation_id"] = str(out["conversation_id"])
    return out
