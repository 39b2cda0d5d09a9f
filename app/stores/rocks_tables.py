"""The worker's `StateTables` port on plain RocksDB (rocksdict) in a folder: the state of a replay
or a rebuild that does not fit in memory (`projector replay --state-dir`, `projector rebuild
--by-replay --state-dir`). No changelog: the folder is scratch space for one run.

One database per table and partition (`{dir}/{table}-{partition}`), the same byte keys as the
faust tables (app/worker/ports.py), writes staged until `commit` (one write batch per database).

Memory: the databases of a folder share one block cache (BLOCK_CACHE_BYTES) and one memtable
budget (MEMTABLE_BUDGET_BYTES), whatever the number of databases and the length of the log.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence
from pathlib import Path
from typing import Any

from rocksdict import BlockBasedOptions, Cache, Options, Rdict, WriteBatch, WriteBufferManager

from app.worker.ports import CHECKPOINT_KEY, parse_row_key, pending_key, row_key, user_key

_ROW_KEY_BYTES = 24
# The memtable of each database (RocksDB's default is 64 MiB, and one more fills while one is
# written out): a replay writes every changed row after each chunk, so its memtables were a large
# share of its memory (a replay of 1M rows with --state-dir peaked above 300 MiB). Smaller
# memtables only mean more, smaller files for the compaction to merge.
WRITE_BUFFER_BYTES = 16 * 1024 * 1024
# The memtables of all the databases of a folder together (RocksDB's WriteBufferManager, shared
# by their options): once their mutable memtables pass 7/8 of it, the next write to a database
# flushes that database's memtable. Without it each database had its own 2 x WRITE_BUFFER_BYTES,
# so a replay's memory grew with the databases the log had reached so far (issue 33, item 4:
# the messages' database fills only once the log's messages start, +13.6% of peak RSS from the
# first 1M lines of a 200,000-user stream to all of it), and a rebuild's with its partitions
# (4 databases each). The bound: this budget plus the memtables being written out (a flush
# frees its memtable when the file is written) plus one write batch; writes never stall.
MEMTABLE_BUDGET_BYTES = 32 * 1024 * 1024
# One block cache for all the databases of a folder. RocksDB's default is a 32 MiB cache per
# database, and a replay reads back every row it evicted: the rows' and the users' caches filled
# (measured: ~45 MiB of a replay's 415 MiB peak). Reads are point reads of recently written keys
# (mostly still in the memtable) and one ordered scan at the end: a small cache is enough.
BLOCK_CACHE_BYTES = 8 * 1024 * 1024


def scratch_options(cache: Any, memtables: Any) -> Any:
    """Options of a scratch database: WRITE_BUFFER_BYTES memtables within the `memtables`
    budget (a WriteBufferManager) and blocks cached in `cache`, both shared by the folder's
    databases."""
    options = Options(raw_mode=True)
    options.set_write_buffer_size(WRITE_BUFFER_BYTES)
    options.set_write_buffer_manager(memtables)
    table = BlockBasedOptions()
    table.set_block_cache(cache)
    options.set_block_based_table_factory(table)
    return options


def memtable_bytes(db: Any, *, active_only: bool = False) -> int:
    """What an open database's memtables hold now (see RocksTables.memtable_bytes)."""
    name = "rocksdb.cur-size-active-mem-table" if active_only else "rocksdb.cur-size-all-mem-tables"
    return int(db.property_int_value(name) or 0)


