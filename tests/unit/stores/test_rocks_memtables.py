"""The scratch databases of a state folder (`projector replay --state-dir`, `projector rebuild
--by-replay --state-dir`) keep their memtables within one shared budget, whatever the number of
databases and however much is written (issue 33, item 4: each database had its own memtables, so
a replay's memory grew as the log reached more of its databases).

Real RocksDB in a temporary folder. What is measured is what the databases' memtables that take
writes hold (`rocksdb.cur-size-active-mem-table`, summed over the folder's databases) after every
commit: the budget's contract is that a write finding them above it switches its database's
memtable first, so they never pass the budget by more than one commit's writes. Memtables already
switched and being written to a file come on top until the file is written.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest

from app.replay.driver import Replayer, ReplayOptions
from app.stores.rocks_tables import MEMTABLE_BUDGET_BYTES, WRITE_BUFFER_BYTES, RocksTables

pytestmark = pytest.mark.timeout(60)

ROWS_PER_COMMIT = 2_500
VALUE_BYTES = 400  # random bytes: about an encoded row's or user's size


def _conversation(index: int) -> str:
    return f"5eed0000-0000-0000-0000-{index:012d}"


def _write_in_commits(
    commits: int,
    write: Callable[[int, int], None],
    commit: Callable[[], None],
    active_bytes: Callable[[], int],
) -> tuple[int, int]:
    """Commits of ROWS_PER_COMMIT writes; (peak active memtable bytes after a commit, the most one
    commit wrote in bytes)."""
    peak = 0
    key = 0
    for _ in range(commits):
        for _ in range(ROWS_PER_COMMIT):
            key += 1
            write(key, key % 97)
        commit()
        peak = max(peak, active_bytes())
    return peak, key


def test_a_replays_memtables_stay_within_the_folders_budget(tmp_path: Path) -> None:
    """The replay's own stores (rows, users and the learned messages, as `Replayer` opens them),
    written as its persist after each chunk writes them: ~40 MiB into each database, more than
    its WRITE_BUFFER_BYTES memtable (each database alone would hold up to that much)."""
    replayer = Replayer(ReplayOptions(), lambda frame: None, state_dir=tmp_path / "state")
    tables, messages = replayer.tables, replayer.rocks_store
    assert tables is not None and messages is not None
    value = os.urandom(VALUE_BYTES)

    def write(user_id: int, slot: int) -> None:
        tables.put_row(0, user_id, _conversation(slot), value)
        tables.put_user(0, user_id, value)
        messages.record_message(
            _conversation(user_id),
            1,
            message_id=value.hex()[: VALUE_BYTES - 64],
            activity_id="a" * 32,
            sender_id=slot,
            counts_unread=True,
            mentioned_user=None,
        )

    def commit() -> None:
        tables.commit_now()
        messages.commit()

    commit_bytes = ROWS_PER_COMMIT * 3 * (VALUE_BYTES + 64)
    written = 3 * WRITE_BUFFER_BYTES * 2.5

    def active_bytes() -> int:
        return tables.memtable_bytes(active_only=True) + messages.memtable_bytes(active_only=True)

    peak, _ = _write_in_commits(int(written // commit_bytes), write, commit, active_bytes)
    try:
        assert peak <= MEMTABLE_BUDGET_BYTES + commit_bytes, (peak, MEMTABLE_BUDGET_BYTES)
        # Everything written is still there (the flushes lost nothing).
        assert tables.get_users(0, [1, ROWS_PER_COMMIT * 5]) == {1: value, ROWS_PER_COMMIT * 5: value}
        found = messages.get(_conversation(ROWS_PER_COMMIT * 5), 1)
        assert found is not None and found.sender_id == ROWS_PER_COMMIT * 5 % 97
    finally:
        messages.close()
        tables.close()


def test_a_rebuilds_memtables_stay_within_the_budget_whatever_its_partitions(tmp_path: Path) -> None:
    """A rebuild's folder holds 2 databases a partition that take writes (rows and users): with
    8 partitions, 16 memtables that were each allowed WRITE_BUFFER_BYTES."""
    tables = RocksTables(tmp_path / "state")
    partitions = 8
    value = os.urandom(VALUE_BYTES)

    def write(user_id: int, slot: int) -> None:
        partition = user_id % partitions
        tables.put_row(partition, user_id, _conversation(slot), value)
        tables.put_user(partition, user_id, value)

    commit_bytes = ROWS_PER_COMMIT * 2 * (VALUE_BYTES + 64)
    written = 2 * MEMTABLE_BUDGET_BYTES
    peak, last = _write_in_commits(
        int(written // commit_bytes),
        write,
        tables.commit_now,
        partial(tables.memtable_bytes, active_only=True),
    )
    try:
        assert tables.database_count() == 2 * partitions
        assert peak <= MEMTABLE_BUDGET_BYTES + commit_bytes, (peak, MEMTABLE_BUDGET_BYTES)
        assert tables.get_rows(last % partitions, [(last, _conversation(last % 97))]) == {
            (last, _conversation(last % 97)): value
        }
    finally:
        tables.close()
