"""`group_by_partition` (app/stores/cassandra_exec.py): which rows go to Cassandra together.

A batch may take several partitions only when they share their replicas, never more of them
than asked, never more rows than `batch_rows`, and a partition's rows are never split between
requests unless they alone exceed `batch_rows` (a partition's batch is its atomic write)."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from cassandra.query import BatchStatement, SimpleStatement
from hypothesis import given
from hypothesis import strategies as st

from app.stores.cassandra_exec import CELL_BYTES, estimated_size, group_by_partition

# A plain statement whose bound text is its values: a batch keeps that text, so the test reads
# back which rows each request carries (a prepared statement needs a server).
STATEMENT = SimpleStatement("ROW %s %s")


def rows_of(request: tuple[Any, Any]) -> list[tuple[Any, tuple[int, int]]]:
    statement, params = request
    if isinstance(statement, BatchStatement):
        assert params == ()
        rows = []
        for _, text, _ in statement._statements_and_parameters:  # (prepared?, text, values)
            _, key, index = text.split()
            rows.append((STATEMENT, (int(key), int(index))))
        return rows
    assert statement is STATEMENT
    return [(statement, tuple(params))]


def writes_for(keys: list[int]) -> list[tuple[Hashable, Any, tuple[int, int]]]:
    # The values carry (partition key, position in the input).
    return [(key, STATEMENT, (key, i)) for i, key in enumerate(keys)]


def test_single_row_partitions_are_batched_ten_to_a_request() -> None:
    requests = group_by_partition(writes_for(list(range(25))), batch_partitions=10)
    assert [len(rows_of(r)) for r in requests] == [10, 10, 5]


def test_by_default_a_batch_holds_one_partition() -> None:
    requests = group_by_partition(writes_for([1, 1, 2, 3, 3, 3]))
    assert [sorted({v[0] for _, v in rows_of(r)}) for r in requests] == [[1], [2], [3]]


def test_partitions_on_other_replicas_are_never_batched_together() -> None:
    requests = group_by_partition(
        writes_for(list(range(12))), batch_partitions=10, replica_set=lambda key: int(str(key)) % 3
    )
    for request in requests:
        assert len({v[0] % 3 for _, v in rows_of(request)}) == 1
    assert sorted(len(rows_of(r)) for r in requests) == [4, 4, 4]


WIDE = SimpleStatement("WIDE %s %s %s")


def statements_in(request: tuple[Any, Any]) -> int:
    statement = request[0]
    return len(statement._statements_and_parameters) if isinstance(statement, BatchStatement) else 1


def test_wide_rows_share_a_batch_only_as_far_as_its_bytes_allow() -> None:
    wide = [(key, WIDE, (key, key, "x" * 500)) for key in range(10)]
    per_row = estimated_size(wide[0][2])
    requests = group_by_partition(wide, batch_partitions=10, batch_bytes=4 * per_row)
    assert [statements_in(r) for r in requests] == [4, 4, 2]


def test_a_row_over_the_bytes_goes_alone() -> None:
    rows = [(1, STATEMENT, (1, 0)), (2, WIDE, (2, 1, "x" * 5000)), (3, STATEMENT, (3, 2))]
    requests = group_by_partition(rows, batch_partitions=10, batch_bytes=1000)
    assert [statements_in(r) for r in requests] == [1, 2]
    assert requests[0][0] is WIDE


def test_a_collection_counts_a_cell_per_element() -> None:
    # A message mentioning 300 users writes 300 cells of its set: never a small row.
    assert estimated_size((set(range(300)),)) > 300 * CELL_BYTES


@given(
    keys=st.lists(st.integers(0, 30), max_size=300),
    batch_rows=st.integers(1, 12),
    batch_rows_bytes=st.integers(1, 12),
    batch_partitions=st.integers(1, 6),
    replicas=st.integers(1, 4),
)
def test_every_row_goes_once_within_the_bounds(
    keys: list[int], batch_rows: int, batch_rows_bytes: int, batch_partitions: int, replicas: int
) -> None:
    writes = writes_for(keys)
    row_bytes = estimated_size(writes[0][2]) if writes else 0  # every test row has the same size
    batch_bytes = batch_rows_bytes * row_bytes
    requests = group_by_partition(
        writes,
        batch_rows,
        batch_bytes=batch_bytes,
        batch_partitions=batch_partitions,
        replica_set=lambda key: int(str(key)) % replicas,
    )
    sent = [row for request in requests for row in rows_of(request)]
    assert sorted(v for _, v in sent) == sorted(params for _, _, params in writes)
    per_partition = {key: keys.count(key) for key in keys}
    seen_in: dict[int, int] = {}
    for n, request in enumerate(requests):
        rows = rows_of(request)
        partitions = {v[0] for _, v in rows}
        assert len(rows) <= min(batch_rows, batch_rows_bytes)
        assert len(partitions) <= batch_partitions
        assert len({p % replicas for p in partitions}) == 1
        for partition in partitions:
            if per_partition[partition] <= min(batch_rows, batch_rows_bytes):  # fits: never split
                assert seen_in.setdefault(partition, n) == n
    # a partition's rows keep their order (its later write wins in a split partition's chunks)
    for key in per_partition:
        assert [v[1] for _, v in sent if v[0] == key] == sorted(v[1] for _, v in sent if v[0] == key)
