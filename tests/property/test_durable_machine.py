"""Two workers, two partitions, one in-memory changelog (tables.durable): batches, persists (some
torn), kills (data dir kept or lost), clean rebalances, silent takeovers (the old owner keeps
persisting: a zombie), standby copies tailing and promoted. After every step, every local store,
owner's or standby's, holds exactly the state of some whole prefix of the persists the changelog
holds (by the independent model `chain_states`), with that prefix's input offset; and every
acknowledged persist is one of them."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tables.durable.changelog import InMemoryChangelog
from tables.durable.checkpointer import ClaimLost, PersistBatch, PersistFailed
from tables.durable.records import PersistId, user_state_key
from tables.durable.store import PartitionStore
from tests.support.durable import Opened, State, chain_states, open_partition, state_of

PARTITIONS = (0, 1)
WORKERS = (0, 1)
USERS = (1, 2, 3, 4, 5)
T = TypeVar("T")


@dataclass
class Worker:
    root: Path
    opened: dict[int, Opened] = field(default_factory=dict)  # owned or standby stores
    owns: set[int] = field(default_factory=set)  # what it believes it owns (a zombie's is stale)
    pending: dict[int, dict[int, bytes | None]] = field(default_factory=dict)  # user -> value
    input_offset: dict[int, int] = field(default_factory=dict)
    durable: dict[int, State] = field(default_factory=dict)  # its state at its last persist

    def path(self, partition: int) -> Path:
        return self.root / f"p{partition}"


class DurableWorkers(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="durable-machine-"))
        self.loop = asyncio.new_event_loop()
        self.changelog = InMemoryChangelog()
        self.workers = [Worker(self.dir / f"w{i}") for i in WORKERS]
        self.owner: dict[int, int | None] = dict.fromkeys(PARTITIONS)  # the group's assignment
        self.values = 0
        self.acknowledged: dict[int, list[Any]] = {p: [] for p in PARTITIONS}

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coroutine)

    def teardown(self) -> None:
        for worker in self.workers:
            for opened in worker.opened.values():
                opened.close()
        self.loop.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _open(self, worker: Worker, partition: int) -> Opened:
        if partition not in worker.opened:
            worker.opened[partition] = open_partition(worker.path(partition), self.changelog, partition)
        return worker.opened[partition]

    def _drop(self, worker: Worker, partition: int) -> None:
        worker.owns.discard(partition)
        worker.pending.pop(partition, None)

    def _claim(self, index: int, partition: int) -> None:
        worker = self.workers[index]
        opened = self._open(worker, partition)
        for _ in range(3):
            try:
                checkpoint = self.run(opened.checkpointer.claim())
                break
            except ClaimLost:
                continue
        else:
            raise AssertionError("a claim lost three times with no other writer claiming")
        worker.owns.add(partition)
        worker.pending[partition] = {}
        worker.input_offset[partition] = checkpoint.input_next_offset
        worker.durable[partition] = state_of(opened.store)
        self.owner[partition] = index

    # -- rules ----------------------------------------------------------------------------------

    @initialize(first=st.sampled_from(WORKERS), second=st.sampled_from(WORKERS))
    def assign_both_partitions(self, first: int, second: int) -> None:
        self._claim(first, 0)
        self._claim(second, 1)

    def owned(self) -> list[tuple[int, int]]:
        return [(i, p) for i, w in enumerate(self.workers) for p in sorted(w.owns)]

    def standbys(self) -> list[tuple[int, int]]:
        return [(i, p) for i, w in enumerate(self.workers) for p in sorted(set(w.opened) - w.owns)]

    @precondition(lambda self: self.owned())
    @rule(
        data=st.data(),
        users=st.lists(st.sampled_from(USERS), min_size=1, max_size=4),
        delete=st.booleans(),
    )
    def batch(self, data: st.DataObject, users: list[int], delete: bool) -> None:
        index, partition = data.draw(st.sampled_from(self.owned()))
        self._apply(index, partition, users, delete)

    def _apply(self, index: int, partition: int, users: list[int], delete: bool) -> None:
        worker = self.workers[index]
        for position, user in enumerate(users):
            self.values += 1
            worker.pending[partition][user] = None if delete and position == 0 else b"v%d" % self.values
        worker.input_offset[partition] += len(users)

    @precondition(lambda self: self.owned())
    @rule(
        data=st.data(), users=st.lists(st.sampled_from(USERS), min_size=1, max_size=4), delete=st.booleans()
    )
    def flush_cycle(self, data: st.DataObject, users: list[int], delete: bool) -> None:
        """A batch, then a persist (the common pair)."""
        index, partition = data.draw(st.sampled_from(self.owned()))
        self._apply(index, partition, users, delete)
        self._persist(index, partition, None)

    @precondition(lambda self: self.owned())
    @rule(data=st.data(), tear=st.integers(min_value=0, max_value=15))
    def persist(self, data: st.DataObject, tear: int) -> None:
        """`tear` below 6: the append delivers that many records and fails (all of them: the
        acknowledgement is lost)."""
        index, partition = data.draw(st.sampled_from(self.owned()))
        self._persist(index, partition, tear if tear < 6 else None)

    def _persist(self, index: int, partition: int, tear: int | None) -> None:
        worker = self.workers[index]
        opened = worker.opened[partition]
        changes = worker.pending[partition]
        batch = PersistBatch(worker.input_offset[partition], users=dict(changes))
        if tear is not None:
            self.changelog.tear_next_append(tear)
        try:
            checkpoint = self.run(opened.checkpointer.persist(batch))
        except PersistFailed:
            # The worker drops the partition's in-memory state and, while the group still
            # assigns it the partition, recovers it (a new claim).
            self._drop(worker, partition)
            if self.owner[partition] == index:
                self._claim(index, partition)
            return
        expected = worker.durable[partition]
        for user, value in changes.items():
            if value is None:
                expected.pop(user_state_key(user), None)
            else:
                expected[user_state_key(user)] = value
        changes.clear()
        assert state_of(opened.store) == expected
        self.acknowledged[partition].append(checkpoint.persist)

    @rule(index=st.sampled_from(WORKERS), keep_data_dir=st.booleans())
    def kill(self, index: int, keep_data_dir: bool) -> None:
        worker = self.workers[index]
        for opened in worker.opened.values():
            opened.close()
        if not keep_data_dir:
            shutil.rmtree(worker.root, ignore_errors=True)
        self.workers[index] = Worker(worker.root)
        for partition, owner in self.owner.items():
            if owner == index:
                self.owner[partition] = None

    @rule(partition=st.sampled_from(PARTITIONS), index=st.sampled_from(WORKERS))
    def rebalance(self, partition: int, index: int) -> None:
        """A clean hand-over: the old owner stops writing (keeps its store as a standby)."""
        previous = self.owner[partition]
        if previous is not None and previous != index:
            self._drop(self.workers[previous], partition)
        self._claim(index, partition)

    @rule(partition=st.sampled_from(PARTITIONS))
    def takeover_unknown_to_the_old_owner(self, partition: int) -> None:
        """The group moved the partition; the old owner has not noticed and persists on."""
        previous = self.owner[partition]
        self._claim(1 - previous if previous is not None else 0, partition)

    def zombies(self) -> list[tuple[int, int]]:
        return [(i, p) for i, p in self.owned() if self.owner[p] != i]

    @precondition(lambda self: self.zombies())
    @rule(
        data=st.data(), users=st.lists(st.sampled_from(USERS), min_size=1, max_size=4), tear=st.integers(0, 4)
    )
    def zombie_persists(self, data: st.DataObject, users: list[int], tear: int) -> None:
        """A writer that lost its partition without knowing persists (its append torn or not);
        then the owner persists."""
        index, partition = data.draw(st.sampled_from(self.zombies()))
        worker = self.workers[index]
        for user in users:
            self.values += 1
            worker.pending[partition][user] = b"zombie%d" % self.values
        if tear < len(users):
            self.changelog.tear_next_append(tear)
        batch = PersistBatch(worker.input_offset[partition] + 1, users=dict(worker.pending[partition]))
        with contextlib.suppress(PersistFailed):
            self.run(worker.opened[partition].checkpointer.persist(batch))
        self._drop(worker, partition)
        owner = self.owner[partition]
        if owner is not None and partition in self.workers[owner].owns:
            self._persist(owner, partition, tear=None)

    @rule(index=st.sampled_from(WORKERS), partition=st.sampled_from(PARTITIONS))
    def open_standby(self, index: int, partition: int) -> None:
        self._open(self.workers[index], partition)

    @precondition(lambda self: self.standbys())
    @rule(data=st.data())
    def standby_tails(self, data: st.DataObject) -> None:
        index, partition = data.draw(st.sampled_from(self.standbys()))
        self.run(self.workers[index].opened[partition].reader.catch_up())

    @precondition(lambda self: self.standbys())
    @rule(data=st.data())
    def damaged_store_is_rebuilt(self, data: st.DataObject) -> None:
        """A standby's store is found damaged: wiped, then rebuilt from the changelog."""
        index, partition = data.draw(st.sampled_from(self.standbys()))
        worker = self.workers[index]
        worker.opened.pop(partition).close()
        PartitionStore.destroy(worker.path(partition))
        self.run(self._open(worker, partition).reader.catch_up())

    @rule(drop_tombstones=st.booleans())
    def rebuild_from_compacted_copies(self, drop_tombstones: bool) -> None:
        for partition in PARTITIONS:
            self._rebuild_from_a_compacted_copy(partition, drop_tombstones)

    def _rebuild_from_a_compacted_copy(self, partition: int, drop_tombstones: bool) -> None:
        """Compaction keeps the state (docs/durability.md): when the last record of every key,
        the checkpoint key included, is an accepted persist's, a store rebuilt from the
        compacted log holds the chain's last state. (A copy is compacted: the model reads the
        log uncompacted.) When the condition does not hold (a torn or refused record not yet
        written again), nothing is checked."""
        records = self.changelog.records(partition)
        chain = chain_states(records)
        if not chain:
            return
        accepted = {persist for persist, _, _ in chain}
        last: dict[bytes | None, bytes] = {}
        for record in records:
            last[record.key] = dict(record.headers)["persist"]
        if any(PersistId.decode(persist) not in accepted for persist in last.values()):
            return
        compacted = self.changelog.copy()
        compacted.compact(partition, drop_tombstones=drop_tombstones)
        path = self.dir / f"rebuilt-{self.values}-{partition}"
        self.values += 1
        rebuilt = open_partition(path, compacted, partition)
        try:
            self.run(rebuilt.reader.catch_up())
            _, offset, state = chain[-1]
            assert state_of(rebuilt.store) == state
            checkpoint = rebuilt.store.position.checkpoint
            assert checkpoint is not None and checkpoint.input_next_offset == offset
        finally:
            rebuilt.close()
            PartitionStore.destroy(path)

    # -- invariants -----------------------------------------------------------------------------

    @invariant()
    def every_store_holds_a_whole_prefix_with_its_input_offset(self) -> None:
        for partition in PARTITIONS:
            chain = chain_states(self.changelog.records(partition))
            by_persist = {persist: (offset, state) for persist, offset, state in chain}
            for worker in self.workers:
                opened = worker.opened.get(partition)
                if opened is None:
                    continue
                checkpoint = opened.store.position.checkpoint
                if checkpoint is None:
                    assert state_of(opened.store) == {}
                    continue
                assert checkpoint.persist in by_persist, (
                    f"store at {checkpoint.persist}: not in the log's chain"
                )
                offset, state = by_persist[checkpoint.persist]
                assert state_of(opened.store) == state
                assert checkpoint.input_next_offset == offset

    @invariant()
    def every_acknowledged_persist_is_in_the_chain(self) -> None:
        for partition in PARTITIONS:
            chained = {persist for persist, _, _ in chain_states(self.changelog.records(partition))}
            assert set(self.acknowledged[partition]) <= chained

    @invariant()
    def an_owner_with_nothing_pending_is_its_last_persist(self) -> None:
        for worker in self.workers:
            for partition in worker.owns:
                if not worker.pending.get(partition):
                    assert state_of(worker.opened[partition].store) == worker.durable[partition]


TestDurableWorkers = DurableWorkers.TestCase
# Bounded by step count, not time (the profile in tests/conftest.py has no deadline).
TestDurableWorkers.settings = settings(max_examples=40, stateful_step_count=30)
