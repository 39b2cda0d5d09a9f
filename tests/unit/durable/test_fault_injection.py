"""A worker killed at every await of its persists, then at every await of its recovery (real
RocksDB in tmp dirs, data dir kept or lost): the state it recovers, with the input offset beside
it, is always the one after some whole prefix of the persists, never a mix.

The awaits of a persist and of a recovery are the changelog calls (`KillingChangelog` counts
them); an append is also killed after each possible number of its records went in (a torn
persist), including all of them (the acknowledgement lost)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tables.durable.changelog import InMemoryChangelog
from tables.durable.checkpointer import PersistBatch
from tables.durable.records import row_state_key, user_state_key, waiting_state_key
from tables.durable.store import PartitionStore
from tests.support.durable import Killed, KillingChangelog, State, open_partition, state_of

C = [f"00000000-0000-4000-8000-00000000000{i}" for i in range(4)]

# Persists touching overlapping keys, with deletions, so that any mix of two is a state no prefix has.
BATCHES = [
    PersistBatch(10, rows={(1, C[0]): b"a1", (1, C[1]): b"b1"}, users={1: b"u1"}, waiting={(2, 50): b"w"}),
    PersistBatch(
        20, rows={(1, C[0]): b"a2", (2, C[2]): b"c2"}, users={1: b"u2", 2: b"v2"}, waiting={(2, 50): None}
    ),
    PersistBatch(30, rows={(1, C[1]): None, (2, C[2]): b"c3"}, users={2: b"v3"}),
    PersistBatch(40, rows={(1, C[0]): b"a4", (1, C[3]): b"d4"}, users={1: b"u4"}, meta=b"gate-4"),
]


def _prefixes() -> list[tuple[int, State]]:
    """(input next offset, state) after each whole prefix of BATCHES (the empty one: offset 0)."""
    state: State = {}
    out = [(0, dict(state))]
    for batch in BATCHES:
        changes = [((waiting_state_key(u, s)), v) for (u, s), v in batch.waiting.items()]
        changes += [(row_state_key(u, c), v) for (u, c), v in batch.rows.items()]
        changes += [(user_state_key(u), v) for u, v in batch.users.items()]
        for key, value in changes:
            if value is None:
                state.pop(key, None)
            else:
                state[key] = value
        out.append((batch.input_next_offset, dict(state)))
    return out


PREFIXES = _prefixes()


def _assert_a_whole_prefix(store: PartitionStore) -> int:
    """The prefix the store holds (its index), its data and input offset from the same one."""
    checkpoint = store.position.checkpoint
    offset = 0 if checkpoint is None else checkpoint.input_next_offset
    found = [i for i, (o, s) in enumerate(PREFIXES) if o == offset and s == state_of(store)]
    assert found, f"state at input offset {offset} is no prefix's: {state_of(store)}"
    return found[0]


async def run_writer(changelog: KillingChangelog, path: Path, partition: int = 0) -> int:
    """Claim and persist every batch; the number of persists acknowledged before a kill."""
    opened = open_partition(path, changelog, partition)
    done = 0
    try:
        await opened.checkpointer.claim()
        for batch in BATCHES:
            await opened.checkpointer.persist(batch)
            done += 1
    except Killed:
        pass
    finally:
        opened.close()
    return done


async def recover(changelog: KillingChangelog, path: Path, partition: int = 0) -> int | None:
    """A restarted worker's recovery (catch up, claim); the prefix it restored, None if killed."""
    opened = open_partition(path, changelog, partition)
    try:
        await opened.checkpointer.claim()
    except Killed:
        _assert_a_whole_prefix(opened.store)  # what a kill mid-recovery leaves on disk, too
        return None
    finally:
        opened.close()
    reopened = PartitionStore.open(path)
    try:
        return _assert_a_whole_prefix(reopened)
    finally:
        reopened.close()


def kill_points(calls: int, append_sizes: dict[int, int]) -> list[tuple[int, int]]:
    """(call, records delivered first) for every await: each append at every split."""
    points: list[tuple[int, int]] = []
    for call in range(calls):
        points += [(call, delivered) for delivered in range(append_sizes.get(call, 0) + 1)]
    return points


async def count_writer_calls(tmp_path: Path) -> KillingChangelog:
    counting = KillingChangelog(InMemoryChangelog())
    assert await run_writer(counting, tmp_path / "count") == len(BATCHES)
    return counting


@pytest.mark.parametrize("data_dir", ["kept", "lost"])
async def test_a_kill_at_any_await_of_a_persist_restores_a_whole_prefix(
    tmp_path: Path, data_dir: str
) -> None:
    counting = await count_writer_calls(tmp_path)
    writer_points = kill_points(counting.calls, counting.append_sizes)
    assert len(writer_points) > 2 * len(BATCHES)
    restored_prefixes = set()
    for run, (kill_at, delivered) in enumerate(writer_points):
        log = InMemoryChangelog()
        path = tmp_path / f"w{run}"
        acknowledged = await run_writer(KillingChangelog(log, kill_at, delivered), path)
        if data_dir == "lost":
            PartitionStore.destroy(path)
        restored = await recover(KillingChangelog(log), path)
        # Never older than what was acknowledged; at most the one persist in flight newer.
        assert restored is not None and acknowledged <= restored <= acknowledged + 1, (kill_at, delivered)
        restored_prefixes.add(restored)
        PartitionStore.destroy(path)
    assert restored_prefixes == set(range(len(PREFIXES)))  # every prefix was reached by some kill


# Logs a killed writer leaves: a persist torn after 2 of its records (the 3rd), one delivered
# whole without its acknowledgement (the 4th), and a clean end.
WRITER_ENDS = [("torn", 2, 2), ("unacknowledged", 3, None), ("clean", None, 0)]


@pytest.mark.parametrize("data_dir", ["kept", "lost"])
@pytest.mark.parametrize(("name", "persist_index", "delivered"), WRITER_ENDS, ids=[e[0] for e in WRITER_ENDS])
async def test_a_kill_at_any_await_of_a_recovery_restores_a_whole_prefix(
    tmp_path: Path, data_dir: str, name: str, persist_index: int | None, delivered: int | None
) -> None:
    counting = await count_writer_calls(tmp_path)
    appends = sorted(counting.append_sizes)  # the claim's, then one per persist
    kill_at = None if persist_index is None else appends[persist_index + 1]
    split = 0 if kill_at is None else (delivered if delivered is not None else counting.append_sizes[kill_at])
    log = InMemoryChangelog()
    path = tmp_path / "writer"
    acknowledged = await run_writer(KillingChangelog(log, kill_at, split), path)
    if data_dir == "lost":
        PartitionStore.destroy(path)
    probe = KillingChangelog(log.copy())
    _copy_dir(path, tmp_path / "probe")
    assert await recover(probe, tmp_path / "probe") is not None
    recovery_points = kill_points(probe.calls, probe.append_sizes)
    assert len(recovery_points) >= 4
    for run, (recovery_kill, recovery_delivered) in enumerate(recovery_points):
        attempt_log = log.copy()
        attempt_path = tmp_path / f"r{run}"
        _copy_dir(path, attempt_path)
        await recover(KillingChangelog(attempt_log, recovery_kill, recovery_delivered), attempt_path)
        # The next start after that kill restores a prefix too, no older than acknowledged.
        final = await recover(KillingChangelog(attempt_log), attempt_path)
        assert final is not None and final >= acknowledged, (recovery_kill, recovery_delivered)
        PartitionStore.destroy(attempt_path)


def _copy_dir(source: Path, target: Path) -> None:
    if source.exists():
        shutil.copytree(source, target)
