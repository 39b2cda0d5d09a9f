"""Real Cassandra: create, insert, single-partition range read; the project schema's encodings."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from app.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_create_insert_and_range_read(cassandra_session: Any, keyspace: str) -> None:
    s = cassandra_session
    s.execute(
        f"CREATE TABLE {keyspace}.msgs (c uuid, seq bigint, body text, PRIMARY KEY ((c), seq))"
        " WITH CLUSTERING ORDER BY (seq DESC)"
    )
    c1, c2 = uuid.uuid4(), uuid.uuid4()
    insert = s.prepare(f"INSERT INTO {keyspace}.msgs (c, seq, body) VALUES (?, ?, ?)")
    for seq in range(1, 21):
        s.execute(insert, (c1, seq, f"m{seq}"))
        s.execute(insert, (c2, seq, f"other{seq}"))
    # The unread recompute's query shape: one partition, base < seq <= latest.
    rows = s.execute(
        f"SELECT seq, body FROM {keyspace}.msgs WHERE c = %s AND seq > %s AND seq <= %s",
        (c1, 5, 12),
    )
    got = [(r.seq, r.body) for r in rows]
    assert got == [(seq, f"m{seq}") for seq in range(12, 5, -1)]


def test_project_schema_is_idempotent_and_migrates_columns(
    servers: Settings, cassandra_session: Any, unique_name: Any
) -> None:
    from app.cli.bootstrap import ensure_cassandra_schema
    from app.stores.schema import TABLES

    ks = unique_name("schema", sep="_")
    try:
        first = ensure_cassandra_schema(servers.cassandra, keyspace=ks)
        assert first.created_keyspace
        assert first.created_tables == [t.name for t in TABLES]
        second = ensure_cassandra_schema(servers.cassandra, keyspace=ks)
        assert not second.created_keyspace
        assert second.created_tables == [] and second.added_columns == []
        assert second.existing_tables == [t.name for t in TABLES]
        # A deployment created by an older version lacks a column: bootstrap adds it.
        cassandra_session.execute(f"ALTER TABLE {ks}.user_conversation_state DROP muted")
        third = ensure_cassandra_schema(servers.cassandra, keyspace=ks)
        assert third.added_columns == ["user_conversation_state.muted"]
    finally:
        cassandra_session.execute(f"DROP KEYSPACE IF EXISTS {ks}")


def test_schema_encodings_u64_users_and_activity_blobs(
    servers: Settings, cassandra_session: Any, unique_name: Any
) -> None:
    from app.cli.bootstrap import ensure_cassandra_schema
    from app.stores.schema import U64_MAX, activity_from_blob, activity_to_blob, check_user_id

    ks = unique_name("enc", sep="_")
    s = cassandra_session
    try:
        ensure_cassandra_schema(servers.cassandra, keyspace=ks)
        conv = uuid.uuid4()
        # varint user ids: the whole u64 range, sorted numerically (keyset paging of members).
        users = [U64_MAX, 2**63, 2**63 - 1, 7, 0]
        add = s.prepare(f"INSERT INTO {ks}.group_members (conversation_id, user_id, role) VALUES (?, ?, ?)")
        for u in users:
            s.execute(add, (conv, check_user_id(u), "member"))
        page = s.execute(
            f"SELECT user_id FROM {ks}.group_members WHERE conversation_id = %s AND user_id > %s LIMIT 3",
            (conv, 0),
        )
        assert [r.user_id for r in page] == [7, 2**63 - 1, 2**63]

        activity = "0123456789abcdef0123456789abcdef"
        s.execute(
            f"INSERT INTO {ks}.messages (conversation_id, conversation_seq, message_id, activity_id,"
            " sender_id, created_at, counts_unread, mentions, recalled, deleted)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (
                conv,
                1,
                "m1",
                activity_to_blob(activity),
                U64_MAX,
                1_700_000_000_000,
                True,
                {U64_MAX, 3},
                False,
                False,
            ),
        )
        row = s.execute(
            f"SELECT * FROM {ks}.messages WHERE conversation_id = %s AND conversation_seq = 1",
            (conv,),
        ).one()
        assert activity_from_blob(row.activity_id) == activity
        assert row.sender_id == U64_MAX and row.mentions == {3, U64_MAX}
        with pytest.raises(ValueError):
            check_user_id(2**64)
    finally:
        s.execute(f"DROP KEYSPACE IF EXISTS {ks}")
