"""Running many Cassandra writes at once: UNLOGGED batches, bounded concurrency.

Shared by the MessageStore and the UserConversationState adapters. Two rules shape it:

* A batch holds rows of ONE replica set. The rows of one partition go together (applied as one
  mutation, atomic for that partition). By default that is all a batch holds; a caller may let
  a batch take the rows of up to ``batch_partitions`` partitions whose replicas are the same
  nodes (``replica_set``). A batch of partitions spread over the ring makes its coordinator fan
  out to every replica set (the classic anti-pattern); one whose partitions share their
  replicas is written by a replica of all of them, to the nodes each single write would reach,
  and costs the client one request instead of several. The Python driver spends ~220 us of CPU
  per request and ~40 us per row in a ten-partition batch (measured on one node, 5,000 rows):
  the state mirror writes one or two rows per user, and its requests were ~30% of the worker's
  CPU at a 100 ms window. Cassandra warns about unlogged batches over more than
  ``unlogged_batch_across_partitions_warn_threshold`` partitions (10 by default) and over
  ``batch_size_warn_threshold`` (5 KiB): a batch also stops at ``batch_bytes`` (estimated).
* Concurrency is bounded (``execute_concurrent``'s window), so a flush of 100,000 rows never
  puts 100,000 requests in flight at once.

The driver is imported inside the functions: importing this module stays free.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

# Rows per batch.
BATCH_ROWS = 40
# Estimated bytes per batch (`estimated_size`). Cassandra warns (a log line on the server, per
# batch) above `batch_size_warn_threshold` (5 KiB by default) and refuses a batch above
# `batch_size_fail_threshold` (50 KiB): a state row written whole counts 340 bytes, so ten users'
# new rows (with their first-seen marks) crossed the first. The estimate counts from above.
BATCH_BYTES = 4096
# What Cassandra 5 counts per row and per cell (its warnings' sizes for batches of known rows: a
# row with no cell 66 bytes, each cell 20 bytes plus its value: a bigint 28, "active" 26).
ROW_BYTES = 66
CELL_BYTES = 20
# Partitions per batch when the caller groups by replica set: Cassandra's default warn threshold.
BATCH_PARTITIONS = 10
# Requests in flight per call. The driver's own default (100) with one node is fine; 64 leaves
# head room for the worker's inline reads on the same connection pool.
CONCURRENCY = 64


class StoreError(RuntimeError):
    """A Cassandra read or write failed (unreachable, timed out, refused)."""


_IDENTIFIER = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,47}")


def checked_keyspace(keyspace: str) -> str:
    """The keyspace, if it is a plain CQL identifier: it is spliced into statement text (CQL
    cannot bind a keyspace), so only an identifier may get there."""
    if not _IDENTIFIER.fullmatch(keyspace):
        raise ValueError(f"keyspace {keyspace!r} is not a CQL identifier")
    return keyspace


def prepare_statement(session: Any, keyspace: str, what: str, template: str, **parts: str) -> Any:
    """`template` prepared at LOCAL_QUORUM, its {ks} the keyspace (checked_keyspace's) and each
    {name} the text `parts` gives (column lists from app/stores/schema.py): nothing else is spliced
    in, every value is a bind marker. A keyspace or table that is not there: StoreError naming
    `what` ("state", "member", ...) and the bootstrap."""
    from cassandra import ConsistencyLevel

    cql = template.replace("{ks}", keyspace)
    for name, text in parts.items():
        cql = cql.replace("{" + name + "}", text)
    try:
        statement = session.prepare(cql)
    except Exception as exc:  # InvalidRequest: keyspace or table missing
        raise StoreError(
            f"cannot prepare {what} statements in keyspace {keyspace!r} ({exc}); "
            "has `projector bootstrap` run?"
        ) from None
    statement.consistency_level = ConsistencyLevel.LOCAL_QUORUM
    return statement


# (partition key, prepared statement, bound parameters)
Write = tuple[Hashable, Any, Sequence[Any]]
_Rows = list[tuple[Any, Sequence[Any]]]  # (prepared statement, bound parameters)


def replica_sets(session: Any, keyspace: str) -> Callable[[bytes], Hashable]:
    """routing key (a partition key's serialized value) -> the nodes holding that partition in
    ``keyspace``, from the driver's view of the ring (what its token-aware policy routes by).
    Without ring metadata every key answers None: one group, as on one node."""

    def replica_set(routing_key: bytes) -> Hashable:
        token_map = session.cluster.metadata.token_map
        if token_map is None:
            return None
        return tuple(token_map.get_replicas(keyspace, token_map.token_class.from_key(routing_key)))

    return replica_set


def group_by_partition(
    writes: Iterable[Write],
    batch_rows: int = BATCH_ROWS,
    *,
    batch_bytes: int = BATCH_BYTES,
    batch_partitions: int = 1,
    replica_set: Callable[[Hashable], Hashable] | None = None,
) -> list[tuple[Any, Any]]:
    """``(statement, params)`` pairs to execute: several writes to one partition folded into
    UNLOGGED batches of at most ``batch_rows`` rows and ``batch_bytes`` (`estimated_size`), a
    single write alone. With ``batch_partitions`` > 1, a batch also takes other partitions'
    rows (at most that many partitions, within the same bounds), only partitions for which
    ``replica_set`` (partition key -> its replicas; None: every key alike, for one node) answers
    the same. A partition's rows stay in one batch unless they alone exceed a bound. (The
    MessageStore's writes and single-partition batches obey the byte bound too: a conversation's
    40 member rows once crossed the size warning.)"""
    from cassandra.query import UNSET_VALUE

    by_partition: dict[Hashable, _Rows] = {}
    for partition, statement, params in writes:
        by_partition.setdefault(partition, []).append((statement, params))
    out: list[tuple[Any, Any]] = []
    # Per replica set, the batch being filled.
    filling: dict[Hashable, _Filling] = {}
    for partition, items in by_partition.items():
        sizes = [estimated_size(params, UNSET_VALUE) for _, params in items]
        size = sum(sizes)
        if batch_partitions <= 1 or len(items) > batch_rows or size > batch_bytes:
            out.extend(_chunks(items, sizes, batch_rows, batch_bytes))
            continue
        group = None if replica_set is None else replica_set(partition)
        batch = filling.get(group)
        if batch is not None and (
            batch.partitions >= batch_partitions
            or len(batch.rows) + len(items) > batch_rows
            or batch.size + size > batch_bytes
        ):
            out.append(_request(batch.rows))
            batch = None
        if batch is None:
            batch = filling[group] = _Filling()
        batch.rows.extend(items)
        batch.partitions += 1
        batch.size += size
    out.extend(_request(batch.rows) for batch in filling.values())
    return out


@dataclass(slots=True)
class _Filling:
    rows: _Rows = field(default_factory=list)
    partitions: int = 0
    size: int = 0


def estimated_size(params: Sequence[Any], unset: Any = None) -> int:
    """What Cassandra counts of one statement's row against ``batch_size_warn_threshold`` (the
    mutation's data size), from above: ``ROW_BYTES`` and, per bound value, ``CELL_BYTES`` and
    the value's bytes (an ``unset`` value writes nothing). Key values count as cells too (they
    are not), and two statements on one row count its overhead twice: the estimate stays above."""
    size = ROW_BYTES
    for value in params:
        if value is unset:
            continue
        if isinstance(value, str):
            size += CELL_BYTES + len(value.encode())
        elif isinstance(value, bytes):
            size += CELL_BYTES + len(value)
        elif isinstance(value, (set, frozenset, list, tuple)):  # a cell per element (mentions)
            size += CELL_BYTES + len(value) * (CELL_BYTES + 16)
        else:  # numbers (8 bytes; a varint up to 9 is only ever a key), uuids, booleans, null
            size += CELL_BYTES + 16
    return size


def _chunks(items: _Rows, sizes: list[int], batch_rows: int, batch_bytes: int) -> list[tuple[Any, Any]]:
    """One partition's rows in order, in requests within both bounds (a row over ``batch_bytes``
    alone)."""
    out: list[tuple[Any, Any]] = []
    rows: _Rows = []
    size = 0
    for item, item_size in zip(items, sizes, strict=True):
        if rows and (len(rows) >= batch_rows or size + item_size > batch_bytes):
            out.append(_request(rows))
            rows, size = [], 0
        rows.append(item)
        size += item_size
    if rows:
        out.append(_request(rows))
    return out


def _request(rows: _Rows) -> tuple[Any, Any]:
    """One row as its own statement, several as one UNLOGGED batch."""
    from cassandra.query import BatchStatement, BatchType

    if len(rows) == 1:
        return rows[0]
    batch = BatchStatement(batch_type=BatchType.UNLOGGED)
    for statement, params in rows:
        batch.add(statement, params)
    return (batch, ())


def execute_all(
    session: Any, statements: Sequence[tuple[Any, Any]], *, what: str, concurrency: int = CONCURRENCY
) -> list[Any]:
    """Execute every ``(statement, params)`` with at most ``concurrency`` in flight; results (the
    driver's ResultSets) in input order.

    The first failure raises :class:`StoreError` (the rest may or may not have been applied:
    every write this package issues is an idempotent upsert, so the caller retries the lot), but
    only once nothing this call sent is in flight any more, and nothing is sent after it. The
    driver's ``execute_concurrent(raise_on_first_error=True)`` raises at the first error and
    goes on sending the rest of the list each time an earlier statement succeeds: a statement
    of a failed mirror round could then be sent after the round that retried it, stamped with
    a newer client timestamp, and its older value would win in Cassandra for good. (A request
    the driver gave up on by its timeout may still reach the server: it carries the timestamp
    it was sent with, older than any later round's, so it can never win over one.)
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    if not statements:
        return []
    window = _Window(concurrency)
    futures: list[Any] = []
    for statement, params in statements:
        if not window.take():
            break
        # Sent outside the window's lock: a send may wait for a free stream on the connection,
        # which the I/O thread frees while completing requests (through the window's callbacks).
        try:
            future = session.execute_async(statement, params)
        except Exception as exc:  # refused before it was sent (a session shut down)
            window.failed(exc)
            break
        futures.append(future)
        future.add_callbacks(callback=window.succeeded, errback=window.failed)
    failure = window.settle()
    if failure is not None:
        raise StoreError(f"cassandra {what} failed: {type(failure).__name__}: {failure}") from None
    try:
        return [future.result() for future in futures]  # all done: no wait
    except Exception as exc:  # the driver raises many unrelated types; all mean "not done"
        raise StoreError(f"cassandra {what} failed: {type(exc).__name__}: {exc}") from None


class _Window:
    """Requests in flight of one :func:`execute_all` call, and its first failure."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._in_flight = 0
        self._failure: BaseException | None = None
        self._changed = threading.Condition()

    def take(self) -> bool:
        """Wait for room for one more request; False once a request failed (send no more)."""
        with self._changed:
            self._changed.wait_for(lambda: self._in_flight < self._size or self._failure is not None)
            if self._failure is not None:
                return False
            self._in_flight += 1
            return True

    def succeeded(self, _: Any) -> None:
        # Called by the driver's I/O thread (or at once, when the request is already done).
        self._done(None)

    def failed(self, exc: BaseException) -> None:
        self._done(exc)

    def _done(self, exc: BaseException | None) -> None:
        with self._changed:
            self._in_flight -= 1
            if exc is not None and self._failure is None:
                self._failure = exc
            self._changed.notify_all()

    def settle(self) -> BaseException | None:
        """Wait until nothing taken is in flight; the first failure, if any."""
        with self._changed:
            self._changed.wait_for(lambda: self._in_flight == 0)
            return self._failure


async def execute_all_async(
    session: Any, statements: Sequence[tuple[Any, Any]], *, what: str, concurrency: int = CONCURRENCY
) -> list[Any]:
    """:func:`execute_all` without blocking the event loop (faust agents, the simulator).

    ``execute_concurrent`` blocks its caller until everything is acknowledged, so it runs in a
    worker thread; the driver's own I/O thread does the networking either way.
    """
    if not statements:
        return []
    return await asyncio.to_thread(execute_all, session, statements, what=what, concurrency=concurrency)


async def one_page(session: Any, statement: Any, params: Sequence[Any], what: str) -> list[Any]:
    """The first page of the answer to ``statement`` bound to ``params``, without blocking the
    event loop (the driver's callbacks run on its own thread). For statements whose whole answer
    fits in one page: a write, a read of one partition's batch of at most 50. Any failure,
    binding included, is a :class:`StoreError` naming ``what``."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[list[Any]] = loop.create_future()

    def settle(rows: list[Any] | None, exc: BaseException | None) -> None:
        if done.done():  # the caller gave up (cancelled): nothing to hand over
            return
        if exc is not None:
            done.set_exception(StoreError(f"cassandra {what} failed: {type(exc).__name__}: {exc}"))
        else:
            done.set_result(rows or [])

    def on_rows(rows: Any) -> None:
        loop.call_soon_threadsafe(settle, list(rows or ()), None)

    def on_error(exc: BaseException) -> None:
        loop.call_soon_threadsafe(settle, None, exc)

    try:
        session.execute_async(statement.bind(params)).add_callbacks(on_rows, on_error)
    except Exception as exc:
        raise StoreError(f"cassandra {what} failed: {type(exc).__name__}: {exc}") from None
    return await done
