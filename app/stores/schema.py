"""The Cassandra schema, in one place: keyspace, tables and the id encodings they assume.

``projector bootstrap`` creates all of it idempotently (``CREATE ... IF NOT EXISTS``) and then adds
any column declared here that an older deployment's table lacks (``ALTER TABLE ... ADD``): adding
a column to a :class:`Table` below is a safe, forward-only migration. Renaming or retyping a column
is not (Cassandra refuses it): add a new column instead.

Id encodings (chosen once; every adapter must follow them):

* ``user_id`` / ``sender_id`` are unsigned 64-bit ints (docs/contract.md §2). They are stored as CQL
  ``varint``: exact for all of ``[0, 2^64)``, and it *sorts numerically*, which keyset paging of
  ``group_members`` by ``user_id`` (docs/contract.md §8) needs. A signed ``bigint`` would need a mapping
  that either breaks that order (two's complement puts ids >= 2^63 first) or makes every stored
  id unreadable (offset by 2^63); the python driver maps ``varint`` to ``int`` with no code at all.
* ``conversation_id`` is a CQL ``uuid`` (pass ``uuid.UUID``; the driver refuses strings).
* ``activity_id`` (32 lowercase hex chars, time-sortable) is a 16-byte ``blob``: byte order is
  time order, the same bytes the list cursor carries. Use :func:`activity_to_blob` /
  :func:`activity_from_blob`.
* Sequence numbers (conversation seqs, mailbox seqs), ``created_at`` (ms) and ``pin_rank`` (u32)
  are ``bigint``.

This module is plain data and string building: no driver import, so anything may import it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

U64_MAX = 2**64 - 1


@dataclass(frozen=True, slots=True)
class Table:
    name: str
    # (column, CQL type), in declaration order; keys first.
    columns: tuple[tuple[str, str], ...]
    partition_key: tuple[str, ...]
    clustering: tuple[tuple[str, str], ...] = ()  # (column, "ASC" | "DESC")
    comment: str = ""

    def create_cql(self, keyspace: str) -> str:
        cols = ",\n    ".join(f"{name} {cql_type}" for name, cql_type in self.columns)
        pk = "(" + ", ".join(self.partition_key) + ")"
        key = ", ".join([pk, *(c for c, _ in self.clustering)])
        cql = f"CREATE TABLE IF NOT EXISTS {keyspace}.{self.name} (\n    {cols},\n    PRIMARY KEY ({key})\n)"
        options = []
        if self.clustering:
            order = ", ".join(f"{c} {d}" for c, d in self.clustering)
            options.append(f"CLUSTERING ORDER BY ({order})")
        if self.comment:
            options.append("comment = '" + self.comment.replace("'", "''") + "'")
        if options:
            cql += " WITH " + " AND ".join(options)
        return cql

    def add_column_cql(self, keyspace: str, column: str) -> str:
        cql_type = dict(self.columns)[column]
        return f"ALTER TABLE {keyspace}.{self.name} ADD {column} {cql_type}"

    @property
    def key_columns(self) -> frozenset[str]:
        return frozenset(self.partition_key) | {c for c, _ in self.clustering}


MESSAGES = Table(
    name="messages",
    columns=(
        ("conversation_id", "uuid"),
        ("conversation_seq", "bigint"),
        ("message_id", "text"),
        ("activity_id", "blob"),
        ("sender_id", "varint"),
        ("created_at", "bigint"),
        ("counts_unread", "boolean"),
        # Users the message mentions (@all expanded, as the mailbox entries say `mention`).
        ("mentions", "set<varint>"),
        ("recalled", "boolean"),
        ("deleted", "boolean"),
    ),
    partition_key=("conversation_id",),
    # Newest first: the bounded recompute reads at most unread_precise_limit rows below `latest`,
    # and a head lookup is the partition's first row.
    clustering=(("conversation_seq", "DESC"),),
    comment="MessageStore: one row per message; unread recomputes read one partition range",
)

CONVERSATION_HEADS = Table(
    name="conversation_heads",
    columns=(
        ("conversation_id", "uuid"),
        ("latest_conversation_seq", "bigint"),
        ("last_message_id", "text"),
        ("last_activity_id", "blob"),
    ),
    partition_key=("conversation_id",),
    comment="Latest message per conversation (fills rows missing from the projection store)",
)

USER_CONVERSATION_STATE = Table(
    name="user_conversation_state",
    columns=(
        ("user_id", "varint"),
        ("conversation_id", "uuid"),
        ("membership", "text"),  # active | left | removed
        ("role", "text"),  # owner | admin | member
        ("joined_at_conversation_seq", "bigint"),
        ("left_at_conversation_seq", "bigint"),
        ("read_conversation_seq", "bigint"),
        ("hidden_before_conversation_seq", "bigint"),
        ("deleted_before_conversation_seq", "bigint"),
        ("pin_rank", "bigint"),  # null = not pinned
        ("archived", "boolean"),
        ("muted", "boolean"),
        ("first_seen_mailbox_seq", "bigint"),
        ("first_seen_ts", "bigint"),
        ("updated_mailbox_seq", "bigint"),
    ),
    partition_key=("user_id",),
    clustering=(("conversation_id", "ASC"),),
    comment="Authority for which conversations a user has; rebuild fallback",
)

GROUP_MEMBERS = Table(
    name="group_members",
    columns=(
        ("conversation_id", "uuid"),
        ("user_id", "varint"),
        ("role", "text"),  # owner | admin | member
        ("state", "text"),  # active | left | removed
        ("joined_at_conversation_seq", "bigint"),
        ("left_at_conversation_seq", "bigint"),
    ),
    partition_key=("conversation_id",),
    # Ascending user_id: the member directory pages by `user_id > after_user_id`.
    clustering=(("user_id", "ASC"),),
    comment="Member directory: members of a group, keyset-paged by user_id",
)

MEMBER_STATS = Table(
    name="member_stats",
    columns=(
        ("conversation_id", "uuid"),
        ("user_id", "varint"),
        # Absolute values derived by the worker from per-(group, user) seq bitmaps (app/members/
        # stats.py), never increments: a replayed entry rewrites the same value. Each write is
        # stamped USING TIMESTAMP <mailbox_seq of the entry that produced it>, so a replay of an
        # older state can never overwrite a newer one (last-write-wins = highest mailbox_seq).
        ("record_count", "bigint"),  # the member's messages here, recalled/deleted ones excluded
        ("mention_count", "bigint"),  # messages mentioning the member (@all included), same rule
        ("stats_mailbox_seq", "bigint"),
    ),
    partition_key=("conversation_id",),
    # Same partition/clustering as group_members: the presentation call reads the statistics of
    # its (at most 50) members with one single-partition `user_id IN (...)` query.
    clustering=(("user_id", "ASC"),),
    comment="Member statistics (member directory presentation), absolute values from the stream",
)

CONVERSATIONS_DISABLED = Table(
    name="conversations_disabled",
    columns=(
        ("conversation_id", "uuid"),
        ("disabled_at", "bigint"),  # ms since epoch
        ("reason", "text"),
    ),
    partition_key=("conversation_id",),
    comment="A row = the conversation is disabled: member reads answer 2002 (no mailbox entry carries it)",
)

GROUP_SETTINGS = Table(
    name="group_settings",
    columns=(
        ("conversation_id", "uuid"),
        # group.settings (seed 004): admin capabilities come only from here. Keys and values:
        # app/members/model.py CAPABILITY_DEFAULTS (the lowest role allowed, or "nobody").
        ("settings", "map<text, text>"),
        ("updated_at", "bigint"),  # ms since epoch
    ),
    partition_key=("conversation_id",),
    comment="Group settings (member directory capabilities); written by the chat backend's administration",
)

MEMBER_PROFILES = Table(
    name="member_profiles",
    columns=(
        ("user_id", "varint"),
        ("display_name", "text"),
        ("avatar_url", "text"),
        ("updated_at", "bigint"),  # ms since epoch
    ),
    partition_key=("user_id",),
    comment="Public profiles (names, avatars) for /api/v1/users/profiles; `projector profiles load`",
)

MEMBER_REMARKS = Table(
    name="member_remarks",
    columns=(
        ("viewer_id", "varint"),  # whose remark: only this user ever reads it
        ("target_user_id", "varint"),  # about whom
        ("remark", "text"),  # app/members/remarks.py check_remark: 1..64 characters, no controls
        ("updated_at", "bigint"),  # ms since epoch
    ),
    # One partition per viewer: the presentation call reads the remarks on its (at most 50)
    # members with one single-partition `target_user_id IN (...)` query.
    partition_key=("viewer_id",),
    clustering=(("target_user_id", "ASC"),),
    comment="Per-viewer remarks (备注) for the member presentation; PUT/DELETE /api/v1/users/{id}/remark",
)

TABLES: tuple[Table, ...] = (
    MESSAGES,
    CONVERSATION_HEADS,
    USER_CONVERSATION_STATE,
    GROUP_MEMBERS,
    MEMBER_STATS,
    CONVERSATIONS_DISABLED,
    GROUP_SETTINGS,
    MEMBER_PROFILES,
    MEMBER_REMARKS,
)


def create_keyspace_cql(
    keyspace: str, replication_factor: int, per_dc: Mapping[str, int] | None = None
) -> str:
    """SimpleStrategy with ``replication_factor`` copies (one data center: local runs, the
    compose stack), or NetworkTopologyStrategy with ``per_dc`` copies in each named data center
    (a fleet; PROJECTOR_CASSANDRA_LOCAL_DC / _REPLICATION_PER_DC). An existing keyspace is left
    as it is: changing replication is an operator's ALTER KEYSPACE plus a repair."""
    if per_dc:
        copies = ", ".join(f"'{dc}': {int(rf)}" for dc, rf in sorted(per_dc.items()))
        strategy = f"{{'class': 'NetworkTopologyStrategy', {copies}}}"
    else:
        strategy = f"{{'class': 'SimpleStrategy', 'replication_factor': {int(replication_factor)}}}"
    return f"CREATE KEYSPACE IF NOT EXISTS {keyspace} WITH replication = {strategy} AND durable_writes = true"


def check_user_id(user_id: int) -> int:
    """The value to bind for a ``varint`` user id column (rejects what is not a u64)."""
    if isinstance(user_id, bool) or not isinstance(user_id, int) or not 0 <= user_id <= U64_MAX:
        raise ValueError(f"user id must be an int in [0, 2^64), got {user_id!r}")
    return user_id


def activity_to_blob(activity_id: str) -> bytes:
    """32 lowercase hex chars -> the 16 bytes stored in ``activity_id`` / ``last_activity_id``."""
    if len(activity_id) != 32:
        raise ValueError(f"activity_id must be 32 hex chars, got {activity_id!r}")
    return bytes.fromhex(activity_id)


def activity_from_blob(blob: bytes) -> str:
    if len(blob) != 16:
        raise ValueError(f"stored activity_id must be 16 bytes, got {len(blob)}")
    return blob.hex()
