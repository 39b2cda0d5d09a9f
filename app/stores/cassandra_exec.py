"""Running many Cassandra writes at once: per-partition UNLOGGED batches, bounded concurrency.

Shared by the MessageStore and the UserConversationState adapters. Two rules shape it:

* A batch only ever holds rows of ONE partition. An UNLOGGED batch on a single partition is
  applied as one mutation by one replica set (cheap, and atomic for that partition); a batch
  spanning partitions would make the coordinator fan out and is the classic Cassandra
  anti-pattern. Rows of different partitions go as separate statements, concurrently.
* Concurrency is bounded (``execute_concurrent``'s window), so a flush of 100,000 rows never
  puts 100,000 requests in flight at once.

The driver is imported inside the functions: importing this module stays free.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Hashable, Iterable, Sequence
from typing import Any

# Rows per single-partition batch. Cassandra warns above `batch_size_warn_threshold` (5 KiB by
# default); our rows are < 100 bytes, so 40 rows stay well below it.
BATCH_ROWS = 40
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


# (partition key, prepared statement, bound parameters)
Write = tuple[Hashable, Any, Sequence[Any]]


def group_by_partition(writes: Iterable[Write], batch_rows: int = BATCH_ROWS) -> list[tuple[Any, Any]]:
    """``(statement, params)`` pairs to execute: single writes alone, several writes to one
    partition folded into UNLOGGED batches of at most ``batch_rows`` rows."""
    from cassandra.query import BatchStatement, BatchType

    by_partition: dict[Hashable, list[tuple[Any, Sequence[Any]]]] = {}
    for partition, statement, params in writes:
        by_partition.setdefault(partition, []).append((statement, params))
    out: list[tuple[Any, Any]] = []
    for items in by_partition.values():
        for start in range(0, len(items), batch_rows):
            chunk = items[start : start + batch_rows]
            if len(chunk) == 1:
                out.append(chunk[0])
                continue
            batch = BatchStatement(batch_type=BatchType.UNLOGGED)
            for statement, params in chunk:
                batch.add(statement, params)
            out.append((batch, ()))
    return out


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
