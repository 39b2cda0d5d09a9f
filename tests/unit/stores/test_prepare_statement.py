"""prepare_statement: every Cassandra store prepares its statements the same way."""

from __future__ import annotations

from typing import Any

import pytest
from cassandra import ConsistencyLevel

from app.stores.cassandra_exec import StoreError, prepare_statement


class _Prepared:
    def __init__(self, cql: str) -> None:
        self.cql = cql
        self.consistency_level: Any = None


class _Session:
    def __init__(self, missing: str | None = None) -> None:
        self.missing = missing

    def prepare(self, cql: str) -> _Prepared:
        if self.missing is not None and self.missing in cql:
            raise RuntimeError(f"unconfigured table {self.missing}")
        return _Prepared(cql)


def test_the_keyspace_and_the_named_parts_are_spliced_in_at_local_quorum() -> None:
    statement = prepare_statement(
        _Session(),
        "ks1",
        "state",
        "INSERT INTO {ks}.t ({columns}) VALUES ({marks})",
        columns="a, b",
        marks="?, ?",
    )
    assert statement.cql == "INSERT INTO ks1.t (a, b) VALUES (?, ?)"
    assert statement.consistency_level == ConsistencyLevel.LOCAL_QUORUM


def test_a_missing_table_is_a_store_error_naming_the_statements_and_the_bootstrap() -> None:
    with pytest.raises(StoreError) as refused:
        session = _Session(missing="member_remarks")
        prepare_statement(session, "ks1", "remark", "SELECT * FROM {ks}.member_remarks")
    text = str(refused.value)
    assert "cannot prepare remark statements in keyspace 'ks1'" in text
    assert "unconfigured table member_remarks" in text and "projector bootstrap" in text
    assert refused.value.__cause__ is None and refused.value.__suppress_context__