class RocksTables:
    """`options`: makes each database's rocksdict Options (default: `scratch_options` over the
    folder's `cache` and `memtables`). The state bench passes the worker's (faust's) options, so
    that it measures the memory the worker's tables really take."""

    def __init__(self, folder: Path, options: Callable[[], Any] | None = None) -> None:
        self.folder = folder
        self._options = options
        folder.mkdir(parents=True, exist_ok=True)
        self._dbs: dict[tuple[str, int], Any] = {}
        self.cache = Cache(BLOCK_CACHE_BYTES)
        self.memtables = WriteBufferManager(MEMTABLE_BUDGET_BYTES, False)
        self._staged: list[tuple[str, int, bytes, bytes | None]] = []

    def _db(self, table: str, partition: int) -> Any:
        db = self._dbs.get((table, partition))
        if db is None:
            if self._options is not None:
                options = self._options()
            else:
                options = scratch_options(self.cache, self.memtables)
            db = self._dbs[(table, partition)] = Rdict(str(self.folder / f"{table}-{partition}"), options)
        return db

    async def acquire(self, partitions: Sequence[int]) -> None:
        """One run owns every partition of its folder: nothing to claim."""

    def hand_over(self, partition: int) -> None:
        """Nothing else writes this store: a hand-over needs no bookkeeping."""

    def put_row(self, partition: int, user_id: int, conversation_id: str, blob: bytes) -> None:
        self._staged.append(("rows", partition, row_key(user_id, conversation_id), blob))

    def put_user(self, partition: int, user_id: int, blob: bytes) -> None:
        self._staged.append(("users", partition, user_key(user_id), blob))

    def put_checkpoint_record(self, partition: int, blob: bytes, next_offset: int | None = None) -> None:
        # The checkpoint record carries the offset itself (the core writes both).
        self._staged.append(("gates", partition, CHECKPOINT_KEY, blob))

    def put_pending(self, partition: int, user_id: int, mailbox_seq: int, raw: bytes) -> None:
        self._staged.append(("pending", partition, pending_key(user_id, mailbox_seq), raw))

    def delete_pending(self, partition: int, user_id: int, mailbox_seq: int) -> None:
        self._staged.append(("pending", partition, pending_key(user_id, mailbox_seq), None))

    async def commit(self) -> None:
        # One write batch per database: not atomic across them, and need not be (the folder is
        # one run's scratch space, never recovered after a crash).
        self.commit_now()

    def commit_now(self) -> None:
        staged, self._staged = self._staged, []
        batches: dict[tuple[str, int], Any] = {}
        for table, partition, key, value in staged:
            batch = batches.get((table, partition))
            if batch is None:
                batch = batches[(table, partition)] = WriteBatch(raw_mode=True)
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
        for (table, partition), batch in batches.items():
            self._db(table, partition).write(batch)

    def get_users(self, partition: int, user_ids: Collection[int]) -> dict[int, bytes]:
        ids = list(user_ids)
        values = self._db("users", partition).get([user_key(u) for u in ids])
        return {u: v for u, v in zip(ids, values, strict=True) if v is not None}

    def get_rows(self, partition: int, keys: Collection[tuple[int, str]]) -> dict[tuple[int, str], bytes]:
        wanted = list(keys)
        values = self._db("rows", partition).get([row_key(u, c) for u, c in wanted])
        return {k: v for k, v in zip(wanted, values, strict=True) if v is not None}

    def user_rows(self, partition: int, user_id: int) -> list[tuple[str, bytes]]:
        prefix = user_key(user_id)
        out = []
        for key, value in self._db("rows", partition).items(from_key=prefix):
            if not key.startswith(prefix):
                break
            out.append((parse_row_key(key)[1], value))
        return out

    def row_keys(self, partition: int) -> Iterator[tuple[int, str]]:
        for key in self._db("rows", partition).keys():  # noqa: SIM118  # an Rdict, not a dict
            if len(key) == _ROW_KEY_BYTES:
                yield parse_row_key(key)

    def rows_after(
        self, partition: int, after: tuple[int, str] | None, limit: int
    ) -> list[tuple[tuple[int, str], bytes]]:
        out: list[tuple[tuple[int, str], bytes]] = []
        if limit <= 0:
            return out
        start = None if after is None else row_key(*after)
        iterator = self._db("rows", partition).iter()
        if start is None:
            iterator.seek_to_first()
        else:
            iterator.seek(start)
            if iterator.valid() and iterator.key() == start:
                iterator.next()
        while iterator.valid() and len(out) < limit:
            key: bytes = iterator.key()
            if len(key) == _ROW_KEY_BYTES:
                out.append((parse_row_key(key), iterator.value()))
            iterator.next()
        return out

    def row_key_bounds(self, partition: int) -> tuple[tuple[int, str], tuple[int, str]] | None:
        iterator = self._db("rows", partition).iter()
        iterator.seek_to_first()
        while iterator.valid() and len(iterator.key()) != _ROW_KEY_BYTES:
            iterator.next()
        if not iterator.valid():
            return None
        first = parse_row_key(iterator.key())
        iterator.seek_to_last()
        while iterator.valid() and len(iterator.key()) != _ROW_KEY_BYTES:
            iterator.prev()
        return first, parse_row_key(iterator.key())

    def estimated_rows(self, partition: int) -> int:
        value = self._db("rows", partition).property_int_value("rocksdb.estimate-num-keys")
        return int(value) if value is not None else 0

    def users(self, partition: int) -> Iterator[tuple[int, bytes]]:
        """Every user's record, in user id order."""
        for key, value in self._db("users", partition).items():
            yield int.from_bytes(key, "big"), value

    def checkpoint_record(self, partition: int) -> bytes | None:
        value: bytes | None = self._db("gates", partition).get(CHECKPOINT_KEY)
        return value

    def pending(self, partition: int) -> list[bytes]:
        return list(self._db("pending", partition).values())

    def memtable_bytes(self, *, active_only: bool = False) -> int:
        """What the memtables of the open databases hold now: those taking writes, and (unless
        `active_only`) those being written out to files."""
        return sum(memtable_bytes(db, active_only=active_only) for db in self._dbs.values())

    def database_count(self) -> int:
        return len(self._dbs)

    def close(self) -> None:
        for db in self._dbs.values():
            db.close()
        self._dbs.clear()
